"""The SFSL round without Flower: :class:`SFSLServer` and the in-process driver :func:`run_round`.

One round of Niu et al.'s secure federated submodel learning is four steps of the server:

1. **PSU union** (Alg. 3): a Bonawitz SecAgg round (instance ``"union"``) sums the clients'
   randomized Bloom filters (:mod:`flwr_fsl.families.sfsl.psu`); the server opens the union
   ``U`` of their real row sets;
2. **perturb** (Alg. 2): each survivor answers ``S''`` over ``U`` by randomized response;
3. **count-weighted rows SecAgg** (Alg. 1): a subset SecAgg round (instance ``"rows"``) in
   which client ``i`` contributes ``(v Δ, v)`` at the rows of ``S''_i`` and ``(w Δ, w)`` for the
   dense tensors;
4. **apply**: each touched row moves by ``Σ v Δ / Σ v`` and the dense tensors by the weighted
   mean, both through the one count-weighted apply
   (:func:`flwr_fsl.submodel.aggregate.apply_count_weighted`).

With DP (``settings.dp``, the strategy's default; :mod:`flwr_fsl.families.sfsl.dp`) step 1
sums noisy per-row holder counts instead of the filter and keeps the rows above a threshold,
step 3 carries each client's noise on every word and is unmasked only when every row kept
enough of its participants (:func:`~flwr_fsl.families.sfsl.dp.short_rows`), and step 4
suppresses the rows whose noisy count is small before the apply.

The server never talks to a client itself: every message goes through an :data:`Exchange`,
``exchange(label, {node: ask}, accept) -> {node: reply}``, which delivers the asks of one
phase (:mod:`flwr_fsl.families.sfsl.messages`), calls ``accept(node, reply)`` on each reply
(a :class:`~flwr_fsl.core.errors.ClientInputError` it raises drops that node, as does a
client's own error or silence) and returns the accepted replies. The Flower strategy's exchange
is :meth:`~flwr_fsl.core.engine.PhasedStrategy.send_phase` over the typed phases of
:mod:`flwr_fsl.families.sfsl.records`; :func:`run_round` hands the asks to
:class:`SFSLParty` objects in this process. Labels: ``union-advertise``, ``union-share``,
``union-train``, ``union-unmask``, ``perturb``, ``rows-advertise``, ``rows-share``,
``rows-train``, ``rows-unmask``.

Threat model and leakage: :mod:`flwr_fsl.families.sfsl.strategy`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.core.exchange import Exchange, local_exchange
from flwr_fsl.core.privacy import check_noise_floor
from flwr_fsl.crypto.discrete_gaussian import per_client_sigma
from flwr_fsl.families.secagg.protocol import SecAggClient, SecAggParams, SecAggServer
from flwr_fsl.families.secagg.replay import ReplayGuard
from flwr_fsl.families.sfsl.bounds import check_rows_sum, check_union_counts
from flwr_fsl.families.sfsl.dp import (
    UNION_THRESHOLD_STDS,
    RowsRound,
    noisy_row_sums,
    rows_input,
    short_rows,
    union_from_counts,
    union_input,
)
from flwr_fsl.families.sfsl.messages import (
    ROWS_INSTANCE,
    UNION_INSTANCE,
    ControlAsk,
    PerturbAsk,
    RowsAsk,
    SFSLSettings,
    UnionAsk,
    expand_download,
    submodel_download,
)
from flwr_fsl.families.sfsl.perturb import PermanentMemo, RRParams, perturb_index_set
from flwr_fsl.families.sfsl.protocol import RowVector, check_perturbed
from flwr_fsl.families.sfsl.psu import (
    PSUParams,
    UnionReport,
    reconstruct_union,
    union_report,
)
from flwr_fsl.families.sfsl.tables import TablePacking
from flwr_fsl.submodel.aggregate import apply_count_weighted
from flwr_fsl.submodel.layout import FlatLayout, RowLayout

__all__ = [
    "Exchange",
    "SFSLParty",
    "SFSLResult",
    "SFSLServer",
    "psu_params",
    "run_round",
]

_UNION_FPR = 1.0 - NormalDist().cdf(UNION_THRESHOLD_STDS)
"""With DP: the chance that a row nobody holds passes the union's threshold."""


