"""Sami & Güler §III on real MNIST: the input reconstruction attack, naive pipeline vs SESA.

Run ``python benchmarks/sesa_attack_demo.py [--seed S] [--trials T] [--png PATH] [--json PATH]``
(needs ``python -m flwr_fsl.data prepare mnist``). Every client takes one SGD step (lr 0.1) on
its own MNIST example(s) with the width-extracted submodel of a fresh MLP 784-200-10 and
uploads ``after - before``; :mod:`flwr_fsl.research.sesa_attack` builds what the server sees
and attacks it. Errors are relative L2 distances ``||x̂ - x|| / ||x||`` to the nearest true
input. It prints:

1. **Fig. 1 at 784-200-10** (N = 2, B = 1/4 and 1/2, nested index sets, ReLU): each client's
   error after Eq. 14 (exclusive nodes) and Eq. 15-16 (peeling), with float64 and float32
   uploads.
2. **Ten clients, naive vs SESA**, capacities 1/2 x5 + 1/4 x5, then §VI's three groups
   1 x3 + 1/2 x3 + 1/4 x4 (random extraction for the naive pipeline; K = 4 shards of 50 nodes
   for SESA, each client picking ``4 B_i`` shards at random): per client, the error of the
   naive attack's attributed recovery (:func:`attack_peel`), the best error of anything the
   naive server gets (attributed or not: also :func:`consensus_inputs` on its sums), and the
   best of anything the SESA server gets (shard ratios and consensus recoveries, never
   attributed); per SESA shard, contributors, single source or not, and what was recovered
   (labelled here with the nearest true input, which the server does not know).
3. **Contributors per shard** k = 1..8, 10, 20, 50 (one example each, ReLU vs sigmoid): the
   fraction of contributors whose input the SESA attack recovers exactly (error < 1e-6), over
   ``--trials``.
4. **Batch size** B = 1..64 for one client (its exclusive nodes, ReLU): the ratio's error to
   the nearest example of the batch and the fraction of the batch recovered exactly.

Writes the numbers as JSON (default ``benchmarks/results/sesa_attack_demo.json``) and, if
matplotlib is installed (the ``examples`` extra), a PNG of the digits: original, naive
recovery, best SESA output (default ``benchmarks/results/sesa_attack_demo.png``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from flwr_fsl.data import load_mnist
from flwr_fsl.research.sesa_attack import (
    ClientUpdate,
    GlobalMLP,
    attack_exclusive,
    attack_peel,
    attack_shards,
    consensus_inputs,
    least_squares_input,
    naive_view,
    nearest_input,
    nodes_of_shards,
    relative_error,
    sesa_view,
)

M, C, HIDDEN, SHARDS = 784, 10, 200, 4
EXACT = 1e-6
ACT = {"relu": torch.relu, "sigmoid": torch.sigmoid}


def global_model(activation: str, seed: int) -> tuple[GlobalMLP, np.ndarray]:
    """Build a fresh 784-200-10 MLP (torch's default init), float64."""
    torch.manual_seed(seed)
    fc1, fc2 = nn.Linear(M, HIDDEN).double(), nn.Linear(HIDDEN, C).double()
    glob = GlobalMLP(
        fc1.weight.detach().numpy(),
        fc1.bias.detach().numpy(),
        fc2.weight.detach().numpy(),
        activation,
    )
    return glob, fc2.bias.detach().numpy().copy()


def local_step(
    glob: GlobalMLP,
    out_bias: np.ndarray,
    nodes: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    dtype: torch.dtype = torch.float64,
) -> ClientUpdate:
    """Take one SGD step (lr 0.1) on the submodel ``nodes``; return ``after - before``."""
    fc1, fc2 = nn.Linear(M, nodes.size).to(dtype), nn.Linear(nodes.size, C).to(dtype)
    with torch.no_grad():
        fc1.weight.copy_(torch.from_numpy(glob.weight[nodes]))
        fc1.bias.copy_(torch.from_numpy(glob.bias[nodes]))
        fc2.weight.copy_(torch.from_numpy(glob.out_weight[:, nodes]))
        fc2.bias.copy_(torch.from_numpy(out_bias))
    params = [fc1.weight, fc1.bias, fc2.weight, fc2.bias]
    before = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=0.1)
    xb = torch.from_numpy(np.asarray(x).reshape(-1, M)).to(dtype)
    out = fc2(ACT[glob.activation](fc1(xb)))
    F.cross_entropy(out, torch.from_numpy(np.asarray(y, dtype=np.int64).reshape(-1))).backward()
    opt.step()
    deltas = [
        (p.detach() - b).to(torch.float64).numpy() for p, b in zip(params, before, strict=True)
    ]
    return ClientUpdate(nodes, *deltas)


