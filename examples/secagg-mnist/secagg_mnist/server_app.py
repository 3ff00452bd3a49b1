"""secagg-mnist: a Flower ServerApp comparing plaintext FedAvg with Bonawitz secure aggregation.

With ``compare-fedavg = true`` it trains twice from the same initial model and the same client
sample (:class:`flwr_fsl.experiment.Experiment`): first with Flower's own
:class:`~flwr.serverapp.strategy.FedAvg` (plaintext: the server reads every client's trained
model, ``num-examples`` and ``train_loss``), then with :class:`~flwr_fsl.strategies.SecAggFedAvg`
(four phases per round; the server learns only the sum over the clients that finished). The
clients train the same way in both arms. SecAggFedAvg's default counts every client 1
(``weighted = false``: its total reveals only how many finished), which equals FedAvg's
sample-weighted mean when the partitions have equal sizes (the default IID split); then the
two models agree up to SecAgg's fixed point. ``weighted = true`` uses Flower's sample weights
(and leaks every client's ``num-examples`` over rounds); ``compare-weighted = true`` adds that
arm beside the default one. It prints accuracy, bytes per client and time per round, a summary,
what the server learns in each arm and the largest difference between each SecAgg model and
FedAvg's.

:func:`run_experiment` is the whole experiment on any :class:`~flwr.serverapp.Grid`;
``python -m flwr_fsl.testing.local`` (through ``main``), the test and the
notebook call it with an in-process grid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from flwr_fsl.core.checks import check_threshold
from flwr_fsl.core.traffic import RoundTraffic, content_bytes
from flwr_fsl.experiment import Arm, ArmSetup, Experiment, ExperimentResult, Metric
from flwr_fsl.models.mnist_task import task_settings
from flwr_fsl.run_config import config_value
from flwr_fsl.strategies import SecAggFedAvg
from secagg_mnist.task import Net, load_test_data
from secagg_mnist.task import test as test_fn

ACCURACY = Metric("acc %", "accuracy", scale=100, digits=2)
FEDAVG_LEARNS = {"server": "each client's full trained model, num-examples and train_loss"}
SECAGG_LEARNS = {
    "server": "only the sum over the clients that finished (the new model, how many they "
    "are), who finished each phase, message sizes",
}
SECAGG_WEIGHTED_LEARNS = {
    "server": "the sum over the clients that finished (the new model, their total "
    "num-examples: over rounds, each client's num-examples), who finished each phase, "
    "message sizes",
}
EVALUATE_LEARNS = "each evaluating client's eval metrics and num-examples (not masked)"

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the FedAvg baseline (optional) and the SecAgg run; print the comparison."""
    run_experiment(grid, context.run_config)


class MeteredFedAvg(FedAvg):
    """Flower's ``FedAvg``, unchanged, that also logs the bytes of its messages.

    The harness reads bytes per client from a strategy's ``traffic`` list
    (:class:`~flwr_fsl.core.traffic.RoundTraffic`, the protobuf size of each message's content, as
    ``SecAggFedAvg`` logs them); Flower's ``FedAvg`` keeps none, so this subclass records what
    ``configure_*`` sends and what ``aggregate_*`` receives. Sampling and aggregation are
    Flower's.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.traffic: list[RoundTraffic] = []

    def _sent(self, server_round: int, phase: str, messages: Iterable[Message]) -> list[Message]:
        sent = list(messages)
        down = {m.metadata.dst_node_id: content_bytes(m.content) for m in sent}
        self.traffic.append(RoundTraffic(server_round, phase, down_bytes=down))
        return sent

    def _received(self, server_round: int, phase: str, replies: Iterable[Message]) -> list[Message]:
        received = list(replies)
        entry = next(
            t for t in reversed(self.traffic) if (t.server_round, t.phase) == (server_round, phase)
        )
        for reply in received:
            if reply.has_content():  # an error reply carries no content
                entry.up_bytes[reply.metadata.src_node_id] = content_bytes(reply.content)
        return received

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's ``configure_train``; log the bytes sent."""
        messages = super().configure_train(server_round, arrays, config, grid)
        return self._sent(server_round, "train", messages)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Flower's ``aggregate_train``; log the bytes received."""
        return super().aggregate_train(server_round, self._received(server_round, "train", replies))

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Flower's ``configure_evaluate``; log the bytes sent."""
        messages = super().configure_evaluate(server_round, arrays, config, grid)
        return self._sent(server_round, "evaluate", messages)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Flower's ``aggregate_evaluate``; log the bytes received."""
        return super().aggregate_evaluate(
            server_round, self._received(server_round, "evaluate", replies)
        )


def reconstruction_threshold(value: Any) -> int | float:
    """Return ``reconstruction-threshold`` as SecAggFedAvg takes it.

    A float in ``(0, 1]`` is a fraction of each round's sampled clients (rounded up), an int
    ``>= 2`` a count.

    Raises
    ------
    ConfigurationError
        If the value is neither (the message names the key).
    """
    return check_threshold("reconstruction-threshold", value, min_count=2)


