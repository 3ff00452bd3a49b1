"""``SecAggFedAvg``: Flower's ``FedAvg`` through Bonawitz et al.'s secure aggregation.

A drop-in for :class:`flwr.serverapp.strategy.FedAvg` (same knobs, same ``start``) for an
unchanged ``@app.train`` behind :func:`~flwr_fsl.mods.secagg_mod`. Each round is four phases
of the round engine (:class:`~flwr_fsl.core.engine.PhasedStrategy`), the protocol being
:mod:`flwr_fsl.families.secagg.protocol`:

Every phase is a ``train`` message (the mod answers the control phases itself, so the
ClientApp needs no extra registered function):

1. ``advertise``: the sampled clients send two public keys;
2. ``share``: the roster goes out, each client's shares for the
   others come back sealed to them and wait in the server's mailbox;
3. ``train``: the model and config (as ``FedAvg`` sends them) plus ``U2``; each client trains
   and replies only its masked vector (:class:`~flwr_fsl.families.secagg.vector.WeightedVector`:
   weighted update, weight, weighted train metrics), added to the running sum as it arrives
   (:meth:`~flwr_fsl.core.engine.PhasedStrategy.stream`);
4. ``unmask``: each survivor gets its mailbox and returns shares;
   the server removes the masks and applies ``w + sum c (w_i - w) / sum c``.

**Threat model and leakage.** One honest-but-curious server (this ServerApp) that may collude
with fewer than ``t`` clients; honest-but-curious clients; no client-to-client channel (shares
are sealed to their recipient and relayed). The server learns the sum over the clients that
finished (the new model, the weight word ``sum c``, the mean of each secure train metric), who
finished which phase, and sizes; no reply carries a client's update, weight or metrics in the
clear. ``t`` is ``reconstruction_threshold`` (a count, or a fraction of the sampled clients) —
at least ``t`` clients must finish the round, or it fails with the model unchanged.
``neighbours=k`` (SecAgg+, Bell et al.; Flower's ``num_shares = k + 1``) masks and shares
with ``k`` neighbours per client in a graph every client derives from the roster's hash
(:mod:`flwr_fsl.families.secagg.graph`, its threat model and bounds there); default ``None``:
the complete graph.

**Over many rounds.** A sum is one equation per round; the server chooses who takes part, so
anything a client contributes *unchanged* round after round is recovered by least squares
over the rounds. By default (``weighted=False``) every client's weight is 1 and the weight word
is the number of survivors, which the server knows: nothing to solve for. With
``weighted=True`` (Flower's sample weights) the totals give every client's ``num-examples``
exactly (``tests/attacks/test_secagg_weights.py``); a train metric that a client reports
unchanged across rounds is recovered the same way (``tests/attacks/test_secagg_metrics.py``).
``dp=SecAggDP(...)`` (:mod:`flwr_fsl.families.secagg.dp`) puts distributed discrete Gaussian
noise on every word and accounts it against ``privacy_budget``. Federated evaluation would
hand the server every evaluated client's metrics and ``num-examples`` in the clear: it is off
(``fraction_evaluate=0.0``) and refused unless ``plaintext_evaluation=True``; evaluate on the
server (``start(..., evaluate_fn=...)``). Not covered: a server that deviates from the protocol
(see :mod:`flwr_fsl.families.secagg.protocol`).

**Failures.** A client that errs, times out or sends a malformed message, or replays a reply
of an earlier round (:mod:`flwr_fsl.families.secagg.replay`), is dropped at that phase with a
logged reason; clients dropped after sharing are recovered in Unmask. Fewer than ``t`` clients
left at any phase, inconsistent shares, or a decoded sum outside its plausibility bounds
(:meth:`~flwr_fsl.families.secagg.vector.WeightedVector.check_bounds`: a masked input not made
for this round, which the server cannot attribute) fail the round (model unchanged).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.supercore import log
from numpy.typing import NDArray

from flwr_fsl.core.checks import (
    check_bool,
    check_instance,
    check_int,
    check_real,
    check_threshold,
)
from flwr_fsl.core.engine import MultiPhaseStrategy, PhasedStrategy, RoundState
from flwr_fsl.core.errors import ConfigurationError, RoundFailedError
from flwr_fsl.core.privacy import PrivacyAccount, PrivacyBudget, refuse_plaintext_evaluation
from flwr_fsl.families.secagg.dp import SecAggDP
from flwr_fsl.families.secagg.graph import check_neighbours, round_threshold
from flwr_fsl.families.secagg.messages import SecAggSettings
from flwr_fsl.families.secagg.protocol import SecAggParams, SecAggServer
from flwr_fsl.families.secagg.records import (
    ADVERTISE,
    MODEL_INSTANCE,
    SHARE,
    TRAIN,
    UNMASK,
    AdvertiseRequest,
    MaskedInputReply,
    MaskedInputRequest,
    ShareRequest,
    UnmaskSharesRequest,
)
from flwr_fsl.families.secagg.replay import ReplayGuard
from flwr_fsl.families.secagg.vector import unattributed

__all__ = ["SecAggDP", "SecAggFedAvg", "SecAggPhases"]


@dataclass
class SecAggPhases:
    """Bonawitz's phases on the round engine, for any vector: a component a strategy holds.

    Every phase is a typed :class:`~flwr_fsl.core.phases.Phase` of
    :mod:`flwr_fsl.families.secagg.records`, sent with
    :meth:`~flwr_fsl.core.engine.PhasedStrategy.send_phase`; its record names the
    ``instance`` (so one round can run several aggregations, e.g. Niu's union and rows). The
    client side is :func:`flwr_fsl.families.secagg.mod.secagg_control` (and the caller's own
    handler of the masked phase). Phase names in the round's traffic are the SecAgg phases,
    prefixed with the instance unless it is ``"model"``.

    Parameters
    ----------
    strategy : PhasedStrategy
        The strategy whose :meth:`~PhasedStrategy.send_phase` / :meth:`~PhasedStrategy.stream`
        run the phases (drops, timeouts, traffic).
    instance : str
        The aggregation's name within a round.
    guard : ReplayGuard, optional
        The strategy's memory of earlier rounds' replies (a replay drops its client).
    """

    strategy: PhasedStrategy
    instance: str = MODEL_INSTANCE
    guard: ReplayGuard | None = None

    def _phase(self, phase: str) -> str:
        return phase if self.instance == MODEL_INSTANCE else f"{self.instance}-{phase}"

    def record(self, params: SecAggParams, phase: str, **fields: Any) -> ConfigRecord:
        """Return the SecAgg record of one of the caller's own phases (e.g. SFSL's ``perturb``).

        Phase, instance, parameters, then ``fields``: the layout of every SecAgg record.
        """
        return ConfigRecord(
            {"phase": phase, "instance": self.instance, "params": params.to_bytes(), **fields}
        )

    def keys(
        self, grid: Grid, state: RoundState, nodes: Sequence[int], params: SecAggParams
    ) -> SecAggServer:
        """AdvertiseKeys and ShareKeys with ``nodes``; return the server holding ``U2``.

        Raises
        ------
        TooFewSurvivorsError
            If fewer than ``t`` clients are left after either phase (the round fails).
        """
        server = SecAggServer(params, self.guard)
        self.strategy.send_phase(
            grid, state, ADVERTISE, dict.fromkeys(nodes, AdvertiseRequest(params, self.instance)),
            label=self._phase("advertise"),
            accept=lambda n, reply: server.add_advertisement(n, reply.advertise),
        )  # fmt: skip
        roster = ShareRequest(params, server.roster(), self.instance)
        members = [n for n in nodes if n in state.survivors]
        self.strategy.send_phase(
            grid, state, SHARE, dict.fromkeys(members, roster), label=self._phase("share"),
            accept=lambda n, reply: server.add_shares(n, reply.shares),
        )  # fmt: skip
        server.sharers(among=state.survivors)  # one survivors set: the engine's
        return server

    def train(
        self, grid: Grid, state: RoundState, server: SecAggServer, request: MaskedInputRequest
    ) -> None:
        """Send the typed masked-input phase to ``U2``; add each reply to the sum as it arrives."""
        asked = dict.fromkeys((n for n in server.sharers() if n in state.survivors), request)
        stream = self.strategy.stream_phase(
            grid, state, TRAIN, asked, label=self._phase(TRAIN.name),
            # In the engine's parse: a vector of the wrong length (SecAggError) drops its node.
            accept=server.add_masked_input,
        )  # fmt: skip
        for _ in stream:
            pass
        server.check_survivors(state.survivors)

    def masked(
        self,
        grid: Grid,
        state: RoundState,
        server: SecAggServer,
        contents: Mapping[int, RecordDict],
        phase: str = "train",
    ) -> None:
        """Send the caller's own masked-input messages; add each reply to the sum as it arrives.

        For vectors other than :class:`WeightedVector` (SFSL's union and rows), whose train
        messages carry the caller's own fields; the reply is the typed masked input.
        """
        asked = {n: c for n, c in contents.items() if n in state.survivors}
        name = self._phase(phase)
        messages = self.strategy.prepare(state, name, asked, MessageType.TRAIN)

        def parse(node: int, content: RecordDict) -> MaskedInputReply:
            reply = TRAIN.parse_reply(content)
            server.add_masked_input(node, reply)  # read at its expected size; errors drop
            return reply

        for _ in self.strategy.stream(grid, state, name, messages, parse):
            pass
        server.check_survivors(state.survivors)

    def unmask(self, grid: Grid, state: RoundState, server: SecAggServer) -> NDArray[np.uint64]:
        """Unmask with the survivors and return the sum of their vectors.

        Raises
        ------
        RoundFailedError
            If too few survivors answer or the shares are inconsistent.
        """
        params = server.params
        requests = {
            n: UnmaskSharesRequest(params, server.unmask_request(n), self.instance)
            for n in server.survivors
        }
        self.strategy.send_phase(
            grid, state, UNMASK, requests, label=self._phase("unmask"),
            accept=lambda n, reply: server.add_unmask(n, reply.unmask),
        )  # fmt: skip
        total = server.result()
        for node, reason in server.excluded.items():  # its input stays in the sum
            state.drop(node, f"{self._phase('unmask')}: {reason}")
        return total


class SecAggFedAvg(MultiPhaseStrategy):
    """Flower ``FedAvg`` with Bonawitz secure aggregation of updates, weights and metrics.

    Differences from ``FedAvg`` (each reasoned in ``docs/dropin.md``, S1-S8; Flower's strategy
    tests run against it in ``tests/flower_upstream/`` with these as expected failures):
    ``configure_train`` / ``aggregate_train`` raise (a round is four phases), a subclass
    overriding either is refused at construction, and Flower's DP wrappers stop at round 1
    (S1); privacy defaults ``fraction_evaluate=0.0`` (S2), unit weights (S3) and no train
    metric (S4; named metrics are scalar means, ``train_metrics_aggr_fn`` is refused);
    Flower's DP accountant refuses it: use ``dp`` and ``privacy_budget`` (S5); the fixed
    point's limits drop a client or fail the round with a reason naming the limit, and
    ``summary()`` logs them (S6); the average is ``FedAvg``'s up to the fixed point (S7); a
    bad reply drops its client at that phase (S8).

    Parameters
    ----------
    fraction_train, min_train_nodes, min_evaluate_nodes, min_available_nodes, \
arrayrecord_key, configrecord_key, evaluate_metrics_aggr_fn, sampling_seed
        As in :class:`flwr.serverapp.strategy.FedAvg`, in FedAvg's positional order; every
        argument after ``evaluate_metrics_aggr_fn`` is keyword-only.
    train_metrics_aggr_fn : None
        FedAvg's 9th argument, kept so positions match; a value is refused
        (:class:`~flwr_fsl.core.errors.ConfigurationError`): train metrics are averaged
        inside the secure vector (the metrics of ``train_metrics``, weighted as the update,
        over the clients that report them), so no function of the clients' records can run.
    fraction_evaluate : float
        Default 0.0 (Flower's is 1.0): federated evaluation replies are Flower's, with each
        client's metrics and ``num-examples`` in the clear. A value > 0 is refused unless
        ``plaintext_evaluation=True``; evaluate on the server with ``evaluate_fn`` instead.
    weighted_by_key : str
        The metric a client weights by when ``weighted=True`` (default ``num-examples``; a
        client uses another key only if its node config lists it under ``fsl-weight-keys``).
    weighted : bool
        ``False`` (default): every survivor counts 1 (the plain mean of the updates; the
        weight word reveals only how many survived). ``True``: Flower's sample weights, whose
        totals over rounds give every client's ``num-examples`` to the server (documented leak,
        ``tests/attacks/test_secagg_weights.py``).
    plaintext_evaluation : bool
        Accept Flower's federated evaluation (``fraction_evaluate > 0``) and its leak.
    dp : SecAggDP, optional
        Distributed DP: each client clips and adds discrete Gaussian noise to its masked
        vector (:mod:`flwr_fsl.families.secagg.dp`). Off by default.
    privacy_budget : PrivacyBudget, optional
        With ``dp``: the run stops before a round that would exceed it; every run logs its
        ``(ε, δ)`` (without a budget too).
    reconstruction_threshold : int or float
        ``t``: shares needed to unmask, and the fewest clients that may finish a round. An int
        ``>= 2``, or a fraction in ``(0, 1]`` of the sampled clients (rounded up, at least 2).
        Default 0.6, Flower's SecAgg+ default.
    clipping_range : float
        Largest ``|w_i - w|`` per coordinate a client contributes (larger changes are
        clipped, as Flower's SecAgg+ clips). Default 8.
    max_weight : float
        Largest ``weighted_by_key`` a client may use (sizes the fixed point). Default 1e5.
    train_metrics : sequence of str
        Train metrics averaged securely (over the clients that report them, weighted as the
        update is); others never leave the client. Default ``()``: none. A metric a client
        reports nearly unchanged round after round is recovered by least squares over the
        rounds' means (``tests/attacks/test_secagg_metrics.py``), so naming one (e.g.
        ``("train_loss",)``) is a documented leak; ``num-examples`` is refused.
    max_metric : float
        Largest ``|metric|``. Default 1e3.
    frac_bits : int
        Fixed-point fractional bits. Default 24.
    max_clients : int
        Most clients per round (sizes the overflow bound). Default 1000.
    neighbours : int, optional
        SecAgg+'s ``k`` (Flower's ``num_shares = k + 1``): an even int ``>= 2``; each client
        masks with and Shamir-shares to ``k`` neighbours of a Harary graph whose ring order
        hashes the roster (:mod:`flwr_fsl.families.secagg.graph`), so client work and
        messages grow with ``k``, not with the clients. ``t`` then counts over the
        neighbourhood (an int ``<= k``, or a fraction of ``k + 1``), and a dropped client is
        recovered when ``t`` of its neighbours survive. Default ``None``: the complete graph
        (every pair masks; strongest against isolation, quadratic cost). For hundreds of
        clients use about ``2 log2 n``
        (:func:`~flwr_fsl.families.secagg.graph.suggested_neighbours`).

    Raises
    ------
    ConfigurationError
        If a setting is invalid or the fixed point could overflow (checked here, before round
        1, naming the setting).
    """

    PHASES = ("advertise", "share", "train", "unmask")

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
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        *,
        reconstruction_threshold: int | float = 0.6,
        clipping_range: float = 8.0,
        max_weight: float = 1e5,
        train_metrics: Sequence[str] = (),
        max_metric: float = 1e3,
        frac_bits: int = 24,
        max_clients: int = 1000,
        sampling_seed: int | None = None,
        weighted: bool = False,
        plaintext_evaluation: bool = False,
        dp: SecAggDP | None = None,
        privacy_budget: PrivacyBudget | None = None,
        neighbours: int | None = None,
    ) -> None:
        if train_metrics_aggr_fn is not None:
            raise ConfigurationError(
                "SecAggFedAvg: train_metrics_aggr_fn is not supported: the server never sees a "
                "client's train metrics, only the secure weighted mean of the metrics named in "
                "train_metrics=(...) (FedAvg's default aggregation); leave it None"
            )
        refuse_plaintext_evaluation("SecAggFedAvg", fraction_evaluate, plaintext_evaluation)
        if privacy_budget is not None and dp is None:
            raise ConfigurationError("SecAggFedAvg: privacy_budget needs dp=SecAggDP(...)")
        if privacy_budget is not None and not isinstance(privacy_budget, PrivacyBudget):
            raise ConfigurationError("SecAggFedAvg: privacy_budget must be a PrivacyBudget")
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
        t = check_threshold("reconstruction_threshold", reconstruction_threshold, min_count=2)
        check_real("clipping_range", clipping_range, 0.0, low_open=True)
        check_real("max_metric", max_metric, 0.0, low_open=True)
        check_int("frac_bits", frac_bits, 0)
        check_int("max_clients", max_clients, 2)
        check_bool("weighted", weighted)
        check_instance("dp", dp, SecAggDP)
        if isinstance(train_metrics, str | bytes) or not all(
            isinstance(m, str) for m in train_metrics
        ):
            raise ConfigurationError("train_metrics must be a sequence of metric names")
        try:
            self.neighbours = check_neighbours(neighbours, t if isinstance(t, int) else None)
        except ConfigurationError as err:
            raise ConfigurationError(f"SecAggFedAvg: {err}") from err
        self.reconstruction_threshold = t
        # Validated once, here, before round 1 (fixed-point overflow included); each round
        # sends it with the model's array names as the train request's settings record.
        try:
            self.settings = SecAggSettings(
                tuple(train_metrics), weighted_by_key, clipping_range, self.max_weight,
                max_metric, frac_bits, max_clients, weighted=weighted, dp=dp,
            )  # fmt: skip
        except ConfigurationError as err:
            raise ConfigurationError(f"SecAggFedAvg: {err}") from err
        self.clipping_range = self.settings.clip
        self.max_metric = self.settings.max_metric
        self.frac_bits = self.settings.frac_bits
        self.max_clients = self.settings.max_clients
        self.train_metrics = self.settings.metrics
        self.weighted = self.settings.weighted
        self.plaintext_evaluation = bool(plaintext_evaluation)
        self.dp = dp
        self._noise_multiplier: float | None = None
        if dp is not None:
            self.privacy_account = PrivacyAccount(privacy_budget)
            self._noise_multiplier = self.settings.noise_multiplier
            if self.train_metrics:
                log(
                    WARNING,
                    "SecAggFedAvg: with dp, each train metric word adds max_metric=%g to the "
                    "sensitivity (and so to the noise on the model); pass train_metrics=() or "
                    "a small max_metric",
                    self.max_metric,
                )
        self.session = os.urandom(16)
        self.replay_guard = ReplayGuard()

    def summary(self) -> None:
        """Log FedAvg's summary, then SecAgg's settings and the limits that drop a client."""
        super().summary()
        log(INFO, "\t└──> SecAgg:")
        log(
            INFO,
            "\t\t├── weights: %s; train metrics averaged securely: %s",
            f"{self.weighted_by_key!r} (at most max_weight={self.max_weight:g})"
            if self.weighted
            else "every survivor counts 1",
            list(self.train_metrics) or "none (train_metrics=())",
        )
        log(
            INFO,
            "\t\t├── a client is dropped whole if a named metric is not a number or exceeds "
            "|max_metric|=%g; each update coordinate is clipped to +-%g",
            self.max_metric,
            self.clipping_range,
        )
        log(
            INFO,
            "\t\t└── t = %s, at most %d clients, mask graph: %s",
            self.reconstruction_threshold,
            self.max_clients,
            "complete" if self.neighbours is None else f"{self.neighbours} neighbours (SecAgg+)",
        )

    def round_noise_multiplier(self) -> float | None:
        """Return the effective ``z`` of a round's release with ``dp`` (``None`` without it)."""
        return self._noise_multiplier

    def round_minimum(self, sampled: int) -> tuple[int, str]:
        """Return ``t`` for ``sampled`` clients: the fewest a round needs (checked up front)."""
        return self.threshold_for(sampled), "reconstruction_threshold"

    def threshold_for(self, sampled: int) -> int:
        """Return ``t`` for a round that sampled ``sampled`` clients."""
        return round_threshold(self.reconstruction_threshold, sampled, self.neighbours)[0]

    def train_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run one SecAgg round (module docstring); None arrays when it failed."""
        model = {k: a.numpy() for k, a in arrays.items()}
        state.model = model
        nodes = self.sample(state, grid)
        if not nodes:
            return None, None
        if len(nodes) > self.max_clients:
            raise RoundFailedError(
                f"{len(nodes)} clients sampled, max_clients is {self.max_clients}"
            )
        settings = replace(self.settings, names=tuple(model))
        layout = settings.layout({k: tuple(v.shape) for k, v in model.items()})
        t = self.threshold_for(len(nodes))
        if len(nodes) < t:
            raise RoundFailedError(f"{len(nodes)} clients sampled, fewer than t = {t}")
        k = round_threshold(self.reconstruction_threshold, len(nodes), self.neighbours)[1]
        params = SecAggParams(state.server_round, self.session, t, layout.length, k)
        state.protocol = params
        phases = SecAggPhases(self, guard=self.replay_guard)
        server = phases.keys(grid, state, nodes, params)
        # MaskedInput: the train message (model and config as FedAvg sends them), streamed
        # into the running sum.
        beside = RecordDict(
            {
                self.arrayrecord_key: arrays,
                self.configrecord_key: ConfigRecord(
                    {**dict(config), "server-round": state.server_round}
                ),
            }
        )
        phases.train(
            grid,
            state,
            server,
            MaskedInputRequest(params, server.sharers(), settings, beside=beside),
        )
        survivors = server.survivors
        total = phases.unmask(grid, state, server)
        try:
            new, metrics, _ = layout.decode(total, model, count=len(survivors), threshold=t)
        except RoundFailedError as err:
            raise RoundFailedError(f"{err}; {unattributed(survivors)}") from err
        log(
            INFO,
            "aggregate_train: SecAgg over %d of %d sampled clients (t = %d)",
            len(survivors),
            len(nodes),
            t,
        )
        out = MetricRecord({**metrics, "secagg-clients": len(survivors)})
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in new.items()}), out
