"""PrivHFL on a GPU, one run: local training per epoch and the secure query, CPU vs CUDA.

Run ``python benchmarks/privhfl_gpu_check.py [--images N] [--width W]`` (under 4 minutes on an
H100 machine's 16 cores; also runs without CUDA, printing ``no CUDA`` and the CPU figures
only). Flower-free: it imports :mod:`flwr_fsl.models.privhfl` (torch),
:mod:`flwr_fsl.families.privhfl.gpu` and :mod:`flwr_fsl.kernels.ring` (numba), and, for part 3
only, the secure protocol, which needs the ``cryptography`` wheel (its AES); without it part 3
prints ``skipped``. Parts:

1. *Local training and re-training*, seconds per epoch of
   :func:`~flwr_fsl.models.privhfl.train_private` and :func:`~flwr_fsl.models.privhfl.retrain`
   (PrivHFL's VGG-7 for 28x28 images at ``--train-width``, ``--images`` synthetic images,
   batch 64), ``device="cpu"`` vs ``device="cuda"``, and the ratio.
2. *Ring matmul* in ``Z_2^64`` on the products of a secure VGG-7 (widths W-2W-4W on 32x32x3,
   one session of ``--session`` queries, 6 = ``max_batch`` at width 64): the numba kernel vs
   :func:`~flwr_fsl.families.privhfl.gpu.limb_matmul` on CUDA (16-bit limbs, float64 GEMMs,
   transfers included), checked bit-identical, and the ratio.
3. *Secure query*, seconds per query of the three parties' compute (wall clock of each
   party's steps, summed: the parties run one after another in one process, as
   ``benchmarks/privhfl_bench.py`` counts them, which uses CPU time instead) with the matmul
   device ``cpu`` and ``cuda``, DCF comparison (one session of ``--session`` queries) and the
   paper's DReLU (``--drelu-batch`` queries), and the ratio. Wall time, so that GPU work
   counts (``limb_matmul`` returns host arrays: it waits for the GPU); a loaded machine
   inflates both columns alike.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import torch

from flwr_fsl.families.privhfl import gpu
from flwr_fsl.models.privhfl import retrain, train_private, vgg7

CUDA = torch.cuda.is_available()


def timed(fn: Any) -> float:
    if CUDA:
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if CUDA:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def ratio(cpu: float, cuda: float | None) -> str:
    return f"{cpu / cuda:6.1f}x" if cuda else "   n/a"


def part_training(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (args.images, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, args.images)
    soft = rng.dirichlet(np.ones(10), args.images // 2).astype(np.float32)
    print(f"1. local training, VGG-7 width {args.train_width}, {args.images} images, batch 64:")
    devices = ["cpu", "cuda"] if CUDA else ["cpu"]
    res: dict[str, dict[str, float]] = {}
    for device in devices:
        torch.manual_seed(0)
        net = vgg7(args.train_width)
        small = slice(0, 128)
        train_private(net, x[small], y[small], 1, 0.02, 64, device=device)  # warm-up
        res[device] = {
            "train": timed(lambda n=net, d=device: train_private(n, x, y, 1, 0.02, 64, device=d)),
            "retrain": timed(
                lambda n=net, d=device: retrain(
                    n, x, y, x[: len(soft)], soft, 1, 2e-3, 64, device=d
                )
            ),
        }
    for what in ("train", "retrain"):
        cpu = res["cpu"][what]
        cuda = res.get("cuda", {}).get(what)
        shown = f"{cuda:7.2f} s" if cuda is not None else "no CUDA"
        print(f"   {what:8s} s/epoch: cpu {cpu:7.2f} s, cuda {shown}, speed-up {ratio(cpu, cuda)}")


def secure_shapes(width: int, batch: int) -> list[tuple[int, int, int]]:
    """``(P, K, O)`` of every Π_Matmul product of the benchmark's VGG-7 on ``batch`` queries."""
    shapes = []
    hw, cin = 32, 3
    for w in (width, 2 * width, 4 * width):
        for _ in range(2):
            shapes.append((batch * hw * hw, cin * 9, w))
            cin = w
        hw //= 2
    shapes.append((batch, cin * hw * hw, 10))
    return shapes


