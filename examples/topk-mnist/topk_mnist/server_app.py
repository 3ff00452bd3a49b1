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
from flwr_fsl.strategies import FedSubAvg
from topk_mnist.task import Net, load_test_data
from topk_mnist.task import test as test_fn

ACCURACY = Metric("acc %", "accuracy", scale=100, digits=2)

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the dense baseline (optional) and the top-k run; print the comparison."""
    cfg = context.run_config
    seed = int(cfg.get("seed", 42))
    x_test, y_test = load_test_data(int(cfg.get("test-size", 0)))

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate the global model on the MNIST test set."""
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test_fn(model, x_test, y_test)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    def fedsubavg(setup: ArmSetup) -> FedSubAvg:
        return FedSubAvg(
            fraction_train=float(cfg.get("fraction-train", 0.5)),
            fraction_evaluate=float(cfg.get("fraction-evaluate", 0.2)),
            min_train_nodes=1,
            min_evaluate_nodes=1,
            min_available_nodes=1,
        )

    ratio = float(cfg.get("topk-ratio", 1.0))
    feedback = bool(cfg.get("topk-error-feedback", True))
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
        arms=[dense, topk] if bool(cfg.get("compare-dense", True)) else [topk],
        initial_arrays=ArrayRecord(Net().state_dict()),
        num_rounds=int(cfg.get("num-server-rounds", 5)),
        sampling_seed=seed,
        run_config=cfg,
        metrics=[ACCURACY],
        evaluate_fn=global_evaluate,
        train_config={"lr": float(cfg.get("lr", 0.05))},
        session_keys=["topk-session"],  # error feedback starts afresh per arm
        results_dir=str(cfg.get("results-dir", "")) or None,
    ).run(grid)
