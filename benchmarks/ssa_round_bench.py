"""SSA servers over a whole round: time per client against the AES floor, on one core and two.

Run ``python benchmarks/ssa_round_bench.py [--clients N] [--log-m 20] [--rate 0.10]``. For the
unchecked round (Cui's semi-honest protocol) and the checked one (the default, issue 21) it adds
``N`` clients to one :class:`~flwr_fsl.families.ssa.protocol.SSAServer` per party and reads the
share once, as a round does (:meth:`~flwr_fsl.families.ssa.protocol.SSAServer.share` scatters
the clients' summed shares once), after one untimed round, as on a long-running server whose
allocator already holds the round buffers' pages. Each configuration runs in a child process
pinned to one core, then to two (``os.sched_setaffinity``), so the per-process digest threads
see exactly those cores.

It prints, per party and configuration, wall milliseconds per client (the round's time divided
by ``N``), the AES-only time of one client's evaluation (its DPF AES calls recorded in place and
replayed alone, :func:`ssa_bench.aes_floor`), their ratio, and the two-core speed-up, ending
with the lines ``server per client / AES floor: X.XX`` and ``2-core speed-up: X.XX`` (the
checked round, S1). Clients alternate between two encoded updates (the servers' work does not
depend on which). Figures are ratios measured in one run: absolute times drift on shared
machines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ssa_bench import aes_floor, client_inputs, make_params

from flwr_fsl.families.ssa import protocol as ssa


def _worker(log_m: int, rate: float, clients: int, verify: bool, cores: int) -> dict[str, object]:
    """One configuration in this (child) process: both parties' round time per client."""
    avail = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, set(avail[:cores]))
    m = 1 << log_m
    k = max(1, round(rate * m))
    rng = np.random.default_rng(7)
    params = replace(make_params(m, k, weighted=False), verify=verify)
    table = ssa.simple_table_for(params)
    uploads = []
    for _ in range(2):
        indices, values, _ = client_inputs(m, k, rng)
        uploads.append(ssa.encode_update(params, indices, values, rng=rng, simple_table=table)[0])
    out: dict[str, object] = {"verify": verify, "cores": len(os.sched_getaffinity(0))}
    for party in (0, 1):

        def one_round(p: int = party) -> float:
            server = ssa.SSAServer(params, p)
            start = time.perf_counter()
            for c in range(clients):
                upload = uploads[c % 2]
                server.add_client(c, upload.public_part, upload.master_seeds[p])
                server.forget_recent()  # as LeadServer after each relayed chunk
            server.share()
            return (time.perf_counter() - start) / clients

        one_round()  # untimed: a long-running server has its round buffers' pages already
        out[f"s{party}_ms"] = 1e3 * one_round()
        floor = aes_floor(
            lambda p=party: ssa.SSAServer(params, p, threads=1).add_client(
                0, uploads[0].public_part, uploads[0].master_seeds[p]
            )
        )
        out[f"s{party}_aes_ms"] = 1e3 * floor["replay_s"]
    return out


def _run(args: argparse.Namespace, verify: bool, cores: int) -> dict[str, object]:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        f"--log-m={args.log_m}",
        f"--rate={args.rate}",
        f"--clients={args.clients}",
        f"--cores={cores}",
        *(["--verify"] if verify else []),
    ]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="clients per round (8)")
    parser.add_argument("--log-m", type=int, default=20, help="log2 m (20)")
    parser.add_argument("--rate", type=float, default=0.10, help="k/m (0.10)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--verify", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cores", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.log_m, args.rate, args.clients, args.verify, args.cores)))
        return
    cores = min(2, len(os.sched_getaffinity(0)))
    print(f"SSA round, m = 2^{args.log_m}, k/m = {args.rate:.0%}, {args.clients} clients")
    print("| round | cores | party | ms per client | AES floor ms | / floor | 2-core speed-up |")
    print("|---|---|---|---|---|---|---|")
    last = {}
    for verify in (False, True):
        rows = {c: _run(args, verify, c) for c in sorted({1, cores})}
        for c, row in rows.items():
            for party in (0, 1):
                ms = float(row[f"s{party}_ms"])  # type: ignore[arg-type]
                aes = float(row[f"s{party}_aes_ms"])  # type: ignore[arg-type]
                one = float(rows[1][f"s{party}_ms"])  # type: ignore[arg-type]
                name = "checked" if verify else "unchecked"
                print(
                    f"| {name} | {c} | S{party} | {ms:.1f} | {aes:.1f} | {ms / aes:.2f} | "
                    f"{one / ms:.2f} |"
                )
                last = {"ratio": ms / aes, "speedup": one / ms, "cores": c}
    print(f"server per client / AES floor: {last['ratio']:.2f}")
    print(f"2-core speed-up: {last['speedup']:.2f} (on {last['cores']} cores)")


if __name__ == "__main__":
    main()
