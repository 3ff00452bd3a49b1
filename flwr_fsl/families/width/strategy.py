"""``WidthFedAvg``: FedRolex / HeteroFL / random / SESA-shard width extraction on the round engine.

Clients of different capacity train narrower copies of the global model
(:mod:`flwr_fsl.families.width.rules`): each round, every sampled client gets only its width slice
— hidden layers narrowed to ``ceil(K * rate / global_rate)`` channels chosen by the
``extraction`` rule, input and output layers whole — and returns the slice trained. Each
global coordinate becomes the mean over the clients that held it (FedRolex's default
unweighted mean; ``weighted=True`` weights by ``num-examples``); coordinates no client held
keep their value. The average goes through the platform's one count-weighted apply
(:func:`~flwr_fsl.submodel.aggregate.apply_count_weighted`) over each client's
:class:`~flwr_fsl.submodel.layout.WidthLayout`.

A round on the round engine (:class:`~flwr_fsl.core.engine.PhasedStrategy`):

1. ``capacity`` (only with ``capacity="query"``, only for sampled nodes whose capacity is not
   known yet): a small ``train`` message the client mod answers from the node config
   (:func:`~flwr_fsl.families.width.mod.capacity_of`); the answer is cached per node for the run.
   With ``capacity="dynamic"`` the server draws each client's rate per round from
   ``capacity_mix`` instead (FedRolex's and HeteroFL's "dynamic" mode, seeded).
2. ``train``: per client, its narrow arrays, the usual config and a
   :class:`~flwr_fsl.families.width.rules.WidthAssignment` (rate, rule, kept channels; bytes are
   counted per client). Replies stream into the running sums as they arrive.

Client side: :func:`~flwr_fsl.mods.width_mod` in front of an ``@app.train`` that builds its
model at ``config["width-rate"]``.

**Failures.** A reply that is an error, late, duplicated, not for the slice it was sent
(digest), misshapen, missing or adding a tensor, not finite, without a valid
``num-examples``, or too large to sum safely drops that client with the reason in
:attr:`~flwr_fsl.core.engine.PhasedStrategy.dropped`; the others are averaged exactly
as if it had not been sampled. A capacity answer that is not a valid rate for the rule drops
the node for the round and is not cached. Settings are checked in the constructor, the layer
structure against the model (and the train config for the reserved ``width-rate`` key) in
:meth:`WidthFedAvg.start`, before round 1, each error naming the setting.

**Privacy.** None beyond FedAvg's: the server picks every client's channels and sees every
client's trained slice. SESA (secure aggregation over ``"shards"``) builds on this module's
pieces.

Not reproduced from the reference code: HeteroFL's masking of classifier rows to a client's
labels (``label_split``), FedRolex's ``overlap`` variant and its weighting of 1-D tensors by
historic update counts; the narrow classifier is averaged like every other tensor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log
from numpy.typing import NDArray

from flwr_fsl.core.engine import MultiPhaseStrategy, RoundState
from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.records import array_loader
from flwr_fsl.families.width.records import (
    CAPACITY,
    RATE_CONFIG_KEY,
    TRAIN,
    CapacityReply,
    CapacityRequest,
    WidthTrainReply,
    WidthTrainRequest,
)
from flwr_fsl.families.width.rules import (
    EXTRACTIONS,
    CapacityMix,
    Extraction,
    WidthAssignment,
    WidthRule,
    WidthSpec,
    assignment_of,
    shard_channels,
)
from flwr_fsl.families.width.settings import WidthSettings
from flwr_fsl.submodel.aggregate import (
    accumulate_elements,
    apply_count_weighted,
    check_clipping_range,
    check_contribution,
    clip_update,
)
from flwr_fsl.submodel.layout import ElementUpdate, WidthLayout
from flwr_fsl.submodel.update import SubmodelUpdate

__all__ = ["WidthFedAvg"]

CAPACITY_MODES = ("query", "dynamic")


class WidthFedAvg(MultiPhaseStrategy):
    """FedAvg for heterogeneous clients by width extraction (rolling / static / random / shards).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key, \
