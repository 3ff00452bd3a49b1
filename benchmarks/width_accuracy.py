"""Accuracy of heterogeneous-capacity training: SESA vs FedRolex vs HeteroFL vs random vs full.

Issue 10's ordering check on Sami & Güler's setting (§VI and their notebooks; anchors from
``../shared/ANCHORS.md``, MNIST, 100 users: full 95.87, SESA 91.92, FedRolex 90.77 maximum
accuracy): clients in three capacity groups of a third each (``B = 1, 1/2, 1/4``), 10% of them
dropping out of each round, McMahan's non-IID split (two label-sorted shards per client), 600
samples per client, Adam with learning rate 5e-4, one local epoch, batch size 10, MLP
784-200-10. It runs ``examples/width-mnist`` itself — its ClientApp (``@app.train`` +
``sesa_mod`` + ``width_mod``) and its ServerApp experiment
(:func:`width_mnist.server_app.run_experiment`: every arm from the same initial model, with
the same clients sampled each round) — on :class:`flwr_fsl.testing.InProcessGrid`, one data
set per invocation, and writes ``results/width_accuracy_<model>_<dataset>.json``.

Arms: ``full`` (every client at rate 1: the target), ``fedrolex`` (rolling window),
``heterofl`` (static prefix), ``random`` (random channels per client and round), ``shards``
(SESA's random shards drawn by the server, plaintext) and ``sesa`` (SESA's secure
aggregation: each client picks its shards secretly; Lagrange-coded aggregation over
``F_p``, ``T`` = half of the sampled clients).

It prints the accuracy curves, a table of final and maximum accuracy, the order of the arms,
and the claims it tests: "rolling >= random >= static" (FedRolex's ordering — a claim, not an
assumption: the printout says whether it held, on the maximum and on the mean of the last five
evaluations) and the gaps SESA − full, FedRolex − full and SESA − FedRolex beside the anchors'.
``--report`` prints the table of every saved data set and draws
``results/width_accuracy_<model>.png`` (accuracy vs round, one panel per data set); ``--tag``
adds a suffix to the file names (a run at another scale).

The default scale (20 users, 18 per round, 40 rounds) is what fits in about eight minutes per
data set on two shared cores: the SESA arm's secure aggregation took ~0.4 s per client and round
at 20 clients here; at 100 users one secure round through Flower took 208 s (193 s of CPU)
and 5.75 GiB peak on two lightly loaded cores (``benchmarks/sesa_bench.py``; 3.4 GiB uploaded
offline, 10.5 GiB relayed down) — it fits, but hundreds of rounds do not. ``--users 100``
runs the paper's population (drop ``sesa`` from ``--arms`` to keep it affordable).

``--engine batched`` runs the MLP arms on the example's plaintext twin
(:mod:`width_mnist.batched`: the sampled clients trained side by side, the library's
extraction rules and aggregation; the SESA arm sums the clients' fixed-point shard vectors in
``F_p`` — the value SESA's decoding yields — without the Lagrange coding).
``--secure-sesa`` puts the real protocol back into that arm (every round one in-process SESA
round over the trained clients: ``flwr_fsl.families.sesa.server.run_round``, ``T`` =
``sesa-privacy`` of them), at the secure round's cost (``benchmarks/sesa_bench.py``).
``tests/examples/test_width_batched.py`` checks it against the Flower arms round for round. It
makes the paper's scale affordable: 100 users, 250 rounds, five arms in 75–85 minutes per data
set on one core (``--eval-every 5 --threads 1``, two data sets side by side).

Usage::

    python benchmarks/width_accuracy.py --datasets mnist       # ~8 min
    python benchmarks/width_accuracy.py --datasets fashion     # ~8 min
    python benchmarks/width_accuracy.py --report               # table + PNG of the saved runs
    python benchmarks/width_accuracy.py --quick                # seconds: smoke test
    python benchmarks/width_accuracy.py --model cnn --rounds 15 --run-config sesa-privacy=2
    python benchmarks/width_accuracy.py --engine batched --datasets mnist --users 100 \
        --rounds 250 --eval-every 5 --arms full,fedrolex,heterofl,random,sesa --tag u100_batched
    python benchmarks/width_accuracy.py --report --tag u100_batched
    python benchmarks/width_accuracy.py --engine batched --datasets mnist --users 100 \
        --rounds 1 --arms sesa --secure-sesa --tag u100_secure     # the secure arm, one round

Issue 20 (privacy by default) made ``SesaFedAvg``'s default ``weighted=False`` (each client
counts 1); the old default is the ``sesa-weighted`` arm (``weighted=True``, which leaks who
chose which shard: ``tests/attacks/test_sesa_weights_subset_sum.py``). Side by side::

    python benchmarks/width_accuracy.py --arms sesa,sesa-weighted --rounds 10 --tag weights

At this scale every client holds 600 images (3,000 per client before the cap, under McMahan's
split and the Dirichlet one alike), so the two weightings compute the same average up to
fixed-point rounding; the arms still differ by their clients' OS-random shard choices.

The CNN's two conv layers form a *pair* group of ``S² = 16`` shard pairs, so SESA needs
``16 + T`` clients in every phase: at 20 users (18 per round) ``T`` must be at most 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
APP_DIR = REPO / "examples" / "width-mnist"
sys.path.insert(0, str(APP_DIR))

from width_mnist.client_app import app as client_app  # noqa: E402
from width_mnist.server_app import (  # noqa: E402
    LABELS,
    accuracy_rows,
    accuracy_table,
    best,
    run_experiment,
)
from width_mnist.task import Settings, client_data  # noqa: E402

from flwr_fsl.families.width.rules import CapacityMix  # noqa: E402
from flwr_fsl.testing import InProcessGrid  # noqa: E402
from flwr_fsl.testing.local import app_run_config  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
ALL_ARMS = "full,fedrolex,heterofl,random,shards,sesa"
ANCHORS = {"full": 95.87, "sesa": 91.92, "fedrolex": 90.77}  # SESA notebooks, MNIST, max acc %
# The batched twin sums the clients' F_p shard vectors in the clear (the value SESA decodes).
BATCHED_SESA_LABEL = "SESA (F_p sum)"
ORDER_CLAIM = ("fedrolex", "random", "heterofl")  # rolling >= random >= static


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=["mnist"], choices=["mnist", "fashion"])
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--users", type=int, default=20)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--arms", default=ALL_ARMS, help=f"comma-separated (default {ALL_ARMS})")
    p.add_argument("--samples", type=int, default=600, help="training samples per client")
    p.add_argument("--test-size", type=int, default=0, help="0 = all 10,000 test images")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--quick", action="store_true", help="6 users, 2 rounds, 64 samples")
    p.add_argument(
        "--engine",
        default="flower",
        choices=["flower", "batched"],
        help="flower: the example's apps on the in-process grid; batched: its plaintext twin "
        "(width_mnist.batched, MLP only), fast enough for hundreds of rounds at 100 users",
    )
    p.add_argument("--eval-every", type=int, default=1, help="batched: evaluate every K rounds")
    p.add_argument("--threads", type=int, default=1, help="batched: torch threads")
    p.add_argument(
        "--secure-sesa",
        action="store_true",
        help="batched: aggregate the sesa arm through the real SESA protocol (keys, sealed "
        "Lagrange evaluations, masked updates, decoding) instead of the plaintext F_p twin",
    )
    p.add_argument("--report", action="store_true", help="only print and plot saved runs")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--tag", default="", help="suffix of the file names (e.g. u100)")
    p.add_argument(
        "--run-config",
        action="append",
        default=[],
        help="more app settings, key=value (e.g. sesa-privacy=2 for the CNN)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.users, args.rounds, args.samples, args.test_size = 10, 2, 64, 500
    if args.users < 2 or args.rounds < 1 or args.samples < 1 or args.test_size < 0:
        p.error("need --users >= 2, --rounds >= 1, --samples >= 1, --test-size >= 0")
    if args.eval_every < 1 or args.threads < 1:
        p.error("need --eval-every >= 1 and --threads >= 1")
    if args.engine == "batched" and args.model != "mlp":
        p.error("--engine batched covers the MLP only")
    return args


def result_path(out: Path, model: str, dataset: str, tag: str = "") -> Path:
    """Return where one data set's run is saved."""
    return out / f"width_accuracy_{model}_{dataset}{'_' + tag if tag else ''}.json"


