"""``SFSLFedSubAvg``: Niu et al.'s secure federated submodel learning (Alg. 1-3).

The model has one row table (an embedding, ``table``) whose rows clients touch privately, and
any number of dense tensors — or several tables, some derived from others by a public row map
(``table=ModelTables(...)``, Niu §VI's goods and categories): they are packed into one virtual
table and the derived sets follow from the perturbed ones
(:mod:`flwr_fsl.families.sfsl.tables`). A round, on the round engine, with
:class:`~flwr_fsl.families.sfsl.mod.PerturbedRows` on the clients:

The round's orchestration is :class:`~flwr_fsl.families.sfsl.server.SFSLServer` (no Flower);
this strategy is its transport: each of the server's asks goes out as a typed phase of
:mod:`flwr_fsl.families.sfsl.records` through
:meth:`~flwr_fsl.core.engine.PhasedStrategy.send_phase` (bad replies drop their node).

1. **Private set union** (Alg. 3, ``union-*`` phases): a Bonawitz SecAgg round
   (:class:`~flwr_fsl.families.secagg.strategy.SecAggPhases`) sums the clients' randomized Bloom
   filters (:mod:`flwr_fsl.families.sfsl.psu`; exact mode by default); the server opens the union
   ``U`` of their real row sets.
2. **Perturbation** (Alg. 2, ``perturb``): each client answers with ``S''_i`` from permanent
   (memoized) and instantaneous randomized response over ``U``. The message carries the
   round's train config (under ``configrecord_key``, with ``server-round``, as the train
   message does), so a client can choose its ``p1..p4`` per training and scope its memo by a
   session entry (``PerturbedRows(rr=..., session_key=...)``).
3. **Count-weighted secure aggregation** (Alg. 1, ``rows-*`` phases): a subset SecAgg round in
   which client ``i`` receives the rows ``S''_i`` (and the dense tensors), trains, and
   contributes ``(v_ij Δ_ij, v_ij)`` for its rows (zero where ``j`` is not a real row) and
   ``(w_i Δ_i, w_i)`` for the dense part (``w_i`` = ``num-examples``); each table row moves by
   ``Σ v Δ / Σ v`` over its participants, the dense tensors by the weighted mean.

**Defaults (issue 20).** ``dp=SFSLDP()``: every client adds discrete Gaussian noise inside its
masked vectors — the union becomes noisy per-row holder counts, the rows round's value and count
words carry noise — and the server moves only rows whose noisy count is large
(:mod:`flwr_fsl.families.sfsl.dp`, ``z = 1``); the run's ``(ε, δ)`` is accounted and logged
every round, and the run stops before a round that would exceed ``privacy_budget`` (default
``ε = 20`` at ``δ = 1e-5``: 10 rounds at ``z = 1``). ``weighted=False``: every contributing
client counts 1 (per-row counts and the dense weight). ``fraction_evaluate=0.0``: federated
evaluation would hand the server each client's metrics and ``num-examples`` in the clear, so a
value > 0 needs ``plaintext_evaluation=True`` (else evaluate on the server with
``evaluate_fn``). **Niu's protocol as the paper specifies it** is ``dp=None, weighted=True``
(clients accept it only with a noise floor of 0 in their node config).

**Threat model and leakage.** One honest-but-curious server colluding with fewer than ``t``
clients; semi-honest clients; everything relayed and sealed. At the defaults the server learns
every ``S''_i`` (ε-LDP per client: ``ε1`` per round, ``ε∞`` over the memo's lifetime — the
client's, :mod:`flwr_fsl.families.sfsl.mod`), who took part, and ``(ε, δ)``-DP releases: the
noisy union and per row the noisy sums over its participants. With ``dp=None`` (the paper) it
learns the exact union ``U`` (and, in Bloom mode, its false positives) and per row the exact
aggregate over its participants: over rounds with changing participants a least-squares solve
per row gives every client's counts, the zero pattern of the value sums and the unions decode
every client's real rows, whatever the randomized response (``tests/attacks/test_sfsl_*``), and
a row with a single participant is that client's row in the clear (Theorem 2, Event 1).
Clients learn ``U`` and, for their own rows, which other clients answered "yes". With
``p1 = p2 = p3 = p4 = 1`` (:meth:`~flwr_fsl.families.sfsl.perturb.RRParams` all ones) every
client uploads all of ``U`` (Theorem 3) — which, without DP, still releases the per-row sums.

**Faulty clients.** A bad or replayed reply drops its client at that phase (SecAgg's replay
guard, :mod:`flwr_fsl.families.secagg.replay`); a decoded rows sum (or DP union) outside its
plausibility bounds (:mod:`flwr_fsl.families.sfsl.bounds`) fails the round with the model
unchanged, naming every survivor; a client deviating within the bounds is not detected.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from flwr_fsl.core.checks import check_int, check_optional_int, check_real, check_threshold
from flwr_fsl.core.engine import MultiPhaseStrategy, RoundState
from flwr_fsl.core.errors import ConfigurationError, RoundFailedError
from flwr_fsl.core.exchange import Accept, encode_once
from flwr_fsl.core.phases import Phase
from flwr_fsl.core.privacy import PrivacyAccount, PrivacyBudget, refuse_plaintext_evaluation
from flwr_fsl.families.secagg.graph import check_neighbours, round_threshold
from flwr_fsl.families.secagg.records import (
    ADVERTISE,
    SHARE,
    UNMASK,
    AdvertiseRequest,
    ShareRequest,
    UnmaskSharesRequest,
)
from flwr_fsl.families.sfsl.dp import DEFAULT_BUDGET, SFSLDP
from flwr_fsl.families.sfsl.messages import UNION_INSTANCE, RowsAsk, SFSLSettings, UnionAsk
from flwr_fsl.families.sfsl.psu import MAX_FILTER
from flwr_fsl.families.sfsl.records import (
    PERTURB,
    ROWS_TRAIN,
    UNION_TRAIN,
    PerturbRequest,
    RowsInputRequest,
    UnionInputRequest,
)
from flwr_fsl.families.sfsl.server import SFSLServer, psu_params
from flwr_fsl.families.sfsl.tables import TablePacking
from flwr_fsl.submodel.tables import ModelTables

__all__ = ["SFSLFedSubAvg"]


def _check_psu_knobs(bloom_fpr: float | None, expected_union: int, partitions: int) -> None:
    """Check the PSU knobs by name, before round 1 (:func:`psu_params` uses them per round).

    Raises
    ------
    ConfigurationError
        If ``bloom_fpr`` is not None or a number in (0, 1), ``expected_union`` or
        ``partitions`` is not an int in ``[1, MAX_FILTER]``, or the Bloom filter they size
        would exceed ``MAX_FILTER`` words.
    """
    if bloom_fpr is not None:
        check_real("bloom_fpr", bloom_fpr, 0.0, 1.0, low_open=True, high_open=True)
    union = check_int("expected_union", expected_union, 1, MAX_FILTER)
    check_int("partitions", partitions, 1, MAX_FILTER)
    if bloom_fpr is not None:
        length = math.ceil(-union * math.log(bloom_fpr) / math.log(2) ** 2)
        if length > MAX_FILTER:
            raise ConfigurationError(
                f"expected_union={union} at bloom_fpr={bloom_fpr:g} needs a Bloom filter of "
                f"{length} words, more than {MAX_FILTER}"
            )


class SFSLFedSubAvg(MultiPhaseStrategy):
    """Niu et al.'s secure federated submodel learning (module docstring).

    Parameters
    ----------
    table : str or ModelTables
        The row table's name in the model, or several tables
        (:class:`~flwr_fsl.submodel.tables.ModelTables`, derived tables included): the round
        then runs on the packed model (:mod:`flwr_fsl.families.sfsl.tables`); the clients'
        mods take the same spec.
    fraction_train, min_train_nodes, min_evaluate_nodes, min_available_nodes, \
