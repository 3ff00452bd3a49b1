"""The experiment harness's definitions (metrics, arms) and its records (the results JSON)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from flwr.serverapp.strategy import Strategy

from flwr_fsl.core.errors import ConfigurationError, FSLError

__all__ = [
    "EXPERIMENT_FORMAT",
    "Arm",
    "ArmRecord",
    "ArmSetup",
    "ExperimentFailedError",
    "ExperimentRecord",
    "Metric",
    "PhaseBytes",
    "RoundRecord",
    "load_experiment",
]

EXPERIMENT_FORMAT = "flwr_fsl.experiment/1"
EVALUATE_PHASE = "evaluate"

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


def _mean(values: Iterable[float]) -> float | None:
    items = list(values)
    return sum(items) / len(items) if items else None