def psu_params(
    domain: int, bloom_fpr: float | None = None, expected_union: int = 10_000, partitions: int = 64
) -> PSUParams:
    """Return a round's PSU parameters: exact mode (``bloom_fpr`` None), else sized by Eq. (1)."""
    if bloom_fpr is None:
        return PSUParams.exact(domain)
    return PSUParams.for_target(domain, expected_union, bloom_fpr, partitions)


@dataclass(frozen=True)
class SFSLResult:
    """One round's outcome.

    Attributes
    ----------
    model : dict[str, numpy.ndarray]
        The new model (new arrays, model order, dtypes kept).
    union : numpy.ndarray
        ``U``.
    report : UnionReport
        The PSU's realized false-positive rate and false-negative bound.
    touched : numpy.ndarray
        The table rows that moved.
    clients : tuple[int, ...]
        The clients whose rows the aggregate holds (the rows round's survivors).
    perturbed : dict[int, numpy.ndarray]
        ``S''`` of every client that answered the perturb phase.
    released_sums, released_counts : numpy.ndarray, optional
        What the rows round released per union row (in ``union`` order): the value sums
        ``(|U|, d)`` and the counts ``(|U|,)``, before any post-processing (the server's view;
        noisy with DP).
    """

    model: dict[str, NDArray[np.generic]]
    union: NDArray[np.int64]
    report: UnionReport
    touched: NDArray[np.int64]
    clients: tuple[int, ...]
    perturbed: dict[int, NDArray[np.int64]] = field(default_factory=dict)
    released_sums: NDArray[np.float64] | None = None
    released_counts: NDArray[np.float64] | None = None


@dataclass(frozen=True)
class _Rows:
    """The rows round's outcome the apply needs."""

    total: NDArray[np.uint64]
    clients: tuple[int, ...]
    alive: NDArray[np.int64]
    t_rows: NDArray[np.int64]
    threshold: int


