"""Accuracy benchmark: dense FedAvg vs top-k submodel updates on MNIST.

100 IID clients (flwr-datasets ``IidPartitioner``), 10 sampled per round, the shared MNIST CNN
(``flwr_fsl.models.MnistCNN``), ``FedSubAvg`` on the server and ``topk_mod`` on the clients,
run in one process through ``flwr_fsl.testing.InProcessGrid`` (no Ray). Seven configurations:
dense, and top-k 10%, 5%, 1% each with and without error feedback. Every configuration starts
from the same initial model and samples the same clients in the same rounds.

Prints final test accuracy and upload MB per client per round as a table, writes the
histories to ``results/accuracy_topk.json`` (and a plot with ``--plot``), and checks the bar:
top-k 10% with error feedback within 1.0 accuracy point of dense while uploading at most 25%
of dense's bytes.

Usage::

    python benchmarks/accuracy_topk.py                  # the full run (50 rounds, 7 configs)
    python benchmarks/accuracy_topk.py --quick          # 3 rounds, 20 clients, smoke test
    python benchmarks/accuracy_topk.py --configs dense,topk10-ef --rounds 20
    python benchmarks/accuracy_topk.py --defaults old   # FedSubAvg without clipping_range
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from tqdm import tqdm

from flwr_fsl.data import load_mnist, partition_indices
from flwr_fsl.models import MnistCNN, evaluate, set_torch_threads, train_one
from flwr_fsl.mods import topk_mod
from flwr_fsl.reporting import RunHistory, comparison_table, plot_histories, save_histories
from flwr_fsl.strategies import FedSubAvg
from flwr_fsl.testing import InProcessGrid


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark configuration."""

    name: str
    label: str
    ratio: float
    error_feedback: bool


CONFIGS = {
    c.name: c
    for c in (
        BenchConfig("dense", "dense", 1.0, False),
        BenchConfig("topk10-ef", "top-k 10% EF", 0.10, True),
        BenchConfig("topk10", "top-k 10%", 0.10, False),
        BenchConfig("topk5-ef", "top-k 5% EF", 0.05, True),
        BenchConfig("topk5", "top-k 5%", 0.05, False),
        BenchConfig("topk1-ef", "top-k 1% EF", 0.01, True),
        BenchConfig("topk1", "top-k 1%", 0.01, False),
    )
}
BAR_CONFIG, BAR_ACC_POINTS, BAR_BYTES_SHARE = "topk10-ef", 1.0, 0.25


