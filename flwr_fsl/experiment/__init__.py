"""Experiments: several strategies ("arms") trained from the same seed in one ServerApp.

The harness lives in :mod:`flwr_fsl.experiment.runner`; this package re-exports its public names.
"""

from flwr_fsl.experiment.runner import (
    EXPERIMENT_FORMAT,
    Arm,
    ArmRecord,
    ArmRun,
    ArmSetup,
    Experiment,
    ExperimentFailedError,
    ExperimentRecord,
    ExperimentResult,
    Metric,
    PhaseBytes,
    RoundRecord,
    learns_text,
    load_experiment,
    max_abs_difference,
    round_bytes,
    round_table,
    sampling_kwargs,
    summary_table,
)

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
