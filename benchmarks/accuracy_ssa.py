"""Accuracy benchmark: two-server secure top-k aggregation (SSA) vs plaintext top-k.

Acceptance check of issue 4: ``examples/dpf-ssa-mnist`` reaches the same test accuracy as the
plaintext top-k run with the same seed — the final accuracies differ by at most 0.3 points
after 20 rounds.

Issue 20 changed the secure strategy's defaults: every client now counts 1 per coordinate it
chose (unit weights), where it counted its ``num-examples`` before (sample weights; still
``SecureFedSubAvg(weighted=True)``, run-config ``ssa-weighted = true``). ``--defaults both``
(the default) trains the experiment under each and prints the accuracy curves side by side:
the accuracy cost of the new default. The plaintext top-k arm of each run weights as its
secure arm (the bar compares those), so "old" plaintext is ``FedSubAvg`` as before. With IID
partitions every client has the same ``num-examples`` and both defaults give the same model;
``--partitioning dirichlet`` gives the clients unequal sizes. (Non-IID, the secure and
plaintext arms of either weighting agree after round 1 up to fixed point, 7e-9, then drift
apart: a 2^-24 difference flips near-tied top-k choices of the next round, 0.01 after round 2.
The 0.3-point bar is for IID partitions.)

It runs the example's own code — its ``ClientApp`` (``mods=[ssa_mod, topk_mod]``) and its
ServerApp experiment (:func:`dpf_ssa_mnist.server_app.run_experiment`: ``SecureFedSubAvg``
with S1 as the in-process twin, then plaintext ``FedSubAvg`` with the same top-k count) — in
one process on :class:`flwr_fsl.testing.InProcessGrid` (no Ray), 10 IID clients, 5 sampled
per round, the same clients and seeds in both trainings. It prints both accuracy curves, the
final accuracies and their difference, upload bytes per client per round and the largest
difference between the final global models, and writes ``results/accuracy_ssa.json``.
Exit status 1 if the bar is missed.

Usage::

    python benchmarks/accuracy_ssa.py                 # 20 rounds, the example's defaults
    python benchmarks/accuracy_ssa.py --quick         # 3 rounds, capped data: smoke test
    python benchmarks/accuracy_ssa.py --partitioning dirichlet --clients 20 --rounds 10 \
        --fraction-train 0.25 --test-size 2000       # unit vs sample weights, unequal clients
    python benchmarks/accuracy_ssa.py --index         # index mode: DP off vs the DP default

The same experiment through Flower's simulation engine is printed at the end (``flwr run``).

**Index mode** (``--index``, issue 20): ``examples/dpf-psr-movielens`` (PSR + row SSA, U-DPF;
``--users`` users, all training every round) twice from the same table and seeds — with the old
defaults (no DP: ``ssa-dp-noise-multiplier = 0`` on S0, node config
``fsl-min-noise-multiplier = 0`` on the clients) and with the new ones (DP on: ``z = 1``, clip
norm 1, weights clipped to 1, budget ``ε = 20`` at ``δ = 1e-5``, which stops the run after 10
rounds) — and prints per round the held-out RMSE of both, the share of rows the DP run updated
(rows whose noisy count passed the threshold) and its ``ε``; writes
``results/accuracy_ssa_index.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
APP_DIR = REPO / "examples" / "dpf-ssa-mnist"
sys.path.insert(0, str(APP_DIR))

from dpf_ssa_mnist.client_app import app as client_app  # noqa: E402
from dpf_ssa_mnist.server_app import ACCURACY, run_experiment  # noqa: E402

from flwr_fsl.testing import InProcessGrid  # noqa: E402

BAR_POINTS = 0.3
OUT_NAME = "accuracy_ssa.json"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=None, help="default 20 (--index: 12)")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--fraction-train", type=float, default=0.5)
    p.add_argument("--max-client-samples", type=int, default=0, help="0 = whole partition")
    p.add_argument("--test-size", type=int, default=0, help="0 = all 10,000 test images")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--defaults",
        choices=["old", "new", "both"],
        default="both",
        help="old: sample weights (weighted=True); new: unit weights (the default now)",
    )
    p.add_argument("--partitioning", choices=["iid", "dirichlet"], default="iid")
    p.add_argument("--dirichlet-alpha", type=float, default=0.5)
    p.add_argument("--quick", action="store_true", help="3 rounds, 300 samples per client")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / OUT_NAME)
    p.add_argument("--plot", action="store_true", help="also save histories and a plot")
    p.add_argument("--index", action="store_true", help="index mode: DP off vs the DP default")
    p.add_argument("--users", type=int, default=100, help="--index: MovieLens users (<= 943)")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 12 if args.index else 20
    if args.quick:
        args.rounds, args.max_client_samples, args.test_size = 3, 300, 2000
    if args.index and args.out == REPO / "benchmarks" / "results" / OUT_NAME:
        args.out = args.out.with_name("accuracy_ssa_index.json")
    return args


def flwr_run_command(run_config: dict[str, Any], clients: int) -> str:
    """Return the ``flwr run`` command of the same experiment on Flower's simulation engine."""
    items = []
    for key, value in run_config.items():
        if isinstance(value, str):
            items.append(f"{key}='{value}'")
        elif isinstance(value, bool):
            items.append(f"{key}={'true' if value else 'false'}")
        else:
            items.append(f"{key}={value}")
    # Double quotes: the shell expands $FLWR_HOME in the key file path.
    return (
        "flwr run examples/dpf-ssa-mnist local --stream --federation-config "
        f'"num-supernodes={clients} client-resources-num-cpus=1" --run-config "{" ".join(items)}"'
    )