def make_client_app(
    x: np.ndarray, y: np.ndarray, parts: list[np.ndarray], epochs: int, batch_size: int
) -> ClientApp:
    """Return the benchmark's ClientApp: a plain ``@app.train`` plus ``topk_mod``."""
    app = ClientApp(mods=[topk_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        config = msg.content["config"]
        seed = int(config["seed"]) + 1000 * int(config["server-round"]) + pid
        torch.manual_seed(seed)
        model = MnistCNN()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        idx = parts[pid]
        loss = train_one(
            model,
            x[idx],
            y[idx],
            epochs=epochs,
            lr=float(config["lr"]),
            batch_size=batch_size,
            seed=seed,
        )
        metrics = MetricRecord({"train_loss": loss, "num-examples": len(idx)})
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=msg)

    return app


def run_config(
    cfg: BenchConfig,
    args: argparse.Namespace,
    data: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    parts: list[np.ndarray],
) -> tuple[RunHistory, float]:
    """Run one configuration; return its history and wall time in seconds."""
    x_train, y_train, x_test, y_test = data
    app = make_client_app(x_train, y_train, parts, args.local_epochs, args.batch_size)
    grid = InProcessGrid(app, num_nodes=args.clients)

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        last = server_round == args.rounds
        if server_round % args.eval_every and not last:
            return None
        model = MnistCNN()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, acc = evaluate(model, x_test, y_test)
        print(f"  [{cfg.name}] round {server_round:>3}: test acc {acc * 100:6.2f}%", flush=True)
        return MetricRecord({"accuracy": acc, "loss": loss})

    torch.manual_seed(args.seed)
    initial = ArrayRecord(MnistCNN().state_dict())
    random.seed(args.seed)  # Flower samples nodes with `random`: same clients for every config
    strategy = FedSubAvg(
        fraction_train=args.per_round / args.clients,
        fraction_evaluate=0.0,
        min_train_nodes=args.per_round,
        min_evaluate_nodes=0,
        min_available_nodes=args.clients,
        clipping_range=None if args.defaults == "old" else 8.0,
    )
    train_config = ConfigRecord(
        {
            "lr": args.lr,
            "seed": args.seed,
            "topk-ratio": cfg.ratio,
            "topk-error-feedback": cfg.error_feedback,
        }
    )
    started = time.perf_counter()
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=args.rounds,
        train_config=train_config,
        evaluate_fn=global_evaluate,
    )
    elapsed = time.perf_counter() - started
    history = RunHistory.from_result(
        cfg.label,
        result,
        strategy.traffic,
        config={"name": cfg.name, "topk-ratio": cfg.ratio, "error-feedback": cfg.error_feedback},
    )
    return history, elapsed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50, help="server rounds (default 50)")
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated subset of {', '.join(CONFIGS)} (default: all)",
    )
    parser.add_argument("--clients", type=int, default=100, help="number of clients")
    parser.add_argument("--per-round", type=int, default=10, help="clients sampled per round")
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--eval-every", type=int, default=1, help="test every N rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=Path("results/accuracy_topk.json"))
    parser.add_argument("--plot", action="store_true", help="also write a .png beside --out")
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 3 rounds, 20 clients, 5 per round"
    )
    parser.add_argument(
        "--defaults",
        choices=["old", "new"],
        default="new",
        help="new: FedSubAvg's clipping_range=8 (issue 24); old: no clipping (before it)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.clients, args.per_round = 3, 20, 5
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        parser.error(f"unknown configs {unknown}; choose from {', '.join(CONFIGS)}")
    args.configs = names
    if args.rounds < 1 or args.eval_every < 1 or not 1 <= args.per_round <= args.clients:
        parser.error("need rounds >= 1, eval-every >= 1 and 1 <= per-round <= clients")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_torch_threads(args.threads)
    logging.getLogger("flwr").setLevel(logging.WARNING)  # the per-round logs are long
    data = load_mnist()
    parts = partition_indices(data[1], args.clients, scheme="iid", seed=args.seed)
    print(
        f"MNIST, {args.clients} IID clients ({len(parts[0])} samples each), "
        f"{args.per_round}/round, {args.rounds} rounds, {args.local_epochs} local epoch(s), "
        f"lr {args.lr}, batch {args.batch_size}, MnistCNN "
        f"({sum(p.numel() for p in MnistCNN().parameters())} parameters)",
        flush=True,
    )
    histories: list[RunHistory] = []
    timings: dict[str, float] = {}
    for name in tqdm(args.configs, desc="configs", unit="config"):
        history, elapsed = run_config(CONFIGS[name], args, data, parts)
        histories.append(history)
        timings[name] = elapsed
        print(f"  [{name}] done in {elapsed:.0f}s", flush=True)

    baseline = args.configs.index("dense") if "dense" in args.configs else None
    table = comparison_table(histories, baseline=baseline)
    print("\n" + table)
    print("wall time per config (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))

    bar: dict[str, object] = {"checked": False}
    if "dense" in args.configs and BAR_CONFIG in args.configs:
        dense = histories[args.configs.index("dense")]
        topk = histories[args.configs.index(BAR_CONFIG)]
        gap = ((dense.final_accuracy or 0.0) - (topk.final_accuracy or 0.0)) * 100
        share = topk.mean_up_mb / dense.mean_up_mb
        ok = gap <= BAR_ACC_POINTS and share <= BAR_BYTES_SHARE
        bar = {"checked": True, "accuracy_gap_points": gap, "upload_share": share, "met": ok}
        print(
            f"bar ({CONFIGS[BAR_CONFIG].label} within {BAR_ACC_POINTS} pt of dense, "
            f"<= {BAR_BYTES_SHARE:.0%} of its upload): gap {gap:+.2f} pt, "
            f"upload {share:.1%} -> {'MET' if ok else 'NOT MET'}"
        )
    meta = {
        "command": " ".join(["python", *sys.argv]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "seconds": timings,
        "bar": bar,
        "table": table,
    }
    out = save_histories(histories, args.out, meta=json.loads(json.dumps(meta)))
    print(f"wrote {out}")
    if args.plot:
        png = plot_histories(histories, out.with_suffix(".png"), title="MNIST top-k")
        del png
        print(f"wrote {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