def mean_last(curve: list[float | None], count: int = 5) -> float | None:
    """Return the mean of the last ``count`` reported values of a curve (None if none)."""
    known = [v for v in curve if v is not None][-count:]
    return sum(known) / len(known) if known else None


def claims(rows: list[dict[str, Any]]) -> list[str]:
    """Return the claims this benchmark tests, each with the numbers it was decided on."""
    by_arm = {r["arm"]: r for r in rows}
    lines = []
    if all(a in by_arm for a in ORDER_CLAIM):
        for name, value in (
            ("max", lambda r: r["max"]),
            ("mean of the last 5 evaluations", _last5),
        ):
            vals = [value(by_arm[a]) for a in ORDER_CLAIM]
            if None in vals:
                continue
            holds = vals[0] >= vals[1] >= vals[2]
            lines.append(
                f"rolling >= random >= static ({name}): "
                f"{vals[0]:.2f} / {vals[1]:.2f} / {vals[2]:.2f} -> "
                f"{'holds' if holds else 'does not hold'}"
            )
    pairs = [
        ("sesa", "full"),
        ("fedrolex", "full"),
        ("sesa", "fedrolex"),
        ("shards", "sesa"),
        ("sesa", "sesa-weighted"),
    ]
    for a, b in pairs:
        if a in by_arm and b in by_arm and by_arm[a]["max"] is not None:
            gap = by_arm[a]["max"] - by_arm[b]["max"]
            anchor = ""
            if a in ANCHORS and b in ANCHORS:
                anchor = f" (anchor, MNIST at 100 users: {ANCHORS[a] - ANCHORS[b]:+.2f})"
            lines.append(f"max acc {a} - {b}: {gap:+.2f} points{anchor}")
    return lines