def index_main(args: argparse.Namespace) -> int:
    """Index mode: the MovieLens example with DP off (old defaults) and on (new); side by side."""
    from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY
    from flwr_fsl.crypto.channel import SealingKeyPair
    from flwr_fsl.helper import InProcessHelper

    sys.path.insert(0, str(REPO / "examples" / "dpf-psr-movielens"))
    from dpf_psr_movielens.client_app import app as movielens_app
    from dpf_psr_movielens.server_app import RMSE
    from dpf_psr_movielens.server_app import run_experiment as movielens_experiment

    users = args.users

    def no_floor(i: int) -> dict[str, Any]:
        return {"partition-id": i, "num-partitions": users, NODE_MIN_NOISE_KEY: 0.0}

    key = SealingKeyPair.generate()
    base: dict[str, Any] = {
        "num-server-rounds": args.rounds,
        "min-nodes": users,
        "seed": args.seed,
        "compare-plaintext": False,
        "ssa-helper-fingerprint": key.fingerprint,
    }
    setups = {
        "old": ({**base, "ssa-dp-noise-multiplier": 0.0}, no_floor),
        "new": (base, None),
    }
    records: dict[str, Any] = {}
    started = time.perf_counter()
    for name, (config, node_config) in tqdm(setups.items(), desc="defaults", unit="run"):
        grid = InProcessGrid(movielens_app, users, config, node_config_fn=node_config)
        result = movielens_experiment(grid, config, helper=InProcessHelper(keypair=key))
        records[name] = result.record.arm("secure")
    elapsed = time.perf_counter() - started
    old, new = records["old"], records["new"]
    rows = []
    print(f"\nindex mode, dpf-psr-movielens, {users} users, all training every round:")
    print(
        f"{'round':>5}  {'RMSE old (no DP)':>16}  {'RMSE new (DP)':>13}  "
        f"{'rows updated (DP)':>17}  {'epsilon (DP)':>12}"
    )
    new_rounds = {r.server_round: r for r in new.rounds}
    for r in old.rounds:
        n = new_rounds.get(r.server_round)
        rmse_new = RMSE.value(n) if n is not None else None
        touched = n.train_metrics.get("touched-fraction") if n is not None else None
        eps = n.train_metrics.get("dp-epsilon") if n is not None else None
        rows.append(
            {
                "round": r.server_round,
                "rmse_old": RMSE.value(r),
                "rmse_new": rmse_new,
                "rows_updated_new": touched,
                "epsilon_new": eps,
            }
        )
        print(
            f"{r.server_round:>5}  {_num(RMSE.value(r), 4):>16}  {_num(rmse_new, 4):>13}  "
            f"{_pct(touched):>17}  {_num(eps, 2):>12}"
        )
    final_old, final_new = old.final(RMSE), new.final(RMSE)
    print(
        f"final RMSE: old defaults (no DP) {_num(final_old, 4)} after "
        f"{len(old.aggregated_rounds)} rounds; new defaults (DP) {_num(final_new, 4)} after "
        f"{len(new.aggregated_rounds)} rounds (its budget stops it); total {elapsed:.0f} s"
    )
    doc = {
        "benchmark": "accuracy_ssa_index",
        "setup": {"users": users, "rounds": args.rounds, "seed": args.seed},
        "rounds": rows,
        "final_rmse": {"old": final_old, "new": final_new},
        "experiment": {"old": old.to_dict(), "new": new.to_dict()},
        "total_seconds": elapsed,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


RUNS = {"new": False, "old": True}  # --defaults -> ssa-weighted


def train(args: argparse.Namespace, weighted: bool) -> tuple[Any, dict[str, Any], float]:
    """Run the example's experiment (secure + plaintext top-k) with one weighting."""
    with tempfile.TemporaryDirectory(prefix="accuracy-ssa-") as tmp:
        run_config: dict[str, Any] = {
            "num-server-rounds": args.rounds,
            "fraction-train": args.fraction_train,
            "max-client-samples": args.max_client_samples,
            "test-size": args.test_size,
            "seed": args.seed,
            "partitioning": args.partitioning,
            "dirichlet-alpha": args.dirichlet_alpha,
            "compare-plaintext": True,
            "compare-dense": False,
            "ssa-weighted": weighted,
            "ssa-helper-key-file": str(Path(tmp) / "s1.pem"),
        }
        if args.plot:
            suffix = "old" if weighted else "new"
            run_config["results-dir"] = str(args.out.parent / f"accuracy_ssa_{suffix}")
        grid = InProcessGrid(client_app, args.clients, run_config)
        started = time.perf_counter()
        result = run_experiment(grid, run_config)
        return result, run_config, time.perf_counter() - started


def side_by_side(results: dict[str, Any]) -> None:
    """Print each round's accuracy of every run's secure and plaintext arms."""
    columns = [(name, arm) for name in results for arm in ("secure", "plaintext")]
    labels = {"new": "unit weights (new)", "old": "sample weights (old)"}
    print("\naccuracy % per round (secure / plaintext top-k, each weighting as its run)")
    print(f"{'round':>5}  " + "  ".join(f"{labels[n][:12] + ' ' + a:>22}" for n, a in columns))
    rounds = max(len(r.arm("secure").record.rounds) for r in results.values())
    for index in range(rounds):
        cells = []
        for name, arm in columns:
            record = results[name].arm(arm).record
            value = ACCURACY.value(record.rounds[index]) if index < len(record.rounds) else None
            cells.append(f"{'n/a' if value is None else f'{value:.2f}':>22}")
        print(f"{index + 1:>5}  " + "  ".join(cells))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the exit status."""
    args = parse_args(argv)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    if args.index:
        return index_main(args)
    names = list(RUNS) if args.defaults == "both" else [args.defaults]
    results, configs, seconds = {}, {}, {}
    for name in names:
        results[name], configs[name], seconds[name] = train(args, RUNS[name])
    side_by_side(results)
    passed, summary = True, {}
    for name in names:
        secure, plain = results[name].arm("secure"), results[name].arm("plaintext")
        acc_s, acc_p = secure.record.final(ACCURACY), plain.record.final(ACCURACY)
        if acc_s is None or acc_p is None:
            print(f"{name}: no final accuracy reported", file=sys.stderr)
            return 1
        diff = acc_s - acc_p  # ACCURACY is in percent: the difference is in points
        ok = abs(diff) <= BAR_POINTS and not any(r.failed for r in secure.record.rounds)
        passed &= ok
        summary[name] = {
            "weighted": RUNS[name],
            "final_accuracy_secure": acc_s,
            "final_accuracy_plaintext": acc_p,
            "final_accuracy_difference_points": diff,
            "max_abs_model_diff": secure.record.max_abs_diff,
            "bar_passed": ok,
            "total_seconds": seconds[name],
            "experiment": results[name].record.to_dict(),
        }
        print(
            f"{name} ({'sample' if RUNS[name] else 'unit'} weights): final acc secure "
            f"{acc_s:.2f}%, plaintext {acc_p:.2f}%; bar |secure - plaintext| = {abs(diff):.2f} "
            f"points (<= {BAR_POINTS}) after {args.rounds} rounds: {'PASS' if ok else 'FAIL'} "
            f"({seconds[name]:.0f} s)"
        )
    if len(names) == 2:
        cost = summary["new"]["final_accuracy_secure"] - summary["old"]["final_accuracy_secure"]
        print(f"new - old defaults, final secure accuracy: {cost:+.2f} points")
    command_config = {k: v for k, v in configs[names[0]].items() if k != "ssa-helper-key-file"}
    command_config["ssa-helper-key-file"] = "$FLWR_HOME/dpf-ssa-mnist-s1.pem"
    command = flwr_run_command(command_config, args.clients)
    print(f"the same experiment on Flower's simulation engine:\n  {command}")
    doc = {
        "benchmark": "accuracy_ssa",
        "bar": {
            "max_abs_final_accuracy_difference_points": BAR_POINTS,
            "rounds": args.rounds,
            "passed": passed,
        },
        "setup": {
            "clients": args.clients,
            "fraction_train": args.fraction_train,
            "max_client_samples": args.max_client_samples,
            "test_size": args.test_size,
            "seed": args.seed,
            "partitioning": args.partitioning,
            "dirichlet_alpha": args.dirichlet_alpha,
            "quick": args.quick,
            "grid": "flwr_fsl.testing.InProcessGrid",
            "helper": "InProcessHelper",
            "python": platform.python_version(),
            "machine": platform.machine(),
        },
        "runs": summary,
        "flwr_run_command": command,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"written to {args.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