@dataclass
class SFSLServer:
    """The server side of one SFSL round (module docstring), over an :data:`Exchange`.

    Parameters
    ----------
    settings : SFSLSettings
        The validated settings (its ``psu`` is set per round by :meth:`run`).
    session : bytes
        Binds the rounds' SecAgg parameters to this run (fresh random by default).
    guard : ReplayGuard
        Digests of earlier rounds' SecAgg replies: a replayed one drops its client
        (:mod:`flwr_fsl.families.secagg.replay`).
    packing : TablePacking, optional
        Several tables (:mod:`flwr_fsl.families.sfsl.tables`): the round runs on the packed
        model (``settings.table`` is then :attr:`TablePacking.name`), the union and every
        ``S''`` are extended by the derived tables' public maps, and the result is unpacked.
    """

    settings: SFSLSettings
    session: bytes = field(default_factory=lambda: os.urandom(16))
    guard: ReplayGuard = field(default_factory=ReplayGuard, repr=False)
    packing: TablePacking | None = None

    def __post_init__(self) -> None:
        if self.packing is not None and self.settings.table != self.packing.name:
            raise ConfigurationError("settings.table must be the packing's virtual table name")

    # -- SecAgg sub-rounds ---------------------------------------------------------------
    def _keys(
        self, exchange: Exchange, instance: str, nodes: Sequence[int], params: SecAggParams
    ) -> tuple[SecAggServer, list[int]]:
        server = SecAggServer(params, self.guard)
        ask = ControlAsk(instance, params)
        answered = exchange(
            f"{instance}-advertise", dict.fromkeys(nodes, ask), server.add_advertisement
        )
        roster = ControlAsk(instance, params, server.roster())
        members = [n for n in nodes if n in answered]
        shared = exchange(f"{instance}-share", dict.fromkeys(members, roster), server.add_shares)
        server.sharers(among=shared)  # a node the exchange refused is not in U2
        return server, [n for n in members if n in shared]

    @staticmethod
    def _unmask(
        exchange: Exchange, instance: str, server: SecAggServer
    ) -> tuple[NDArray[np.uint64], list[int]]:
        params = server.params
        asks = {n: ControlAsk(instance, params, server.unmask_request(n)) for n in server.survivors}
        answered = exchange(f"{instance}-unmask", asks, server.add_unmask)
        total = server.result()
        drop = getattr(exchange, "drop", None)
        for node, reason in server.excluded.items():  # its input stays in this sum
            if callable(drop):
                drop(node, f"{instance}-unmask: {reason}")
        return total, [n for n in server.survivors if n in answered and n not in server.excluded]

    # -- the four steps ------------------------------------------------------------------
    def union(
        self, exchange: Exchange, nodes: Sequence[int], params: SecAggParams, settings: SFSLSettings
    ) -> tuple[NDArray[np.int64], UnionReport, list[int]]:
        """Step 1, PSU: return ``U``, its report and the clients that finished the step."""
        assert settings.psu is not None
        server, alive = self._keys(exchange, UNION_INSTANCE, nodes, params)
        ask = UnionAsk(params, server.sharers(), settings)
        accepted = exchange(
            f"{UNION_INSTANCE}-train",
            dict.fromkeys((n for n in server.sharers() if n in alive), ask),
            lambda n, words: server.add_masked_input(n, words),
        )
        server.check_survivors(accepted)
        survivors = len(server.survivors)
        members = server.survivors
        total, alive = self._unmask(exchange, UNION_INSTANCE, server)
        if settings.dp is not None:
            union, cut = union_from_counts(
                total, settings.dp, settings.frac_bits, params.threshold, survivors
            )
            counts = total.view(np.int64).astype(np.float64) / 2.0**settings.frac_bits
            check_union_counts(counts, cut / UNION_THRESHOLD_STDS, members)
            # Rows held by few clients are left out by design: no false-negative bound.
            report = UnionReport(int(union.size), int(union.size), _UNION_FPR, 1.0, total.size)
            return self._extend(union), report, alive
        union = reconstruct_union(settings.psu, total)
        report = union_report(settings.psu, total, union, survivors)
        return self._extend(union), report, alive

    def _extend(self, rows: NDArray[np.int64]) -> NDArray[np.int64]:
        """Several tables: the derived rows of ``rows``' primary rows replace its derived ones."""
        return rows if self.packing is None else self.packing.extend(rows)

    def perturb(
        self,
        exchange: Exchange,
        nodes: Sequence[int],
        params: SecAggParams,
        union: NDArray[np.int64],
    ) -> dict[int, NDArray[np.int64]]:
        """Step 2: every client's ``S''`` (a malformed one drops its client).

        With several tables a client answers its primary rows only (a subset of the union's
        primary rows) and the server derives the rest: ``S''`` is then
        :meth:`TablePacking.extend` of the answer, a function of the perturbed primary rows.
        """
        asked = union if self.packing is None else union[self.packing.primary_mask(union)]
        answers = exchange(
            "perturb",
            dict.fromkeys(nodes, PerturbAsk(params, union)),
            lambda n, rows: check_perturbed(rows, asked),
        )
        return {n: self._extend(np.asarray(rows, dtype=np.int64)) for n, rows in answers.items()}

    def rows(
        self,
        exchange: Exchange,
        model: Mapping[str, NDArray[np.generic]],
        perturbed: Mapping[int, NDArray[np.int64]],
        params: SecAggParams,
        layout: RowVector,
        settings: SFSLSettings,
    ) -> _Rows:
        """Step 3: the count-weighted subset SecAgg round; the sum and its clients.

        Raises
        ------
        RoundFailedError
            With DP, if a row kept fewer than its ``t_j`` participants (before unmasking).
        """
        table = settings.table
        server, alive = self._keys(exchange, ROWS_INSTANCE, list(perturbed), params)
        u2 = server.sharers()
        dense = np.arange(layout.length, params.vector_length, dtype=np.int64)
        shared = server.assign_rows(
            {u: np.concatenate([layout.positions(perturbed[u]), dense]) for u in u2}
        )
        asks = {}
        for u in (n for n in u2 if n in alive):
            arrays = submodel_download(model, table, perturbed[u])  # the rows of S'' only
            asks[u] = RowsAsk(params, u2, perturbed[u], shared[u], layout.union, settings, arrays)
        accepted = exchange(
            f"{ROWS_INSTANCE}-train", asks, lambda n, words: server.add_masked_input(n, words)
        )
        server.check_survivors(accepted)
        clients = server.survivors
        _, kept, t_rows = short_rows(perturbed, u2, clients, layout.union, params.threshold)
        short = (kept > 0) & (kept < t_rows)
        if settings.dp is not None and np.any(short):
            raise RoundFailedError(
                f"{int(short.sum())} row(s) kept fewer participants than their noise counts on "
                "(DP): not unmasked"
            )
        total, _ = self._unmask(exchange, ROWS_INSTANCE, server)
        return _Rows(total, clients, kept, t_rows, params.threshold)

    def apply(
        self,
        model: Mapping[str, NDArray[np.generic]],
        layout: RowVector,
        rows_round: _Rows,
        released: dict[str, NDArray[np.float64]] | None = None,
    ) -> tuple[dict[str, NDArray[np.generic]], NDArray[np.int64]]:
        """Step 4 (line 9): ``w += Σ c Δ / Σ c`` per touched row and for the dense tensors.

        With DP the rows (and the weight) whose noisy count is small are left unchanged
        (:func:`~flwr_fsl.families.sfsl.dp.noisy_row_sums`). ``released`` is filled with the
        per-row sums and counts the round released (``"sums"``, ``"counts"``).

        Raises
        ------
        RoundFailedError
            If the aggregated weight is not positive (without DP) or the result is not finite.
        """
        table = self.settings.table
        dense = [k for k in model if k != table]
        total = rows_round.total
        check_rows_sum(
            layout, layout.codec.decode(total), self.settings, rows_round.alive,
            rows_round.clients, self._noise(layout, rows_round, total.size - layout.length),
        )  # fmt: skip
        values = layout.codec.decode(total[layout.length :])
        weight = float(values[-1])
        dp = self.settings.dp
        released = released if released is not None else {}
        if dp is None:
            if not weight > 0:
                raise RoundFailedError("the aggregated weight is not positive")
            sums, counts = layout.sums(total[: layout.length])
            words = layout.codec.decode(total[: layout.length])
            words = words.reshape(layout.union.size, layout.width + 1)
            released["sums"], released["counts"] = words[:, : layout.width], words[:, -1]
        else:
            noisy = noisy_row_sums(
                layout, total, dp, rows_round.alive, rows_round.t_rows,
                len(rows_round.clients), rows_round.threshold, self.settings.weighted,
            )  # fmt: skip
            sums, counts, weight = noisy.sums, noisy.counts, noisy.dense_weight
            values = np.concatenate([noisy.dense_sum, [weight]])
            released["sums"], released["counts"] = noisy.released_sums, noisy.released_counts
        rows = RowLayout.of(model, table)
        full_sums = np.zeros((rows.size, rows.width))
        full_counts = np.zeros(rows.size)
        full_sums[layout.union] = sums
        full_counts[layout.union] = counts
        new = apply_count_weighted(model, rows, full_sums, full_counts)
        if not np.all(np.isfinite(new[table])):
            raise RoundFailedError("the aggregated table is not finite")
        shapes = tuple(tuple(np.shape(model[k])) for k in dense)
        offsets = tuple(int(x) for x in np.cumsum([0, *[math.prod(s) for s in shapes]]))
        flat = FlatLayout(tuple(dense), shapes, offsets)
        if weight > 0:  # with DP, a suppressed weight leaves the dense tensors unchanged
            new = apply_count_weighted(
                new, flat, values[:-1].reshape(-1, 1), np.full(flat.size, weight)
            )
        return new, layout.union[full_counts[layout.union] > 0]

    def _noise(
        self, layout: RowVector, rows_round: _Rows, dense_words: int
    ) -> tuple[NDArray[np.float64], float] | None:
        """With DP: the std of each row's summed noise and of the dense part's (real units)."""
        dp = self.settings.dp
        if dp is None:
            return None
        k = dp.rows_k(layout.union.size)
        scale = layout.codec.scale
        sigma = dp.rows_sigma(k, layout.codec.frac_bits, k * (layout.width + 1) + dense_words)
        rows = np.array(
            [
                per_client_sigma(sigma, max(int(t), 1)) * math.sqrt(int(a)) / scale
                for a, t in zip(rows_round.alive, rows_round.t_rows, strict=True)
            ]
        )
        each = per_client_sigma(sigma, max(rows_round.threshold, 1))
        return rows, each * math.sqrt(len(rows_round.clients)) / scale

    def run(
        self,
        exchange: Exchange,
        model: Mapping[str, NDArray[np.generic]],
        nodes: Sequence[int],
        server_round: int,
        threshold: int,
        psu: PSUParams,
        *,
        neighbours: int | None = None,
    ) -> SFSLResult:
        """One round: PSU union, perturb, count-weighted rows SecAgg, apply.

        ``neighbours`` (SecAgg+'s ``k``) makes the full-vector union round's mask graph
        sparse; the rows round is a subset round and keeps the complete graph.

        Raises
        ------
        RoundFailedError
            If the model has no 2-D table, too few clients are left at a step
            (:class:`~flwr_fsl.families.secagg.protocol.TooFewSurvivorsError`) or the
            aggregate is invalid; the model is then unchanged.
        """
        if self.packing is not None:
            order = tuple(model)
            try:
                packed = self.packing.pack(model)
            except (KeyError, ValueError) as err:
                raise RoundFailedError(f"the model does not fit the table spec: {err}") from err
            result = self._run(exchange, packed, nodes, server_round, threshold, psu, neighbours)
            return replace(result, model=self.packing.unpack(result.model, order))
        return self._run(exchange, model, nodes, server_round, threshold, psu, neighbours)

    def _run(
        self,
        exchange: Exchange,
        model: Mapping[str, NDArray[np.generic]],
        nodes: Sequence[int],
        server_round: int,
        threshold: int,
        psu: PSUParams,
        neighbours: int | None,
    ) -> SFSLResult:
        table = self.settings.table
        if table not in model or np.ndim(model[table]) != 2:
            raise RoundFailedError(f"the model has no 2-D table {table!r}")
        settings = replace(self.settings, psu=psu)
        # With DP the union vector is one noisy count per table row (exact mode).
        union_params = SecAggParams(
            server_round, self.session, threshold, settings.union_length(), neighbours
        )
        union, report, alive = self.union(exchange, nodes, union_params, settings)
        _, width = np.shape(model[table])
        dense_size = sum(int(np.size(model[k])) for k in model if k != table)
        layout, length = settings.layout(union, int(width), dense_size)
        rows_params = SecAggParams(server_round, self.session, threshold, length)
        perturbed = self.perturb(exchange, alive, rows_params, union)
        rows_round = self.rows(exchange, model, perturbed, rows_params, layout, settings)
        released: dict[str, NDArray[np.float64]] = {}
        new, touched = self.apply(model, layout, rows_round, released)
        return SFSLResult(
            new, union, report, touched, rows_round.clients, dict(perturbed),
            released.get("sums"), released.get("counts"),
        )  # fmt: skip


