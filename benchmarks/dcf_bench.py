"""DCF microbenchmark: Gen and point evaluation per key against the AES floor, old tree vs new.

Run ``python benchmarks/dcf_bench.py [--keys N] [--bits L] [--reps R] [--baseline-tree DIR]``.
Times :func:`flwr_fsl.crypto.dcf.generate_keys_batch` and
:func:`~flwr_fsl.crypto.dcf.evaluate_paired` at ``tau = 2`` (the ReLU of
:mod:`flwr_fsl.families.privhfl`) on ``N`` keys of ``L`` bits (defaults: ``2**17`` keys, one
query's first VGG-7 ReLU layer at width 64, and ``bound_bits = 40``; a batch-256 query of
VGG-7 at widths 64-128-256 makes 229,376 comparisons per query, in Gen calls of 98k..393k keys).
Process CPU time, best of the repetitions. ``gen`` generates into fresh arrays (its time
includes the first touch of ~1.3 kB of public part per key, page faults included), ``gen_out``
into one reused, already touched blob (``out=``, as PrivHFL's dealer writes a message): the
difference is the page-fault cost, the rest is the kernels'.

The AES floor of each timing is the same sequence of native AES calls (the chunk sizes the
driver uses: ``L`` level calls of ``6 c`` blocks and one leaf call of ``2 c`` per Gen chunk of
``c`` keys, ``2 c`` and ``c`` blocks per Eval chunk) replayed alone from one hot buffer through
:func:`~flwr_fsl.kernels.aes.native_replay`; "non-AES" is the time above it.

Each tree is timed in a subprocess of its own (``PYTHONPATH=tree``); with ``--baseline-tree``
the baseline and this tree alternate, ``--reps`` times each, in one run, and the table shows
both and their ratio with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpf_bench import best_of

U64 = np.uint64
ROOT = Path(__file__).resolve().parents[1]
OPS = ("gen", "gen_out", "eval")  # Gen into fresh arrays, Gen into a reused blob, Eval


def aes_sizes(m: int, bits: int, gen_chunk: int, eval_chunk: int) -> tuple[list[int], list[int]]:
    """Return the block counts of every native AES call of one Gen and one Eval of ``m`` keys."""
    gen: list[int] = []
    for lo in range(0, m, gen_chunk):
        c = min(m, lo + gen_chunk) - lo
        gen += [6 * c] * bits + [2 * c]
    ev: list[int] = []
    for lo in range(0, m, eval_chunk):
        c = min(m, lo + eval_chunk) - lo
        ev += [2 * c] * bits + [c]
    return gen, ev


def child(keys: int, bits: int, repeat: int) -> dict[str, float]:
    """Time Gen, Eval and their AES floors on the tree this process imports (in seconds)."""
    from flwr_fsl.crypto import dcf
    from flwr_fsl.kernels.aes import native_aes, native_replay

    rng = np.random.default_rng(1)
    alphas = rng.integers(0, 1 << bits, keys, dtype=U64)
    betas = rng.integers(0, 2**63, (keys, 2), dtype=U64)
    points = rng.integers(0, 1 << bits, keys, dtype=U64)
    seeds = (bytes(range(16)), bytes(range(16, 32)))
    k0, _ = dcf.generate_keys_batch(alphas, betas, bits, master_seeds=seeds)  # warm-up, compile
    dcf.evaluate_paired(k0, points)
    gen = best_of(lambda: dcf.generate_keys_batch(alphas, betas, bits, master_seeds=seeds), repeat)
    blob = np.zeros(dcf.public_size(bits, 2, keys), dtype=np.uint8)  # touched once: no faults
    gen_out = best_of(
        lambda: dcf.generate_keys_batch(alphas, betas, bits, master_seeds=seeds, out=blob), repeat
    )
    ev = best_of(lambda: dcf.evaluate_paired(k0, points), repeat)
    gen_sizes, ev_sizes = aes_sizes(keys, bits, dcf._GEN_CHUNK, dcf._CHUNK)
    nat = native_aes(dcf.MMO_KEY_DCF)
    if nat is None:
        raise SystemExit("the AES floor needs OpenSSL's libcrypto (native AES)")
    cap = max(gen_sizes + ev_sizes)
    src = rng.integers(0, 2**63, (cap, 2)).astype(U64)
    dst = np.empty((cap + 1, 2), dtype=U64)
    floors = []
    for sizes in (gen_sizes, ev_sizes):
        arr = np.asarray(sizes, dtype=np.int64)
        native_replay(nat.fn, nat.ctx, src, dst, arr)
        floors.append(best_of(lambda a=arr: native_replay(nat.fn, nat.ctx, src, dst, a), repeat))
    return {
        "gen": gen, "gen_out": gen_out, "eval": ev,
        "gen_aes": floors[0], "gen_out_aes": floors[0], "eval_aes": floors[1],
    }  # fmt: skip


def run_tree(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    """Run :func:`child` on ``tree`` in a subprocess and return its timings."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child"]
    cmd += ["--keys", str(args.keys), "--bits", str(args.bits), "--repeat", str(args.repeat)]
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def load() -> str:
    """Return the 1-minute load average, or '?' where the OS has none."""
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:  # pragma: no cover - no load average
        return "?"


def main() -> None:
    """Parse the arguments, time the trees alternately and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--keys", type=int, default=1 << 17, help="keys (and points)")
    parser.add_argument("--bits", type=int, default=40, help="domain bits (bound_bits)")
    parser.add_argument("--reps", type=int, default=3, help="subprocess runs of each tree")
    parser.add_argument("--repeat", type=int, default=3, help="timings per subprocess (best)")
    parser.add_argument("--baseline-tree", type=Path, help="also time this checkout, alternating")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.keys, args.bits, args.repeat)))
        return
    trees = [("this", ROOT)]
    if args.baseline_tree is not None:
        trees.insert(0, ("base", args.baseline_tree.resolve()))
    best: dict[str, dict[str, float]] = {}
    loads = []
    for _ in range(args.reps):
        for name, tree in trees:
            res = run_tree(tree, args)
            loads.append(load())
            prev = best.setdefault(name, res)
            for k, v in res.items():
                prev[k] = min(prev[k], v)
    m = args.keys
    print(f"DCF tau = 2, {args.bits} bits, {m} keys; us per key, best of", end=" ")
    print(f"{args.reps} x {args.repeat} runs")
    print(f"load (1 min) after each run: {' '.join(loads)}")
    print(f"{'tree':6} {'op':7} {'total':>7} {'AES':>7} {'non-AES':>8} {'total/AES':>9}")
    for name, _ in trees:
        r = best[name]
        for op in OPS:
            tot, aes = r[op] / m * 1e6, r[op + "_aes"] / m * 1e6
            print(f"{name:6} {op:7} {tot:7.3f} {aes:7.3f} {tot - aes:8.3f} {tot / aes:9.2f}")
    if "base" in best:
        for op in OPS:
            b, t = best["base"], best["this"]
            non_b, non_t = b[op] - b[op + "_aes"], t[op] - t[op + "_aes"]
            print(
                f"{op}: this/base total {t[op] / b[op]:.3f}, non-AES {non_t / non_b:.3f} "
                f"(baseline {args.baseline_tree})"
            )


if __name__ == "__main__":
    main()