def fig1(x: np.ndarray, y: np.ndarray, seed: int) -> list[dict[str, Any]]:
    """Section 1: the paper's example at full MLP width, float64 and float32 uploads."""
    glob, c = global_model("relu", seed)
    rows = []
    for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
        updates = {
            1: local_step(glob, c, np.arange(50), x[0], y[0], dtype),
            2: local_step(glob, c, np.arange(100), x[1], y[1], dtype),
        }
        view = naive_view(updates, HIDDEN)
        exclusive = attack_exclusive(view, min_bias=1e-6)
        peeled = attack_peel(view, glob, min_bias=1e-6)
        for u in (1, 2):
            rows.append(
                {
                    "upload": name,
                    "client": u,
                    "width": 50 * u,
                    "eq14_error": relative_error(exclusive[u].x, x[u - 1])
                    if u in exclusive
                    else None,
                    "eq16_error": relative_error(peeled[u].x, x[u - 1]) if u in peeled else None,
                    "method": peeled[u].method if u in peeled else "-",
                }
            )
    return rows


GROUPS = {
    "halves-quarters": [0.5] * 5 + [0.25] * 5,
    "paper-groups": [1.0] * 3 + [0.5] * 3 + [0.25] * 4,
}


def ten_clients(
    x: np.ndarray, y: np.ndarray, capacities: list[float], seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, np.ndarray]]:
    """Section 2: the same ten clients under the naive pipeline and under SESA."""
    rng = np.random.default_rng(seed)
    glob, c = global_model("relu", seed)
    truth = {u: x[u] for u in range(len(capacities))}
    naive_updates, sesa_updates = {}, {}
    for u, cap in enumerate(capacities):
        width = int(cap * HIDDEN)
        naive_nodes = np.sort(rng.choice(HIDDEN, width, replace=False))
        shards = rng.choice(SHARDS, int(cap * SHARDS), replace=False)
        naive_updates[u] = local_step(glob, c, naive_nodes, x[u], y[u])
        sesa_updates[u] = local_step(glob, c, nodes_of_shards(shards, HIDDEN, SHARDS), x[u], y[u])
    view = naive_view(naive_updates, HIDDEN)
    naive = attack_peel(view, glob)
    naive_any = [r.x for r in naive.values()]
    naive_any += [r.x for r in consensus_inputs(view.weight_sum, view.bias_sum)]
    findings = attack_shards(sesa_view(sesa_updates.values(), HIDDEN, SHARDS))
    outputs = [f.mixture for f in findings if f.mixture is not None]
    outputs += [r.x for f in findings for r in f.recovered]
    per_client = []
    images: dict[str, np.ndarray] = {}
    for u, cap in enumerate(capacities):
        errors = [relative_error(o, x[u]) for o in outputs]
        best = int(np.argmin(errors))
        images[f"sesa{u}"] = outputs[best]
        any_errors = [relative_error(o, x[u]) for o in naive_any]
        if u in naive:
            images[f"naive{u}"] = naive[u].x
        per_client.append(
            {
                "client": u,
                "capacity": cap,
                "naive_error": relative_error(naive[u].x, x[u]) if u in naive else None,
                "naive_method": naive[u].method if u in naive else "-",
                "naive_best_error": min(any_errors) if any_errors else None,
                "sesa_best_error": errors[best],
            }
        )
    per_shard = []
    for f in findings:
        recovered = []
        for r in f.recovered:
            who, err = nearest_input(r.x, truth)
            recovered.append([int(who), err, int(r.nodes.size)])
        per_shard.append(
            {
                "shard": f.shard,
                "contributors": f.contributors,
                "single_source": f.single_source,
                "ratio_error": nearest_input(f.mixture, truth)[1]
                if f.mixture is not None
                else None,
                "recovered": recovered,
            }
        )
    return per_client, per_shard, images


