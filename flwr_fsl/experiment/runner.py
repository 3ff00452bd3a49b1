"""The experiment loop: :class:`Experiment` trains each arm, prints, saves and checks the result.

See :mod:`flwr_fsl.experiment` for what it measures and how to use it.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from numpy.typing import NDArray

from flwr_fsl.core.checks import check_federation, check_int
from flwr_fsl.core.engine import PhasedStrategy
from flwr_fsl.core.errors import ConfigurationError, RunFailedError
from flwr_fsl.core.rounds import wait_for_nodes
from flwr_fsl.experiment.grid import _MeteredGrid, _RoundClock, round_bytes
from flwr_fsl.experiment.logs import flower_log_level
from flwr_fsl.experiment.records import (
    EVALUATE_PHASE,
    Arm,
    ArmRecord,
    ArmSetup,
    ConfigValue,
    ExperimentFailedError,
    ExperimentRecord,
    Metric,
    RoundRecord,
)
from flwr_fsl.experiment.tables import learns_text, round_table, summary_table
from flwr_fsl.reporting import RunHistory, plot_histories, save_histories

__all__ = ["ArmRun", "Experiment", "ExperimentResult", "max_abs_difference", "sampling_kwargs"]

MODEL_FILE = "global-model-{}.npz"
_KEY_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]*")


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

    def __post_init__(self) -> None:  # noqa: C901
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
        ConfigurationError
            Before any arm trains: an arm's strategy refuses its settings or cannot run on
            the grid's nodes (every arm is built and checked first).
        ExperimentFailedError
            If an arm aggregated no round (raised after printing and saving).
        """
        nonce = f"{time.time_ns():x}"
        # Every arm's strategy is built and checked before the first arm trains: a bad setting
        # of the last arm must not cost the earlier arms' training.
        with flower_log_level(self.run_config):  # the run config's log-level, if it has one
            built = [
                self._build_arm(grid, arm, f"{self.name}/{arm.key}@{nonce}") for arm in self.arms
            ]
            runs = [self._run_arm(grid, arm, strategy, setup) for arm, strategy, setup in built]
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

    def _build_arm(self, grid: Grid, arm: Arm, session: str) -> tuple[Arm, Strategy, ArmSetup]:
        """Build an arm's strategy and check it against the federation (before any arm trains).

        Raises
        ------
        ConfigurationError
            If the strategy refuses its settings, samples with another seed, or cannot run
            on the grid's nodes (:func:`~flwr_fsl.core.checks.check_federation`).
        """
        setup = ArmSetup({**self.run_config, **arm.overrides}, self.sampling_seed, session)
        try:
            strategy = arm.strategy(setup)
        except ConfigurationError as err:
            raise ConfigurationError(f"arm {arm.key!r}: {err}") from err
        _reseed_sampling(strategy, self.sampling_seed)
        try:
            _check_federation(strategy, grid, self.timeout)
        except ConfigurationError as err:
            raise ConfigurationError(f"arm {arm.key!r}: {err}") from err
        return arm, strategy, setup

    def _run_arm(self, grid: Grid, arm: Arm, strategy: Strategy, setup: ArmSetup) -> ArmRun:
        session = setup.session
        sessions = dict.fromkeys(self.session_keys, session)
        train_config = ConfigRecord({**self.train_config, **arm.train_config, **sessions})
        evaluate_config = ConfigRecord({**self.evaluate_config, **arm.evaluate_config, **sessions})
        initial = ArrayRecord(
            {k: Array(np.array(v.numpy())) for k, v in self.initial_arrays.items()}
        )
        # A PhasedStrategy prints its own progress line per round; Flower's get one here.
        clock = _RoundClock(
            initial, None if isinstance(strategy, PhasedStrategy) else self.num_rounds
        )
        detail = f", {arm.description}" if arm.description else ""
        print(f"\n=== {arm.label}: {self.num_rounds} rounds{detail} ===", flush=True)
        started = time.perf_counter()
        try:
            result = strategy.start(
                grid=_MeteredGrid(grid, clock),
                initial_arrays=initial,
                num_rounds=self.num_rounds,
                timeout=self.timeout,
                train_config=train_config,
                evaluate_config=evaluate_config,
                evaluate_fn=clock.wrap(self.evaluate_fn),
            )
        except RunFailedError as err:  # reported with the other arms, then run() raises
            print(f"WARNING: {arm.label}: {err}", flush=True)
            result = err.result if isinstance(err.result, Result) else Result(arrays=initial)
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
def _check_federation(strategy: Strategy, grid: Grid, timeout: float) -> None:
    """Check an arm's sampling (and protocol minimum) against the grid's nodes, before round 1.

    A :class:`~flwr_fsl.core.engine.PhasedStrategy` checks itself
    (:meth:`~flwr_fsl.core.engine.PhasedStrategy.check_federation`); Flower's own strategies
    (``FedAvg`` and its kin, which check nothing and would wait forever for nodes that do not
    exist) get the same sampling check on their ``FedAvg`` knobs.
    """
    if isinstance(strategy, PhasedStrategy):
        strategy.check_federation(grid)
        return
    knobs = ("fraction_train", "fraction_evaluate", "min_train_nodes", "min_evaluate_nodes")
    if not all(hasattr(strategy, k) for k in (*knobs, "min_available_nodes")):
        return
    minimum = check_int("min_available_nodes", strategy.min_available_nodes, 0)  # type: ignore[attr-defined]
    check_federation(strategy, len(wait_for_nodes(grid, minimum, timeout)))


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
