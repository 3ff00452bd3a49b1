"""SESA's ``F_p`` products on a GPU, one run: numba vs CUDA limbs, and one user's phases.

Run ``python benchmarks/sesa_gpu_check.py [--clients 100] [--repeats 3]`` (about a minute on a
GPU machine; also runs without CUDA, printing ``no CUDA`` and the CPU figures only). The setting
is ``benchmarks/sesa_bench.py``'s, the paper's: ``N`` users, ``T = N/2``, MLP 784-200-10 in
``K = 4`` shards of ``d = 39,751`` words, ``p = 2^32 - 5``. Parts:

1. *Products* at ``N``: one user's mask evaluations (eq. 22: per slot the
   ``(N × (T+1)) @ ((T+1) × d)`` product, ``K_i`` = 4, 2, 1), the server's decode with its
   check of the extra evaluations (``(K + N - D - K - T) × (K + T) @ (K + T) × d``, 10% lost),
   and one user's ``ψ(α_i)`` (``(1 × N K_i) @ (N K_i × d)``): the numba kernel (matmul device
   ``cpu``) vs :func:`~flwr_fsl.kernels.gpu.field_limb_matmul` on CUDA (transfers included,
   median of ``--repeats`` after a warm-up), each checked bit-identical, and the ratio.
2. *One user's phases* (``sesa_bench.per_user``: offline, masked update, evaluation at full size,
   sealing and AES included) with the matmul device ``cpu`` and ``cuda``, and the ratio.

Wall-clock seconds (GPU work counts: the limb path returns host arrays, so it waits for the GPU).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from privhfl_gpu_check import CUDA, ratio
from sesa_bench import SHARD_WORDS, K, per_user

from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.crypto.ring import PrimeField
from flwr_fsl.families.sesa.coding import mask_evaluations
from flwr_fsl.kernels import gpu


def _median_seconds(fn: Any, repeats: int) -> tuple[Any, float]:
    out = fn()  # warm-up (numba compile, CUDA context, cuBLAS handles)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def part_products(n: int, repeats: int) -> None:
    f = PrimeField()
    t = n // 2
    prg = PRGStream.fresh()
    evaluators = n - n // 10
    rows = K + evaluators - (K + t)
    print(f"1. F_p products at N = {n}, T = {t}, d = {SHARD_WORDS} (median of {repeats}, wall):")
    cases: list[tuple[str, Any]] = []
    for slots in (4, 2, 1):
        basis = f.random((n, K + t), prg)
        r, v = f.random((slots, SHARD_WORDS), prg), f.random((t, slots, SHARD_WORDS), prg)
        cases.append(
            (
                f"mask evaluations K_i = {slots} "
                f"({n} x {t + 1} @ {t + 1} x {SHARD_WORDS}, x{slots})",
                lambda b=basis, r=r, v=v, s=slots: mask_evaluations(f, b, tuple(range(s)), r, v),
            )
        )
    lag, values = f.random((rows, K + t), prg), f.random((K + t, SHARD_WORDS), prg)
    cases.append(
        (
            f"server decode ({rows} x {K + t} @ {K + t} x {SHARD_WORDS})",
            lambda: f.matmul(lag, values),
        )
    )
    coef, xs = f.random((1, n * K), prg), f.random((n * K, SHARD_WORDS), prg)
    cases.append(
        (f"psi K_i = 4 (1 x {n * K} @ {n * K} x {SHARD_WORDS})", lambda: f.matmul(coef, xs))
    )
    total = {"cpu": 0.0, "cuda": 0.0}
    for label, fn in cases:
        gpu.set_matmul_device("cpu")
        want, t_cpu = _median_seconds(fn, repeats)
        total["cpu"] += t_cpu
        line = f"   {label}: numba {t_cpu * 1e3:8.1f} ms"
        if CUDA:
            gpu.set_matmul_device("cuda")
            got, t_gpu = _median_seconds(fn, repeats)
            total["cuda"] += t_gpu
            same = "bit-identical" if np.array_equal(got, want) else "DIFFERENT WORDS"
            line += f", cuda limbs {t_gpu * 1e3:7.1f} ms ({ratio(t_cpu, t_gpu)}), {same}"
        print(line)
    gpu.set_matmul_device("auto")
    shown = f"{total['cuda']:.3f} s" if CUDA else "no CUDA"
    print(
        f"   all products: numba {total['cpu']:.3f} s, cuda {shown}, "
        f"speed-up {ratio(total['cpu'], total['cuda'] if CUDA else None)}"
    )


def part_phases(n: int, repeats: int) -> None:
    print(f"2. one user's phases at N = {n}, full size, s (median of {repeats}, wall):")
    for slots in (4, 2, 1):
        res = {}
        for device in ["cpu", "cuda"] if CUDA else ["cpu"]:
            gpu.set_matmul_device(device)
            res[device] = per_user(n, slots, repeats)
        gpu.set_matmul_device("auto")
        for what in ("offline_s", "online_mask_s", "online_eval_s"):
            cpu = res["cpu"][what]
            cuda = res["cuda"][what] if CUDA else None
            shown = f"{cuda:7.3f}" if cuda is not None else "no CUDA"
            print(
                f"   K_i = {slots} {what:14s} cpu {cpu:7.3f}, cuda {shown}, "
                f"speed-up {ratio(cpu, cuda)}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=100, help="N (T = N/2)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma list of parts to skip: 1,2")
    args = parser.parse_args()
    skip = set(args.skip.split(",")) - {""}
    start = time.perf_counter()
    name = torch.cuda.get_device_name(0) if CUDA else "no CUDA"
    print(f"torch {torch.__version__}, {name}, {os.cpu_count()} cpus")
    if "1" not in skip:
        part_products(args.clients, args.repeats)
    if "2" not in skip:
        part_phases(args.clients, args.repeats)
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
