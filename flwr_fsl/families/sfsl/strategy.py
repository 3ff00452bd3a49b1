"""``SFSLFedSubAvg``: Niu et al.'s secure federated submodel learning on one table (Alg. 1-3).

The model has one row table (an embedding, ``table``) whose rows clients touch privately, and
any number of dense tensors. A round, on the round engine, with
:class:`~flwr_fsl.families.sfsl.mod.PerturbedRows` on the clients:

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

**Threat model and leakage.** One honest-but-curious server colluding with fewer than ``t``
clients; semi-honest clients; everything relayed and sealed. The server learns the union ``U``
(and, in Bloom mode, its false positives), every ``S''_i`` (ε-LDP per client: ``ε1`` per round,
``ε∞`` over all rounds, :mod:`flwr_fsl.families.sfsl.perturb`), and per row the participant set and
the aggregate over it — a row with a single participant is that client's row in the clear
(Theorem 2, Event 1). Clients learn ``U`` and, for their own rows, which other clients answered
"yes". With ``p1 = p2 = p3 = p4 = 1`` (:meth:`~flwr_fsl.families.sfsl.perturb.RRParams` all ones)
every client uploads all of ``U`` and the round is as private as secure FL over ``U``
(Theorem 3).
"""

from __future__ import annotations

import math
import os
from logging import INFO

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

from flwr_fsl.core.engine import MultiPhaseStrategy, RoundState
from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.families.secagg.protocol import SecAggParams, encode_ids, encode_rows
from flwr_fsl.families.secagg.records import SECAGG_KEY, read_secagg_bytes
from flwr_fsl.families.secagg.strategy import SecAggPhases
from flwr_fsl.families.sfsl.protocol import GammaQuantizer, RowVector
from flwr_fsl.families.sfsl.psu import PSUParams, reconstruct_union, union_report
from flwr_fsl.families.sfsl.records import ROWS_INSTANCE, UNION_INSTANCE

__all__ = ["SFSLFedSubAvg", "psu_fields", "sfsl_layout"]


def psu_fields(params: PSUParams) -> dict[str, int | bytes]:
    """Return the PSU parameters as SecAgg record fields."""
    return {
        "psu-domain": params.domain_size,
        "psu-length": params.bloom_length,
        "psu-hashes": params.num_hashes,
        "psu-partitions": params.num_partitions,
        "psu-key": params.hash_key,
    }


def sfsl_layout(
    union: NDArray[np.int64],
    width: int,
    dense_size: int,
    codec: FixedPoint,
    quantizer: GammaQuantizer | None = None,
) -> tuple[RowVector, int]:
    """Return the rows round's layout: union rows and counts, then the dense part and weight."""
    rows = RowVector(union, width, codec, quantizer)
    return rows, rows.length + dense_size + 1


