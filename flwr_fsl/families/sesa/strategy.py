"""``SesaFedAvg``: secure submodel aggregation (SESA, Sami & Güler §IV) on the round engine.

Heterogeneous clients train random *shard* submodels of the global model — every hidden layer
is split into ``S = num_shards`` shards and a client of capacity ``B`` picks ``B · S`` of them
per layer, *secretly* — and the server learns, per shard, only the count-weighted average
over the clients that chose it: neither which shards a client chose nor its values
(:mod:`flwr_fsl.families.sesa.protocol`, shard groups :mod:`flwr_fsl.families.sesa.layout`). The
client side is :func:`~flwr_fsl.mods.sesa_mod` in front of a width-scalable ``@app.train``
(the same function :func:`~flwr_fsl.mods.width_mod` takes).

The round's orchestration is :class:`~flwr_fsl.families.sesa.server.SesaRoundServer` (no
Flower); this strategy is its transport: each of the server's asks goes out as a typed phase of
:mod:`flwr_fsl.families.sesa.records` through
:meth:`~flwr_fsl.core.engine.PhasedStrategy.send_phase` (bad replies drop their node). The
settings travel as one :class:`~flwr_fsl.families.sesa.messages.SesaSettings` record, validated
here once.

A round is four ``train`` messages of the round engine
(:class:`~flwr_fsl.core.engine.PhasedStrategy`), each carrying a :data:`SESA_KEY`
record; the mod answers all but the third itself:

1. ``advertise``: the round's parameters (``T``, the groups) and the layer structure; each
   sampled client picks its shards and replies an X25519 public key;
2. ``offline``: the roster goes out; each client's sealed selector and mask evaluations for
   every other client come back and wait in the server's mailbox;
3. ``train``: the whole global model, the config and ``U2``; each client trains its narrow
   model and replies only its masked shard vectors;
4. ``decode``: each survivor gets ``U3``, every masked update and the evaluations addressed
   to it, and replies ``ψ(α_i)``; the server decodes the per-shard sums from any
   ``K_max + T`` of them and applies ``w += Σ c·Δ / Σ c`` shard by shard
   (:meth:`~flwr_fsl.families.sesa.layout.SesaLayout.apply`, the platform's count-weighted
   apply).

**Threat model and leakage.** One honest-but-curious server (this ServerApp) that may collude
with up to ``T`` clients (``privacy``: a count, or a fraction of the sampled clients — the
paper's ``T = N/2`` is ``privacy=0.5``); honest-but-curious clients. At the defaults
(``weighted=False``, ``fraction_evaluate=0.0``) the server learns, per shard, the sum of
``Δ`` over the survivors that chose it and how many they are — so a shard exactly one
survivor chose reveals that client's update of it (unattributed), and within one round the
counts shift the odds of who chose which (measured in
``tests/attacks/test_sesa_shard_least_squares.py``: no round's assignment decoded, nothing
accumulated over rounds, since each round's choice is fresh) — plus who finished which phase
and each client's number of shards (message sizes; public by design). It learns nothing else
about a client's choice or values (tests in ``tests/families/sesa/test_protocol.py``). Each
client downloads the whole model (fetching only its shards would reveal them) and every other
client's masked update. ``weighted=True`` and ``plaintext_evaluation=True`` leak more (their
parameters; ``docs/families/sesa.md``). Not covered: a deviating server or malicious clients
(see the protocol module).

**Failures.** A client that errs, times out or sends a malformed message is dropped at that
phase with a logged reason, and only the engine's survivors (:attr:`RoundState.survivors`) go
on to the next phase: a node dropped at any phase (a duplicated reply included) is never sent
``train`` and never aggregated. Lost before ``train`` replies: left out of the aggregate; lost
after: aggregated (the others hold its evaluations). A client whose sealed evaluations do not
open for a recipient (corrupted, or replayed from another round) is excluded on that
recipient's complaint, consistently for everyone; a masked update bound to another round is
refused; one evaluation off the polynomial is attributed when ``K_max + T + 2`` arrived
(:mod:`~flwr_fsl.families.sesa.attribution`). Fewer than ``K_max + T`` clients left at any
phase, unattributable inconsistent evaluations, or decoded sums outside their bounds (a count
word beyond the survivors, a coordinate beyond ``clipping_range`` × its count) fail the round
with the model unchanged.

**Fixed point.** Each coordinate travels as ``c·Δ`` with ``c = num-examples / max_weight``
(``weighted=True``; 1 otherwise) and ``Δ`` clipped to ``clipping_range``, at ``frac_bits``
fractional bits in ``F_p`` (``p = 2^32 - 5``): the sum of ``max_clients`` such values must
stay below ``(p - 1)/2``, which the constructor checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from flwr_fsl.core.checks import check_bool, check_int, check_real, check_threshold
from flwr_fsl.core.engine import MultiPhaseStrategy, RoundState
from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.exchange import Accept, encode_once
from flwr_fsl.core.phases import Phase
from flwr_fsl.core.privacy import refuse_plaintext_evaluation
from flwr_fsl.families.sesa.layout import SesaLayout
from flwr_fsl.families.sesa.messages import MAX_CLIENTS, MAX_SHARDS, SesaParams
from flwr_fsl.families.sesa.records import (
    ADVERTISE,
    DECODE,
    OFFLINE,
    SESA_KEY,
    TRAIN,
    AdvertiseRequest,
    DecodeRequest,
    MaskedUpdateRequest,
    OfflineRequest,
)
from flwr_fsl.families.sesa.server import SesaRoundServer, TrainAsk
from flwr_fsl.families.sesa.settings import SesaSettings

__all__ = ["SESA_KEY", "SesaFedAvg"]


class SesaFedAvg(MultiPhaseStrategy):
    """SESA secure submodel aggregation for width-scalable models (module docstring).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key, \
