"""Recommendation workload: one DIN-like CTR model trained by six protocols, one table.

Issue 22 item 5. It runs ``examples/recsys-movielens`` itself — its ClientApp and its
ServerApp experiment (:func:`recsys_movielens.server_app.run_experiment`: every arm from the
same initial model with the same users sampled each round) — on
:class:`flwr_fsl.testing.InProcessGrid` (one process, no Ray): MovieLens-100k, one client per
user, ratings >= 4 as clicks, a split by time per user, the model of
:mod:`flwr_fsl.models.din` (item table, genre table derived through the item -> genre map,
dense attention/MLP weights). Arms: FedAvg (dense), plaintext FedSubAvg, SecAgg
(``SecAggFedAvg``), Cui SSA/PSR on the mixed model (``ssa``: no DP, the paper's setting — the
clients' node config accepts noiseless rounds; ``ssa-dp``: the library's DP default) and Niu
SFSL at CPP2 / CPP4 — an arm this checkout cannot run is printed as "not run: <reason>",
never estimated.

Per arm: final and best AUC on the held-out samples of the users, upload and download bytes
per client per round, client and server seconds per round, what each party learns; then the
papers' orderings it can check (SFSL above FL on AUC, Niu Fig. 5; SFSL's download below
secure FL's, Niu Fig. 5a; Cui's per-round cost below 3 s per client and 1 min on the server,
Cui §7.5) with "holds" / "does not hold" / "not checked: <why>". Writes
``results/recsys_compare.json`` and, with matplotlib, ``results/recsys_compare.png`` (AUC
per round and bytes per client per round, one bar per arm).

Usage::

    python benchmarks/recsys_compare.py              # 300 users, 30 per round, 20 rounds
    python benchmarks/recsys_compare.py --quick      # seconds: 6 users, 2 rounds, no ssa-dp
    python benchmarks/recsys_compare.py --arms fedavg,fedsubavg --rounds 20
    python benchmarks/recsys_compare.py --run-config "pooling='mean' dim=16"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
APP_DIR = REPO / "examples" / "recsys-movielens"
sys.path.insert(0, str(APP_DIR))

from recsys_movielens.client_app import app as client_app  # noqa: E402
from recsys_movielens.server_app import run_experiment  # noqa: E402
from recsys_movielens.task import ALL_ARMS  # noqa: E402

from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY as NO_FLOOR  # noqa: E402
from flwr_fsl.experiment.logs import LOG_LEVEL_KEY, flower_log_level  # noqa: E402
from flwr_fsl.testing import InProcessGrid  # noqa: E402
from flwr_fsl.testing.local import app_run_config  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
OUT_NAME = "recsys_compare"
CUI_CLIENT_S, CUI_SERVER_S = 3.0, 60.0  # Cui et al. §7.5: per round, DIN on Taobao
SFSL_ARMS = ("sfsl-cpp2", "sfsl-cpp4")
FL_ARMS = ("fedavg", "secagg")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=300, help="clients = MovieLens users 0..N-1")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--fraction-train", type=float, default=0.1)
    p.add_argument("--arms", default=None, help="comma list (default: all; --quick: no ssa-dp)")
    p.add_argument("--run-config", default="", help="extra key=value overrides of the app")
    p.add_argument("--quick", action="store_true", help="6 users, all per round, 2 rounds")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--no-plot", action="store_true")
    return p.parse_args(argv)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    users, rounds, fraction = args.users, args.rounds, args.fraction_train
    arms = args.arms or ",".join(ALL_ARMS)
    if args.quick:
        users, rounds, fraction = 6, 2, 1.0
        # At 6 users no noisy count passes the DP threshold: the model would not move.
        arms = args.arms or ",".join(a for a in ALL_ARMS if a != "ssa-dp")
    overrides = [
        f"num-users={users} num-server-rounds={rounds} fraction-train={fraction} "
        f"arms='{arms}' log-level='warning'"
    ]
    if args.run_config:
        overrides.append(args.run_config)
    return app_run_config(APP_DIR, overrides)


def claims(rows: dict[str, dict[str, Any]], not_run: dict[str, str]) -> list[str]:
    """Return the papers' orderings as lines: holds / does not hold / not checked (why)."""

    def missing(keys: tuple[str, ...]) -> str | None:
        gone = [k for k in keys if k not in rows]
        if not gone:
            return None
        why = [f"{k}: {not_run.get(k, 'not requested')}" for k in gone]
        return "not checked (" + "; ".join(why) + ")"

    out = []
    for sfsl in SFSL_ARMS:
        skip = missing((sfsl, "fedavg"))
        if skip:
            out.append(f"{sfsl} AUC above FedAvg's (Niu Fig. 5): {skip}")
            continue
        a, b = rows[sfsl]["final_auc"], rows["fedavg"]["final_auc"]
        verdict = "holds" if a > b else "does not hold"
        out.append(f"{sfsl} AUC above FedAvg's (Niu Fig. 5): {verdict} ({a:.4f} vs {b:.4f})")
    for sfsl in SFSL_ARMS:
        skip = missing((sfsl, "secagg"))
        if skip:
            out.append(f"{sfsl} download below SecAgg's (Niu Fig. 5a): {skip}")
            continue
        a, b = rows[sfsl]["down_bytes"], rows["secagg"]["down_bytes"]
        verdict = "holds" if a < b else "does not hold"
        out.append(
            f"{sfsl} download below SecAgg's (Niu Fig. 5a): {verdict} "
            f"({a:,.0f} vs {b:,.0f} B/client/round, {1 - a / b:+.0%} saving)"
        )
    skip = missing(("ssa",))
    if skip:
        out.append(f"Cui SSA/PSR < {CUI_CLIENT_S:g} s client, < {CUI_SERVER_S:g} s server: {skip}")
    else:
        c, s = rows["ssa"]["client_seconds"], rows["ssa"]["server_seconds"]
        verdict = "holds" if c < CUI_CLIENT_S and s < CUI_SERVER_S else "does not hold"
        out.append(
            f"Cui SSA/PSR < {CUI_CLIENT_S:g} s client, < {CUI_SERVER_S:g} s server per round: "
            f"{verdict} ({c:.2f} s, {s:.2f} s)"
        )
    return out


