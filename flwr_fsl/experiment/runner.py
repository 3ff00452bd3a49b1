"""Experiments: several strategies ("arms") trained from the same seed in one ServerApp.

An example app compares protocols — secure vs plaintext aggregation, several secure protocols,
several width-extraction rules — by training the same model once per arm inside one
``@app.main`` and printing one comparison. :class:`Experiment` is that loop, written once:

- every arm starts from the same initial arrays and samples the same clients in every round;
- per round it records the evaluation metrics (the centralized ``evaluate_fn`` and the clients'
  aggregated train and evaluate metrics), the bytes per client of the training phases and of
  evaluation (from the strategy's ``traffic`` log), the wall time of the round split into time
  spent waiting on the grid and the server's own time, dropped replies and failed rounds;
- it prints the same tables for every family (:func:`round_table`, :func:`summary_table`,
  :func:`learns_text`), with "what each party learns" supplied by each arm;
- with a results folder it writes the history JSON through
  :func:`flwr_fsl.reporting.save_histories` (read it back with :func:`load_experiment` or
  :func:`flwr_fsl.reporting.load_histories`), an accuracy plot when there is centralized
  accuracy, and optionally each arm's final model (``global-model-<key>.npz``);
- it raises :class:`ExperimentFailedError` (after printing and saving) when an arm aggregated no
  round at all, so ``flwr run`` never ends "completed" with an untrained model.

The harness is protocol-agnostic: an arm's strategy is any Flower
:class:`~flwr.serverapp.strategy.Strategy` whose ``start`` has Flower's signature and calls
``evaluate_fn`` after each round (Flower's loop does). Its ``traffic`` (a list of
:class:`~flwr_fsl.core.traffic.RoundTraffic`), ``dropped`` and ``failed_rounds`` are read when it
has them, as :class:`~flwr_fsl.strategies.FedSubAvg` and its subclasses do; without ``traffic`` the
byte columns read ``n/a``.

**Bytes per client per round.** The phases of a round other than ``"evaluate"`` are its training
phases (``"psr"`` + ``"train"``, later ``"advertise"`` … ``"unmask"``). Download is the mean, over
the nodes sent a message in those phases, of the bytes sent to each; upload is the mean, over
the nodes that replied in them, of the bytes each sent (what :class:`RoundTraffic` means by a
phase's mean, summed over phases per node). Evaluation bytes are reported separately.

**Time.** ``seconds`` of a round runs from the end of the previous round's centralized
evaluation to the start of this round's; ``grid_seconds`` is the part spent inside the grid
(``send_and_receive``, push/pull, waiting for nodes): client computation and transport in
simulation and deployment; ``server_seconds`` is the rest (S0's own work, including its calls to
a helper server); centralized evaluation is ``eval_seconds``, outside both.

Usage (inside ``@app.main``)::

    experiment = Experiment(
        name="my-app",
        arms=[
            Arm("secure", "secure (SSA)", lambda setup: SecureFedSubAvg(helper, 0.1),
                learns={"S0": "the aggregate only", "S1": "nothing"}, equivalent_to="plain"),
            Arm("plain", "plaintext", lambda setup: FedSubAvg(), train_config={"topk-count": k},
                learns={"server": "each client's top-k indices and values"}),
        ],
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=5,
        sampling_seed=42,
        metrics=[Metric("acc %", "accuracy", scale=100, digits=2)],
        evaluate_fn=global_evaluate,
        baseline="plain",
    )
    result = experiment.run(grid)
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore.run import Run
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError, FSLError
from flwr_fsl.core.traffic import RoundTraffic
from flwr_fsl.reporting import RunHistory, plot_histories, save_histories

__all__ = [
    "EXPERIMENT_FORMAT",
    "Arm",
    "ArmRecord",
    "ArmRun",
    "ArmSetup",
    "Experiment",
    "ExperimentFailedError",
    "ExperimentRecord",
    "ExperimentResult",
    "Metric",
    "PhaseBytes",
    "RoundRecord",
    "learns_text",
    "load_experiment",
    "max_abs_difference",
    "round_bytes",
    "round_table",
    "sampling_kwargs",
    "summary_table",
]

EXPERIMENT_FORMAT = "flwr_fsl.experiment/1"
EVALUATE_PHASE = "evaluate"
MODEL_FILE = "global-model-{}.npz"
_KEY_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]*")

MetricSource = Literal["server", "train", "evaluate"]
ConfigValue = int | float | str | bytes | bool


class ExperimentFailedError(FSLError, RuntimeError):
    """An arm of the experiment aggregated no round: the run must end as failed.

    Not a per-client or per-round error (those are handled inside the strategies): it ends the
    ServerApp after the comparison has been printed and saved.
    """


# -- definitions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """A per-round number shown in the tables, read from one of the round's metric records.

    Parameters
    ----------
    title : str
        Column title (``"acc %"``, ``"RMSE"``); the summary's headline column is
        ``"final <title>"``.
    key : str
        Metric name in the record (``"accuracy"``, ``"mse"``).
    source : {"server", "train", "evaluate"}
        ``"server"``: the centralized ``evaluate_fn``; ``"train"`` / ``"evaluate"``: the
        strategy's aggregate of the clients' train / evaluate metrics.
    scale : float
        Factor applied to the value (100 for a percentage).
    sqrt : bool
        Take the square root first (RMSE from a mean squared error).
    digits : int
        Decimals printed.
    """

    title: str
    key: str
    source: MetricSource = "server"
    scale: float = 1.0
    sqrt: bool = False
    digits: int = 4

    def __post_init__(self) -> None:
        if self.source not in ("server", "train", "evaluate"):
            raise ConfigurationError(
                f"metric {self.title!r}: source must be server, train or evaluate"
            )
        if not self.title or not self.key or self.digits < 0:
            raise ConfigurationError("a metric needs a title, a key and digits >= 0")

    def value(self, record: RoundRecord) -> float | None:
        """Return this metric in round ``record`` (None when it was not reported)."""
        raw = {
            "server": record.server_metrics,
            "train": record.train_metrics,
            "evaluate": record.evaluate_metrics,
        }[self.source].get(self.key)
        if raw is None or (self.sqrt and raw < 0):
            return None
        return (math.sqrt(raw) if self.sqrt else raw) * self.scale


@dataclass(frozen=True)
class ArmSetup:
    """What an arm's strategy factory receives.

    Attributes
    ----------
    run_config : Mapping[str, Any]
        The experiment's run config with the arm's ``overrides`` on top.
    sampling_seed : int
        The experiment's client-sampling seed (the same for every arm).
    session : str
        An id unique to this arm in this experiment (also sent to clients under the
        experiment's ``session_keys``).
    """

    run_config: Mapping[str, Any]
    sampling_seed: int
    session: str


@dataclass(frozen=True)
class Arm:
    """One training of an experiment: a strategy and what distinguishes it.

    Parameters
    ----------
    key : str
        Short id (lowercase letters, digits, ``-``, ``_``): JSON keys, file names, sessions.
    label : str
        Name printed in the tables.
    strategy : Callable[[ArmSetup], Strategy]
        Builds a fresh strategy for this arm.
    learns : Mapping[str, str]
        Party -> what it learns about a client in this arm (printed under the summary).
    overrides : Mapping[str, Any]
        Run-config keys replaced for this arm (seen by ``strategy`` through
        :attr:`ArmSetup.run_config`; clients see only ``train_config`` / ``evaluate_config``).
    train_config, evaluate_config : Mapping[str, ConfigValue]
        Entries added to the experiment's train / evaluate ``ConfigRecord`` for this arm.
    equivalent_to : str, optional
        Key of an arm that computes the same model (e.g. the plaintext twin of a secure arm):
        the largest absolute difference of the two final models is printed and saved.
    description : str
        Printed in the arm's header line (e.g. ``"top-k 1838 coordinates"``).
    """

    key: str
    label: str
    strategy: Callable[[ArmSetup], Strategy]
    learns: Mapping[str, str] = field(default_factory=dict)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    train_config: Mapping[str, ConfigValue] = field(default_factory=dict)
    evaluate_config: Mapping[str, ConfigValue] = field(default_factory=dict)
    equivalent_to: str | None = None
    description: str = ""


class _SamplingSettings(Protocol):
    fraction_train: float
    fraction_evaluate: float
    min_nodes: int


def sampling_kwargs(settings: _SamplingSettings) -> dict[str, Any]:
    """Return Flower ``FedAvg``'s sampling arguments from the examples' three settings.

    Parameters
    ----------
    settings : object
        Has ``fraction_train``, ``fraction_evaluate`` and ``min_nodes``.

    Returns
    -------
    dict[str, Any]
        ``fraction_train``, ``fraction_evaluate``, ``min_train_nodes``,
        ``min_evaluate_nodes`` (0 without client evaluation) and ``min_available_nodes``.
    """
    return {
        "fraction_train": settings.fraction_train,
        "fraction_evaluate": settings.fraction_evaluate,
        "min_train_nodes": settings.min_nodes,
        "min_evaluate_nodes": settings.min_nodes if settings.fraction_evaluate > 0 else 0,
        "min_available_nodes": settings.min_nodes,
    }


# -- records (JSON) ---------------------------------------------------------------------------
@dataclass
class PhaseBytes:
    """Bytes of one phase of one round, mean per node.

    Attributes
    ----------
    nodes : int
        Nodes sent a message in the phase.
    down_bytes : float
        Mean bytes sent per node that was sent a message.
    up_bytes : float
        Mean bytes received per node that replied.
    """

    nodes: int
    down_bytes: float
    up_bytes: float


@dataclass
class RoundRecord:
    """One round of one arm.

    Attributes
    ----------
    server_round : int
        The round (1-based).
    server_metrics, train_metrics, evaluate_metrics : dict[str, float]
        Centralized evaluation after the round; the strategy's aggregate of the clients'
        train and evaluate metrics (numbers only).
    phases : dict[str, PhaseBytes]
        Per phase of the round (``"train"``, ``"psr"``, ``"evaluate"``, ...).
    clients : int | None
        Nodes sent a message in a training phase (the round's sampled clients); None without
        traffic log.
    down_bytes, up_bytes : float | None
        Bytes per client of the training phases (module docstring); None without traffic log.
    eval_down_bytes, eval_up_bytes : float | None
        The same for the evaluate phase (None if there was none).
    aggregated : bool
        Whether the round changed the global model.
    dropped : dict[int, str]
        Node id -> why its reply was dropped.
    failed : str | None
        Why the round failed, if the strategy says so.
    seconds, grid_seconds, eval_seconds : float | None
        Wall time of the round, the part of it inside the grid, and the centralized
        evaluation after it (None when the strategy never called ``evaluate_fn``).
    """

    server_round: int
    server_metrics: dict[str, float] = field(default_factory=dict)
    train_metrics: dict[str, float] = field(default_factory=dict)
    evaluate_metrics: dict[str, float] = field(default_factory=dict)
    phases: dict[str, PhaseBytes] = field(default_factory=dict)
    clients: int | None = None
    down_bytes: float | None = None
    up_bytes: float | None = None
    eval_down_bytes: float | None = None
    eval_up_bytes: float | None = None
    aggregated: bool = False
    dropped: dict[int, str] = field(default_factory=dict)
    failed: str | None = None
    seconds: float | None = None
    grid_seconds: float | None = None
    eval_seconds: float | None = None

    @property
    def server_seconds(self) -> float | None:
        """The server's own time in the round: ``seconds - grid_seconds``."""
        if self.seconds is None or self.grid_seconds is None:
            return None
        return max(0.0, self.seconds - self.grid_seconds)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoundRecord:
        """Rebuild a record from :func:`dataclasses.asdict` output (JSON round trip)."""
        values = dict(data)
        values["phases"] = {k: PhaseBytes(**v) for k, v in data.get("phases", {}).items()}
        values["dropped"] = {int(k): str(v) for k, v in data.get("dropped", {}).items()}
        values.pop("server_seconds", None)
        return cls(**values)


@dataclass
class ArmRecord:
    """Everything measured in one arm (JSON-serializable through :meth:`to_dict`).

    Attributes
    ----------
    key, label, description : str
        As in :class:`Arm`.
    learns : dict[str, str]
        Party -> what it learns.
    overrides : dict[str, Any]
        The arm's run-config overrides.
    equivalent_to : str | None
        Key of the arm that computes the same model.
    max_abs_diff : float | None
        ``max |this - equivalent_to|`` over the final models.
    initial_metrics : dict[str, float]
        Centralized evaluation of the initial model (round 0), if any.
    rounds : list[RoundRecord]
        Rounds 1..N.
    seconds : float
        Wall time of the whole training (``strategy.start``).
    """

    key: str
    label: str
    description: str = ""
    learns: dict[str, str] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    equivalent_to: str | None = None
    max_abs_diff: float | None = None
    initial_metrics: dict[str, float] = field(default_factory=dict)
    rounds: list[RoundRecord] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def aggregated_rounds(self) -> list[int]:
        """Rounds that changed the global model."""
        return [r.server_round for r in self.rounds if r.aggregated]

    def final(self, metric: Metric) -> float | None:
        """Return ``metric`` after the last round that reported it (None if none did)."""
        values = [metric.value(r) for r in self.rounds]
        if metric.source == "server" and not any(v is not None for v in values):
            values = [metric.value(RoundRecord(0, server_metrics=self.initial_metrics))]
        reported = [v for v in values if v is not None]
        return reported[-1] if reported else None

    def mean(self, name: str) -> float | None:
        """Return the mean of a :class:`RoundRecord` number over the rounds that have it."""
        values = [getattr(r, name) for r in self.rounds]
        known = [float(v) for v in values if v is not None]
        return sum(known) / len(known) if known else None

    def to_dict(self) -> dict[str, Any]:
        """Return the record as a JSON-serializable dict (with summary means)."""
        out = asdict(self)
        out["aggregated_rounds"] = self.aggregated_rounds
        for name in ("down_bytes", "up_bytes", "eval_down_bytes", "seconds", "grid_seconds"):
            out[f"mean_{name}"] = self.mean(name)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArmRecord:
        """Rebuild a record from :meth:`to_dict` output (summary fields are ignored).

        Raises
        ------
        ValueError
            If a field is missing or malformed.
        """
        try:
            return cls(
                key=str(data["key"]),
                label=str(data["label"]),
                description=str(data.get("description", "")),
                learns={str(k): str(v) for k, v in data.get("learns", {}).items()},
                overrides=dict(data.get("overrides", {})),
                equivalent_to=data.get("equivalent_to"),
                max_abs_diff=data.get("max_abs_diff"),
                initial_metrics=dict(data.get("initial_metrics", {})),
                rounds=[RoundRecord.from_dict(r) for r in data["rounds"]],
                seconds=float(data["seconds"]),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed arm record: {err!r}") from None


@dataclass
class ExperimentRecord:
    """The measured part of an experiment: what the results JSON holds.

    Attributes
    ----------
    name : str
        The experiment's name (also the JSON file's stem).
    arms : list[ArmRecord]
        In the order they ran.
    baseline : str | None
        Key of the arm the relative columns refer to.
    sampling_seed : int
        The client-sampling seed.
    extra : dict[str, Any]
        What the experiment's ``extras`` callback returned.
    """

    name: str
    arms: list[ArmRecord]
    baseline: str | None = None
    sampling_seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def arm(self, key: str) -> ArmRecord:
        """Return the arm with this key.

        Raises
        ------
        KeyError
            If there is none.
        """
        for record in self.arms:
            if record.key == key:
                return record
        raise KeyError(f"no arm {key!r} in experiment {self.name!r}")

    def to_dict(self) -> dict[str, Any]:
        """Return the record as a JSON-serializable dict."""
        return {
            "format": EXPERIMENT_FORMAT,
            "name": self.name,
            "baseline": self.baseline,
            "sampling_seed": self.sampling_seed,
            "arms": [a.to_dict() for a in self.arms],
            "extra": self.extra,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentRecord:
        """Rebuild a record from :meth:`to_dict` output.

        Raises
        ------
        ValueError
            If the format tag is not :data:`EXPERIMENT_FORMAT` or a field is malformed.
        """
        if not isinstance(data, Mapping) or data.get("format") != EXPERIMENT_FORMAT:
            raise ValueError(f"not a {EXPERIMENT_FORMAT} record")
        try:
            return cls(
                name=str(data["name"]),
                arms=[ArmRecord.from_dict(a) for a in data["arms"]],
                baseline=data.get("baseline"),
                sampling_seed=int(data.get("sampling_seed", 0)),
                extra=dict(data.get("extra", {})),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"malformed experiment record: {err!r}") from None


def load_experiment(path: str | Path) -> ExperimentRecord:
    """Read the experiment record from a results JSON written by :meth:`Experiment.run`.

    Parameters
    ----------
    path : str | Path
        The ``<name>.json`` file (a :func:`flwr_fsl.reporting.save_histories` document whose
        ``meta["experiment"]`` holds the record).

    Returns
    -------
    ExperimentRecord
        The record.

    Raises
    ------
    ValueError
        If the file holds no experiment record of a supported format.
    """
    doc = json.loads(Path(path).read_text())
    meta = doc.get("meta") if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or "experiment" not in meta:
        raise ValueError(f"{path} holds no experiment record")
    return ExperimentRecord.from_dict(meta["experiment"])


# -- live results -----------------------------------------------------------------------------
@dataclass
class ArmRun:
    """One arm after training: its record and the live objects.

    Attributes
    ----------
    arm : Arm
        The definition.
    record : ArmRecord
        What was measured.
    strategy : Strategy
        The strategy after the run (``traffic``, ``dropped``, ``failed_rounds``, ...).
    result : Result
        What ``strategy.start`` returned.
    arrays : dict[str, numpy.ndarray]
        The final global model.
    """

    arm: Arm
    record: ArmRecord
    strategy: Strategy
    result: Result
    arrays: dict[str, NDArray[Any]]


@dataclass
class ExperimentResult:
    """What :meth:`Experiment.run` returns.

    Attributes
    ----------
    record : ExperimentRecord
        The measurements (what the JSON holds).
    runs : list[ArmRun]
        The arms with their strategies, results and final models.
    """

    record: ExperimentRecord
    runs: list[ArmRun]

    def arm(self, key: str) -> ArmRun:
        """Return the run of the arm with this key.

        Raises
        ------
        KeyError
            If there is none.
        """
        for run in self.runs:
            if run.arm.key == key:
                return run
        raise KeyError(f"no arm {key!r} in experiment {self.record.name!r}")


# -- traffic ----------------------------------------------------------------------------------
def round_bytes(
    traffic: Iterable[RoundTraffic], server_round: int
) -> tuple[dict[str, PhaseBytes], int, float | None, float | None]:
    """Summarize one round of a strategy's traffic log.

    Parameters
    ----------
    traffic : Iterable[RoundTraffic]
        The strategy's ``traffic`` (several entries of one phase and round are added up;
        entries that moved no bytes are left out).
    server_round : int
        The round.

    Returns
    -------
    tuple
        ``(phases, clients, down, up)``: per phase the node count and mean bytes; the nodes
        sent a message in a training phase (every phase but ``"evaluate"``); and the training
        phases' bytes per client — down averaged over those nodes, up over the nodes that
        replied in a training phase (None for both when the round has no training phase).
    """
    per_phase: dict[str, tuple[Counter[int], Counter[int]]] = {}
    for t in traffic:
        if t.server_round != server_round or not (t.down_bytes or t.up_bytes):
            continue  # another round, or a phase that sent nothing (e.g. no evaluation)
        down, up = per_phase.setdefault(t.phase, (Counter(), Counter()))
        down.update(t.down_bytes)  # adds bytes per node
        up.update(t.up_bytes)
    phases = {
        name: PhaseBytes(len(down), _mean(down.values()) or 0.0, _mean(up.values()) or 0.0)
        for name, (down, up) in per_phase.items()
    }
    train_down: Counter[int] = Counter()
    train_up: Counter[int] = Counter()
    for name, (down, up) in per_phase.items():
        if name != EVALUATE_PHASE:
            train_down.update(down)
            train_up.update(up)
    if not train_down and not train_up:
        return phases, 0, None, None
    return phases, len(train_down), _mean(train_down.values()) or 0.0, _mean(train_up.values())


def _mean(values: Iterable[float]) -> float | None:
    items = list(values)
    return sum(items) / len(items) if items else None


# -- instrumentation --------------------------------------------------------------------------
class _RoundClock:
    """Round boundaries from ``evaluate_fn`` calls; grid time accumulated per round."""

    def __init__(self, initial: ArrayRecord) -> None:
        self.boundary = time.perf_counter()
        self.grid = 0.0
        self.previous: ArrayRecord = initial
        self.seconds: dict[int, float] = {}
        self.grid_seconds: dict[int, float] = {}
        self.eval_seconds: dict[int, float] = {}
        self.changed: dict[int, bool] = {}

    def wrap(
        self, evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None
    ) -> Callable[[int, ArrayRecord], MetricRecord | None]:
        def timed_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            entered = time.perf_counter()
            if server_round > 0:
                self.seconds[server_round] = entered - self.boundary
                self.grid_seconds[server_round] = self.grid
                # Flower's loop passes the same object on when a round aggregated nothing.
                self.changed[server_round] = arrays is not self.previous
            self.previous = arrays
            try:
                return evaluate_fn(server_round, arrays) if evaluate_fn is not None else None
            finally:
                self.boundary = time.perf_counter()
                self.grid = 0.0
                if server_round > 0:
                    self.eval_seconds[server_round] = self.boundary - entered

        return timed_evaluate


class _MeteredGrid(Grid):
    """A grid that forwards everything to another and adds the time spent in it to a clock."""

    def __init__(self, inner: Grid, clock: _RoundClock) -> None:
        self._inner, self._clock = inner, clock

    def _timed(self, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return call()
        finally:
            self._clock.grid += time.perf_counter() - started

    def set_run(self, run: Run) -> None:
        """Forward to the wrapped grid."""
        self._inner.set_run(run)

    @property
    def run(self) -> Run:
        """The wrapped grid's run."""
        return self._inner.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Forward to the wrapped grid."""
        return self._inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """Forward to the wrapped grid (timed: a real grid may wait for nodes)."""
        return list(self._timed(lambda: list(self._inner.get_node_ids())))

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Forward to the wrapped grid (timed)."""
        return list(self._timed(lambda: list(self._inner.push_messages(messages))))

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Forward to the wrapped grid (timed)."""
        return list(self._timed(lambda: list(self._inner.pull_messages(message_ids))))

    @property
    def synchronous(self) -> bool:
        """Whether the wrapped grid has every reply as soon as it pushed the messages."""
        return bool(getattr(self._inner, "synchronous", False))

    @property
    def pull_interval(self) -> float:
        """The wrapped grid's pause between pulls."""
        return float(getattr(self._inner, "pull_interval", 0.1))

    def pause(self, seconds: float) -> None:
        """Wait between pulls for replies (timed: it is time spent waiting for the grid)."""
        self._timed(lambda: time.sleep(seconds))

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Forward to the wrapped grid (timed)."""
        return list(
            self._timed(lambda: list(self._inner.send_and_receive(messages, timeout=timeout)))
        )


_NOT_SEEDABLE = object()


def _reseed_sampling(strategy: Strategy, seed: int) -> None:
    """Give ``strategy`` the experiment's client sample in every round.

    ``flwr_fsl`` strategies sample with their own ``sampling_seed``
    (:meth:`flwr_fsl.strategies.PhasedStrategy.sample`): the harness sets it (and refuses a
    different one). Flower's own strategies sample with the module-level :mod:`random`, which
    Flower's heartbeat and retry code draw from as well, so for them the same rule is applied
    by re-seeding that generator just before each round's sampling: train with
    ``seed * 1_000_003 + round``, evaluation with ``"evaluate/<seed>/<round>"`` — the streams
    the engine uses, so both kinds sample the same clients.

    Raises
    ------
    ConfigurationError
        If the strategy was built with another ``sampling_seed``.
    """
    own = getattr(strategy, "sampling_seed", _NOT_SEEDABLE)
    if own is not _NOT_SEEDABLE:
        if own is not None and own != seed:
            raise ConfigurationError(
                f"the strategy samples with sampling_seed={own}, the experiment with {seed}"
            )
        strategy.sampling_seed = seed  # type: ignore[attr-defined]
        return
    configure_train, configure_evaluate = strategy.configure_train, strategy.configure_evaluate

    def seeded_train(
        server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        random.seed(seed * 1_000_003 + server_round)
        return configure_train(server_round, arrays, config, grid)

    def seeded_evaluate(
        server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        random.seed(f"evaluate/{seed}/{server_round}")
        return configure_evaluate(server_round, arrays, config, grid)

    # Instance attributes shadow the methods Flower's loop calls (``self.configure_train``).
    setattr(strategy, "configure_train", seeded_train)  # noqa: B010
    setattr(strategy, "configure_evaluate", seeded_evaluate)  # noqa: B010


# -- the experiment ---------------------------------------------------------------------------
@dataclass
class Experiment:
    """Several arms trained from the same initial arrays and client-sampling seed.

    Parameters
    ----------
    name : str
        Printed in headers; the results JSON is ``<name>.json``.
    arms : Sequence[Arm]
        The trainings, run in this order.
    initial_arrays : ArrayRecord
        The initial global model of every arm (copied per arm).
    num_rounds : int
        Rounds per arm.
    sampling_seed : int
        Client-sampling seed shared by the arms.
    run_config : Mapping[str, Any]
        The run config (``context.run_config``): the base of each arm's
        :attr:`ArmSetup.run_config`, saved with the results.
    metrics : Sequence[Metric]
        Columns of the per-round table; the first is the summary's headline.
    evaluate_fn : Callable[[int, ArrayRecord], MetricRecord | None], optional
        Centralized evaluation, as in Flower's ``Strategy.start``.
    train_config, evaluate_config : Mapping[str, ConfigValue]
        ``ConfigRecord`` entries of every arm (each arm adds its own).
    session_keys : Sequence[str]
        Config keys set to the arm's session id in both configs, so clients that keep state
        between rounds (error-feedback residuals, personal parameters) start afresh per arm.
    baseline : str, optional
        Key of the arm the relative summary columns refer to (default: the first arm).
    results_dir : str | Path, optional
        Folder for ``<name>.json``, ``<name>.png`` and the models; None saves nothing.
    save_models : bool
        Also write each arm's final model to ``global-model-<key>.npz``.
    timeout : float
        Per-phase reply timeout passed to ``strategy.start``.
    extras : Callable[[ExperimentResult], Mapping[str, Any] | None], optional
        Called after the common tables are printed: prints the app's own sections and returns
        JSON-serializable data stored as ``extra`` in the record.

    Raises
    ------
    ConfigurationError
        If arms are missing, keys are malformed or repeated, a referenced key is unknown, or
        ``num_rounds < 1``.
    """

    name: str
    arms: Sequence[Arm]
    initial_arrays: ArrayRecord
    num_rounds: int
    sampling_seed: int
    run_config: Mapping[str, Any] = field(default_factory=dict)
    metrics: Sequence[Metric] = ()
    evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None
    train_config: Mapping[str, ConfigValue] = field(default_factory=dict)
    evaluate_config: Mapping[str, ConfigValue] = field(default_factory=dict)
    session_keys: Sequence[str] = ()
    baseline: str | None = None
    results_dir: str | Path | None = None
    save_models: bool = False
    timeout: float = 3600.0
    extras: Callable[[ExperimentResult], Mapping[str, Any] | None] | None = None

    def __post_init__(self) -> None:
        if not self.arms:
            raise ConfigurationError(f"experiment {self.name!r} has no arms")
        if self.num_rounds < 1:
            raise ConfigurationError(f"num_rounds must be >= 1, got {self.num_rounds}")
        keys = [a.key for a in self.arms]
        for key in keys:
            if not _KEY_PATTERN.fullmatch(key):
                raise ConfigurationError(
                    f"arm key {key!r} must be lowercase letters, digits, '-' or '_'"
                )
        for seen, name in ((keys, "key"), ([a.label for a in self.arms], "label")):
            if len(set(seen)) != len(seen):
                raise ConfigurationError(f"arm {name}s must be unique, got {seen}")
        for arm in self.arms:
            if arm.equivalent_to is not None and arm.equivalent_to not in keys:
                raise ConfigurationError(
                    f"arm {arm.key!r}: equivalent_to {arm.equivalent_to!r} is not an arm"
                )
            if arm.equivalent_to == arm.key:
                raise ConfigurationError(f"arm {arm.key!r} is equivalent_to itself")
        if self.baseline is not None and self.baseline not in keys:
            raise ConfigurationError(f"baseline {self.baseline!r} is not an arm")

    def run(self, grid: Grid) -> ExperimentResult:
        """Train every arm, print the comparison, save it, and check every arm trained.

        Parameters
        ----------
        grid : Grid
            Flower's grid in a ServerApp, or :class:`flwr_fsl.testing.InProcessGrid`.

        Returns
        -------
        ExperimentResult
            Records, strategies, results and final models.

        Raises
        ------
        ExperimentFailedError
            If an arm aggregated no round (raised after printing and saving).
        """
        nonce = f"{time.time_ns():x}"
        runs = [self._run_arm(grid, arm, f"{self.name}/{arm.key}@{nonce}") for arm in self.arms]
        for run in runs:
            other = run.arm.equivalent_to
            if other is not None:
                run.record.max_abs_diff = max_abs_difference(
                    run.arrays, next(r.arrays for r in runs if r.arm.key == other)
                )
        baseline = self.baseline or self.arms[0].key
        record = ExperimentRecord(self.name, [r.record for r in runs], baseline, self.sampling_seed)
        result = ExperimentResult(record, runs)
        print("\n" + round_table(record, self.metrics), flush=True)
        print("\n" + summary_table(record, self.metrics), flush=True)
        print("\n" + learns_text(record), flush=True)
        for arm_record in record.arms:
            if arm_record.max_abs_diff is not None:
                other_label = record.arm(arm_record.equivalent_to or "").label
                print(
                    f"max |{arm_record.label} - {other_label}| over the final models: "
                    f"{arm_record.max_abs_diff:.3g}",
                    flush=True,
                )
        if self.extras is not None:
            record.extra = dict(self.extras(result) or {})
        if self.results_dir:
            self._save(result, Path(self.results_dir))
        idle = [r.label for r in record.arms if not r.aggregated_rounds]
        if idle:
            # Flower would still mark the run completed: fail it visibly instead.
            raise ExperimentFailedError(
                f"no round aggregated any client update in: {', '.join(idle)}"
            )
        return result

    def _run_arm(self, grid: Grid, arm: Arm, session: str) -> ArmRun:
        setup = ArmSetup({**self.run_config, **arm.overrides}, self.sampling_seed, session)
        strategy = arm.strategy(setup)
        _reseed_sampling(strategy, self.sampling_seed)
        sessions = dict.fromkeys(self.session_keys, session)
        train_config = ConfigRecord({**self.train_config, **arm.train_config, **sessions})
        evaluate_config = ConfigRecord({**self.evaluate_config, **arm.evaluate_config, **sessions})
        initial = ArrayRecord(
            {k: Array(np.array(v.numpy())) for k, v in self.initial_arrays.items()}
        )
        clock = _RoundClock(initial)
        detail = f", {arm.description}" if arm.description else ""
        print(f"\n=== {arm.label}: {self.num_rounds} rounds{detail} ===", flush=True)
        started = time.perf_counter()
        result = strategy.start(
            grid=_MeteredGrid(grid, clock),
            initial_arrays=initial,
            num_rounds=self.num_rounds,
            timeout=self.timeout,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=clock.wrap(self.evaluate_fn),
        )
        seconds = time.perf_counter() - started
        record = self._arm_record(arm, strategy, result, clock, seconds)
        for line in _warnings(record):
            print(line, flush=True)
        arrays = {k: np.array(v.numpy(), copy=True) for k, v in result.arrays.items()}
        return ArmRun(arm, record, strategy, result, arrays)

    def _arm_record(
        self, arm: Arm, strategy: Strategy, result: Result, clock: _RoundClock, seconds: float
    ) -> ArmRecord:
        traffic = getattr(strategy, "traffic", None)
        dropped: Mapping[int, Mapping[int, str]] = getattr(strategy, "dropped", {})
        failed: Mapping[int, str] = getattr(strategy, "failed_rounds", {})
        rounds = []
        for rnd in range(1, self.num_rounds + 1):
            rec = RoundRecord(
                server_round=rnd,
                server_metrics=_numbers(result.evaluate_metrics_serverapp.get(rnd)),
                train_metrics=_numbers(result.train_metrics_clientapp.get(rnd)),
                evaluate_metrics=_numbers(result.evaluate_metrics_clientapp.get(rnd)),
                aggregated=clock.changed.get(rnd, rnd in result.train_metrics_clientapp),
                dropped=dict(dropped.get(rnd, {})),
                failed=failed.get(rnd),
                seconds=clock.seconds.get(rnd),
                grid_seconds=clock.grid_seconds.get(rnd),
                eval_seconds=clock.eval_seconds.get(rnd),
            )
            if isinstance(traffic, list):
                rec.phases, rec.clients, rec.down_bytes, rec.up_bytes = round_bytes(traffic, rnd)
                evaluation = rec.phases.get(EVALUATE_PHASE)
                if evaluation is not None:
                    rec.eval_down_bytes = evaluation.down_bytes
                    rec.eval_up_bytes = evaluation.up_bytes
            rounds.append(rec)
        return ArmRecord(
            key=arm.key,
            label=arm.label,
            description=arm.description,
            learns=dict(arm.learns),
            overrides=_jsonable(dict(arm.overrides)),
            equivalent_to=arm.equivalent_to,
            initial_metrics=_numbers(result.evaluate_metrics_serverapp.get(0)),
            rounds=rounds,
            seconds=seconds,
        )

    def _save(self, result: ExperimentResult, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        histories = [_history(r.record) for r in result.runs]
        meta = {
            "run_config": _jsonable(dict(self.run_config)),
            "experiment": result.record.to_dict(),
        }
        path = save_histories(histories, out / f"{self.name}.json", meta=meta)
        if any(h.final_accuracy is not None for h in histories):
            try:
                plot_histories(histories, out / f"{self.name}.png", title=self.name)
            except ImportError as err:
                print(f"(no plot: {err})", flush=True)
        if self.save_models:
            for run in result.runs:
                np.savez(out / MODEL_FILE.format(run.arm.key), **run.arrays)  # type: ignore[arg-type]
        print(f"results written to {path.resolve()}", flush=True)


# -- helpers ----------------------------------------------------------------------------------
def max_abs_difference(a: Mapping[str, NDArray[Any]], b: Mapping[str, NDArray[Any]]) -> float:
    """Return ``max |a - b|`` over all tensors of two models with the same names and shapes.

    Raises
    ------
    ValueError
        If the models have different tensor names or shapes.
    """
    if set(a) != set(b):
        raise ValueError(f"the models have different tensors: {sorted(a)} vs {sorted(b)}")
    diff = 0.0
    for name in a:
        if np.shape(a[name]) != np.shape(b[name]):
            raise ValueError(f"tensor {name!r} has shapes {np.shape(a[name])}, {np.shape(b[name])}")
        delta = np.abs(np.asarray(a[name], np.float64) - np.asarray(b[name], np.float64))
        diff = max(diff, float(np.max(delta, initial=0.0)))
    return diff


def _numbers(record: MetricRecord | None) -> dict[str, float]:
    if record is None:
        return {}
    out = {}
    for key, value in record.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            if math.isfinite(value):
                out[key] = float(value)
    return out


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, bool | int | float | str) else repr(v) for k, v in values.items()}


def _history(record: ArmRecord) -> RunHistory:
    """Return the arm as a :class:`RunHistory` (centralized accuracy/loss, training bytes)."""
    evaluated = [r for r in record.rounds if r.server_metrics]
    if record.initial_metrics:
        evaluated.insert(0, RoundRecord(0, server_metrics=record.initial_metrics))
    traffic = [r for r in record.rounds if r.up_bytes is not None and r.down_bytes is not None]
    return RunHistory(
        label=record.label,
        rounds=[r.server_round for r in evaluated],
        accuracy=[r.server_metrics.get("accuracy") for r in evaluated],
        loss=[r.server_metrics.get("loss") for r in evaluated],
        traffic_rounds=[r.server_round for r in traffic],
        up_bytes_per_client=[float(r.up_bytes or 0.0) for r in traffic],
        down_bytes_per_client=[float(r.down_bytes or 0.0) for r in traffic],
        config={"key": record.key, "overrides": record.overrides},
    )


def _warnings(record: ArmRecord) -> list[str]:
    lines = []
    for r in record.rounds:
        if r.failed:
            lines.append(f"WARNING: {record.label}: round {r.server_round} failed: {r.failed}")
        if r.dropped:
            first = next(iter(r.dropped.values()))
            lines.append(
                f"WARNING: {record.label}: round {r.server_round}: {len(r.dropped)} replies "
                f"dropped (first: {first})"
            )
    return lines


# -- tables -----------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def round_table(record: ExperimentRecord, metrics: Sequence[Metric] = ()) -> str:
    """Return the per-round table: one row per round and arm.

    Columns: the metrics, training-phase bytes per client down and up, clients sampled,
    replies dropped ("drops"), wall and server seconds, and a note for rounds that failed or changed
    nothing. Round 0 (the initial model) is shown when a server metric reported it.

    Parameters
    ----------
    record : ExperimentRecord
        The experiment.
    metrics : Sequence[Metric]
        The metric columns.

    Returns
    -------
    str
        The table (no trailing newline).
    """
    width = max(len("arm"), *(len(a.label) for a in record.arms))
    mwidths = [max(8, len(m.title)) for m in metrics]
    header = f"{'round':>5}  {'arm':<{width}}" + "".join(
        f"  {m.title:>{w}}" for m, w in zip(metrics, mwidths, strict=True)
    )
    header += (
        f"  {'down B/cl':>11}  {'up B/cl':>11}  {'clients':>7}  {'drops':>5}"
        f"  {'round s':>7}  {'server s':>8}  note"
    )
    lines = [header, "-" * len(header)]
    server_metrics = [m for m in metrics if m.source == "server"]
    for arm in record.arms:
        if arm.initial_metrics and server_metrics:
            initial = RoundRecord(0, server_metrics=arm.initial_metrics)
            row = f"{0:>5}  {arm.label:<{width}}" + "".join(
                f"  {_fmt(m.value(initial), f'.{m.digits}f'):>{w}}"
                for m, w in zip(metrics, mwidths, strict=True)
            )
            lines.append(row.rstrip())
    rounds = sorted({r.server_round for a in record.arms for r in a.rounds})
    by_arm = [{r.server_round: r for r in a.rounds} for a in record.arms]
    for rnd in rounds:
        for arm, stats in zip(record.arms, by_arm, strict=True):
            r = stats.get(rnd)
            if r is None:
                continue
            note = "failed" if r.failed else ("" if r.aggregated else "no aggregate")
            row = f"{rnd:>5}  {arm.label:<{width}}" + "".join(
                f"  {_fmt(m.value(r), f'.{m.digits}f'):>{w}}"
                for m, w in zip(metrics, mwidths, strict=True)
            )
            row += (
                f"  {_fmt(r.down_bytes, ',.0f'):>11}  {_fmt(r.up_bytes, ',.0f'):>11}"
                f"  {_fmt(r.clients, 'd'):>7}  {len(r.dropped):>5}  {_fmt(r.seconds, '.1f'):>7}"
                f"  {_fmt(r.server_seconds, '.1f'):>8}  {note}"
            )
            lines.append(row.rstrip())
    return "\n".join(lines)


def summary_table(record: ExperimentRecord, metrics: Sequence[Metric] = ()) -> str:
    """Return the summary: one row per arm.

    Columns: the headline metric (the first of ``metrics``) after the last round and its
    difference to the baseline arm, mean bytes per client per round down and up (training
    phases) and the upload relative to the baseline, evaluation download per client, rounds
    aggregated, and mean server / grid seconds per round and total seconds.

    Parameters
    ----------
    record : ExperimentRecord
        The experiment (its ``baseline`` names the reference arm).
    metrics : Sequence[Metric]
        The first is the headline; none gives no metric columns.

    Returns
    -------
    str
        The table (no trailing newline).
    """
    headline = metrics[0] if metrics else None
    base = record.arm(record.baseline) if record.baseline is not None else None
    relative = base is not None and len(record.arms) > 1
    width = max(len("arm"), *(len(a.label) for a in record.arms))
    header = f"{'arm':<{width}}"
    if headline is not None:
        final_title = f"final {headline.title}"
        header += f"  {final_title:>{max(10, len(final_title))}}"
        if relative:
            header += f"  {'d ' + headline.title:>{max(8, len(headline.title) + 2)}}"
    header += f"  {'down B/cl/rd':>12}  {'up B/cl/rd':>12}"
    share_title = f"up vs {base.key}" if base is not None else ""
    if relative:
        header += f"  {share_title:>{max(8, len(share_title))}}"
    header += (
        f"  {'eval down B':>11}  {'rounds':>6}  {'server s/rd':>11}  {'grid s/rd':>9}"
        f"  {'total s':>7}"
    )
    lines = [header, "-" * len(header)]
    for arm in record.arms:
        row = f"{arm.label:<{width}}"
        if headline is not None:
            final = arm.final(headline)
            row += f"  {_fmt(final, f'.{headline.digits}f'):>{max(10, len(final_title))}}"
            if relative and base is not None:
                base_final = base.final(headline)
                diff = None if final is None or base_final is None else final - base_final
                row += f"  {_fmt(diff, f'+.{headline.digits}f'):>{max(8, len(headline.title) + 2)}}"
        up, down = arm.mean("up_bytes"), arm.mean("down_bytes")
        row += f"  {_fmt(down, ',.0f'):>12}  {_fmt(up, ',.0f'):>12}"
        if relative and base is not None:
            base_up = base.mean("up_bytes")
            share = "n/a" if up is None or not base_up else f"{up / base_up * 100:.1f}%"
            row += f"  {share:>{max(8, len(share_title))}}"
        server = _mean(s for r in arm.rounds if (s := r.server_seconds) is not None)
        done = f"{len(arm.aggregated_rounds)}/{len(arm.rounds)}"
        row += (
            f"  {_fmt(arm.mean('eval_down_bytes'), ',.0f'):>11}  {done:>6}"
            f"  {_fmt(server, '.2f'):>11}  {_fmt(arm.mean('grid_seconds'), '.2f'):>9}"
            f"  {arm.seconds:>7.1f}"
        )
        lines.append(row)
    return "\n".join(lines)


def learns_text(record: ExperimentRecord) -> str:
    """Return "what each party learns", one block per arm (as the arms define it)."""
    width = max(len(a.label) for a in record.arms)
    lines = ["what each party learns:"]
    for arm in record.arms:
        items = list(arm.learns.items()) or [("", "(not stated)")]
        for i, (party, what) in enumerate(items):
            name = arm.label if i == 0 else ""
            lines.append(f"  {name:<{width}}  {party + ': ' if party else ''}{what}")
    return "\n".join(lines)
