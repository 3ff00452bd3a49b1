"""Private set union (Niu Alg. 3) over Bonawitz SecAgg: bytes per client and server time.

Run ``python benchmarks/psu_bench.py [--clients 20 40 60 80 100] [--domain 143534]
[--set-size 330] [--json PATH]``. The setting mirrors Niu et al.'s Taobao evaluation (§VI):
a domain of 143,534 goods IDs, exact mode (the identity map as the filter, FPR 0, no
partitions, as they ran it), and per-client sets of ``--set-size`` random IDs (their union of
100 clients reached 32,904 IDs, about 330 per client). For each client count it runs one full
round of :func:`flwr_fsl.families.secagg.protocol.run_round` with
:func:`flwr_fsl.families.sfsl.psu.client_vector` inputs in one process and reports

* **bytes per client**, up and down, counted from the protocol messages themselves
  (advertisement, roster, sealed share bundle, the masked vector of ``m + 1`` 64-bit words,
  unmask request and reply; Flower's framing is not included);
* **dropouts**: ``--dropout`` of the clients share their keys and then go silent, so the
  server must reconstruct their mask keys and remove their pair masks (the expensive case);
* **client time** (key generation, sharing, Bloom vector, masking, unmasking: the mean per
  client) and **server time** (everything the server does: collecting, summing, reconstructing
  the seeds and removing masks, then the union);
* that the union is exact.

Niu et al. report 0.91 MB per client at n = 100 with a ring of 2^32 (4-byte words); our words
are 8 bytes (Z_2^64, so sums never wrap for any client count), which doubles the vector.
Writes JSON (default ``benchmarks/results/psu_bench.json``).

``--ssa-union`` instead compares **Cui's basic protocol** (the two SSA servers run this PSU on
additive shares, then SSA over the union only: :mod:`flwr_fsl.families.ssa.union`) with the
default SSA round over ``[0, m)``, on the same clients, for element sets that overlap fully
(every client holds the same ``k`` rows), partly (drawn from a pool of ``4k`` popular rows) or
hardly (uniform over ``[0, m)``). Per arm: the union size, the largest key's domain bits
(``bits``, Cui's ``log Θ``, 9 -> 5 in their experiments), upload per client (PSU vector + SSA
keys, to S0 and S1 together), the union each client downloads, each server's time for the
round (PSU sums and opening, SSA evaluation; one thread) and the ratios to the default. The PSU
costs one more message round (clients -> servers -> clients) before SSA. ``--domains``,
``--union-clients``, ``--k`` and ``--width`` set the grid.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from flwr_fsl.crypto.psu import PSUParams, client_vector, reconstruct_union
from flwr_fsl.families.secagg.protocol import SecAggParams, run_round
from flwr_fsl.families.ssa.aggregation_strategy import SSASettings
from flwr_fsl.families.ssa.placement import key_domain_bits
from flwr_fsl.families.ssa.union import ClientSet, run_basic_round

MIB = 1 << 20


def one_round(n: int, domain: int, set_size: int, seed: int, dropout: float) -> dict[str, float]:
    """One PSU round of ``n`` clients, ``dropout`` of them lost after sharing."""
    rng = np.random.default_rng(seed)
    sets = {u: rng.choice(domain, size=set_size, replace=False) for u in range(1, n + 1)}
    psu = PSUParams.exact(domain)
    t = max(2, -(-6 * n // 10))
    params = SecAggParams(1, os.urandom(16), t, psu.vector_length)
    start = time.perf_counter()
    inputs = {u: client_vector(psu, s) for u, s in sets.items()}
    vectors_s = time.perf_counter() - start
    lost = set(list(sets)[: int(dropout * n)])
    # Shared their keys, then went silent: the server unmasks them away.
    out = run_round(inputs, params, dropouts={"mask": lost})
    client_s = out.client_seconds + vectors_s
    start = time.perf_counter()
    union = reconstruct_union(psu, out.total)
    server_s = out.server_seconds + time.perf_counter() - start
    up, down = out.up_bytes, out.down_bytes
    kept = [s for u, s in sets.items() if u not in lost]
    exact = bool(np.array_equal(union, np.unique(np.concatenate(kept))))
    return {
        "clients": n,
        "dropped": len(lost),
        "union": int(union.size),
        "up_mib_per_client": up / n / MIB,
        "down_mib_per_client": down / n / MIB,
        "client_s": client_s / n,
        "server_s": server_s,
        "exact": exact,
    }


OVERLAPS = ("full", "pool 4k", "uniform")


def union_clients(
    m: int, n: int, k: int, width: int, overlap: str, rng: np.random.Generator
) -> dict[int, ClientSet]:
    """``n`` clients of ``k`` rows each, overlapping as ``overlap`` says."""
    pool = {"full": k, "pool 4k": 4 * k, "uniform": m}[overlap]
    popular = rng.choice(m, pool, replace=False)
    return {
        c: ClientSet(
            np.sort(rng.choice(popular, k, replace=False)), rng.uniform(-0.1, 0.1, (k, width))
        )
        for c in range(1, n + 1)
    }


def union_arms(m: int, n: int, k: int, width: int, overlap: str, seed: int) -> list[dict[str, Any]]:
    """One round of each arm (default, PSU exact, PSU Bloom) on the same clients."""
    rng = np.random.default_rng(seed)
    clients = union_clients(m, n, k, width, overlap, rng)
    params = SSASettings().params(
        round_id=1, domain_size=m, num_items=k, value_width=width, hash_key=os.urandom(16)
    )
    bloom = PSUParams.for_target(m, n * k, 1e-6, max(1, m // 1024))
    rows: list[dict[str, Any]] = []
    for arm, union, psu in (
        ("default", "off", None),
        ("psu exact", "psu", PSUParams.exact(m)),
        ("psu bloom", "psu", bloom),
    ):
        out = run_basic_round(params, clients, union, psu, rng=rng)
        ssa = out.ssa_params
        up = sum(out.up_lead.values()) + sum(out.up_helper.values())
        rows.append(
            {
                "m": m,
                "clients": n,
                "k": k,
                "overlap": overlap,
                "arm": arm,
                "union": m if out.union is None else out.union.size,
                "key_bits": 0 if ssa is None else int(key_domain_bits(ssa).max()),
                "up_kib_per_client": up / n / 1024,
                "down_union_kib": out.down_union / 1024,
                "s0_s": out.server_seconds["S0"] + out.server_seconds["reconstruct"],
                "s1_s": out.server_seconds["S1"],
            }
        )
    base = rows[0]
    for row in rows:
        row["up_ratio"] = row["up_kib_per_client"] / base["up_kib_per_client"]
        row["server_ratio"] = (row["s0_s"] + row["s1_s"]) / (base["s0_s"] + base["s1_s"])
    return rows


def ssa_union_table(args: argparse.Namespace) -> None:
    """Print the basic-protocol comparison and write JSON."""
    union_arms(1024, 2, 8, args.width, "full", 0)  # warm-up (kernels, caches)
    print(
        f"SSA over [0, m) vs Cui's basic protocol (two-server PSU, SSA over the union): "
        f"n = {args.union_clients}, k = {args.k}, width {args.width}, one process, one thread; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    header = (
        f"{'m':>7} {'overlap':>8} {'arm':>10} {'|U|':>6} {'bits':>5} {'up KiB/cl':>10} "
        f"{'x def':>6} {'down KiB':>9} {'S0 s':>7} {'S1 s':>7} {'x def':>6}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for m in args.domains:
        for overlap in OVERLAPS:
            for row in union_arms(m, args.union_clients, args.k, args.width, overlap, args.seed):
                rows.append(row)
                print(
                    f"{m:>7} {overlap:>8} {row['arm']:>10} {row['union']:>6} {row['key_bits']:>5} "
                    f"{row['up_kib_per_client']:>10.1f} {row['up_ratio']:>6.2f} "
                    f"{row['down_union_kib']:>9.1f} {row['s0_s']:>7.3f} {row['s1_s']:>7.3f} "
                    f"{row['server_ratio']:>6.3f}"
                )
    path = Path(args.json.replace("psu_bench", "psu_bench_ssa_union"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(args), "rows": rows}))
    print(f"wrote {path}")


def main() -> None:
    """Print the table and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 40, 60, 80, 100])
    parser.add_argument("--domain", type=int, default=143_534)
    parser.add_argument("--set-size", type=int, default=330)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dropout", type=float, default=0.1, help="lost after sharing (0.1)")
    parser.add_argument("--json", default="benchmarks/results/psu_bench.json")
    parser.add_argument("--ssa-union", action="store_true", help="Cui's basic protocol vs SSA")
    parser.add_argument("--domains", type=int, nargs="+", default=[1 << 14, 1 << 16])
    parser.add_argument("--union-clients", type=int, default=10)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--width", type=int, default=4)
    args = parser.parse_args()
    if args.ssa_union:
        ssa_union_table(args)
        return
    print(
        f"PSU over SecAgg, exact mode, m = {args.domain}, {args.set_size} IDs per client, "
        f"t = 0.6 n, {args.dropout:.0%} of clients lost after sharing, one process"
    )
    header = (
        f"{'n':>4} {'union':>7} {'up MiB/cl':>10} {'down MiB/cl':>12} {'client s':>9} "
        f"{'server s':>9} {'exact':>6}"
    )
    print(header)
    print("-" * len(header))
    rows = []
    for n in args.clients:
        row = one_round(n, args.domain, args.set_size, args.seed + n, args.dropout)
        rows.append(row)
        print(
            f"{n:>4} {row['union']:>7} {row['up_mib_per_client']:>10.3f} "
            f"{row['down_mib_per_client']:>12.3f} {row['client_s']:>9.3f} "
            f"{row['server_s']:>9.2f} {row['exact']!s:>6}"
        )
    print("Niu et al. (Taobao, n = 100, ring 2^32): 0.91 MB per client")
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(args), "rows": rows}))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