def _last5(row: dict[str, Any]) -> float | None:
    return mean_last(row["curve"])


def group_labels(run_config: dict[str, Any], users: int) -> list[str]:
    """Return, per capacity group, its clients and the labels their data hold.

    Under McMahan's split a client holds about two labels; a channel only the capacity-1
    group trains (static extraction's upper channels) learns from those labels only.
    """
    settings = Settings.from_run_config(run_config)
    rates = CapacityMix.parse(settings.width_mix).fixed(users)
    lines = []
    for rate in sorted(set(rates), reverse=True):
        labels: set[int] = set()
        clients = [pid for pid, r in enumerate(rates) if r == rate]
        for pid in clients:
            labels.update(int(v) for v in set(client_data(settings, pid, users)[1].tolist()))
        lines.append(
            f"capacity {rate:g}: {len(clients)} clients, labels {sorted(labels)} "
            f"({len(labels)} of 10)"
        )
    return lines


def curves_table(rows: list[dict[str, Any]], every: int) -> str:
    """Return accuracy (%) per round for every arm, every ``every`` rounds and the last."""
    rounds = len(rows[0]["curve"])
    shown = sorted({*range(every, rounds + 1, every), 1, rounds})
    header = f"{'round':>5}" + "".join(f"  {r['arm']:>9}" for r in rows)
    lines = [header, "-" * len(header)]
    for rnd in shown:
        if all(r["curve"][rnd - 1] is None for r in rows):
            continue  # not evaluated in this round
        cells = []
        for r in rows:
            v = r["curve"][rnd - 1]
            cells.append(f"  {'n/a' if v is None else format(v, '.2f'):>9}")
        lines.append(f"{rnd:>5}" + "".join(cells))
    return "\n".join(lines)


def run_dataset(args: argparse.Namespace, dataset: str) -> dict[str, Any]:
    """Run every arm on one data set; return what is saved."""
    overrides = {
        "num-server-rounds": args.rounds,
        "arms": args.arms,
        "dataset": dataset,
        "model": args.model,
        "max-client-samples": args.samples,
        "test-size": args.test_size,
        "seed": args.seed,
    }
    config = {**app_run_config(APP_DIR, args.run_config), **overrides}
    print(
        f"\n##### {dataset} {args.model}: {args.users} users, {args.rounds} rounds "
        f"({args.engine}) #####",
        flush=True,
    )
    saved = {
        "benchmark": "width_accuracy",
        "engine": args.engine,
        "dataset": dataset,
        "model": args.model,
        "users": args.users,
        "rounds": args.rounds,
        "secure_sesa": bool(args.secure_sesa),
        "run_config": config,
        "machine": f"{platform.machine()}, {platform.python_version()}",
    }
    started = time.perf_counter()
    if args.engine == "batched":
        return {**saved, **run_batched_dataset(args, config, started)}
    result = run_experiment(InProcessGrid(client_app, args.users, config), config)
    seconds = time.perf_counter() - started
    rows = accuracy_rows(result.record)
    initial = result.record.arms[0].initial_metrics.get("accuracy")
    return {
        **saved,
        "initial_accuracy": None if initial is None else 100 * initial,
        "rows": rows,
        "arm_seconds": {r.arm.key: r.record.seconds for r in result.runs},
        "failed_rounds": {
            r.arm.key: sorted(getattr(r.strategy, "failed_rounds", {})) for r in result.runs
        },
        "seconds": seconds,
    }