evaluate_metrics_aggr_fn, sampling_seed
        As in :class:`flwr.serverapp.strategy.FedAvg` (train metrics are not sent).
    num_shards : int
        ``S = 1 / B_min``: shards per hidden layer (every hidden width a multiple of it).
        Default 4 (capacities 1, 1/2, 1/4).
    privacy : int or float
        ``T``, the colluding clients tolerated: an int ``>= 1``, or a fraction in ``(0, 1)``
        of the sampled clients (rounded down, at least 1). Default 0.5 (the paper's N/2).
    weighted : bool
        False (default): every contributing client counts 1 — an unweighted mean over each
        shard's clients (FedRolex's); a shard's count word is then how many survivors chose
        it. True: weight each client by ``weighted_by_key`` (``num-examples``, or a metric
        the client's node config allows in ``fsl-weight-keys``) over ``max_weight`` — a
        documented leak: over rounds with changing survivors the server recovers every
        client's weight from the totals and decodes each shard's count word as a subset sum
        of known weights, i.e. who chose which shard
        (``tests/attacks/test_sesa_weights_subset_sum.py``).
    max_weight : float
        Largest ``weighted_by_key`` a client may report. Default 1000.
    clipping_range : float
        Largest ``|Δ|`` per coordinate a client contributes (larger ones are clipped).
        Default 8.
    frac_bits : int
        Fixed-point fractional bits. Default 16.
    max_clients : int
        Most clients per round (sizes the overflow bound). Default 1000.
    plaintext_evaluation : bool
        Allow federated evaluation (``fraction_evaluate > 0``), whose replies carry every
        evaluated client's metrics and ``num-examples`` in the clear. Default False:
        ``fraction_evaluate`` defaults to 0.0 and a value above it is refused; evaluate on
        the server instead (``strategy.start(..., evaluate_fn=...)``).
    relay_mib : float
        Most MiB of relayed SESA messages in flight at once (default 512). The offline
        uploads, the ``train`` mailboxes and the evaluation requests are ``O(N K d)`` words
        per client; a phase whose clients would exceed this goes out in batches that fit
        (:meth:`relay_batch`), so the server holds one batch of them beside its mailbox, not
        ``O(N² K d)`` more. At this default, rounds of up to 20 clients of MLP 784-200-10 at
        ``S = 4`` go at once and 100 go in batches of 4; on a real deployment the batches of
        the ``offline`` and ``train`` phases compute one after another, so raise it where
        the server's memory allows.

    Raises
    ------
    ConfigurationError
        If a setting is invalid, the fixed point could overflow ``F_p``, or
        ``fraction_evaluate > 0`` without ``plaintext_evaluation=True``.
    """

    PHASES = ("advertise", "offline", "train", "decode")

    def __init__(  # noqa: PLR0913
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 0.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        *,
        num_shards: int = 4,
        privacy: int | float = 0.5,
        weighted: bool = False,
        max_weight: float = 1000.0,
        clipping_range: float = 8.0,
        frac_bits: int = 16,
        max_clients: int = 1000,
        sampling_seed: int | None = None,
        plaintext_evaluation: bool = False,
        relay_mib: float = 512.0,
    ) -> None:
        if not isinstance(plaintext_evaluation, bool):
            raise ConfigurationError("plaintext_evaluation must be a bool")
        refuse_plaintext_evaluation("SesaFedAvg", fraction_evaluate, plaintext_evaluation)
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
            sampling_seed=sampling_seed,
            max_weight=max_weight,
        )
        check_int("num_shards", num_shards, 1, MAX_SHARDS)
        t = check_threshold("privacy", privacy, min_count=1, high_open=True)
        if isinstance(t, int) and t > MAX_SHARDS:
            raise ConfigurationError(f"privacy (T) must be at most {MAX_SHARDS}, got {t}")
        check_bool("weighted", weighted)
        check_real("relay_mib", relay_mib, 0.0, low_open=True)
        self.relay_mib = float(relay_mib)
        check_real("clipping_range", clipping_range, 0.0, low_open=True)
        check_int("max_clients", max_clients, 2, MAX_CLIENTS)
        check_int("frac_bits", frac_bits, 0)
        if isinstance(t, int) and num_shards + t > max_clients:
            raise ConfigurationError(
                f"privacy (T) = {t} with num_shards = {num_shards} needs at least K_max + T = "
                f"{num_shards + t} clients per round, more than max_clients = {max_clients}"
            )
        # Validated once, here, before round 1; each round sends it with its layer structure.
        self.settings = SesaSettings(
            num_shards, weighted, weighted_by_key, float(max_weight), float(clipping_range),
            frac_bits, max_clients, configrecord_key,
        )  # fmt: skip
        self.server = SesaRoundServer(self.settings)
        self.num_shards = num_shards
        self.privacy = t
        self.weighted = weighted
        self.clipping_range = self.settings.clip
        self.frac_bits = frac_bits
        self.max_clients = max_clients
        self.codec = self.settings.codec()
        self.session = self.server.session
        self._layout: SesaLayout | None = None
        self._layout_key: tuple[object, ...] = ()

    def round_minimum(self, sampled: int) -> tuple[int, str]:
        """Return ``K_max + T`` for ``sampled`` clients, checked before round 1.

        Before :meth:`start` has seen the model, ``K_max`` is taken as ``num_shards`` (every
        model with a hidden layer has a group of ``S`` shards; a pair group has ``S²``), a
        lower bound that :meth:`start` tightens.
        """
        k_max = self.num_shards
        if self._layout is not None:
            k_max = max(g.shards for g in self._layout.sesa_groups())
        return k_max + self.privacy_for(sampled), "privacy (T) with num_shards (K_max + T)"

    def relay_batch(self, state: RoundState) -> int:
        """Return how many clients one batch of a relay phase may address (``relay_mib``).

        A client's offline upload, mailbox and evaluation request are each at most
        ``2 · N · Σ_g K_g (d_g + 1)`` words of 4 bytes (its sealed evaluations for, or from,
        every other client, and every masked update); a batch holds as many clients as fit in
        ``relay_mib``, at least one.
        """
        params = state.protocol
        if not isinstance(params, SesaParams):
            return max(1, len(state.survivors))
        words = sum(g.shards * (g.length + 1) for g in params.groups)
        per_client = 8 * max(1, len(state.survivors)) * words + 4096
        return max(1, int(self.relay_mib * (1 << 20)) // per_client)

    def privacy_for(self, sampled: int) -> int:
        """Return ``T`` for a round that sampled ``sampled`` clients."""
        t = self.privacy
        if isinstance(t, float):
            return max(1, math.floor(t * sampled))
        return t

    def layout_of(self, model: dict[str, np.ndarray]) -> SesaLayout:
        """Return the model's shard groups (cached while the model's shapes stay the same).

        Raises
        ------
        ConfigurationError
            If the model does not split into ``num_shards`` shards per hidden layer.
        """
        key = tuple((k, tuple(np.shape(v)), np.asarray(v).dtype.str) for k, v in model.items())
        if self._layout is None or key != self._layout_key:
            self._layout = SesaLayout.of(model, self.num_shards)
            self._layout_key = key
        return self._layout

    def start(self, grid: Grid, initial_arrays: ArrayRecord, *args: Any, **kwargs: Any) -> Any:
        """Check the model's shard structure, then run Flower's ``start`` (same signature).

        Raises
        ------
        ConfigurationError
            If the initial model does not split into shards (before round 1).
        """
        self.layout_of({k: a.numpy() for k, a in initial_arrays.items()})
        return super().start(grid, initial_arrays, *args, **kwargs)

    def train_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run one SESA round (module docstring); None arrays when it failed."""
        model = {k: a.numpy() for k, a in arrays.items()}
        state.model = model
        layout = self.layout_of(model)
        nodes = self.sample(state, grid)
        if not nodes:
            return None, None
        t = self.privacy_for(len(nodes))
        params = self.server.params(layout, len(nodes), state.server_round, t)
        state.protocol = params
        train_config = ConfigRecord({**dict(config), "server-round": state.server_round})
        exchange = _FlowerExchange(self, grid, state, arrays, train_config)
        totals, server = self.server.aggregate(
            exchange, model, nodes, params, layout, drop=state.drop
        )
        new = self.server.apply(model, layout, totals, self.codec)
        survivors = server.survivors
        log(
            INFO,
            "aggregate_train: SESA over %d of %d sampled clients (T = %d, %d evaluations)",
            len(survivors),
            len(nodes),
            t,
            len(server.evaluators),
        )
        metrics = MetricRecord(
            {
                "sesa-clients": len(survivors),
                "sesa-evaluations": len(server.evaluators),
                "sesa-T": t,
            }
        )
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in new.items()}), metrics