def part_matmul(args: argparse.Namespace, batch: int) -> None:
    print(f"2. ring matmul Z_2^64, VGG-7 width {args.width}, {batch} queries (one session):")
    rng = np.random.default_rng(1)
    total_cpu = total_gpu = 0.0
    for p, k, o in secure_shapes(args.width, batch):
        a = rng.integers(0, 2**64 - 1, (p, k), dtype=np.uint64, endpoint=True)
        b = rng.integers(0, 2**64 - 1, (k, o), dtype=np.uint64, endpoint=True)
        gpu.cpu_matmul(a[:4], b)
        ref = gpu.cpu_matmul(a, b)
        t_cpu = timed(lambda a=a, b=b: gpu.cpu_matmul(a, b))
        total_cpu += t_cpu
        line = f"   ({p:6d} x {k:5d}) @ ({k:5d} x {o:3d}): numba {t_cpu * 1e3:8.1f} ms"
        if CUDA:
            dev = torch.device("cuda")
            gpu.limb_matmul(a[:4], b, dev)  # warm-up
            assert np.array_equal(gpu.limb_matmul(a, b, dev), ref), "limb matmul differs"
            t_gpu = timed(lambda a=a, b=b, dev=dev: gpu.limb_matmul(a, b, dev))
            total_gpu += t_gpu
            line += f", cuda limbs {t_gpu * 1e3:7.1f} ms ({ratio(t_cpu, t_gpu)}), bit-identical"
        print(line)
    print(
        f"   all products: numba {total_cpu:.3f} s, cuda "
        f"{f'{total_gpu:.3f} s' if CUDA else 'no CUDA'}, speed-up {ratio(total_cpu, total_gpu)}"
    )
    # Each layer's product is computed three times per session (Q's deal, A, S), same shape.
    per_cpu, per_gpu = 3 * total_cpu / batch, 3 * total_gpu / batch
    print(
        f"   matmul part of a secure query (3 products per layer): numba {per_cpu:.4f} s, "
        f"cuda {f'{per_gpu:.4f} s' if CUDA else 'no CUDA'} per query"
    )


def part_secure(args: argparse.Namespace, batch: int) -> None:
    try:
        from flwr_fsl.families.privhfl.inference import from_torch
        from flwr_fsl.families.privhfl.protocol import (
            PrivHFLConfig,
            SessionSeeds,
            Transcript,
            secure_predict,
        )
    except ImportError as err:
        print(f"3. secure query: skipped ({err}; it needs the 'cryptography' wheel)")
        return
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    cin = 3
    for w in (args.width, 2 * args.width, 4 * args.width):
        for _ in range(2):
            layers += [nn.Conv2d(cin, w, 3, padding=1), nn.ReLU()]
            cin = w
        layers.append(nn.MaxPool2d(2))
    net = nn.Sequential(*layers, nn.Flatten(), nn.Linear(cin * 16, 10)).eval()
    model = from_torch(net, (3, 32, 32))
    print(f"3. secure query, VGG-7 width {args.width}, s/query of the three parties (wall):")
    for comparison, n in (("dcf", batch), ("drelu", args.drelu_batch)):
        x = np.random.default_rng(2).uniform(0, 1, (n, 3, 32, 32))
        cfg = PrivHFLConfig(comparison=comparison)  # type: ignore[arg-type]
        times = {}
        for device in ["cpu", "cuda"] if CUDA else ["cpu"]:
            gpu.set_matmul_device(device)
            secure_predict([model], x[:1], cfg, seeds=[SessionSeeds.fresh()])  # warm-up
            tr = Transcript()
            secure_predict([model], x, cfg, seeds=[SessionSeeds.fresh()], transcript=tr)
            times[device] = sum(tr.seconds.values()) / n
        gpu.set_matmul_device("auto")
        cuda = times.get("cuda")
        shown = f"{cuda:.4f} s" if cuda is not None else "no CUDA"
        print(
            f"   {comparison:5s} batch {n:3d}: matmul on cpu {times['cpu']:.4f} s, on cuda "
            f"{shown}, speed-up {ratio(times['cpu'], cuda)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=4096, help="training images (synthetic)")
    parser.add_argument("--train-width", type=int, default=32, help="VGG-7 width for training")
    parser.add_argument("--width", type=int, default=64, help="secure VGG-7 base width")
    parser.add_argument(
        "--session", type=int, default=6, help="DCF queries per session (max_batch at width 64)"
    )
    parser.add_argument("--drelu-batch", type=int, default=32, help="queries for the DReLU")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: 1,2,3")
    args = parser.parse_args()
    skip = set(args.skip.split(",")) - {""}
    start = time.perf_counter()
    name = torch.cuda.get_device_name(0) if CUDA else "no CUDA"
    print(
        f"torch {torch.__version__}, {name}, {os.cpu_count()} cpus, "
        f"torch threads {torch.get_num_threads()}"
    )
    batch = args.session
    if "1" not in skip:
        part_training(args)
    if "2" not in skip:
        part_matmul(args, batch)
    if "3" not in skip:
        part_secure(args, batch)
    print(f"total {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