def run_batched_dataset(
    args: argparse.Namespace, config: dict[str, Any], started: float
) -> dict[str, Any]:
    """Run the batched twin (``width_mnist.batched``); save the curves at every evaluation.

    The partial file (``*.partial.json`` beside the result) lets a run cut short be reported.
    """
    import torch
    from width_mnist.batched import run_batched

    torch.set_num_threads(args.threads)
    settings = Settings.from_run_config(config)
    arms = [a for a in args.arms.split(",") if a]
    partial = result_path(args.out, args.model, config["dataset"], args.tag)
    partial = partial.with_suffix(".partial.json")

    def rows_of(curves: dict[str, list[float | None]]) -> list[dict[str, Any]]:
        rows = []
        for arm, curve in curves.items():
            top, at = best(curve)
            final = next((v for v in reversed(curve) if v is not None), None)
            rows.append(
                {"arm": arm, "label": LABELS[arm], "final": final, "max": top,
                 "max_round": at, "aggregated": len(curve), "curve": list(curve)}
            )  # fmt: skip
        return rows

    def progress(rnd: int, run: Any) -> None:
        line = "  ".join(f"{a} {c[-1]:.2f}" for a, c in run.curves.items())
        print(f"round {rnd:>4} ({time.perf_counter() - started:>6.0f} s): {line}", flush=True)
        snapshot = {"rows": rows_of(run.curves), "rounds_done": rnd,
                    "seconds": time.perf_counter() - started}  # fmt: skip
        partial.write_text(json.dumps(snapshot))

    run = run_batched(
        settings, args.users, arms, args.eval_every, progress, secure_sesa=args.secure_sesa
    )
    partial.unlink(missing_ok=True)
    return {
        "eval_every": args.eval_every,
        "initial_accuracy": None,
        "rows": rows_of(run.curves),
        "arm_seconds": run.seconds,
        "failed_rounds": {a: [] for a in arms},
        "seconds": time.perf_counter() - started,
    }


def report(runs: list[dict[str, Any]], png: Path) -> None:
    """Print the table of every run and draw the accuracy curves into ``png``."""
    for run in runs:
        rows = run["rows"]
        batched = run.get("engine") == "batched"
        for row in rows:
            if batched and row["arm"] == "sesa" and not run.get("secure_sesa"):
                row["label"] = BATCHED_SESA_LABEL
        print(
            f"\n== {run['dataset']} {run['model']}: {run['users']} users "
            f"({'batched twin, ' if batched else ''}"
            f"fraction-train {run['run_config'].get('fraction-train')}), {run['rounds']} rounds, "
            f"{run['run_config'].get('max-client-samples')} samples per client, "
            f"{run['seconds']:.0f} s =="
        )
        every = max(1, run["rounds"] // 8)
        step = int(run.get("eval_every", 1))
        print(curves_table(rows, max(step, every // step * step)))
        print()
        print(accuracy_table(rows))
        for line in claims(rows):
            print(line)
        for line in group_labels(run["run_config"], run["users"]):
            print(line)
    try:
        from matplotlib.figure import Figure
    except ImportError:
        print("(no plot: matplotlib is not installed)")
        return
    fig = Figure(figsize=(5.5 * len(runs), 4), layout="constrained")
    axes = fig.subplots(1, len(runs), squeeze=False)[0]
    for ax, run in zip(axes, runs, strict=True):
        for row in run["rows"]:
            points = [(i + 1, v) for i, v in enumerate(row["curve"]) if v is not None]
            ax.plot(*zip(*points, strict=True), label=row["label"])
        ax.set_title(
            f"{run['dataset']} {run['model']}, {run['users']} users, capacities 1/0.5/0.25"
            + (" (batched)" if run.get("engine") == "batched" else "")
        )
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.savefig(png, dpi=110)
    print(f"\nplot written to {png}")


def main(argv: list[str] | None = None) -> int:
    """Run the requested data sets (or only report the saved ones)."""
    args = parse_args(argv)
    flwr_logger = logging.getLogger("flwr")
    flwr_logger.setLevel(logging.WARNING)
    # The note that client-side evaluation is off (always, here) is expected.
    flwr_logger.addFilter(lambda r: "fraction_evaluate is set to 0.0" not in r.getMessage())
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for dataset in tqdm(args.datasets, desc="datasets", unit="dataset"):
            run = run_dataset(args, dataset)
            path = result_path(args.out, args.model, dataset, args.tag)
            if args.quick:
                path = path.with_name(path.stem + "_quick.json")
            path.write_text(json.dumps(run, indent=1))
            print(f"results written to {path}")
            report([run], path.with_suffix(".png"))
        return 0
    runs = []
    for dataset in ("mnist", "fashion"):
        path = result_path(args.out, args.model, dataset, args.tag)
        if path.exists():
            runs.append(json.loads(path.read_text()))
    if not runs:
        print(f"no saved runs for model {args.model} in {args.out}")
        return 1
    tag = f"_{args.tag}" if args.tag else ""
    report(runs, args.out / f"width_accuracy_{args.model}{tag}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
