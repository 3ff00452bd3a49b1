"""``FedSubAvg``: Flower's FedAvg for submodel replies, with count-weighted averaging.

Replies may mix plain dense weights, coordinate-sparse deltas and row-sparse deltas (wire
format :mod:`flwr_fsl.submodel.codec`) in one round. Each coordinate is averaged over the
clients that updated it, weighted by sample count (or per-index counts when sent); untouched
coordinates keep their value (Niu et al., Alg. 1 / App. C). On dense replies it is FedAvg for
floating tensors; integer buffers (e.g. batch-norm counters) keep their dtype and are rounded,
where Flower's FedAvg turns them into float64 means.

Failure handling is the round engine's (:mod:`flwr_fsl.core.engine`): a reply that is an
error, arrives for another round, repeats a node, comes from a node that was not asked, lacks
a valid weight or fails the codec's validation is dropped with a logged reason (kept in
:attr:`~flwr_fsl.core.engine.PhasedStrategy.dropped`); the others are aggregated
exactly as if it had never been sent. With no valid reply left the round returns no arrays
and the global model stays unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING

from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp import Grid
from flwr.supercore import log

from flwr_fsl.core.engine import PhasedStrategy, RoundState
from flwr_fsl.core.errors import RoundFailedError
from flwr_fsl.core.records import decode_update
from flwr_fsl.submodel import SubmodelUpdate
from flwr_fsl.submodel.aggregate import check_contribution, count_weighted_average


class FedSubAvg(PhasedStrategy):
    """Federated submodel averaging: a drop-in for Flower's ``FedAvg``.

    Takes the same arguments as :class:`flwr.serverapp.strategy.FedAvg`, plus
    ``sampling_seed`` (:class:`~flwr_fsl.core.engine.PhasedStrategy`).
    """

    def round_config(
        self, state: RoundState, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> ConfigRecord:
        """Return the train message's config (subclasses add their protocol's fields)."""
        return ConfigRecord({**dict(config), "server-round": state.server_round})

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes as FedAvg does and remember the model the deltas refer to."""
        state = self.round_state(server_round)
        nodes = self.sample(state, grid)
        if not nodes:
            return []
        state.model = {name: array.numpy() for name, array in arrays.items()}
        try:
            round_config = self.round_config(state, arrays, config, grid)
        except RoundFailedError as err:  # e.g. S1 unreachable: nobody trains for nothing
            self.fail_round(state, err)
            return []
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: round_config})
        return self.prepare(state, "train", dict.fromkeys(nodes, content), MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate every reply, drop bad ones with a reason, count-weight-average the rest."""
        state = self.round_state(server_round)

        def parse(_node: int, content: RecordDict) -> tuple[SubmodelUpdate, RecordDict]:
            update = decode_update(content, state.model, self.weight_of(content))
            check_contribution(update, self.max_weight, len(state.sampled))
            return update, content

        valid = self.receive(state, "train", replies, parse)
        log(INFO, "aggregate_train: %d valid replies, %d dropped", len(valid), len(state.dropped))
        if not valid:
            log(WARNING, "aggregate_train: no valid reply; the global model is unchanged")
            return None, None
        try:
            new_arrays, stats = count_weighted_average(state.model, [u for u, _ in valid.values()])
        except RoundFailedError as err:  # a non-finite aggregate: keep the model
            self.fail_round(state, err)
            return None, None
        touched = sum(stats.touched.values()) / max(1, sum(a.size for a in state.model.values()))
        metrics = self.train_metrics([c for _, c in valid.values()], state, touched)
        return ArrayRecord({k: Array(v) for k, v in new_arrays.items()}), metrics

    def train_metrics(
        self, contents: list[RecordDict], state: RoundState, touched: float
    ) -> MetricRecord:
        """Aggregate the clients' metrics and add the round's bytes and touched fraction."""
        metrics = self.client_metrics(self.train_metrics_aggr_fn, contents) if contents else None
        metrics = metrics if metrics is not None else MetricRecord()
        for key, value in self.phase_metrics(state).items():
            metrics[key] = value
        metrics["touched-fraction"] = touched
        return metrics
