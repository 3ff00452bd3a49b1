"""PrivHFL accuracy (Table 1's claim): local baseline < private-data queries < mixup queries.

10 clients on Fashion-MNIST (default; ``--dataset mnist`` too), IID, each with its own
architecture — VGG-7, ResNet-8 and ResNet-10 of :mod:`flwr_fsl.models.privhfl` assigned by
partition id — run through the Flower workflow (:class:`~flwr_fsl.families.privhfl.strategy.PrivHFL`
+
:class:`~flwr_fsl.families.privhfl.mod.PrivHFLClient`) on the in-process grid, plaintext answering.

The local models are trained once (the local phase: Adam by default — the paper uses SGD,
but these BN-free residual networks train far slower with it, see
:func:`flwr_fsl.models.privhfl.train_private`) and every arm starts from copies of
them, so the arms differ only in what happens after local training. One PrivHFL iteration per
arm (the paper reports accuracy after one iteration):

* ``local``: the local models as they are (the paper's *baseline*);
* ``none``: the local models re-trained on their private data alone with the re-training
  settings (equal effort: the same Adam schedule, no knowledge from others);
* ``private``: queries are the querier's private images (the paper's "private data-based
  query", knowledge-distillation style);
* ``mixup`` (and optionally ``cutmix``, ``cutout``): queries selected at random from a pool
  expanded from the private images (Table 1 uses random selection).

Each querier's queries are answered by the 9 other clients; the querier re-trains on
``softmax(sum of their logits)`` (the paper's un-normalized aggregation) plus its private data.
Prints mean test accuracy over the clients and per architecture, bytes per client, time, and
whether the ordering holds; writes ``results/privhfl_accuracy.json``.

Query seeds (``--query-seeds``): ``own`` (default, since issue 20) — each querier expands and
selects from a seed of its own, here an HMAC under a per-node ``PrivateData.query_key``
derived from ``--seed`` so that runs repeat (a deployment leaves the key out, ``os.urandom``,
or reads it from the node's own configuration); ``server`` —
the behaviour before issue 20, the server's ``PhaseConfig.seed`` (which lets the server
recompute every query's sources: ``tests/attacks/test_privhfl_query_seed.py``), for comparing
accuracy.

Usage::

    python benchmarks/privhfl_accuracy.py                     # ~10 minutes on 2 busy cores
    python benchmarks/privhfl_accuracy.py --quick             # seconds: smoke test
    python benchmarks/privhfl_accuracy.py --arms none,private,mixup,cutmix,cutout
    python benchmarks/privhfl_accuracy.py --arms mixup --query-seeds server   # before issue 20
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context
from flwr.clientapp import ClientApp
from torch import nn
from tqdm import tqdm

from flwr_fsl.data import load_fashion, load_mnist, partition_indices
from flwr_fsl.families.privhfl.mod import PhaseConfig, PrivateData, PrivHFLClient
from flwr_fsl.families.privhfl.strategy import PrivHFL
from flwr_fsl.models import set_torch_threads
from flwr_fsl.models.privhfl import build_model
from flwr_fsl.testing import InProcessGrid

MODEL_SLOT = "fsl.privhfl.model"  # where PrivHFLClient keeps a node's weights


class ServerSeededClient(PrivHFLClient):
    """The query seeds before issue 20: the server's ``PhaseConfig.seed`` (for comparison)."""

    def query_seed(self, context: Context, config: PhaseConfig, data: PrivateData) -> int:
        """Return the server's seed of this ``generate`` request."""
        return config.seed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=["fashion", "mnist"], default="fashion")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--per-client", type=int, default=500, help="private images per client")
    parser.add_argument("--archs", default="vgg7,resnet8,resnet10")
    parser.add_argument("--arms", default="none,private,mixup")
    parser.add_argument("--queries", type=int, default=1000, help="queries per querier (mixup)")
    parser.add_argument("--pool", type=int, default=5000, help="expanded pool size")
    parser.add_argument("--local-epochs", type=int, default=15)
    parser.add_argument("--local-optimizer", choices=["sgd", "adam"], default="adam")
    parser.add_argument("--local-lr", type=float, default=3e-3)
    parser.add_argument("--retrain-epochs", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--test", type=int, default=2000, help="test images per evaluation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--query-seeds", choices=["own", "server"], default="own",
        help="querier's own seeds (default) or the server's (before issue 20)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="tiny settings (smoke test)")
    parser.add_argument("--out", type=Path, default=Path("results/privhfl_accuracy.json"))
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.per_client, args.queries, args.pool = 4, 60, 60, 300
        args.local_epochs, args.retrain_epochs, args.test = 2, 1, 200
    return args


def load(dataset: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return load_fashion() if dataset == "fashion" else load_mnist()


def copy_record(record: ArrayRecord) -> ArrayRecord:
    return ArrayRecord({k: Array(v.numpy().copy()) for k, v in record.items()})


def strategy_for(args: argparse.Namespace, expansion: str) -> PrivHFL:
    queries = args.per_client if expansion == "private" else args.queries
    return PrivHFL(
        min_available_nodes=args.clients,
        min_train_nodes=args.clients,
        min_evaluate_nodes=args.clients,
        expansion=expansion,
        answering="plaintext",  # not the default (secure): thousands of CNN queries per arm
        pool_size=max(args.pool, queries),
        num_queries=queries,
        selection="random",
        temperature=args.temperature,
        local_epochs=args.local_epochs,
        local_optimizer=args.local_optimizer,
        local_lr=args.local_lr,
        retrain_epochs=args.retrain_epochs,
        seed=args.seed,
        sampling_seed=args.seed,
    )


def summarize(
    metrics: dict[int, dict[str, float]], arch_of: dict[int, str], archs: list[str]
) -> dict[str, Any]:
    accs = {n: m["accuracy"] for n, m in metrics.items()}
    per_arch = {
        a: float(np.mean([accs[n] for n in accs if arch_of[n] == a]))
        for a in archs
        if any(arch_of[n] == a for n in accs)
    }
    return {"mean": float(np.mean(list(accs.values()))), "per_arch": per_arch, "nodes": accs}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    set_torch_threads(1)
    archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    x_train, y_train, x_test, y_test = load(args.dataset)
    parts = partition_indices(y_train, len(x_train) // args.per_client, "iid", seed=args.seed)
    parts = [p[: args.per_client] for p in parts[: args.clients]]
    test_idx = np.random.default_rng(args.seed).permutation(len(x_test))[: args.test]
    xt, yt = x_test[test_idx].reshape(-1, 1, 28, 28), y_test[test_idx]

    def arch(context: Context) -> str:
        return archs[int(context.node_config["partition-id"]) % len(archs)]

    def model_fn(context: Context) -> nn.Module:
        pid = int(context.node_config["partition-id"])
        return build_model(arch(context), seed=args.seed * 1000 + pid)

    def data_fn(context: Context) -> PrivateData:
        pid = int(context.node_config["partition-id"])
        idx = parts[pid]
        key = f"privhfl_accuracy benchmark, seed {args.seed}, node {pid}".encode()
        return PrivateData(x_train[idx].reshape(-1, 1, 28, 28), y_train[idx], xt, yt, key)

    app = ClientApp()
    client = ServerSeededClient if args.query_seeds == "server" else PrivHFLClient
    client(model_fn, data_fn, num_threads=1).register(app)

    def new_grid() -> InProcessGrid:
        return InProcessGrid(app, args.clients)

    print(
        f"PrivHFL on {args.dataset}: {args.clients} clients x {args.per_client} private images, "
        f"architectures {archs} by partition id, {args.test} test images; local "
        f"{args.local_epochs} epochs ({args.local_optimizer}, lr {args.local_lr}), re-training "
        f"{args.retrain_epochs} epochs (Adam), T = {args.temperature}, query seeds: "
        f"{args.query_seeds}",
        flush=True,
    )
    t0 = time.perf_counter()
    grid = new_grid()
    arch_of = {n: arch(grid.context(n)) for n in grid.get_node_ids()}
    base = strategy_for(args, "none")
    base.local(grid, base.round_state(1))
    local_models = {n: copy_record(grid.context(n).state[MODEL_SLOT]) for n in grid.get_node_ids()}
    local_metrics = base.node_metrics[0]
    results: dict[str, Any] = {
        "local": {**summarize(local_metrics, arch_of, archs), "queries": 0, "seconds": 0.0}
    }
    print(f"local phase + evaluation: {time.perf_counter() - t0:.1f} s", flush=True)
    for arm in tqdm(arms, desc="arms", unit="arm"):
        t = time.perf_counter()
        grid = new_grid()
        for n in grid.get_node_ids():
            grid.context(n).state[MODEL_SLOT] = copy_record(local_models[n])
        strategy = strategy_for(args, arm)
        strategy.trained = set(grid.get_node_ids())
        strategy.run(grid, num_rounds=1)
        if strategy.failed_rounds or strategy.dropped.get(1):
            print(f"{arm}: round failed or nodes dropped: {strategy.rounds[1]}", file=sys.stderr)
            return 1
        up = sum(t.mean_up_bytes for t in strategy.rounds[1].traffic) / 1e6
        down = sum(t.mean_down_bytes for t in strategy.rounds[1].traffic) / 1e6
        queries = 0 if arm == "none" else strategy.num_queries
        results[arm] = {
            **summarize(strategy.node_metrics[1], arch_of, archs),
            "queries": queries,
            "up_mb": up,
            "down_mb": down,
            "seconds": time.perf_counter() - t,
        }
        print(f"{arm}: {results[arm]['mean']:.4f} in {results[arm]['seconds']:.1f} s", flush=True)

    header = f"{'arm':<9} {'queries':>7} {'mean acc':>9} " + " ".join(f"{a:>9}" for a in archs)
    header += f" {'up MB/cl':>9} {'down MB/cl':>10} {'time s':>7}"
    print("\nTest accuracy after one PrivHFL iteration (mean over clients, per architecture):")
    print(header)
    for name, r in results.items():
        row = f"{name:<9} {r['queries']:>7} {100 * r['mean']:>8.2f}% "
        row += " ".join(f"{100 * r['per_arch'].get(a, float('nan')):>8.2f}%" for a in archs)
        row += f" {r.get('up_mb', 0.0):>9.2f} {r.get('down_mb', 0.0):>10.2f} {r['seconds']:>7.1f}"
        print(row)
    order = [a for a in ("local", "private", "mixup") if a in results]
    if len(order) > 1:
        holds = all(results[a]["mean"] < results[b]["mean"] for a, b in itertools.pairwise(order))
        print(f"\nordering {' < '.join(order)}: {'holds' if holds else 'does NOT hold'}")
    if "none" in results and "mixup" in results:
        gain = 100 * (results["mixup"]["mean"] - results["none"]["mean"])
        print(f"mixup vs equal-effort re-training on private data only: {gain:+.2f} points")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"settings": {k: str(v) for k, v in vars(args).items()}, "results": results}
    args.out.write_text(json.dumps(payload, indent=2, default=float))
    print(f"wrote {args.out}; total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
