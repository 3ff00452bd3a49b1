"""How much one core slows when the other core works too: the ceiling on any 2-core speed-up.

Run ``python benchmarks/core_contention.py [--pairs 4]``. For two workloads it times one
process pinned to core 0 alone, then two copies at once pinned to cores 0 and 1, and prints
each pair's CPU seconds and the per-core slowdown (the slower copy against the lone run):

- ``aes``: AES-128-ECB through ``cryptography`` over a 64 KiB buffer that stays in L2
  (compute-bound: the DPF trees' AES calls);
- ``mem``: ``numpy`` sums over a 512 MB array (memory-bound: the SSA servers' share scatter,
  a DPF's output write).

A slowdown ``s`` caps a perfectly parallel job's 2-core speed-up at ``2 / s``. Shared virtual
machines differ from run to run: compare the two workloads within one run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes


def _work(kind: str) -> float:
    """Run one workload and return its CPU seconds."""
    if kind == "aes":
        enc = Cipher(algorithms.AES(bytes(16)), modes.ECB()).encryptor()
        buf = bytearray(65536)
        out = bytearray(65536 + 16)  # update_into wants block_size - 1 spare bytes
        start = time.process_time()
        for _ in range(120_000):
            enc.update_into(buf, out)
        return time.process_time() - start
    words = np.ones(1 << 26, dtype=np.uint64)
    start = time.process_time()
    for _ in range(20):
        words.sum()
    return time.process_time() - start


def _child(kind: str, core: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--child", kind, str(core)], stdout=subprocess.PIPE
    )


def main() -> None:
    """Parse arguments and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=4, help="lone runs and pairs per workload")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        os.sched_setaffinity(0, {int(args.child[1])})
        print(_work(args.child[0]))
        return
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs two cores")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| workload | alone s CPU | both busy s CPU | per-core slowdown | 2-core ceiling |")
    print("|---|---|---|---|---|")
    for kind in ("aes", "mem"):
        for _ in range(args.pairs):
            alone = float(_child(kind, 0).communicate()[0])
            pair = [_child(kind, core) for core in (0, 1)]
            both = [float(p.communicate()[0]) for p in pair]
            slow = max(both) / alone
            print(
                f"| {kind} | {alone:.3f} | {both[0]:.3f} / {both[1]:.3f} | {slow:.2f}x "
                f"| {2 / slow:.2f} |"
            )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