def contributors_sweep(
    x: np.ndarray, y: np.ndarray, trials: int, seed: int
) -> list[dict[str, Any]]:
    """Section 3: k single-example contributors to one shard; fraction recovered exactly."""
    rng = np.random.default_rng(seed)
    rows = []
    for activation in ("relu", "sigmoid"):
        for k in (*range(1, 9), 10, 20, 50):
            hits, ratio_errors = 0, []
            for t in range(trials):
                glob, c = global_model(activation, seed + 100 * t + k)
                pick = rng.choice(len(y), k, replace=False)
                updates = [local_step(glob, c, np.arange(50), x[i], y[i]) for i in pick]
                (finding,) = attack_shards(sesa_view(updates, 50, 1))
                truth = {j: x[i] for j, i in enumerate(pick)}
                got = {nearest_input(r.x, truth) for r in finding.recovered}
                hits += len({who for who, err in got if err < EXACT})
                if finding.mixture is not None:
                    ratio_errors.append(nearest_input(finding.mixture, truth)[1])
            rows.append(
                {
                    "activation": activation,
                    "contributors": k,
                    "recovered_fraction": hits / (k * trials),
                    "ratio_error_median": float(np.median(ratio_errors)) if ratio_errors else None,
                }
            )
    return rows


def batch_sweep(x: np.ndarray, y: np.ndarray, trials: int, seed: int) -> list[dict[str, Any]]:
    """Section 4: one client, batch of B examples, all 200 nodes its own (naive exclusive)."""
    rng = np.random.default_rng(seed)
    rows = []
    for batch in (1, 2, 4, 8, 16, 32, 64):
        ratio_errors, hits = [], 0
        for t in range(trials):
            glob, c = global_model("relu", seed + 1000 * t + batch)
            pick = rng.choice(len(y), batch, replace=False)
            up = local_step(glob, c, np.arange(HIDDEN), x[pick], y[pick])
            active = np.abs(up.bias) > 1e-9 * np.abs(up.bias).max()
            ratio, _ = least_squares_input(up.weight[active], up.bias[active])
            truth = {j: x[i] for j, i in enumerate(pick)}
            ratio_errors.append(nearest_input(ratio, truth)[1])
            found = consensus_inputs(up.weight, up.bias)
            hits += len({w for w, e in (nearest_input(r.x, truth) for r in found) if e < EXACT})
        rows.append(
            {
                "batch": batch,
                "ratio_error_median": float(np.median(ratio_errors)),
                "recovered_fraction": hits / (batch * trials),
            }
        )
    return rows


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}" if value < 1e-2 else f"{value:.3f}"