train_metrics_aggr_fn, evaluate_metrics_aggr_fn, sampling_seed, max_weight
        As in :class:`~flwr_fsl.core.engine.PhasedStrategy` (Flower's ``FedAvg``).
    extraction : {"rolling", "static", "random", "shards"}
        FedRolex's rolling window (default), HeteroFL's static prefix, random channels per
        client and round, or SESA's random shards (drawn by the server here: a plaintext
        baseline, the server knows them).
    capacity : {"query", "dynamic"}
        Where a client's rate comes from: its node config, asked once per node
        (``"query"``), or a fresh draw from ``capacity_mix`` per client and round
        (``"dynamic"``).
    capacity_mix : str or CapacityMix, optional
        The distribution of ``"dynamic"`` mode, e.g. ``"a6-b10-c11-d18-e55"``.
    global_rate : float
        Rate of the global model (local widths are ``ceil(K * rate / global_rate)``).
    num_shards : int, optional
        ``S = 1 / B_min`` for ``extraction="shards"``.
    weighted : bool
        Weight each client's slice by ``weighted_by_key`` (``num-examples``) instead of
        FedRolex's unweighted mean.
    seed : int
        Seed of the random rule, the shard draws and dynamic capacities.
    spec : WidthSpec, optional
        The model's layer structure; default: inferred from the initial arrays
        (:meth:`WidthSpec.sequential`).
    clipping_range : float or None
        Largest change of one coordinate a client's slice may make (the secure strategies'
        setting and default, 8): larger finite changes are clipped to it, a non-finite
        value drops the client; None: no bound.

    Raises
    ------
    ConfigurationError
        If a setting is invalid (the message names it).

    Attributes
    ----------
    capacities : dict[int, float]
        Node id -> its capacity, as answered (``"query"`` mode).
    rates : dict[int, dict[int, float]]
        Round -> node id -> the rate it trained at.
    """

    PHASES = ("train with a per-client slice",)

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
        extraction: Extraction = "rolling",
        capacity: str = "query",
        capacity_mix: str | CapacityMix | None = None,
        global_rate: float = 1.0,
        num_shards: int | None = None,
        weighted: bool = False,
        seed: int = 0,
        spec: WidthSpec | None = None,
        sampling_seed: int | None = None,
        max_weight: float = 1e9,
        clipping_range: float | None = 8.0,
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
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
            sampling_seed=sampling_seed,
            max_weight=max_weight,
        )
        if extraction not in EXTRACTIONS:
            raise ConfigurationError(
                f"extraction must be one of {list(EXTRACTIONS)}, got {extraction!r}"
            )
        # WidthRule raises ConfigurationError naming global_rate / num_shards / seed.
        self.rule = WidthRule(extraction, global_rate, num_shards, seed)
        if capacity not in CAPACITY_MODES:
            raise ConfigurationError(
                f"capacity must be one of {list(CAPACITY_MODES)}, got {capacity!r}"
            )
        self.capacity = capacity
        self.capacity_mix: CapacityMix | None = None
        if capacity == "dynamic":
            if capacity_mix is None:
                raise ConfigurationError("capacity_mix is required with capacity='dynamic'")
            try:
                mix = (
                    capacity_mix
                    if isinstance(capacity_mix, CapacityMix)
                    else CapacityMix.parse(capacity_mix)
                )
                for rate in mix.rates:
                    self.rule.check_rate(rate)
            except ConfigurationError as err:
                raise ConfigurationError(f"capacity_mix: {err}") from err
            self.capacity_mix = mix
        elif capacity_mix is not None:
            raise ConfigurationError("capacity_mix applies only to capacity='dynamic'")
        if not isinstance(weighted, bool):
            raise ConfigurationError(f"weighted must be a bool, got {weighted!r}")
        if spec is not None and not isinstance(spec, WidthSpec):
            raise ConfigurationError(f"spec must be a WidthSpec, got {type(spec).__name__}")
        self.weighted = weighted
        self.spec = spec
        self.clipping_range = check_clipping_range(clipping_range)
        # Validated once, here; every train message carries it (one versioned record).
        self.settings = WidthSettings(configrecord_key)
        self.capacities: dict[int, float] = {}
        self.rates: dict[int, dict[int, float]] = {}
        self._widths: dict[str, int] = {}

    @property
    def extraction(self) -> str:
        """The extraction rule."""
        return self.rule.extraction

    def summary(self) -> None:
        """Log the strategy's settings."""
        super().summary()
        log(
            INFO,
            "\t├── Width extraction: %s, capacity %s%s, global rate %s, %s mean",
            self.rule.extraction,
            self.capacity,
            f" ({self.capacity_mix})" if self.capacity_mix else "",
            self.rule.global_rate,
            "num-examples-weighted" if self.weighted else "unweighted",
        )

    # -- before round 1 -------------------------------------------------------------------------
    def prepare_model(self, arrays: ArrayRecord, train_config: ConfigRecord | None) -> None:
        """Check the layer structure against the model and the train config (before round 1).

        Raises
        ------
        ConfigurationError
            If the structure does not fit the model (``spec``), a layer does not split into
            ``num_shards`` equal shards, or the train config uses the reserved
            ``width-rate`` key.
        """
        model = {name: array.numpy() for name, array in arrays.items()}
        try:
            spec = self.spec if self.spec is not None else WidthSpec.sequential(model)
            widths = spec.widths(model)
        except ConfigurationError as err:
            raise ConfigurationError(f"spec: {err}") from err
        if not widths:
            raise ConfigurationError("spec: the model has no scaled (hidden) layer")
        if self.rule.num_shards is not None:
            for layer, width in widths.items():
                try:
                    shard_channels(width, self.rule.num_shards, [0])
                except ConfigurationError as err:
                    raise ConfigurationError(f"num_shards: layer {layer!r}: {err}") from err
        if train_config is not None and RATE_CONFIG_KEY in train_config:
            raise ConfigurationError(
                f"train_config key {RATE_CONFIG_KEY!r} is reserved: the client mod sets it"
            )
        self.spec, self._widths = spec, widths

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Check the model and config (:meth:`prepare_model`), then run as ``FedAvg.start``."""
        self.prepare_model(initial_arrays, train_config)
        return super().start(
            grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn
        )

    # -- a round ---------------------------------------------------------------------------------
    def round_rates(self, grid: Grid, state: RoundState, nodes: list[int]) -> dict[int, float]:
        """Every sampled node's rate this round (asking unknown nodes in ``"query"`` mode)."""
        if self.capacity == "dynamic":
            mix = self.capacity_mix
            assert mix is not None
            return {n: mix.draw(self.rule.seed, state.server_round, n) for n in nodes}
        unknown = [n for n in nodes if n not in self.capacities]
        if unknown:
            answers: dict[int, float] = {}

            def accept(node: int, reply: CapacityReply) -> None:
                try:
                    answers[node] = self.rule.check_rate(reply.rate)
                except ValueError as err:
                    raise ClientInputError(f"capacity: {err}") from err

            request = CapacityRequest()
            self.send_phase(
                grid, state, CAPACITY, dict.fromkeys(unknown, request), accept=accept
            )  # fmt: skip
            self.capacities.update(answers)
        # The phase shrank the survivors to the nodes it asked: add back the known ones.
        state.survivors = [n for n in nodes if n in self.capacities and n not in state.dropped]
        return {n: self.capacities[n] for n in state.survivors}

    def slice_requests(
        self,
        state: RoundState,
        model: dict[str, NDArray[Any]],
        rates: dict[int, float],
        round_config: ConfigRecord,
    ) -> tuple[dict[int, WidthAssignment], dict[int, WidthLayout], dict[int, WidthTrainRequest]]:
        """Each node's width assignment, layout and train request (its slice of ``model``)."""
        assert self.spec is not None
        assignments: dict[int, WidthAssignment] = {}
        layouts: dict[int, WidthLayout] = {}
        requests: dict[int, WidthTrainRequest] = {}
        for node, rate in rates.items():
            assignment = assignment_of(self.rule, self._widths, rate, state.server_round, node)
            layout = self.spec.layout(model, assignment.indices)
            narrow = {k: Array(np.ascontiguousarray(v)) for k, v in layout.extract(model).items()}
            assignments[node], layouts[node] = assignment, layout
            beside = RecordDict(
                {self.arrayrecord_key: ArrayRecord(narrow), self.configrecord_key: round_config}
            )
            requests[node] = WidthTrainRequest(assignment, self.settings, beside)
        return assignments, layouts, requests

    def slice_update(
        self,
        state: RoundState,
        model: dict[str, NDArray[Any]],
        layout: WidthLayout,
        node: int,
        content: RecordDict,
    ) -> SubmodelUpdate:
        """Check a node's trained slice and return its bounded delta update.

        Raises
        ------
        ClientInputError
            If the reply is malformed, its weight invalid, a value not finite, or the update
            could overflow the round's sums (finite changes are clipped to ``clipping_range``).
        """
        trained = list(content.array_records.values())
        if len(trained) != 1:
            raise ClientInputError(f"expected one ArrayRecord, got {len(trained)}")
        weight = self.weight_of(content)
        load = array_loader(trained[0])  # bytes that do not parse drop the client
        sub = {name: load(name) for name in trained[0].keys()}
        for name in layout.base.names:
            if name in sub and not np.issubdtype(sub[name].dtype, np.floating):
                raise ClientInputError(f"{name}: expected floating values")
        update = layout.delta(model, sub, weight if self.weighted else 1.0)
        clipped = clip_update(update, self.clipping_range)
        check_contribution(update, self.max_weight, len(state.sampled))
        if clipped:
            log(INFO, "node %s: %d coordinates clipped to clipping_range", node, clipped)
        return update

    def train_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run one round (module docstring); None arrays when no client's slice came back."""
        if not self._widths:
            self.prepare_model(arrays, None)
        model = {name: array.numpy() for name, array in arrays.items()}
        state.model = model
        nodes = self.sample(state, grid)
        if not nodes:
            return None, None
        rates = self.round_rates(grid, state, nodes)
        self.rates[state.server_round] = dict(rates)
        round_config = ConfigRecord({**dict(config), "server-round": state.server_round})
        assignments, layouts, requests = self.slice_requests(state, model, rates, round_config)
        log(
            INFO,
            "round %s: %s clients by rate %s",
            state.server_round,
            self.rule.extraction,
            dict(sorted(Counter(rates.values()).items(), reverse=True)),
        )
        parts: dict[int, tuple[ElementUpdate, RecordDict]] = {}

        def accept(node: int, reply: WidthTrainReply) -> None:
            if reply.digest != assignments[node].digest:
                raise ClientInputError(
                    "the reply does not name this round's width assignment (install width_mod)"
                )
            update = self.slice_update(state, model, layouts[node], node, reply.beside)
            metrics = RecordDict(dict(reply.beside.metric_records))
            parts[node] = (layouts[node].elements(update), metrics)

        stream = self.stream_phase(grid, state, TRAIN, requests, accept=accept)
        del requests
        size = next(iter(layouts.values())).size if layouts else 0
        sums, counts = np.zeros((size, 1)), np.zeros(size)
        replies: list[RecordDict] = []
        for node, _reply in stream:
            part, reply_metrics = parts.pop(node)
            s, c = accumulate_elements(size, 1, [part])
            sums += s
            counts += c
            replies.append(reply_metrics)
        if not replies:
            log(WARNING, "round %s: no valid reply; the model is unchanged", state.server_round)
            return None, None
        base = layouts[state.survivors[0]]
        new = apply_count_weighted(model, base, sums, counts)
        metrics = self.client_metrics(self.train_metrics_aggr_fn, replies)
        for key, value in self.phase_metrics(state).items():
            metrics[key] = value
        metrics["touched-fraction"] = float(np.count_nonzero(counts > 0)) / max(1, size)
        used = [rates[n] for n in state.survivors]
        metrics["mean-rate"] = float(np.mean(used))
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in new.items()}), metrics
