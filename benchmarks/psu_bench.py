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
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from flwr_fsl.families.secagg.protocol import SecAggParams, run_round
from flwr_fsl.families.sfsl.psu import PSUParams, client_vector, reconstruct_union

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


def main() -> None:
    """Print the table and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[20, 40, 60, 80, 100])
    parser.add_argument("--domain", type=int, default=143_534)
    parser.add_argument("--set-size", type=int, default=330)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dropout", type=float, default=0.1, help="lost after sharing (0.1)")
    parser.add_argument("--json", default="benchmarks/results/psu_bench.json")
    args = parser.parse_args()
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
