"""Bytes per client of a mixed index-mode round vs a single-table one, in one run.

A DIN-like model on MovieLens-100k's sizes: an item table (1,682 x 16, ``max_rows`` 64), a genre
table derived from the items through a public many-to-many map (19 x 16, ``max_rows`` 19) and a
dense MLP (48 x 32 + 32 + 32 + 1 = 1,601 coordinates). Four clients with the same rows every
round, two rounds each, DP off, in-process S1; per phase the mean bytes per client of round 2 as
the round engine measured them (round 1 always carries fresh keys):

* **single table**: ``SecureRowFedSubAvg(helper, "item", 64)`` + ``PrivateRows`` (the genre table
  and the MLP stay as initialised);
* **mixed**: ``SecureRowFedSubAvg(helper, ModelTables(item, genre))`` + ``PrivateTables`` (both
  tables by PSR + row SSA, the MLP as the dense part, ``dense_width`` = 16);
* **mixed + psu**: the same with ``union="psu"`` (Cui's basic protocol: one PSU of the item
  rows, the genre union derived from it by the public map, PSR and SSA over the unions; the
  clients opt in with ``fsl-allow-union = true``). Also printed: each arm's wall time of the
  round (S0, S1 and the clients in one process: compare within one run only).

The single-table and mixed arms run with U-DPF (the default: a client whose rows of a table are
unchanged sends that table's hint) and with ``udpf=False`` (fresh keys every round); the psu arm
has no U-DPF (its unions change the layout every round).

``--popular N`` draws every client's items from the first ``N`` items (overlapping row sets,
where a union is small; default: all 1,682).

Run: ``python benchmarks/mixed_bytes.py [--popular 128]``.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.index_mod import PrivateRows
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.families.ssa.mixed_mod import PrivateTables
from flwr_fsl.families.ssa.union import NODE_ALLOW_UNION_KEY
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.submodel.tables import ModelTables, RowMap, TableSpec
from flwr_fsl.testing import InProcessGrid

ITEMS, GENRES, DIM, K_ITEM, CLIENTS = 1682, 19, 16, 64, 4
GENRE_OF = RowMap.from_lists(
    [np.random.default_rng([5, i]).choice(GENRES, 1 + i % 3, replace=False) for i in range(ITEMS)]
)
TABLES = ModelTables(
    (
        TableSpec("item", K_ITEM),
        TableSpec("genre", GENRES, derived_from="item", row_map=GENRE_OF),
    )
)


def model() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "item": rng.normal(0, 0.1, (ITEMS, DIM)).astype(np.float32),
        "genre": rng.normal(0, 0.1, (GENRES, DIM)).astype(np.float32),
        "mlp.w1": rng.normal(0, 0.1, (48, 32)).astype(np.float32),
        "mlp.b1": np.zeros(32, np.float32),
        "mlp.w2": rng.normal(0, 0.1, (32, 1)).astype(np.float32),
        "mlp.b2": np.zeros(1, np.float32),
    }


POPULAR = [ITEMS]  # clients draw their items from the first POPULAR[0] items (--popular)


def items(context: Context) -> np.ndarray:
    pid = int(context.node_config["partition-id"])
    return np.sort(np.random.default_rng([pid]).choice(POPULAR[0], K_ITEM, replace=False))


def app(mixed: bool) -> ClientApp:
    mod: Any = PrivateTables(TABLES, rows=items) if mixed else PrivateRows("item", rows=items)
    client = ClientApp(mods=[mod.mod])
    client.query("psr")(mod.query)
    if mixed:
        client.query("psu")(mod.query_psu)

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = {k: v.numpy() + np.float32(0.001) for k, v in msg.content["arrays"].items()}
        out = ArrayRecord({k: Array(v) for k, v in arrays.items()})
        return Message(
            RecordDict({"arrays": out, "metrics": MetricRecord({"num-examples": 1})}),
            reply_to=msg,
        )

    return client


def run(
    mixed: bool, udpf: bool | None = None, union: str = "off"
) -> tuple[dict[str, tuple[float, float]], float]:
    key = SealingKeyPair.generate()
    grid = InProcessGrid(
        app(mixed),
        CLIENTS,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=lambda i: {
            "partition-id": i,
            "num-partitions": CLIENTS,
            NODE_MIN_NOISE_KEY: 0.0,
            NODE_ALLOW_UNION_KEY: True,
        },
    )
    table: Any = TABLES if mixed else "item"
    rows: Any = {} if mixed else {"max_rows": K_ITEM}
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        table,
        dp=None,
        min_available_nodes=CLIENTS,
        udpf=udpf,
        union=union,
        **rows,
    )
    initial = ArrayRecord({k: Array(v) for k, v in model().items()})
    start = time.perf_counter()
    strategy.start(grid=grid, initial_arrays=initial, num_rounds=2)
    seconds = (time.perf_counter() - start) / 2
    round2 = {
        t.phase: (t.mean_up_bytes, t.mean_down_bytes)
        for t in strategy.traffic
        if t.server_round == 2
    }
    return round2, seconds


def main() -> None:
    """Print the bytes per client of both rounds, per phase and in total."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--popular", type=int, default=ITEMS, help="items clients draw from")
    POPULAR[0] = max(K_ITEM, min(ITEMS, parser.parse_args().popular))
    logging.getLogger("flwr").setLevel(logging.ERROR)
    arms = (
        ("single table (item, k=64)", run(mixed=False)),
        ("single table, udpf=False", run(mixed=False, udpf=False)),
        ("mixed (item+genre+MLP)", run(mixed=True)),
        ("mixed, udpf=False", run(mixed=True, udpf=False)),
        ("mixed + psu", run(mixed=True, union="psu")),
    )
    print(f"clients draw {K_ITEM} of the first {POPULAR[0]} items")
    print(f"{'bytes per client, round 2':<34} {'up B':>10} {'down B':>10} {'round s':>8}")
    for label, (result, seconds) in arms:
        for phase, (up, down) in result.items():
            print(f"{label + ' ' + phase:<34} {up:>10,.0f} {down:>10,.0f}")
        up = sum(u for u, _ in result.values())
        down = sum(d for _, d in result.values())
        print(f"{label + ' total':<34} {up:>10,.0f} {down:>10,.0f} {seconds:>8.2f}")


if __name__ == "__main__":
    main()
