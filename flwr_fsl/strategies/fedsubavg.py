"""``FedSubAvg``: Flower's FedAvg for submodel replies, with count-weighted averaging.

Replies may mix plain dense weights, coordinate-sparse deltas and row-sparse deltas (wire
format :mod:`flwr_fsl.submodel.codec`) in one round. Each coordinate is averaged over the
clients that updated it, weighted by sample count (or per-index counts when sent); untouched
coordinates keep their value (Niu et al., Alg. 1 / App. C). On dense replies it is FedAvg for
floating tensors; integer buffers (e.g. batch-norm counters) keep their dtype and are rounded,
where Flower's FedAvg turns them into float64 means.

Failure handling: a reply that is an error, arrives for another round, repeats a node, comes
from a node that was not asked, lacks a valid weight or fails the codec's validation is dropped
with a logged reason (kept in :attr:`FedSubAvg.dropped`); the others are aggregated exactly as
if it had never been sent. With no valid reply left the round returns no arrays and the global
model stays unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from logging import INFO, WARNING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.supercore import log
from numpy.typing import NDArray

from flwr_fsl.records import decode_update
from flwr_fsl.submodel import SubmodelFormatError, SubmodelUpdate
from flwr_fsl.submodel.aggregate import count_weighted_average
from flwr_fsl.traffic import RoundTraffic, content_bytes


class FedSubAvg(FedAvg):
    """Federated submodel averaging.

    Takes the same arguments as :class:`flwr.serverapp.strategy.FedAvg`.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key, \
