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

from flwr_fsl.experiment.grid import round_bytes
from flwr_fsl.experiment.logs import LOG_LEVEL_KEY, flower_log_level
from flwr_fsl.experiment.records import (
    EXPERIMENT_FORMAT,
    Arm,
    ArmRecord,
    ArmSetup,
    ExperimentFailedError,
    ExperimentRecord,
    Metric,
    PhaseBytes,
    RoundRecord,
    load_experiment,
)
from flwr_fsl.experiment.runner import (
    ArmRun,
    Experiment,
    ExperimentResult,
    max_abs_difference,
    sampling_kwargs,
)
from flwr_fsl.experiment.tables import learns_text, round_table, summary_table

__all__ = [
    "EXPERIMENT_FORMAT",
    "LOG_LEVEL_KEY",
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
    "flower_log_level",
    "learns_text",
    "load_experiment",
    "max_abs_difference",
    "round_bytes",
    "round_table",
    "sampling_kwargs",
    "summary_table",
]
