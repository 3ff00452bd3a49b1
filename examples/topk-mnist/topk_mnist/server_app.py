"""topk-mnist: a Flower ServerApp comparing dense and top-k uploads with FedSubAvg.

With ``compare-dense = true`` it trains twice from the same initial model: first dense (the
train ConfigRecord carries ``topk-ratio = 1.0``, so ``topk_mod`` passes the full weights
through), then with the run config's top-k settings. It prints the final test accuracy and
the upload per client per round of both.
"""

from __future__ import annotations

from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from flwr_fsl.reporting import RunHistory, comparison_table, plot_histories, save_histories
from flwr_fsl.strategies import FedSubAvg
from topk_mnist.task import Net, load_test_data
from topk_mnist.task import test as test_fn

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the dense baseline (optional) and the top-k run; print the comparison."""
    cfg = context.run_config
    num_rounds = int(cfg.get("num-server-rounds", 5))
    lr = float(cfg.get("lr", 0.05))
    seed = int(cfg.get("seed", 42))
    x_test, y_test = load_test_data(int(cfg.get("test-size", 0)))

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate the global model on the MNIST test set."""
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test_fn(model, x_test, y_test)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    ratio = float(cfg.get("topk-ratio", 1.0))
    feedback = bool(cfg.get("topk-error-feedback", True))
    runs = []
    if bool(cfg.get("compare-dense", True)):
        runs.append(("dense", 1.0))
    runs.append((f"top-k {ratio:.0%}" + (" EF" if feedback else ""), ratio))

    histories = []
    for label, run_ratio in runs:
        torch.manual_seed(seed)  # the same initial model for every run
        initial = ArrayRecord(Net().state_dict())
        strategy = FedSubAvg(
            fraction_train=float(cfg.get("fraction-train", 0.5)),
            fraction_evaluate=float(cfg.get("fraction-evaluate", 0.2)),
            min_train_nodes=1,
            min_evaluate_nodes=1,
            min_available_nodes=1,
        )
        print(f"\n=== {label}: {num_rounds} rounds ===", flush=True)
        result = strategy.start(
            grid=grid,
            initial_arrays=initial,
            num_rounds=num_rounds,
            train_config=ConfigRecord({"lr": lr, "topk-ratio": run_ratio}),
            evaluate_fn=global_evaluate,
        )
        histories.append(
            RunHistory.from_result(
                label, result, strategy.traffic, config={"topk-ratio": run_ratio}
            )
        )

    table = comparison_table(histories)
    print("\n" + table, flush=True)
    results_dir = str(cfg.get("results-dir", ""))
    if results_dir:
        out = Path(results_dir)
        save_histories(histories, out / "topk-mnist.json", meta={"run_config": dict(cfg)})
        try:
            plot_histories(histories, out / "topk-mnist.png", title="topk-mnist")
        except ImportError as err:
            print(f"(no plot: {err})")
        print(f"history written to {out.resolve()}")
