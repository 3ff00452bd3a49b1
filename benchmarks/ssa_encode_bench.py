"""SSA client encode against its AES floor, this tree beside an older commit, in one run.

Run ``python benchmarks/ssa_encode_bench.py [--base REV] [--log-m 20] [--rate 0.10]``. It times
:func:`~flwr_fsl.families.ssa.protocol.encode_update` (the checked round, the default: unit
weights, verifiable keys; the round's simple table built beforehand, as a client has it) on
one core, best of ``--reps`` after one untimed call, and the AES-only time of the same encode
(its DPF AES calls recorded in place and replayed alone, :func:`ssa_bench.aes_floor`). With
``--base REV`` the package of commit ``REV`` (``git archive``, unpacked once into the
temporary directory and reused) runs the same inputs in the same way, the two trees
alternating ``--rounds`` times so that load on a shared machine falls on both; each tree's
best figures are printed with their ratio, the load average before and after, and the issue 26
line ``client encode: X ms (AES-only Y ms; target <= 40 ms: PASS/FAIL)`` for this tree.
Each tree runs in its own child process pinned to one core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import replace
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 40.0  # issue 26's client encode target


def _worker(log_m: int, rate: float, reps: int) -> dict[str, float]:
    """Time one tree's encode in this (child) process, pinned to one core."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ssa_bench import aes_floor, client_inputs, make_params

    from flwr_fsl.families.ssa import protocol as ssa

    m = 1 << log_m
    k = max(1, round(rate * m))
    params = replace(make_params(m, k, weighted=False), verify=True, value_check="off")
    table = ssa.simple_table_for(params)
    idx, vals, _ = client_inputs(m, k, np.random.default_rng(7))
    seeds = (bytes(range(16)), bytes(range(16, 32)))

    def encode() -> object:
        rng = np.random.default_rng(11)
        return ssa.encode_update(params, idx, vals, rng=rng, simple_table=table, master_seeds=seeds)

    encode()  # untimed: numba dispatch, the round's cached domain bits, allocator pages
    wall, cpu = [], []
    for _ in range(reps):
        w, c = time.perf_counter(), time.process_time()
        encode()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
    floor = aes_floor(encode)
    return {
        "encode_ms": 1e3 * min(wall),
        "cpu_ms": 1e3 * min(cpu),
        "aes_ms": 1e3 * floor["replay_s"],
        "aes_blocks": floor["blocks"],
        "aes_calls": floor["calls"],
    }


def _base_tree(rev: str) -> Path:
    """Unpack ``flwr_fsl`` of commit ``rev`` once (reused: its numba cache survives runs)."""
    sha = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    dest = Path(tempfile.gettempdir()) / f"flwr_fsl-base-{sha[:12]}"
    if not (dest / "flwr_fsl").is_dir():
        blob = subprocess.run(
            ["git", "-C", str(ROOT), "archive", sha, "flwr_fsl"], check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=BytesIO(blob)) as tar:
            tar.extractall(dest, filter="data")
    return dest


def _run(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--worker", f"--log-m={args.log_m}", f"--rate={args.rate}"]
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [*cmd, f"--reps={args.reps}"], check=True, capture_output=True, text=True, env=env
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:  # pragma: no cover - not Linux
        return "n/a"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="an older commit to time beside this tree")
    parser.add_argument("--log-m", type=int, default=20, help="log2 m (20)")
    parser.add_argument("--rate", type=float, default=0.10, help="k/m (0.10)")
    parser.add_argument("--reps", type=int, default=5, help="timed encodes per child (5)")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the trees (3)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.log_m, args.rate, args.reps)))
        return
    trees = {"this tree": ROOT}
    if args.base:
        trees[f"base {args.base}"] = _base_tree(args.base)
    print(f"SSA client encode (checked round), m = 2^{args.log_m}, k/m = {args.rate:.0%}, 1 core")
    print(f"load average before: {_loadavg()}")
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            row = _run(tree, args)
            keep = best.setdefault(name, row)
            for key in ("encode_ms", "cpu_ms", "aes_ms"):
                keep[key] = min(keep[key], row[key])
    print(f"load average after: {_loadavg()}")
    print("| tree | encode ms (wall) | CPU ms | AES-only ms (blocks, calls) | encode / AES |")
    print("|---|---|---|---|---|")
    for name, r in best.items():
        print(
            f"| {name} | {r['encode_ms']:.1f} | {r['cpu_ms']:.1f} | {r['aes_ms']:.1f} "
            f"({r['aes_blocks'] / 1e6:.2f}M, {r['aes_calls']:.0f}) | "
            f"{r['encode_ms'] / r['aes_ms']:.2f} |"
        )
    new = best["this tree"]
    if args.base:
        old = best[f"base {args.base}"]
        print(
            f"speed-up over {args.base}: {old['encode_ms'] / new['encode_ms']:.2f}x wall, "
            f"{old['cpu_ms'] / new['cpu_ms']:.2f}x CPU"
        )
    ok = new["encode_ms"] <= TARGET_MS
    print(
        f"client encode: {new['encode_ms']:.1f} ms (AES-only {new['aes_ms']:.1f} ms; "
        f"target <= {TARGET_MS:.0f} ms: {'PASS' if ok else 'FAIL'})"
    )


if __name__ == "__main__":
    main()