# -- the in-process clients and driver ---------------------------------------------------------
TrainFn = Callable[[dict[str, NDArray[np.generic]]], tuple[dict[str, NDArray[np.generic]], float]]
"""``train(model) -> (trained model, weight)``."""


@dataclass
class SFSLParty:
    """An in-process SFSL client: what :class:`~flwr_fsl.families.sfsl.mod.PerturbedRows` does.

    Parameters
    ----------
    node : int
        Its id.
    rows : numpy.ndarray
        ``S``, distinct table rows.
    counts : numpy.ndarray
        ``v > 0`` per row.
    rr : RRParams
        Its randomized-response probabilities.
    train : Callable
        ``train(model) -> (trained, weight)`` on the submodel it receives.
    memo : PermanentMemo
        Its permanent answers (kept across rounds).
    noise_floor : float
        The smallest noise multiplier it accepts (the mod's node-config floor); 0 (default)
        accepts the paper's noiseless rounds, as in-process tests and benchmarks need.
    packing : TablePacking, optional
        Several tables: ``rows`` and ``counts`` are then its *primary* rows as virtual rows
        (:meth:`TablePacking.to_virtual`); ``train`` sees the unpacked model.
    """

    node: int
    rows: NDArray[np.int64]
    counts: NDArray[np.float64]
    rr: RRParams
    train: TrainFn
    memo: PermanentMemo = field(default_factory=PermanentMemo)
    secagg: dict[str, SecAggClient] = field(default_factory=dict)
    noise_floor: float = 0.0
    packing: TablePacking | None = None

    def __post_init__(self) -> None:
        r = np.asarray(self.rows, dtype=np.int64)
        c = np.asarray(self.counts, dtype=np.float64)
        if r.shape != c.shape or r.ndim != 1 or np.unique(r).size != r.size:
            raise ConfigurationError("rows must be distinct with one count per row")
        order = np.argsort(r)
        self.rows, self.counts = r[order], c[order]

    def answer(self, label: str, ask: Any) -> Any:
        """Answer one ask (module docstring of :mod:`flwr_fsl.families.sfsl.server`)."""
        if isinstance(ask, ControlAsk):
            if label.endswith("-advertise"):
                self.secagg[ask.instance] = SecAggClient(self.node, ask.params)
                return self.secagg[ask.instance].advertise()
            client = self.secagg[ask.instance]
            if label.endswith("-share"):
                return client.share_keys(ask.body)
            return client.unmask(ask.body)
        if isinstance(ask, UnionAsk):
            settings = ask.settings
            assert settings.psu is not None
            self._check_floor(settings)
            vector = union_input(
                settings.psu, self.rows, settings.dp, settings.frac_bits, ask.params.threshold
            )
            return self.secagg[UNION_INSTANCE].masked_input(ask.sharers, vector)
        if isinstance(ask, PerturbAsk):
            union = ask.union
            if self.packing is not None:  # perturb the primary rows only; the server derives
                union = union[self.packing.primary_mask(union)]
            perturbed, self.memo = perturb_index_set(self.rows, union, self.memo, self.rr)
            return perturbed
        if isinstance(ask, RowsAsk):
            table = ask.settings.table
            assert ask.settings.psu is not None
            model = expand_download(ask.model, table, ask.rows, ask.settings.psu.domain_size)
            layout, length = ask.settings.layout(
                ask.union,
                int(model[table].shape[1]),
                sum(int(v.size) for k, v in model.items() if k != table),
            )
            if length != ask.params.vector_length:
                raise ClientInputError("the SFSL layout does not match the round's length")
            self._check_floor(ask.settings)
            trained, weight = self._train(model, ask.rows)
            weighted = ask.settings.weighted
            settings = ask.settings
            peers = RowsRound(
                table, settings.clip, settings.dp, ask.params.threshold, len(ask.sharers),
                ask.shared, settings.max_count,
            )  # fmt: skip
            rows, counts = self.rows, self.counts
            if self.packing is not None:
                rows, counts = self.packing.real_of_virtual(rows, counts)
            real = (rows, counts if weighted else np.ones(rows.size))
            vector, positions = rows_input(
                layout, peers, ask.rows, model, trained,
                weight if weighted else 1.0, real, length,
            )  # fmt: skip
            return self.secagg[ROWS_INSTANCE].masked_input(
                ask.sharers, vector, rows=positions, shared_rows=ask.shared
            )
        raise ClientInputError(f"unknown SFSL ask {label!r}")

    def _train(
        self, model: dict[str, NDArray[np.generic]], rows: NDArray[np.int64]
    ) -> tuple[dict[str, NDArray[np.generic]], float]:
        """Run ``train`` on the model (unpacked with several tables), return it packed."""
        if self.packing is None:
            return self.train({k: np.array(v) for k, v in model.items()})
        self.packing.check_extended(rows)
        trained, weight = self.train(self.packing.unpack(model))
        return self.packing.pack(trained), weight

    def _check_floor(self, settings: SFSLSettings) -> None:
        try:
            check_noise_floor(settings.noise_multiplier, self.noise_floor, what="SFSL")
        except ConfigurationError as err:
            raise ClientInputError(str(err)) from err


