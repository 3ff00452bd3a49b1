"""topk-mnist: a Flower ServerApp comparing dense and top-k uploads with FedSubAvg.

With ``compare-dense = true`` it trains twice from the same initial model and the same client
sample (:class:`flwr_fsl.experiment.Experiment`): first dense (the train ConfigRecord carries
``topk-ratio = 1.0``, so ``topk_mod`` passes the full weights through), then with the run
config's top-k settings. It prints accuracy, bytes per client and time per round, and a summary
with the final test accuracy and the upload per client per round of both.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from flwr_fsl.experiment import Arm, ArmSetup, Experiment, Metric
from flwr_fsl.models.mnist_task import task_settings
from flwr_fsl.run_config import config_value
from flwr_fsl.strategies import FedSubAvg
from topk_mnist.task import Net, load_test_data
from topk_mnist.task import test as test_fn

ACCURACY = Metric("acc %", "accuracy", scale=100, digits=2)

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the dense baseline (optional) and the top-k run; print the comparison."""
    cfg = context.run_config
    # Every key is checked here, naming it, before any client trains.
    task = task_settings(cfg)  # the clients' keys (local-epochs, lr, partitioning, ...)
    seed = task.seed
    num_rounds = config_value(cfg, "num-server-rounds", 5, low=1)
    fraction_train = config_value(cfg, "fraction-train", 0.5, low=0.0, high=1.0)
    fraction_evaluate = config_value(cfg, "fraction-evaluate", 0.2, low=0.0, high=1.0)
    ratio = config_value(cfg, "topk-ratio", 1.0, low=0.0, high=1.0, low_open=True)
    feedback = config_value(cfg, "topk-error-feedback", True)
    compare = config_value(cfg, "compare-dense", True)
    results_dir = config_value(cfg, "results-dir", "")
    x_test, y_test = load_test_data(task.test_size)

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate the global model on the MNIST test set."""
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test_fn(model, x_test, y_test)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    def fedsubavg(setup: ArmSetup) -> FedSubAvg:
        return FedSubAvg(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=1,
            min_evaluate_nodes=1,
            min_available_nodes=1,
        )

    dense = Arm(
        "dense",
        "dense",
        fedsubavg,
        learns={"server": "each client's full update"},
        train_config={"topk-ratio": 1.0},
    )
    topk = Arm(
        "topk",
        f"top-k {ratio:.0%}" + (" EF" if feedback else ""),
        fedsubavg,
        learns={"server": "each client's top-k coordinates and their values"},
        train_config={"topk-ratio": ratio},
    )
    torch.manual_seed(seed)  # the same initial model for every arm
    Experiment(
        name="topk-mnist",
        arms=[dense, topk] if compare else [topk],
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=num_rounds,
        sampling_seed=seed,
        run_config=cfg,
        metrics=[ACCURACY],
        evaluate_fn=global_evaluate,
        train_config={"lr": task.lr},
        session_keys=["topk-session"],  # error feedback starts afresh per arm
        results_dir=results_dir or None,
    ).run(grid)