class SFSLFedSubAvg(MultiPhaseStrategy):
    """Niu et al.'s secure federated submodel learning (module docstring).

    Parameters
    ----------
    table : str
        The row table's name in the model.
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key, sampling_seed
        As in :class:`flwr.serverapp.strategy.FedAvg`.
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

    Raises
    ------
    ConfigurationError
        If a setting is invalid (checked here, before round 1).
    """

    PHASES = ("union", "perturb", "rows")

    def __init__(
        self,
        table: str,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
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
    ) -> None:
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
        if not isinstance(table, str) or not table:
            raise ConfigurationError("table must name the model's row table")
        t = reconstruction_threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or t <= 0:
            raise ConfigurationError("reconstruction_threshold must be an int >= 2 or in (0, 1]")
        if (isinstance(t, int) and t < 2) or (isinstance(t, float) and t > 1):
            raise ConfigurationError("reconstruction_threshold must be an int >= 2 or in (0, 1]")
        if bloom_fpr is not None and not 0 < bloom_fpr < 1:
            raise ConfigurationError("bloom_fpr must be None (exact PSU) or in (0, 1)")
        if not (math.isfinite(clip) and clip > 0):
            raise ConfigurationError("clip must be finite and > 0")
        try:
            self.quantizer = (
                None
                if quantization_levels is None
                else GammaQuantizer(quantization_levels, -float(clip), float(clip))
            )
            levels = 0 if quantization_levels is None else quantization_levels - 1
            self.codec = FixedPoint(frac_bits, max_count * max(clip, 1.0, levels), max_clients)
        except ConfigurationError as err:
            raise ConfigurationError(
                f"clip / max_count / frac_bits / max_clients / quantization_levels: {err}"
            ) from err
        self.table = table
        self.reconstruction_threshold = t
        self.bloom_fpr = bloom_fpr
        self.expected_union = int(expected_union)
        self.partitions = int(partitions)
        self.clip = float(clip)
        self.max_clients = int(max_clients)
        self.session = os.urandom(16)
        self.reports: dict[int, dict[str, float]] = {}

    def _threshold(self, sampled: int) -> int:
        t = self.reconstruction_threshold
        return max(2, math.ceil(t * sampled)) if isinstance(t, float) else t

    def train_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run PSU, perturbation and the count-weighted subset SecAgg round."""
        model = {k: a.numpy() for k, a in arrays.items()}
        if self.table not in model or model[self.table].ndim != 2:
            raise RoundFailedError(f"the model has no 2-D table {self.table!r}")
        table = model[self.table]
        m, width = table.shape
        state.model = model
        nodes = self.sample(state, grid)
        if not nodes:
            return None, None
        t = self._threshold(len(nodes))
        if not t <= len(nodes) <= self.max_clients:
            raise RoundFailedError(f"{len(nodes)} clients sampled for t = {t}")
        # 1. Private set union.
        if self.bloom_fpr is None:
            psu = PSUParams.exact(m)
        else:
            psu = PSUParams.for_target(m, self.expected_union, self.bloom_fpr, self.partitions)
        union_phases = SecAggPhases(self, UNION_INSTANCE)
        union_params = SecAggParams(state.server_round, self.session, t, psu.vector_length)
        server = union_phases.keys(grid, state, nodes, union_params)
        record = union_phases.record(
            union_params, "train", sharers=encode_ids(server.sharers()), **psu_fields(psu)
        )
        union_phases.masked(
            grid, state, server, dict.fromkeys(server.sharers(), RecordDict({SECAGG_KEY: record}))
        )
        total = union_phases.unmask(grid, state, server)
        union = reconstruct_union(psu, total)
        report = union_report(psu, total, union, len(server.survivors))
        log(INFO, "SFSL: union of %d rows (FPR %.2e)", union.size, report.false_positive_rate)
        # 2. Perturbation: each client's S'' over the union.
        dense = [k for k in model if k != self.table]
        dense_size = sum(model[k].size for k in dense)
        layout, length = sfsl_layout(union, width, dense_size, self.codec, self.quantizer)
        rows_phases = SecAggPhases(self, ROWS_INSTANCE)
        rows_params = SecAggParams(state.server_round, self.session, t, length)
        train_config = ConfigRecord({**dict(config), "server-round": state.server_round})
        ask = RecordDict(
            {
                SECAGG_KEY: rows_phases.record(
                    rows_params, "perturb", union=union.astype("<i8").tobytes()
                ),
                self.configrecord_key: train_config,
            }
        )
        survivors = [n for n in nodes if n in state.survivors]
        perturbed = self.send(
            grid, state, "perturb", dict.fromkeys(survivors, ask), MessageType.TRAIN,
            lambda n, c: _read_perturbed(c, union),
        )  # fmt: skip
        # 3. Count-weighted subset SecAgg over each row's participants.
        server = rows_phases.keys(grid, state, list(perturbed), rows_params)
        u2 = server.sharers()
        dense_positions = np.arange(layout.length, length, dtype=np.int64)
        positions = {
            u: np.concatenate([layout.positions(perturbed[u]), dense_positions]) for u in u2
        }
        shared = server.assign_rows(positions)
        contents = {}
        for u in u2:
            sub = table.copy()
            keep = np.zeros(m, dtype=bool)
            keep[perturbed[u]] = True
            sub[~keep] = 0  # the client sees only the rows of S''
            arrays_u = ArrayRecord(
                {k: Array(sub if k == self.table else np.asarray(v)) for k, v in model.items()}
            )
            contents[u] = RecordDict(
                {
                    self.arrayrecord_key: arrays_u,
                    self.configrecord_key: train_config,
                    SECAGG_KEY: rows_phases.record(
                        rows_params,
                        "train",
                        sharers=encode_ids(u2),
                        rows=perturbed[u].astype("<i8").tobytes(),
                        shared=encode_rows(shared[u]),
                        union=union.astype("<i8").tobytes(),
                        table=self.table,
                        clip=self.clip,
                        **{
                            "frac-bits": self.codec.frac_bits,
                            "levels": 0 if self.quantizer is None else self.quantizer.levels,
                            "max-abs": self.codec.max_abs,
                            "max-clients": self.codec.max_summands,
                            "weight-key": self.weighted_by_key,
                        },
                    ),
                }
            )
        rows_phases.masked(grid, state, server, contents)
        total = rows_phases.unmask(grid, state, server)
        # Line 9: each row by its count-weighted mean; dense tensors by the weighted mean.
        new = {k: np.asarray(v).copy() for k, v in model.items()}
        touched, mean, _ = layout.decode(total[: layout.length])
        updated = new[self.table].astype(np.float64)
        updated[touched] += mean
        values = self.codec.decode(total[layout.length :])
        weight = float(values[-1])
        if not weight > 0:
            raise RoundFailedError("the aggregated weight is not positive")
        at = 0
        for k in dense:
            size = model[k].size
            step = values[at : at + size].reshape(model[k].shape) / weight
            at += size
            value = model[k].astype(np.float64) + step
            if np.issubdtype(model[k].dtype, np.integer):
                value = np.rint(value)
            new[k] = value.astype(model[k].dtype)
        if not np.all(np.isfinite(updated)):
            raise RoundFailedError("the aggregated table is not finite")
        new[self.table] = updated.astype(table.dtype)
        self.reports[state.server_round] = {
            "union": float(union.size),
            "fpr": report.false_positive_rate,
            "rows-updated": float(touched.size),
        }
        log(
            INFO,
            "SFSL: %d rows updated by %d clients (union %d)",
            touched.size,
            len(server.survivors),
            union.size,
        )
        metrics = MetricRecord(
            {"sfsl-clients": len(server.survivors), "union-size": int(union.size)}
        )
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in new.items()}), metrics


def _read_perturbed(content: RecordDict, union: NDArray[np.int64]) -> NDArray[np.int64]:
    raw = read_secagg_bytes(content, "perturbed")
    if len(raw) % 8 or len(raw) > 8 * union.size:
        raise ClientInputError("the perturbed set has a bad length")
    rows = np.frombuffer(raw, dtype="<i8").astype(np.int64)
    if rows.size and (np.any(rows[1:] <= rows[:-1]) or not np.isin(rows, union).all()):
        raise ClientInputError("the perturbed set must be increasing rows of the union")
    return rows