def run_round(  # noqa: PLR0913
    model: Mapping[str, NDArray[np.generic]],
    parties: Mapping[int, SFSLParty],
    settings: SFSLSettings,
    *,
    server_round: int = 1,
    threshold: int | None = None,
    psu: PSUParams | None = None,
    session: bytes | None = None,
    dropped: dict[int, str] | None = None,
    tamper: Callable[[str, int, Any], Any] | None = None,
    neighbours: int | None = None,
    packing: TablePacking | None = None,
) -> SFSLResult:
    """Drive one SFSL round in this process: the same steps and asks as the Flower strategy.

    Parameters
    ----------
    model : Mapping[str, numpy.ndarray]
        The global model (with the 2-D table ``settings.table``).
    parties : Mapping[int, SFSLParty]
        The round's clients.
    settings : SFSLSettings
        The round's settings.
    server_round : int
        The round number (binds the SecAgg parameters).
    threshold : int, optional
        SecAgg's ``t`` (default: ``max(2, ceil(0.6 n))``, the strategy's default).
    psu : PSUParams, optional
        Default: exact mode over the table's rows.
    session : bytes, optional
        SecAgg's session (default fresh random).
    dropped : dict, optional
        Filled with node -> reason for every client dropped (as the strategy logs it).
    tamper : Callable[[str, int, Any], Any], optional
        ``tamper(label, node, reply) -> reply``: a test's hook on every reply (a deviating
        client); it may raise :class:`~flwr_fsl.core.errors.ClientInputError` to go silent.
    neighbours : int, optional
        SecAgg+'s ``k`` for the union round (:meth:`SFSLServer.run`).
    packing : TablePacking, optional
        Several tables (:class:`SFSLServer`); ``settings.table`` is replaced by its name.

    Returns
    -------
    SFSLResult
        The new model and the round's view.
    """
    drops = dropped if dropped is not None else {}

    exchange = local_exchange(parties, drops, tamper)
    nodes = list(parties)
    t = threshold if threshold is not None else max(2, math.ceil(0.6 * len(nodes)))
    if packing is not None:
        settings = replace(settings, table=packing.name)
        domain = packing.rows
    else:
        domain = int(np.shape(model[settings.table])[0])
    server = SFSLServer(
        settings, session if session is not None else os.urandom(16), packing=packing
    )
    return server.run(
        exchange, model, nodes, server_round, t,
        psu if psu is not None else psu_params(domain), neighbours=neighbours,
    )  # fmt: skip
