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

from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING

import numpy as np
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
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords
from flwr.supercore import log
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM
from numpy.typing import NDArray

from flwr_fsl.core.engine import PhasedStrategy, RoundState
from flwr_fsl.core.errors import ClientInputError, RoundFailedError
from flwr_fsl.core.records import array_loader, decode_update, is_submodel_reply
from flwr_fsl.submodel import SubmodelUpdate
from flwr_fsl.submodel.aggregate import (
    check_clipping_range,
    check_contribution,
    clip_update,
    count_weighted_average,
)

_DP_SPARSE = (
    "a sparse (top-k) reply in a round run under Flower's DP wrapper (its 'clipping_norm' is in "
    "the train config): the wrapper's noise is calibrated to FedAvg's average over every sampled "
    "client (sensitivity C/n), but a sparse reply's coordinates are averaged over the clients "
    "that sent them, where one client can move a coordinate by C; send dense replies (no "
    "topk_mod) under Flower's DP wrappers"
)


class FedSubAvg(PhasedStrategy):
    """Federated submodel averaging: a drop-in for Flower's ``FedAvg``.

    Takes :class:`flwr.serverapp.strategy.FedAvg`'s arguments in its order with its defaults,
    plus the keyword-only ``sampling_seed`` and ``max_weight``
    (:class:`~flwr_fsl.core.engine.PhasedStrategy`). On dense replies it is ``FedAvg``
    (the same arithmetic and dtypes) whoever drives it, including Flower's own
    ``Strategy.start``, its DP wrappers and direct calls of :meth:`aggregate_train`; Flower's
    Message-API strategy tests pass against it (``tests/flower_upstream/``).

    Differences from ``FedAvg`` (each reasoned in ``docs/dropin.md``, F1-F10): a bad reply
    drops that client with a logged reason instead of raising (F1); integer tensors keep
    their dtype, rounded (F2); Flower's DP accountant refuses it (its check wants
    ``FedAvg.aggregate_train``; count weighting of sparse replies voids its calibration), and
    under Flower's DP wrappers only dense replies are taken: a sparse reply is dropped with
    the reason under the client-side wrappers, Flower's server-side clipping raises on it
    (F3); replies whose metric keys differ give no client metrics that round, with a
    warning, instead of raising (F4); a reply missing a tensor is kept, the tensor averaged
    over the replies that have it (F5); the default metric aggregation adds
    ``down-bytes-per-client``, ``up-bytes-per-client`` and ``touched-fraction`` (F6);
    sparse replies to a round it did not configure are skipped (F7); a weight above
    ``max_weight`` drops the client (F8); ``Result.arrays`` is the initial model when no
    round aggregated (F9); each coordinate's change is clipped to ``clipping_range``, a
    non-finite one drops the client (F10).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key, \
train_metrics_aggr_fn, evaluate_metrics_aggr_fn, sampling_seed, max_weight
        As in :class:`~flwr_fsl.core.engine.PhasedStrategy` (Flower's ``FedAvg``).
    clipping_range : float or None
        Largest change of one coordinate a reply may make against the model this strategy
        sent (the secure strategies' setting and default, 8): a larger finite change is
        clipped to it (logged per client; what SecAgg's client mod does before masking), a
        non-finite value drops the client. None: no bound (``FedAvg``'s arithmetic exactly).
        Replies to rounds this strategy did not configure have no model to clip against.

    Raises
    ------
    ConfigurationError
        If a setting is invalid (the message names it).
    """

    def __init__(  # noqa: PLR0913
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
        *,
        sampling_seed: int | None = None,
        max_weight: float = 1e9,
        clipping_range: float | None = 8.0,
    ) -> None:
        super().__init__(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
            min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key,
            train_metrics_aggr_fn, evaluate_metrics_aggr_fn,
            sampling_seed=sampling_seed, max_weight=max_weight,
        )  # fmt: skip
        self.clipping_range = check_clipping_range(clipping_range)

    @property
    def _dp_wrapped_rounds(self) -> set[int]:
        """Rounds whose train config carried Flower's DP wrapper's clipping norm."""
        rounds: set[int] = vars(self).setdefault("_dp_rounds", set())
        return rounds

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
        if KEY_CLIPPING_NORM in config:  # Flower's client-side DP wrapper drives this round
            self._dp_wrapped_rounds.add(server_round)
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
        """Validate every reply, drop bad ones with a reason, average the rest.

        A round of dense replies only is Flower's ``FedAvg`` average (the same arithmetic,
        dtypes and key order); any sparse reply makes it count-weighted per coordinate.
        Replies this strategy's :meth:`configure_train` did not ask for (Flower's tests, a
        custom loop, a wrapper that hands replies over) are aggregated as ``FedAvg`` would,
        when dense (:meth:`aggregate_unconfigured`).
        """
        state = self.round_state(server_round)
        if "train" not in state._asked:
            return self.aggregate_unconfigured(state, list(replies))

        dense_only = server_round in self._dp_wrapped_rounds

        def parse(_node: int, content: RecordDict) -> tuple[SubmodelUpdate, RecordDict]:
            if dense_only and is_submodel_reply(content):
                raise ClientInputError(_DP_SPARSE)
            update = decode_update(content, state.model, self.weight_of(content))
            clipped = clip_update(update, self.clipping_range, state.model)
            check_contribution(update, self.max_weight, len(state.sampled))
            if clipped:
                log(INFO, "node %s: %d coordinates clipped to clipping_range", _node, clipped)
                if not is_submodel_reply(content):
                    content = clip_dense(content, state.model, self.clipping_range)
            return update, content

        valid = self.receive(state, "train", replies, parse)
        log(INFO, "aggregate_train: %d valid replies, %d dropped", len(valid), len(state.dropped))
        if not valid:
            log(WARNING, "aggregate_train: no valid reply; the global model is unchanged")
            return None, None
        contents = [c for _, c in valid.values()]
        if not any(is_submodel_reply(c) for c in contents):
            weights = [u.weight for u, _ in valid.values()]
            dense = fedavg_dense(contents, weights, state.model)
            if dense is None:
                self.fail_round(state, RoundFailedError("the dense average is not finite"))
                return None, None
            return dense, self.train_metrics(contents, state, 1.0)
        try:
            new_arrays, stats = count_weighted_average(state.model, [u for u, _ in valid.values()])
        except RoundFailedError as err:  # a non-finite aggregate: keep the model
            self.fail_round(state, err)
            return None, None
        touched = sum(stats.touched.values()) / max(1, sum(a.size for a in state.model.values()))
        metrics = self.train_metrics(contents, state, touched)
        return ArrayRecord({k: Array(v) for k, v in new_arrays.items()}), metrics

    def aggregate_unconfigured(
        self, state: RoundState, replies: list[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate replies to messages this strategy did not send, as ``FedAvg`` does.

        Without this strategy's :meth:`configure_train` there is no model the replies' deltas
        refer to, and no record of whom was asked: a dense reply is averaged as Flower's
        ``FedAvg`` averages it; a reply that is an error, lacks a valid weight, is a sparse
        submodel update (it needs the model it was computed against) or does not match the
        other replies' shapes is logged and skipped (``FedAvg`` would raise for some of these).
        """
        contents: list[RecordDict] = []
        weights: list[float] = []
        shapes: dict[str, tuple[int, ...]] = {}
        for msg in replies:
            try:
                if msg.has_error():
                    raise ClientInputError(f"error reply: {msg.error.reason}")
                content = msg.content
                weight = self.weight_of(content)
                if is_submodel_reply(content):
                    raise ClientInputError(
                        "a sparse submodel reply needs the model of this strategy's "
                        "configure_train for this round"
                    )
                _check_dense_reply(content, shapes)
            except ClientInputError as err:
                log(WARNING, "aggregate_train: skipping a reply: %s", err)
                continue
            contents.append(content)
            weights.append(weight)
        log(INFO, "aggregate_train: %d valid replies of %d", len(contents), len(replies))
        if not contents:
            return None, None
        arrays = fedavg_dense(contents, weights, None)
        if arrays is None:
            self.fail_round(state, RoundFailedError("the dense average is not finite"))
            return None, None
        return arrays, self.train_metrics(contents, state, 1.0)

    def train_metrics(
        self, contents: list[RecordDict], state: RoundState, touched: float
    ) -> MetricRecord:
        """Aggregate the clients' metrics; add the round's bytes and touched fraction.

        The three added keys (``down-bytes-per-client``, ``up-bytes-per-client``,
        ``touched-fraction``) join the record of the default aggregation only, and only in
        rounds this strategy configured; a ``train_metrics_aggr_fn`` of the user's returns
        exactly its own record (as with ``FedAvg``).
        """
        metrics = self.client_metrics(self.train_metrics_aggr_fn, contents) if contents else None
        metrics = metrics if metrics is not None else MetricRecord()
        if self.train_metrics_aggr_fn is not aggregate_metricrecords or not state.traffic:
            return metrics
        for key, value in self.phase_metrics(state).items():
            metrics.setdefault(key, value)
        metrics.setdefault("touched-fraction", touched)
        return metrics


def _check_dense_reply(content: RecordDict, shapes: dict[str, tuple[int, ...]]) -> None:
    """Check a dense reply: one ArrayRecord of finite real arrays, shaped as earlier replies'."""
    records = list(content.array_records.values())
    if len(records) != 1:
        raise ClientInputError(f"a dense reply needs exactly one ArrayRecord, got {len(records)}")
    loader = array_loader(records[0])
    for name in records[0].keys():
        value = loader(name)
        if not (np.issubdtype(value.dtype, np.integer) or np.issubdtype(value.dtype, np.floating)):
            raise ClientInputError(f"{name}: dtype {value.dtype} is not a real number type")
        if not np.all(np.isfinite(value)):
            raise ClientInputError(f"{name}: values contain NaN or inf")
        if shapes.setdefault(name, value.shape) != value.shape:
            raise ClientInputError(f"{name}: shape {value.shape} differs from other replies'")


def clip_dense(
    content: RecordDict, model: Mapping[str, NDArray[np.generic]], clip: float | None
) -> RecordDict:
    """Return a dense reply with each floating coordinate within ``clip`` of the model's.

    Coordinates already within the bound keep their exact value (``FedAvg``'s arithmetic on
    them is unchanged); integer tensors are left alone (see
    :func:`~flwr_fsl.submodel.aggregate.clip_update`).
    """
    key, record = next(iter(content.array_records.items()))
    if clip is None:
        return content
    arrays: dict[str, Array] = {}
    for name in record.keys():
        value = record[name].numpy()
        ref = model.get(name)
        if ref is None or not np.issubdtype(np.asarray(ref).dtype, np.floating):
            arrays[name] = record[name]
            continue
        base = np.asarray(ref, np.float64)
        delta = value.astype(np.float64) - base
        over = np.abs(delta) > clip
        arrays[name] = Array(
            np.where(over, base + np.sign(delta) * clip, value).astype(value.dtype)
        )
    out = RecordDict(dict(content.items()))
    out[key] = ArrayRecord(arrays)
    return out


def fedavg_dense(
    contents: list[RecordDict],
    weights: list[float],
    model: Mapping[str, NDArray[np.generic]] | None,
) -> ArrayRecord | None:
    """Flower ``FedAvg``'s weighted average of dense replies, tensor by tensor.

    The arithmetic is ``aggregate_arrayrecords``'s (``sum_i x_i * (w_i / W)`` in the replies'
    dtype, so a float64 reply to a float32 model gives float64 as with ``FedAvg``), with two
    differences: a tensor some replies leave out is averaged over the replies that have it
    (``W`` is their weight; the model's value when none has it), and an integer tensor of the
    model (e.g. batch-norm's ``num_batches_tracked``) keeps its dtype, rounded to nearest.

    Returns
    -------
    ArrayRecord or None
        The averaged arrays (the model's key order, then the replies'); None when a result is
        not finite.
    """
    tensors = [next(iter(c.array_records.values())) for c in contents]
    names = list(model or {})
    for record in tensors:
        names += [k for k in record.keys() if k not in names]
    out: dict[str, Array] = {}
    for name in names:
        have = [(r, w) for r, w in zip(tensors, weights, strict=True) if name in r]
        if not have and model is not None:  # no reply updated it: the model's value stays
            out[name] = Array(np.asarray(model[name]))
            continue
        total = sum(w for _, w in have)
        acc = have[0][0][name].numpy() * (have[0][1] / total)
        for record, w in have[1:]:
            acc += record[name].numpy() * (w / total)
        if not np.all(np.isfinite(acc)):
            return None
        ref = None if model is None else np.asarray(model[name])
        if ref is not None and np.issubdtype(ref.dtype, np.integer):
            acc = np.rint(acc).astype(ref.dtype)
        out[name] = Array(np.asarray(acc))
    return ArrayRecord(out)