train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in :class:`flwr.serverapp.strategy.FedAvg`.

    Raises
    ------
    ValueError
        If a fraction is outside [0, 1] or a minimum is negative.

    Attributes
    ----------
    traffic : list[RoundTraffic]
        Bytes sent to and received from each node, per round and phase.
    dropped : dict[int, dict[int, str]]
        Round -> node id -> reason its train reply was dropped.
    """

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
    ) -> None:
        for name, value in (
            ("fraction_train", fraction_train),
            ("fraction_evaluate", fraction_evaluate),
        ):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        for name, count in (
            ("min_train_nodes", min_train_nodes),
            ("min_evaluate_nodes", min_evaluate_nodes),
            ("min_available_nodes", min_available_nodes),
        ):
            if count < 0:
                raise ValueError(f"{name} must be >= 0, got {count}")
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        self.traffic: list[RoundTraffic] = []
        self.dropped: dict[int, dict[int, str]] = {}
        self._sent: dict[tuple[int, str], RoundTraffic] = {}
        self._global: dict[str, NDArray[np.generic]] = {}

    # -- train ------------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes as FedAvg does and remember the model the deltas refer to."""
        messages = list(super().configure_train(server_round, arrays, config, grid))
        _tag_round(messages, server_round)
        self._global = {name: array.numpy() for name, array in arrays.items()}
        self._record_sent(server_round, "train", messages)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate every reply, drop bad ones with a reason, count-weight-average the rest."""
        replies = list(replies)
        traffic = self._record_received(server_round, "train", replies)
        updates: list[SubmodelUpdate] = []
        valid: list[RecordDict] = []
        dropped = self.dropped.setdefault(server_round, {})
        seen: set[int] = set()
        for reply in replies:
            node = reply.metadata.src_node_id
            reason = self._reply_problem(server_round, reply, traffic, seen)
            update = None
            if reason is None:
                try:
                    update = decode_update(reply.content, self._global, self._weight(reply.content))
                except SubmodelFormatError as err:
                    reason = str(err)
            seen.add(node)
            if update is None:
                dropped[node] = reason or "invalid reply"
                log(WARNING, "aggregate_train: dropping reply from node %s: %s", node, reason)
                continue
            updates.append(update)
            valid.append(reply.content)
        log(
            INFO,
            "aggregate_train: %d valid replies, %d dropped",
            len(updates),
            len(dropped),
        )
        if not updates:
            log(WARNING, "aggregate_train: no valid reply; the global model is unchanged")
            return None, None
        new_arrays, stats = count_weighted_average(self._global, updates)
        metrics = self.train_metrics_aggr_fn(valid, self.weighted_by_key)
        metrics["down-bytes-per-client"] = self._sent[(server_round, "train")].mean_down_bytes
        metrics["up-bytes-per-client"] = traffic.mean_up_bytes
        metrics["touched-fraction"] = sum(stats.touched.values()) / max(
            1, sum(a.size for a in self._global.values())
        )
        return ArrayRecord({k: Array(v) for k, v in new_arrays.items()}), metrics

    # -- evaluate ---------------------------------------------------------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes as FedAvg does and account for the bytes sent."""
        messages = list(super().configure_evaluate(server_round, arrays, config, grid))
        _tag_round(messages, server_round)
        self._record_sent(server_round, "evaluate", messages)
        return messages

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Aggregate evaluation metrics of well-formed replies (others are logged and skipped)."""
        replies = list(replies)
        self._record_received(server_round, "evaluate", replies)
        valid = []
        for reply in replies:
            if reply.has_error():
                log(WARNING, "evaluate reply error from node %s", reply.metadata.src_node_id)
                continue
            try:
                self._weight(reply.content)
            except SubmodelFormatError as err:
                log(
                    WARNING,
                    "evaluate reply from node %s skipped: %s",
                    reply.metadata.src_node_id,
                    err,
                )
                continue
            valid.append(reply.content)
        if not valid:
            return None
        return self.evaluate_metrics_aggr_fn(valid, self.weighted_by_key)

    # -- run --------------------------------------------------------------------------------
    def start(self, grid: Grid, initial_arrays: ArrayRecord, *args, **kwargs) -> Result:  # type: ignore[no-untyped-def]
        """Run the rounds as :meth:`FedAvg.start` and log a per-round traffic summary."""
        result = super().start(grid, initial_arrays, *args, **kwargs)
        if not result.arrays:
            # No round produced an aggregate: the global model is still the initial one.
            result.arrays = initial_arrays
        for line in self.traffic_table().splitlines():
            log(INFO, "%s", line)
        return result

    def traffic_table(self) -> str:
        """Return the per-round communication summary as a text table (MB per client)."""
        header = f"{'round':>5} {'phase':<9} {'clients':>7} {'down MB/cl':>11} {'up MB/cl':>10}"
        lines = ["Communication per round (mean per client):", header]
        for t in self.traffic:
            lines.append(
                f"{t.server_round:>5} {t.phase:<9} {len(t.down_bytes):>7} "
                f"{t.mean_down_bytes / 1e6:>11.4f} {t.mean_up_bytes / 1e6:>10.4f}"
            )
        return "\n".join(lines)

    # -- helpers ----------------------------------------------------------------------------
    def _weight(self, content: RecordDict) -> float:
        records = list(content.metric_records.values())
        if len(records) != 1:
            raise SubmodelFormatError(f"expected one MetricRecord, got {len(records)}")
        value = records[0].get(self.weighted_by_key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SubmodelFormatError(f"missing numeric {self.weighted_by_key!r} in metrics")
        if not (math.isfinite(value) and value > 0):
            raise SubmodelFormatError(f"{self.weighted_by_key!r} must be finite and > 0")
        return float(value)

    def _reply_problem(
        self, server_round: int, reply: Message, traffic: RoundTraffic, seen: set[int]
    ) -> str | None:
        node = reply.metadata.src_node_id
        if reply.has_error():
            return f"client error: {reply.error.reason}"
        if reply.metadata.group_id != str(server_round):
            return f"late reply for round {reply.metadata.group_id!r}"
        if node not in self._sent[(server_round, "train")].down_bytes:
            return "reply from a node that was not sampled this round"
        if node in seen:
            return "second reply from the same node"
        return None

    def _record_sent(self, server_round: int, phase: str, messages: list[Message]) -> None:
        traffic = RoundTraffic(server_round, phase)
        # All messages of a phase share one RecordDict: size it once.
        sizes: dict[int, int] = {}
        for msg in messages:
            key = id(msg.content)
            if key not in sizes:
                sizes[key] = content_bytes(msg.content)
            traffic.down_bytes[msg.metadata.dst_node_id] = sizes[key]
        self._sent[(server_round, phase)] = traffic
        self.traffic.append(traffic)

    def _record_received(
        self, server_round: int, phase: str, replies: list[Message]
    ) -> RoundTraffic:
        traffic = self._sent.setdefault((server_round, phase), RoundTraffic(server_round, phase))
        for reply in replies:
            if reply.has_content():
                node = reply.metadata.src_node_id
                traffic.up_bytes[node] = traffic.up_bytes.get(node, 0) + content_bytes(
                    reply.content
                )
        return traffic


def _tag_round(messages: list[Message], server_round: int) -> None:
    # Replies inherit the group id, so a reply to an earlier round is recognisable as late.
    for msg in messages:
        msg.metadata.group_id = str(server_round)
