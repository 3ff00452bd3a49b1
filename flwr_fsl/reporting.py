"""Run histories: collect, save as JSON, compare in a table and plot.

A :class:`RunHistory` gathers, per server round, the centralized test metrics of a Flower
:class:`~flwr.serverapp.strategy.Result` (``evaluate_metrics_serverapp``) and the train-phase
traffic a :class:`~flwr_fsl.strategies.FedSubAvg` logged (``strategy.traffic``)::

    result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=5, evaluate_fn=fn)
    history = RunHistory.from_result("top-k 10%", result, strategy.traffic)
    save_histories([history], "results/run.json")
    plot_histories([history], "results/run.png")

Plotting needs matplotlib (the ``examples`` extra); it is imported only when drawing and
always with the non-interactive Agg backend.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.serverapp.strategy import Result

from flwr_fsl.core.traffic import RoundTraffic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

HISTORY_FORMAT = "flwr_fsl.history/1"
MB = 1e6


@dataclass
class RunHistory:
    """Per-round metrics and traffic of one federated run.

    Attributes
    ----------
    label : str
        Name of the run in tables and legends (e.g. ``"top-k 10% EF"``).
    rounds : list[int]
        Server rounds with a centralized evaluation (0 = the initial model, if evaluated).
    accuracy : list[float | None]
        Centralized test accuracy after each round of ``rounds`` (None if not reported).
    loss : list[float | None]
        Centralized test loss after each round of ``rounds`` (None if not reported).
    traffic_rounds : list[int]
        Rounds with a train phase.
    up_bytes_per_client : list[float]
        Mean bytes a sampled client uploaded in each train phase of ``traffic_rounds``.
    down_bytes_per_client : list[float]
        Mean bytes sent to a sampled client in each train phase of ``traffic_rounds``.
    config : dict[str, Any]
        Settings of the run (JSON-serializable), stored alongside.
    """

    label: str
    rounds: list[int] = field(default_factory=list)
    accuracy: list[float | None] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    traffic_rounds: list[int] = field(default_factory=list)
    up_bytes_per_client: list[float] = field(default_factory=list)
    down_bytes_per_client: list[float] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (len(self.rounds) == len(self.accuracy) == len(self.loss)):
            raise ValueError("rounds, accuracy and loss must have the same length")
        if not (
            len(self.traffic_rounds)
            == len(self.up_bytes_per_client)
            == len(self.down_bytes_per_client)
        ):
            raise ValueError("traffic_rounds and the byte lists must have the same length")

    @classmethod
    def from_result(
        cls,
        label: str,
        result: Result,
        traffic: Iterable[RoundTraffic] = (),
        *,
        accuracy_key: str = "accuracy",
        loss_key: str = "loss",
        config: Mapping[str, Any] | None = None,
    ) -> RunHistory:
        """Build a history from a strategy's ``Result`` and traffic log.

        Parameters
        ----------
        label : str
            Name of the run.
        result : Result
            What ``strategy.start`` returned; its ``evaluate_metrics_serverapp`` (from
            ``evaluate_fn``) gives accuracy and loss per round.
        traffic : Iterable[RoundTraffic]
            The strategy's ``traffic`` log; only ``"train"`` phases are kept. When empty,
            the ``"up-bytes-per-client"`` / ``"down-bytes-per-client"`` entries of
            ``result.train_metrics_clientapp`` are used instead.
        accuracy_key : str
            Metric name of the accuracy in the centralized MetricRecords.
        loss_key : str
            Metric name of the loss in the centralized MetricRecords.
        config : Mapping[str, Any] | None
            Settings of the run to store with it.

        Returns
        -------
        RunHistory
            The history, rounds in increasing order.
        """
        rounds = sorted(result.evaluate_metrics_serverapp)
        accuracy = [_metric(result.evaluate_metrics_serverapp[r], accuracy_key) for r in rounds]
        loss = [_metric(result.evaluate_metrics_serverapp[r], loss_key) for r in rounds]
        per_round: dict[int, tuple[float, float]] = {}
        for t in traffic:
            if t.phase == "train":
                per_round[t.server_round] = (t.mean_up_bytes, t.mean_down_bytes)
        if not per_round:
            for r, metrics in result.train_metrics_clientapp.items():
                up = _metric(metrics, "up-bytes-per-client")
                down = _metric(metrics, "down-bytes-per-client")
                if up is not None and down is not None:
                    per_round[r] = (up, down)
        traffic_rounds = sorted(per_round)
        return cls(
            label=label,
            rounds=rounds,
            accuracy=accuracy,
            loss=loss,
            traffic_rounds=traffic_rounds,
            up_bytes_per_client=[per_round[r][0] for r in traffic_rounds],
            down_bytes_per_client=[per_round[r][1] for r in traffic_rounds],
            config=dict(config or {}),
        )

    @property
    def final_accuracy(self) -> float | None:
        """Accuracy after the last evaluated round (None if never reported)."""
        reported = [a for a in self.accuracy if a is not None]
        return reported[-1] if reported else None

    @property
    def mean_up_mb(self) -> float:
        """Mean upload in MB per client per round (0.0 if no train phase was logged)."""
        values = self.up_bytes_per_client
        return sum(values) / len(values) / MB if values else 0.0

    @property
    def mean_down_mb(self) -> float:
        """Mean download in MB per client per round (0.0 if no train phase was logged)."""
        values = self.down_bytes_per_client
        return sum(values) / len(values) / MB if values else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Return the history as a JSON-serializable dict (with summary fields)."""
        out = asdict(self)
        out["final_accuracy"] = self.final_accuracy
        out["mean_up_mb_per_client_round"] = self.mean_up_mb
        out["mean_down_mb_per_client_round"] = self.mean_down_mb
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunHistory:
        """Rebuild a history from :meth:`to_dict`'s output (summary fields are ignored).

        Parameters
        ----------
        data : Mapping[str, Any]
            A dict as written by :meth:`to_dict`.

        Returns
        -------
        RunHistory
            The history.

        Raises
        ------
        ValueError
            If a field is missing or has the wrong type.
        """
        try:
            return cls(
                label=str(data["label"]),
                rounds=[int(r) for r in data["rounds"]],
                accuracy=[None if a is None else float(a) for a in data["accuracy"]],
                loss=[None if v is None else float(v) for v in data["loss"]],
                traffic_rounds=[int(r) for r in data["traffic_rounds"]],
                up_bytes_per_client=[float(b) for b in data["up_bytes_per_client"]],
                down_bytes_per_client=[float(b) for b in data["down_bytes_per_client"]],
                config=dict(data.get("config", {})),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed run history: {err!r}") from None


def _metric(record: Mapping[str, Any], key: str) -> float | None:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def save_histories(
    histories: Sequence[RunHistory], path: str | Path, meta: Mapping[str, Any] | None = None
) -> Path:
    """Write histories to a JSON file (parent folders are created).

    Parameters
    ----------
    histories : Sequence[RunHistory]
        The runs to save.
    path : str | Path
        The ``.json`` file.
    meta : Mapping[str, Any] | None
        Extra JSON-serializable information about the experiment (command, seed, ...).

    Returns
    -------
    Path
        The written file.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": HISTORY_FORMAT,
        "meta": dict(meta or {}),
        "runs": [h.to_dict() for h in histories],
    }
    out.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    return out


def load_histories(path: str | Path) -> list[RunHistory]:
    """Read histories written by :func:`save_histories`.

    Parameters
    ----------
    path : str | Path
        The ``.json`` file.

    Returns
    -------
    list[RunHistory]
        The runs, in the saved order.

    Raises
    ------
    ValueError
        If the file is not a history file of a supported format.
    """
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("format") != HISTORY_FORMAT:
        raise ValueError(f"{path} is not a {HISTORY_FORMAT} file")
    return [RunHistory.from_dict(run) for run in doc["runs"]]


def comparison_table(histories: Sequence[RunHistory], baseline: int | None = 0) -> str:
    """Return a text table: final accuracy and MB per client per round of each run.

    Parameters
    ----------
    histories : Sequence[RunHistory]
        The runs, one row each.
    baseline : int | None
        Index of the run the accuracy difference and the upload share are relative to
        (typically the dense run); None omits those columns.

    Returns
    -------
    str
        The table (no trailing newline).

    Raises
    ------
    IndexError
        If ``baseline`` is not an index of ``histories``.
    """
    base = histories[baseline] if baseline is not None else None
    width = max([len("run"), *(len(h.label) for h in histories)])
    header = f"{'run':<{width}}  {'final acc %':>11}  {'up MB/cl/rd':>11}  {'down MB/cl/rd':>13}"
    share_width = max(9, len(base.label) + 6) if base is not None else 0
    if base is not None:
        header += f"  {'d acc (pts)':>11}  {'up vs ' + base.label:>{share_width}}"
    lines = [header, "-" * len(header)]
    for h in histories:
        acc = h.final_accuracy
        row = (
            f"{h.label:<{width}}  {_fmt(acc, 100, 2):>11}  {h.mean_up_mb:>11.4f}  "
            f"{h.mean_down_mb:>13.4f}"
        )
        if base is not None:
            base_acc = base.final_accuracy
            diff = None if acc is None or base_acc is None else (acc - base_acc) * 100
            share = h.mean_up_mb / base.mean_up_mb * 100 if base.mean_up_mb > 0 else None
            row += f"  {_fmt(diff, 1, 2, signed=True):>11}  "
            share_text = "n/a" if share is None else f"{share:.1f}%"
            row += f"{share_text:>{share_width}}"
        lines.append(row)
    return "\n".join(lines)


def _fmt(value: float | None, scale: float, digits: int, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value * scale:{'+' if signed else ''}.{digits}f}"


def plot_histories(
    histories: Sequence[RunHistory], path: str | Path | None = None, title: str | None = None
) -> Figure:
    """Draw accuracy vs round and upload MB per client vs round, one line per run.

    Parameters
    ----------
    histories : Sequence[RunHistory]
        The runs to draw.
    path : str | Path | None
        If given, the figure is saved there (format from the suffix, e.g. ``.png``).
    title : str | None
        Figure title.

    Returns
    -------
    matplotlib.figure.Figure
        The figure (two axes: accuracy, upload MB).

    Raises
    ------
    ImportError
        If matplotlib is not installed.
    ValueError
        If ``histories`` is empty.
    """
    if not histories:
        raise ValueError("histories must not be empty")
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as err:
        raise ImportError(
            "plotting needs matplotlib: pip install 'flwr_fsl[examples]' (or matplotlib)"
        ) from err
    # A bare Figure (no pyplot) draws with the Agg canvas and never opens a window.
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax_acc, ax_mb = fig.subplots(1, 2)
    for h in histories:
        points = [(r, a * 100) for r, a in zip(h.rounds, h.accuracy, strict=True) if a is not None]
        if points:
            ax_acc.plot(*zip(*points, strict=True), marker=".", label=h.label)
        ax_mb.plot(
            h.traffic_rounds, [b / MB for b in h.up_bytes_per_client], marker=".", label=h.label
        )
    ax_acc.set(xlabel="round", ylabel="test accuracy (%)", title="Accuracy vs round")
    ax_mb.set(xlabel="round", ylabel="upload MB per client", title="Upload per client vs round")
    ax_mb.set_ylim(bottom=0)
    for ax in (ax_acc, ax_mb):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    if path is not None:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    return fig