weighted_by_key, arrayrecord_key, configrecord_key, sampling_seed
        As in :class:`flwr.serverapp.strategy.FedAvg` (``weighted_by_key`` is used only with
        ``weighted=True``).
    fraction_evaluate : float
        Default 0.0; a value > 0 needs ``plaintext_evaluation=True``.
    weighted : bool
        False (default): every contributing client counts 1; True: per-row counts from the
        clients' data and the dense weight from ``weighted_by_key`` (Niu's count weighting;
        a client uses only ``num-examples`` or a key its node config allows).
    dp : SFSLDP or None
        Distributed DP (default ``SFSLDP()``: ``z = 1``, ``C = W = 1``, ``k = 32``); None runs
        the paper's noiseless protocol, whose aggregates leak the clients' rows over rounds.
    privacy_budget : PrivacyBudget or None
        The run's ``(ε, δ)`` ceiling (default ``ε = 20``, ``δ = 1e-5``): the run stops before a
        round that would exceed it. None accounts and logs without stopping. Ignored without DP.
    plaintext_evaluation : bool
        Accept federated evaluation (its replies carry metrics and ``num-examples`` in the
        clear). Default False.
    reconstruction_threshold : int or float
        ``t`` of both SecAgg rounds (count, or fraction of the sampled clients). Default 0.6.
    bloom_fpr : float or None
        None (default): exact PSU (identity map, FPR 0). Else the target FPR of Eq. (1).
    expected_union : int
        The union size the Bloom filter is sized for (Bloom mode).
    partitions : int
        PSU partitions of the row domain (Bloom mode).
    clip : float
        Largest ``|Δ|`` per coordinate. Default 8.
    max_count : float
        Largest per-row count and client weight. Default 1e4.
    frac_bits : int
        Fixed-point fractional bits. Default 24.
    max_clients : int
        Most clients per round. Default 1000.
    quantization_levels : int, optional
        γ of Niu's App. B stochastic quantization of the row updates over
        ``[-clip, clip]`` (the paper used 2^15); None (default) sends them in fixed point.
        Needs ``dp=None``, as does ``bloom_fpr``.
    neighbours : int, optional
        SecAgg+'s ``k`` for the full-vector union round (as ``SecAggFedAvg``'s
        ``neighbours``, :mod:`flwr_fsl.families.secagg.graph`): an even int ``>= 2``, and
        ``t`` then counts over the neighbourhood. The rows round keeps the complete graph: a
        row's few holders need not be neighbours, and a lone holder would be unmasked.
        Default ``None``: the complete graph in both rounds.

    Raises
    ------
    ConfigurationError
        If a setting is invalid (checked here, before round 1: one
        :class:`~flwr_fsl.families.sfsl.messages.SFSLSettings`).
    """

    PHASES = ("union", "perturb", "rows")

    def __init__(  # noqa: PLR0913
        self,
        table: str | ModelTables,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 0.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        *,
        reconstruction_threshold: int | float = 0.6,
        bloom_fpr: float | None = None,
        expected_union: int = 10_000,
        partitions: int = 64,
        clip: float = 8.0,
        max_count: float = 1e4,
        frac_bits: int = 24,
        max_clients: int = 1000,
        quantization_levels: int | None = None,
        sampling_seed: int | None = None,
        weighted: bool = False,
        dp: SFSLDP | None = SFSLDP(),  # noqa: B008 (frozen: one shared default is safe)
        privacy_budget: PrivacyBudget | None = DEFAULT_BUDGET,
        plaintext_evaluation: bool = False,
        neighbours: int | None = None,
    ) -> None:
        refuse_plaintext_evaluation("SFSLFedSubAvg", fraction_evaluate, plaintext_evaluation)
        check_real("max_count", max_count, 0.0, 1e300, low_open=True)  # the engine's max_weight
        if not isinstance(weighted, bool):
            raise ConfigurationError("weighted must be a bool")
        if dp is not None and not isinstance(dp, SFSLDP):
            raise ConfigurationError("dp must be SFSLDP or None")
        if privacy_budget is not None and not isinstance(privacy_budget, PrivacyBudget):
            raise ConfigurationError("privacy_budget must be PrivacyBudget or None")
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            sampling_seed=sampling_seed,
            max_weight=max_count,
        )
        t = check_threshold("reconstruction_threshold", reconstruction_threshold, min_count=2)
        _check_psu_knobs(bloom_fpr, expected_union, partitions)
        check_optional_int("quantization_levels", quantization_levels, 2)
        # Validated once, here, before round 1; each round sends it with its PSU parameters.
        if not isinstance(table, str | ModelTables):
            raise ConfigurationError("table must be a table name or ModelTables")
        self.tables = table if isinstance(table, ModelTables) else None
        name = table.names[0] if isinstance(table, ModelTables) else table  # until start()
        self.settings = SFSLSettings(
            name, weighted_by_key, clip, max_count, frac_bits, max_clients,
            0 if quantization_levels is None else quantization_levels, None, weighted, dp,
        )  # fmt: skip
        if dp is not None and bloom_fpr is not None:
            raise ConfigurationError(
                "bloom_fpr needs dp=None: with DP the union is a noisy count per table row"
            )
        self.weighted = weighted
        self.dp = dp
        self.plaintext_evaluation = plaintext_evaluation
        # Every round is spent before it runs (the engine), whether a client took part or not.
        self.privacy_account = None if dp is None else PrivacyAccount(privacy_budget)
        self.server = SFSLServer(self.settings)
        self.table = name
        self.reconstruction_threshold = t
        self.neighbours = check_neighbours(neighbours, t if isinstance(t, int) else None)
        self.bloom_fpr = bloom_fpr
        self.expected_union = int(expected_union)
        self.partitions = int(partitions)
        self.clip = self.settings.clip
        self.max_clients = self.settings.max_clients
        self.codec = self.settings.codec()
        self.quantizer = self.settings.quantizer()
        self.session = self.server.session
        self.reports: dict[int, dict[str, float]] = {}

    def round_noise_multiplier(self) -> float | None:
        """Return the round's effective ``z`` (``1/sqrt(2ρ)``, both releases); None without DP."""
        if self.dp is None:
            return None
        return self.dp.round_noise_multiplier(self.settings.frac_bits, self.settings.max_clients)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, *args: Any, **kwargs: Any) -> Any:
        """Check that the model has the 2-D ``table``, then run ``start`` (same signature).

        With several tables the spec is checked against the initial model and the round's
        packing (:class:`~flwr_fsl.families.sfsl.tables.TablePacking`) is fixed here.

        Raises
        ------
        ConfigurationError
            If the initial model has no 2-D tensor named ``table`` or does not fit the
            tables (before round 1).
        """
        if self.tables is not None:
            model = {k: a.numpy() for k, a in initial_arrays.items()}
            packing = TablePacking.of(self.tables, model)
            self.settings = replace(self.settings, table=packing.name)
            self.server.settings, self.server.packing = self.settings, packing
            return super().start(grid, initial_arrays, *args, **kwargs)
        if self.table not in initial_arrays or len(initial_arrays[self.table].shape) != 2:
            raise ConfigurationError(f"table: the model has no 2-D tensor {self.table!r}")
        return super().start(grid, initial_arrays, *args, **kwargs)

    def round_minimum(self, sampled: int) -> tuple[int, str]:
        """Return ``t`` for ``sampled`` clients: the fewest a round needs (checked up front)."""
        return self._threshold(sampled), "reconstruction_threshold"

    def _threshold(self, sampled: int) -> int:
        return round_threshold(self.reconstruction_threshold, sampled, self.neighbours)[0]

    def train_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run PSU, perturbation and the count-weighted subset SecAgg round (the server's)."""
        model = {k: a.numpy() for k, a in arrays.items()}
        packing = self.server.packing
        if packing is None and (self.table not in model or model[self.table].ndim != 2):
            raise RoundFailedError(f"the model has no 2-D table {self.table!r}")
        state.model = model
        nodes = self.sample(state, grid)
        if not nodes:
            return None, None
        t = self._threshold(len(nodes))
        if not t <= len(nodes) <= self.max_clients:
            raise RoundFailedError(f"{len(nodes)} clients sampled for t = {t}")
        domain = packing.rows if packing is not None else int(model[self.table].shape[0])
        psu = psu_params(domain, self.bloom_fpr, self.expected_union, self.partitions)
        train_config = ConfigRecord({**dict(config), "server-round": state.server_round})
        exchange = _FlowerExchange(self, grid, state, train_config)
        k = round_threshold(self.reconstruction_threshold, len(nodes), self.neighbours)[1]
        result = self.server.run(exchange, model, nodes, state.server_round, t, psu, neighbours=k)
        log(
            INFO, "SFSL: union of %d rows (FPR %.2e)",
            result.union.size, result.report.false_positive_rate,
        )  # fmt: skip
        self.reports[state.server_round] = {
            "union": float(result.union.size),
            "fpr": result.report.false_positive_rate,
            "rows-updated": float(result.touched.size),
        }
        log(
            INFO, "SFSL: %d rows updated by %d clients (union %d)",
            result.touched.size, len(result.clients), result.union.size,
        )  # fmt: skip
        if self.privacy_account is not None:
            log(INFO, "SFSL: differential privacy so far: %s", self.privacy_account.describe())
        metrics = MetricRecord(
            {"sfsl-clients": len(result.clients), "union-size": int(result.union.size)}
        )
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in result.model.items()}), metrics


