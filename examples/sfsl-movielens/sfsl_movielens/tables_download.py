"""Download per client and round of SFSL on a several-table MovieLens model vs SecAgg's dense one.

The model is the issue-22 recommendation setting's shape: an item table (1682 x ``dim``), a
genre table (19 x ``dim``) *derived* from the items by MovieLens' public item -> genres map,
and dense layers (an MLP over [pooled history items, pooled history genres, target item]).
Users are clients; a user's primary rows are the items of its ratings (at most ``max-rows``,
count 1). The arms, in one run, on :class:`~flwr_fsl.testing.InProcessGrid`:

* ``sfsl-cpp2``, ``sfsl-cpp5`` — ``SFSLFedSubAvg(ModelTables, dp=None, weighted=True)`` (Niu's
  protocol as the paper specifies it, Table V's CPP2 / CPP5);
* ``sfsl-dp`` — ``SFSLFedSubAvg(ModelTables)`` at its defaults (distributed DP), CPP2;
* ``secagg`` — ``SecAggFedAvg`` on the whole model (what every client downloads: all of it).

Bytes are Flower's protobuf encoding of every message the round engine sends a client (all
phases of the round: SecAgg keys and shares, the union, the perturb ask, the rows ask with the
submodel), per client and round, averaged. Training is a stand-in (a small random step on the
client's real rows and the dense layers): bytes do not depend on it.

Run (from the repository root, with the data prepared)::

    python examples/sfsl-movielens/sfsl_movielens/tables_download.py --users 100 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.experiment.logs import LOG_LEVEL_KEY, flower_log_level
from flwr_fsl.families.sfsl.perturb import RRParams
from flwr_fsl.models import mf
from flwr_fsl.mods import PerturbedRows, secagg_mod
from flwr_fsl.strategies import SecAggFedAvg, SFSLFedSubAvg
from flwr_fsl.submodel.tables import ModelTables, RowMap, TableSpec
from flwr_fsl.testing import InProcessGrid

ARMS = ("sfsl-cpp2", "sfsl-cpp5", "sfsl-dp", "secagg")
PARTS = {"train": "train", "perturb": "perturb"}
"""Download parts by phase: the train messages (SFSL: union-train + rows-train, whose rows ask
carries the submodel, the union and the shared runs), the perturb ask (the union) and the
SecAgg key phases (advertise, share, unmask: the roster, the peers' encrypted shares)."""
CPP = {"sfsl-cpp2": RRParams.symmetric(15 / 16, 1 / 16), "sfsl-cpp5": RRParams.symmetric(1, 1)}


def genre_map() -> RowMap:
    """MovieLens-100k's public item -> genres map (the prepared ``movielens-items.npz``)."""
    root = Path(os.environ.get("FLWR_FSL_CACHE", ".cache/data"))
    data = np.load(root / "movielens-items.npz", allow_pickle=False)
    return RowMap(data["indptr"], data["indices"])


def build(dim: int, hidden: int, max_rows: int) -> tuple[ModelTables, dict[str, np.ndarray]]:
    """Return the table spec and the initial model."""
    genres = genre_map()
    items, num_genres = genres.num_parents, genres.max_child + 1
    tables = ModelTables(
        (
            TableSpec("item_emb", max_rows),
            TableSpec("genre_emb", num_genres, derived_from="item_emb", row_map=genres),
        )
    )
    rng = np.random.default_rng(0)
    model = {
        "item_emb": (0.1 * rng.normal(size=(items, dim))).astype(np.float32),
        "genre_emb": (0.1 * rng.normal(size=(num_genres, dim))).astype(np.float32),
        "mlp.0.weight": (0.1 * rng.normal(size=(hidden, 3 * dim))).astype(np.float32),
        "mlp.0.bias": np.zeros(hidden, np.float32),
        "mlp.1.weight": (0.1 * rng.normal(size=(1, hidden))).astype(np.float32),
        "mlp.1.bias": np.zeros(1, np.float32),
    }
    return tables, model


def user_items(user: int, max_rows: int) -> np.ndarray:
    """Return the user's row set: its training ratings' items (``flwr_fsl.models.mf``)."""
    return np.asarray(mf.user_data(user, max_rows).rows, dtype=np.int64)


def client_app(tables: ModelTables, max_rows: int, rr: RRParams) -> ClientApp:
    """One ClientApp for every arm: ``PerturbedRows`` (the tables) and ``secagg_mod``."""

    def rows(context: Context) -> dict[str, np.ndarray]:
        return {"item_emb": user_items(int(context.node_config["partition-id"]), max_rows)}

    mod = PerturbedRows(tables, rows=rows, rr=rr, persist_memo=False)
    app = ClientApp(mods=[mod.mod, secagg_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        user = int(context.node_config["partition-id"])
        arrays = {k: a.numpy().copy() for k, a in msg.content["arrays"].items()}
        real = tables.client_rows({"item_emb": user_items(user, max_rows)})
        step = np.random.default_rng(user)
        for name, idx in real.items():
            arrays[name][idx] += (
                0.01 * step.normal(size=(idx.size, arrays[name].shape[1]))
            ).astype(np.float32)
        for name in ("mlp.0.weight", "mlp.0.bias", "mlp.1.weight", "mlp.1.bias"):
            arrays[name] += np.float32(0.001)
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                "metrics": MetricRecord({"num-examples": 1}),
            }
        )
        return Message(content, reply_to=msg)

    return app


def strategy(arm: str, tables: ModelTables, users: int) -> Any:
    """Return the arm's strategy (every sampled client each round)."""
    if arm == "secagg":
        return SecAggFedAvg(min_available_nodes=users, fraction_evaluate=0.0)
    paper = {} if arm == "sfsl-dp" else {"dp": None, "weighted": True}
    return SFSLFedSubAvg(tables, min_available_nodes=users, max_count=100.0, **paper)


def run_arm(arm: str, users: int, rounds: int, dim: int, hidden: int, max_rows: int) -> dict:
    """Run one arm; return its mean download / upload per client and round and its time."""
    tables, model = build(dim, hidden, max_rows)
    rr = CPP.get(arm, CPP["sfsl-cpp2"])
    node = {"fsl-min-noise-multiplier": 0.0}  # these clients accept the paper's noiseless rounds

    def config(i: int) -> dict[str, Any]:
        return {"partition-id": i, "num-partitions": users, **node}

    grid = InProcessGrid(client_app(tables, max_rows, rr), users, node_config_fn=config)
    strat = strategy(arm, tables, users)
    initial = ArrayRecord({k: Array(v.copy()) for k, v in model.items()})
    start = time.perf_counter()
    strat.start(grid=grid, initial_arrays=initial, num_rounds=rounds)
    seconds = time.perf_counter() - start
    down: dict[tuple[int, int], int] = {}
    up: dict[tuple[int, int], int] = {}
    parts: dict[str, float] = {}
    for t in strat.traffic:
        if t.phase.startswith("evaluate"):
            continue
        for n, b in t.down_bytes.items():
            down[(t.server_round, n)] = down.get((t.server_round, n), 0) + b
        for n, b in t.up_bytes.items():
            up[(t.server_round, n)] = up.get((t.server_round, n), 0) + b
        part = PARTS.get(t.phase.rsplit("-", 1)[-1], "keys")
        parts[part] = parts.get(part, 0.0) + sum(t.down_bytes.values())
    reports = getattr(strat, "reports", {})
    union = np.mean([r["union"] for r in reports.values()]) if reports else float("nan")
    model_bytes = sum(v.nbytes for v in model.values())
    return {
        "arm": arm,
        "down": float(np.mean(list(down.values()))),
        "up": float(np.mean(list(up.values()))),
        "union": float(union),
        "model": model_bytes,
        "seconds": seconds / rounds,
        "failed": len(getattr(strat, "failed_rounds", {})),
        "parts": {k: v / max(len(down), 1) for k, v in parts.items()},
    }


def main(argv: list[str] | None = None) -> None:
    """Print the download table (command in the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--max-rows", type=int, default=64)
    parser.add_argument("--arms", default=",".join(ARMS))
    args = parser.parse_args(argv)
    with flower_log_level({LOG_LEVEL_KEY: "warning"}):  # restored afterwards
        rows = [
            run_arm(a, args.users, args.rounds, args.dim, args.hidden, args.max_rows)
            for a in args.arms.split(",")
        ]
    print(
        f"{args.users} users, {args.rounds} rounds, item 1682x{args.dim} + genre 19x{args.dim} "
        f"(derived) + MLP {args.hidden} hidden; model {rows[0]['model']:,} B; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    secagg = next((r["down"] for r in rows if r["arm"] == "secagg"), None)
    print(
        f"{'arm':<10} {'down B/cl/rd':>13} {'vs secagg':>10} {'up B/cl/rd':>11} "
        f"{'union':>6} {'s/rd':>6}"
    )
    for r in rows:
        ratio = f"{r['down'] / secagg:.0%}" if secagg else "n/a"
        print(
            f"{r['arm']:<10} {r['down']:>13,.0f} {ratio:>10} {r['up']:>11,.0f} "
            f"{r['union']:>6.0f} {r['seconds']:>6.1f}" + (" FAILED" if r["failed"] else "")
        )
    print("download by part (B per client and round): train messages / perturb ask / SecAgg keys")
    for r in rows:
        p = r["parts"]
        print(
            f"{r['arm']:<10} {p.get('train', 0):>10,.0f} {p.get('perturb', 0):>10,.0f} "
            f"{p.get('keys', 0):>10,.0f}"
        )


if __name__ == "__main__":
    main()