@dataclass
class _FlowerExchange:
    """The server's :data:`~flwr_fsl.families.sesa.server.Exchange` over typed phases."""

    strategy: SesaFedAvg
    grid: Grid
    state: RoundState
    arrays: ArrayRecord
    config: ConfigRecord

    def __call__(self, label: str, asks: Mapping[int, Any], accept: Accept) -> dict[int, Any]:
        phase, field, make = self._route(label)
        alive = set(self.state.survivors)  # the engine's survivors: one set per round
        nodes = [n for n in asks if n in alive]
        size = len(nodes) if label == "advertise" else self.strategy.relay_batch(self.state)
        replies: dict[int, Any] = {}
        accepted: set[int] = set()

        def take(node: int, reply: Any) -> None:
            accept(node, getattr(reply, field))

        # Batches of at most relay_mib of relayed bytes (one batch at small N): the asks of a
        # batch are built, encoded, sent and let go before the next batch's are built.
        for start in range(0, len(nodes), max(1, size)):
            batch = {n: asks[n] for n in nodes[start : start + size]}
            requests = encode_once(batch, make)
            del batch
            if phase is TRAIN:  # replies stream in as they arrive, as Flower's train round
                got = dict(
                    self.strategy.stream_phase(self.grid, self.state, phase, requests, accept=take)
                )
            else:
                got = self.strategy.send_phase(self.grid, self.state, phase, requests, accept=take)
            del requests
            accepted.update(self.state.survivors)  # the engine's survivors of this batch
            replies.update({n: getattr(r, field) for n, r in got.items()})
        # Each batch left the engine's survivors at its own accepted nodes: the phase's are all.
        self.state.survivors = [n for n in nodes if n in accepted and n not in self.state.dropped]
        alive = set(self.state.survivors)  # a node the engine dropped after accept: not kept
        return {n: r for n, r in replies.items() if n in alive}

    def _route(self, label: str) -> tuple[Phase[Any, Any], str, Callable[[Any], Any]]:
        """Return the phase of an ask's label, its reply's field and the ask -> request map."""
        if label == "advertise":
            return ADVERTISE, "advertise", lambda a: AdvertiseRequest(a.params, a.settings)
        if label == "offline":
            return OFFLINE, "bundle", lambda a: OfflineRequest(a.params, a.roster)
        if label == "decode":
            return DECODE, "evaluation", lambda a: DecodeRequest(a.params, a.request)
        return TRAIN, "masked", self._train

    def _train(self, ask: TrainAsk) -> MaskedUpdateRequest:
        beside = RecordDict(
            {
                self.strategy.arrayrecord_key: self.arrays,
                self.strategy.configrecord_key: self.config,
            }
        )
        return MaskedUpdateRequest(ask.params, ask.sharers, ask.settings, beside, ask.mailbox)