def plot(result: dict[str, Any], path: Path) -> str:
    """Draw AUC per round and bytes per client per round; return what was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed"
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in result["arms"]:
        left.plot(arm["rounds"], arm["auc"], marker="o", ms=3, label=arm["label"])
    left.set_xlabel("round")
    left.set_ylabel("AUC (held-out samples)")
    left.legend()
    rows = result["comparison"]
    x = range(len(rows))
    width = 0.4
    right.bar([i - width / 2 for i in x], [r["up_bytes"] or 0 for r in rows], width, label="up")
    right.bar([i + width / 2 for i in x], [r["down_bytes"] or 0 for r in rows], width, label="down")
    right.set_xticks(list(x), [r["label"] for r in rows], rotation=20)
    right.set_ylabel("bytes per client per round")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"plot written to {path}"


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; print, save and plot it (Flower's loggers at warnings meanwhile)."""
    with flower_log_level({LOG_LEVEL_KEY: "warning"}):
        return _main(parse_args(argv))


def _main(args: argparse.Namespace) -> int:
    config = _config(args)
    users = int(config["num-users"])
    started = time.perf_counter()
    load_before = os.getloadavg()
    # The clients accept the paper's noiseless two-server rounds (the "ssa" arm); "ssa-dp" is
    # the library's default.
    grid = InProcessGrid(
        client_app,
        users,
        config,
        node_config_fn=lambda i: {"partition-id": i, "num-partitions": users, NO_FLOOR: 0.0},
    )
    result = run_experiment(grid, config)
    seconds = time.perf_counter() - started
    extra = result.record.extra
    rows = {r["key"]: r for r in extra["comparison"]}
    not_run = {n["key"]: n["reason"] for n in extra["not_run"]}
    print("\npapers' orderings:")
    for line in claims(rows, not_run):
        print(f"  {line}")
    load_after = os.getloadavg()
    print(
        f"\n{users} users, {config['num-server-rounds']} rounds, fraction-train "
        f"{config['fraction-train']}: {seconds:.0f} s; load average {load_before[0]:.2f} "
        f"before, {load_after[0]:.2f} after ({os.cpu_count()} cores)"
    )
    arms = [
        {
            "key": a.key,
            "label": a.label,
            "rounds": [r.server_round for r in a.rounds],
            "auc": [r.server_metrics.get("auc") for r in a.rounds],
        }
        for a in result.record.arms
    ]
    out = {
        "config": {k: v for k, v in config.items() if isinstance(v, int | float | str | bool)},
        "comparison": extra["comparison"],
        "not_run": extra["not_run"],
        "claims": claims(rows, not_run),
        "arms": arms,
        "seconds": seconds,
        "load": [load_before[0], load_after[0]],
        "machine": platform.platform(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = OUT_NAME + ("_quick" if args.quick else "")
    path = args.out / f"{name}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"results written to {path}")
    if not args.no_plot:
        print(plot(out, args.out / f"{name}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