@dataclass
class _FlowerExchange:
    """The server's :data:`~flwr_fsl.families.sfsl.server.Exchange` over typed phases."""

    strategy: SFSLFedSubAvg
    grid: Grid
    state: RoundState
    config: ConfigRecord

    def __call__(self, label: str, asks: Mapping[int, Any], accept: Accept) -> dict[int, Any]:
        phase, field, make = self._route(label)
        requests = encode_once(asks, make)  # a shared ask is encoded once

        # A masked input goes to SecAgg's server as the reply itself: it is read at the size
        # the server expects for that client, never at the size the client claims.
        def value(reply: Any) -> Any:
            return reply if field is None else getattr(reply, field)

        replies = self.strategy.send_phase(
            self.grid, self.state, phase, requests, label=label,
            accept=lambda n, reply: accept(n, value(reply)),
        )  # fmt: skip
        return {n: value(r) for n, r in replies.items()}

    def drop(self, node: int, reason: str) -> None:
        """Drop a node the protocol found lying after its phase (e.g. wrong Unmask shares)."""
        self.state.drop(node, reason)

    def _route(self, label: str) -> tuple[Phase[Any, Any], str | None, Callable[[Any], Any]]:
        """Return the phase of a label, its reply's field (None: the reply) and the request map."""
        if label.endswith("-advertise"):
            return ADVERTISE, "advertise", lambda a: AdvertiseRequest(a.params, a.instance)
        if label.endswith("-share"):
            return SHARE, "shares", lambda a: ShareRequest(a.params, a.body, a.instance)
        if label.endswith("-unmask"):
            return UNMASK, "unmask", lambda a: UnmaskSharesRequest(a.params, a.body, a.instance)
        if label == "perturb":
            beside = RecordDict({self.strategy.configrecord_key: self.config})
            return PERTURB, "rows", lambda a: PerturbRequest(a.params, a.union, beside)
        if label == f"{UNION_INSTANCE}-train":
            return UNION_TRAIN, None, self._union
        return ROWS_TRAIN, None, self._rows

    @staticmethod
    def _union(ask: UnionAsk) -> UnionInputRequest:
        return UnionInputRequest(ask.params, ask.sharers, ask.settings)

    def _rows(self, ask: RowsAsk) -> RowsInputRequest:
        arrays = ArrayRecord({k: Array(np.asarray(v)) for k, v in ask.model.items()})
        beside = RecordDict(
            {self.strategy.arrayrecord_key: arrays, self.strategy.configrecord_key: self.config}
        )
        return RowsInputRequest(
            ask.params, ask.sharers, ask.rows, ask.shared, ask.union, ask.settings, beside
        )