def run_experiment(grid: Grid, run_config: Mapping[str, Any]) -> ExperimentResult:
    """Train with FedAvg (with ``compare-fedavg``) and SecAggFedAvg; print and save both.

    Every run-config key is checked first, and every arm's strategy is built before the
    first arm trains, so a bad setting is refused (naming the key) before any client trains.

    Parameters
    ----------
    grid : Grid
        The grid (Flower's in a ServerApp, or :class:`flwr_fsl.testing.InProcessGrid`).
    run_config : Mapping[str, Any]
        The run config (``[tool.flwr.app.config]`` keys).

    Returns
    -------
    ExperimentResult
        Arms ``"fedavg"`` (with ``compare-fedavg``) and ``"secagg"``.

    Raises
    ------
    ConfigurationError
        If a run-config key is bad (named) or the federation is too small for the sampling.
    """
    cfg = run_config
    task = task_settings(cfg)  # the clients' keys (local-epochs, lr, partitioning, ...)
    seed = task.seed
    num_rounds = config_value(cfg, "num-server-rounds", 5, low=1)
    fraction_evaluate = config_value(cfg, "fraction-evaluate", 0.0, low=0.0, high=1.0)
    # SecAgg needs at least 2 clients per round (t >= 2): both arms sample at least 2.
    min_nodes = config_value(cfg, "min-nodes", 2, low=2)
    knobs = {
        "fraction_train": config_value(cfg, "fraction-train", 0.5, low=0.0, high=1.0),
        "fraction_evaluate": fraction_evaluate,
        "min_train_nodes": min_nodes,
        "min_evaluate_nodes": 1,
        "min_available_nodes": min_nodes,
    }
    t = reconstruction_threshold(cfg.get("reconstruction-threshold", 0.6))
    clip = config_value(cfg, "clipping-range", 8.0, low=0.0, low_open=True)
    weighted = config_value(cfg, "weighted", False)
    # Federated evaluation hands the server each evaluated client's metrics and num-examples:
    # SecAggFedAvg refuses fraction-evaluate > 0 unless the run config accepts the leak.
    plaintext_evaluation = config_value(cfg, "plaintext-evaluation", False)
    compare = config_value(cfg, "compare-fedavg", True)
    compare_weighted = config_value(cfg, "compare-weighted", False)
    results_dir = config_value(cfg, "results-dir", "")
    x_test, y_test = load_test_data(task.test_size)

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate the global model on the MNIST test set."""
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test_fn(model, x_test, y_test)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    def fedavg(setup: ArmSetup) -> FedAvg:
        return MeteredFedAvg(**knobs)

    def secagg_arm(weights: bool) -> Callable[[ArmSetup], SecAggFedAvg]:
        def make(setup: ArmSetup) -> SecAggFedAvg:
            return SecAggFedAvg(
                **knobs,
                reconstruction_threshold=t,
                clipping_range=clip,
                weighted=weights,
                plaintext_evaluation=plaintext_evaluation,
            )

        return make

    def learns(base: Mapping[str, str]) -> dict[str, str]:
        if fraction_evaluate <= 0:
            return dict(base)
        return {**base, "server (evaluate)": EVALUATE_LEARNS}

    t_text = f"{t:.0%} of the sampled clients" if isinstance(t, float) else f"{t} clients"
    arms = [
        Arm(
            "secagg",
            "SecAggFedAvg",
            secagg_arm(weighted),
            learns=learns(SECAGG_WEIGHTED_LEARNS if weighted else SECAGG_LEARNS),
            equivalent_to="fedavg" if compare else None,
            description=f"t = {t_text}, clipping range {clip:g}, "
            + ("sample weights" if weighted else "unit weights"),
        )
    ]
    if compare_weighted and not weighted:
        arms.append(
            Arm(
                "secagg-weighted",
                "SecAggFedAvg(weighted=True)",
                secagg_arm(True),
                learns=learns(SECAGG_WEIGHTED_LEARNS),
                equivalent_to="fedavg" if compare else None,
                description=f"t = {t_text}, clipping range {clip:g}, sample weights",
            )
        )
    if compare:
        arms.insert(0, Arm("fedavg", "FedAvg", fedavg, learns=learns(FEDAVG_LEARNS)))
    torch.manual_seed(seed)  # the same initial model for every arm
    return Experiment(
        name="secagg-mnist",
        arms=arms,
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=num_rounds,
        sampling_seed=seed,
        run_config=cfg,
        metrics=[ACCURACY],
        evaluate_fn=global_evaluate,
        train_config={"lr": task.lr},
        results_dir=results_dir or None,
        save_models=True,
    ).run(grid)