def save_png(path: Path, x: np.ndarray, images: dict[str, np.ndarray]) -> bool:
    """Plot originals, naive recoveries and the best SESA outputs of the ten clients."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(3, 10, figsize=(12, 4))
    for u in range(10):
        panels = [x[u], images.get(f"naive{u}"), images.get(f"sesa{u}")]
        for row, img in enumerate(panels):
            ax = axes[row, u]
            ax.set_xticks([])
            ax.set_yticks([])
            if img is not None:
                ax.imshow(np.clip(img.reshape(28, 28), 0, 1), cmap="gray", vmin=0, vmax=1)
    for row, label in enumerate(["original", "naive (attributed)", "SESA best (unattributed)"]):
        axes[row, 0].set_ylabel(label, fontsize=7)
    fig.suptitle("Sami & Güler §III on MNIST, MLP 784-200-10, one SGD step per client")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> None:
    """Run the four sections, print the tables, write JSON and the PNG."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=5, help="repetitions in sections 3-4 (5)")
    parser.add_argument("--json", default="benchmarks/results/sesa_attack_demo.json")
    parser.add_argument("--png", default="benchmarks/results/sesa_attack_demo.png")
    args = parser.parse_args()
    if args.trials < 1:
        parser.error("--trials must be >= 1")
    torch.set_num_threads(1)
    x_train, y_train, _, _ = load_mnist()
    x_all = x_train.reshape(-1, M).astype(np.float64)
    rng = np.random.default_rng(args.seed)
    pick = rng.choice(len(y_train), 12, replace=False)
    x, y = x_all[pick], y_train[pick]

    print("1. Fig. 1 at MLP 784-200-10: N=2, B=(1/4, 1/2), nested (HeteroFL prefix), ReLU")
    print(f"{'upload':8} {'client':>6} {'width':>5} {'Eq.14 err':>10} {'Eq.16 err':>10}  method")
    first = fig1(x, y, args.seed)
    for r in first:
        print(
            f"{r['upload']:8} {r['client']:>6} {r['width']:>5} {_fmt(r['eq14_error']):>10} "
            f"{_fmt(r['eq16_error']):>10}  {r['method']}"
        )

    section2: dict[str, Any] = {}
    images: dict[str, np.ndarray] = {}
    for name, capacities in GROUPS.items():
        print(f"\n2. Ten clients, capacities {capacities}: naive random extraction vs SESA K=4")
        clients, shards, pics = ten_clients(x, y, capacities, args.seed)
        section2[name] = {"clients": clients, "shards": shards}
        if name == "halves-quarters":
            images = pics
        print(
            f"{'client':>6} {'B':>5} {'naive err':>10} {'method':>10} {'naive any':>10} "
            f"{'SESA any':>10}"
        )
        for r in clients:
            print(
                f"{r['client']:>6} {r['capacity']:>5} {_fmt(r['naive_error']):>10} "
                f"{r['naive_method']:>10} {_fmt(r['naive_best_error']):>10} "
                f"{_fmt(r['sesa_best_error']):>10}"
            )
        print(
            f"{'shard':>6} {'contrib':>7} {'single':>6} {'ratio err':>10}  "
            "SESA recovered (nearest true input)"
        )
        for s in shards:
            rec = ", ".join(f"client {w} ({_fmt(e)}, {n} nodes)" for w, e, n in s["recovered"])
            print(
                f"{s['shard']:>6} {s['contributors']:>7} {s['single_source']!s:>6} "
                f"{_fmt(s['ratio_error']):>10}  {rec or '-'}"
            )

    print(f"\n3. One shard of 50 nodes, k single-example contributors ({args.trials} trials)")
    print(f"{'activation':>10} {'k':>3} {'recovered':>10} {'ratio err (median)':>19}")
    sweep = contributors_sweep(x_all, y_train, args.trials, args.seed)
    for r in sweep:
        print(
            f"{r['activation']:>10} {r['contributors']:>3} {r['recovered_fraction']:>10.2f} "
            f"{_fmt(r['ratio_error_median']):>19}"
        )

    print(f"\n4. One client, batch of B examples, 200 exclusive ReLU nodes ({args.trials} trials)")
    print(f"{'B':>3} {'ratio err (median)':>19} {'recovered':>10}")
    batches = batch_sweep(x_all, y_train, args.trials, args.seed)
    for r in batches:
        print(
            f"{r['batch']:>3} {_fmt(r['ratio_error_median']):>19} {r['recovered_fraction']:>10.2f}"
        )

    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "args": vars(args),
        "fig1": first,
        "ten_clients": section2,
        "contributors": sweep,
        "batches": batches,
    }
    out.write_text(json.dumps(record, indent=2))
    print(f"\nwrote {out}")
    if save_png(Path(args.png), x, images):
        print(f"wrote {args.png}")
    else:
        print("matplotlib not installed (pip install -e '.[examples]'): no PNG")


if __name__ == "__main__":
    main()
