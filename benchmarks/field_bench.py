"""Ring and field arithmetic benchmark: numba kernels vs numpy, float-split BLAS and big ints.

Run ``python benchmarks/field_bench.py [--json PATH] [--quick]``. Everything runs on one core
(the process pins itself to one CPU where the OS allows it, BLAS limited to one thread). Every
alternative is checked for equality with the kernel before it is timed. Prints one table and
writes the numbers as JSON (default ``benchmarks/results/field_bench.json``).

* F_p elementwise product (p = 2^32 - 5): :meth:`PrimeField.mul` (numba ``mul_mod``) vs numpy
  ``(a * b) % p`` in uint64 (exact: each product < 2^64) vs Python ints in an object array.
* F_p matmul: :meth:`PrimeField.matmul` (numba, exact 128-bit accumulation) vs a *float-split*
  product as CryptGPU does on GPUs: 16-bit limbs ``a = a1 2^16 + a0``, three float64 BLAS
  products per limb pair class (``a1 b1``, ``a1 b0 + a0 b1``, ``a0 b0``), each exact while
  ``k (2^16 - 1)^2 * 2 < 2^53`` (k < 2^20), recombined mod p; vs object-dtype numpy.
* Z_2^64 matmul: :meth:`Z2k.matmul` (numba ``matmul_wrap``) vs numpy's uint64 ``@`` (a naive
  integer loop, wrap-around) vs float-split with four 16-bit limbs (the 10 limb products with
  ``i + j <= 3`` matter mod 2^64; exact for k < 2^21).
* Lagrange (SESA decoding): build ``L`` for K nodes and K targets (numba), then apply it to a
  ``(K, d)`` value block with one field matmul; vs a Python big-int evaluation of the
  same matrix-vector work on a few columns (per-column time extrapolated).
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from flwr_fsl.crypto.ring import Z2_64, PrimeField
from flwr_fsl.crypto.sharing import lagrange_matrix

U64 = np.uint64
F = PrimeField()
P = F.p


def best_of(fn: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


# ---------------------------------------------------------------------------------- alternatives


def numpy_mulmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b) % U64(P)


def object_mulmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return ((a.astype(object) * b.astype(object)) % P).astype(U64)


def _limbs16(x: np.ndarray, count: int) -> list[np.ndarray]:
    return [((x >> U64(16 * i)) & U64(0xFFFF)).astype(np.float64) for i in range(count)]


def float_split_field_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """F_p matmul from three exact float64 BLAS products of 16-bit limbs (p < 2^32)."""
    a0, a1 = _limbs16(a, 2)
    b0, b1 = _limbs16(b, 2)
    high = (a1 @ b1).astype(U64) % U64(P)  # each < k 2^32 < 2^53: exact in float64
    mid = (a1 @ b0 + a0 @ b1).astype(U64) % U64(P)  # < k 2^33 < 2^53 for k < 2^20
    low = (a0 @ b0).astype(U64) % U64(P)
    out = (high * U64(2**32 % P)) % U64(P)  # < p^2 < 2^64
    out = (out + (mid << U64(16)) % U64(P)) % U64(P)  # mid < 2^32, shifted < 2^48
    return (out + low) % U64(P)


def object_matmul(a: np.ndarray, b: np.ndarray, modulus: int) -> np.ndarray:
    return ((a.astype(object) @ b.astype(object)) % modulus).astype(U64)


def float_split_wrap_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Z_2^64 matmul from the 10 float64 BLAS limb products with i + j <= 3 (16-bit limbs)."""
    al, bl = _limbs16(a, 4), _limbs16(b, 4)
    out = np.zeros((a.shape[0], b.shape[1]), dtype=U64)
    for i in range(4):
        for j in range(4 - i):
            part = (al[i] @ bl[j]).astype(U64)  # < k 2^32 < 2^53: exact
            out += part << U64(16 * (i + j))  # wraps mod 2^64, as it should
    return out


def bigint_lagrange_apply(
    nodes: list[int], targets: list[int], values: np.ndarray
) -> list[list[int]]:
    """Lagrange basis and evaluation in Python ints (pow(., -1, p) for the denominators)."""
    k = len(nodes)
    rows = []
    for z in targets:
        row = []
        for j in range(k):
            num = den = 1
            for m in range(k):
                if m != j:
                    num = num * (z - nodes[m]) % P
                    den = den * (nodes[j] - nodes[m]) % P
            row.append(num * pow(den, -1, P) % P)
        rows.append(row)
    cols = values.astype(object)
    return [
        [
            sum(r * int(v) for r, v in zip(row, cols[:, c], strict=True)) % P
            for c in range(values.shape[1])
        ]
        for row in rows
    ]


# ---------------------------------------------------------------------------------- main


Record = Callable[[str, str, str, float, float, str], None]


def bench_matmuls(rng: np.random.Generator, shape: tuple[int, int, int], record: Record) -> None:
    """Time the F_p and Z_2^64 matmuls of one ``(m, k, n)`` shape, checked against the kernel."""
    m_, k_, n_ = shape
    size = f"{m_}x{k_}x{n_}"
    macs = m_ * k_ * n_
    x, y = rng.integers(0, P, (m_, k_), dtype=U64), rng.integers(0, P, (k_, n_), dtype=U64)
    want = F.matmul(x, y)
    assert np.array_equal(float_split_field_matmul(x, y), want)
    record("F_p matmul", size, "numba matmul_mod", best_of(lambda: F.matmul(x, y)), macs, "MAC/s")
    t = best_of(lambda: float_split_field_matmul(x, y))
    record("F_p matmul", size, "float-split BLAS (3)", t, macs, "MAC/s")
    if macs <= 2**21:
        assert np.array_equal(object_matmul(x, y, P), want)
        t = best_of(lambda: object_matmul(x, y, P), 1)
        record("F_p matmul", size, "object dtype", t, macs, "MAC/s")

    u = rng.integers(0, 2**64, (m_, k_), dtype=U64, endpoint=False)
    v = rng.integers(0, 2**64, (k_, n_), dtype=U64, endpoint=False)
    want = Z2_64.matmul(u, v)
    assert np.array_equal(u @ v, want)
    assert np.array_equal(float_split_wrap_matmul(u, v), want)
    t = best_of(lambda: Z2_64.matmul(u, v))
    record("Z_2^64 matmul", size, "numba matmul_wrap", t, macs, "MAC/s")
    record("Z_2^64 matmul", size, "numpy uint64 @", best_of(lambda: u @ v), macs, "MAC/s")
    t = best_of(lambda: float_split_wrap_matmul(u, v))
    record("Z_2^64 matmul", size, "float-split BLAS (10)", t, macs, "MAC/s")
    if macs <= 2**21:
        assert np.array_equal(object_matmul(u, v, 2**64), want)
        t = best_of(lambda: object_matmul(u, v, 2**64), 1)
        record("Z_2^64 matmul", size, "object dtype", t, macs, "MAC/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="benchmarks/results/field_bench.json")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []

    def record(op: str, size: str, impl: str, seconds: float, per: float, unit: str) -> None:
        rows.append(
            {
                "op": op,
                "size": size,
                "impl": impl,
                "seconds": seconds,
                "rate": per / seconds,
                "unit": unit,
            }
        )

    # Warm-up: load (or compile) every kernel once.
    F.mul(F.zeros(2), F.zeros(2))
    F.matmul(F.zeros((2, 2)), F.zeros((2, 2)))
    Z2_64.matmul(Z2_64.zeros((2, 2)), Z2_64.zeros((2, 2)))
    lagrange_matrix(F, [1, 2], [3])

    # F_p elementwise product.
    n = 2**18 if args.quick else 2**22
    a, b = rng.integers(0, P, n, dtype=U64), rng.integers(0, P, n, dtype=U64)
    want = F.mul(a, b)
    assert np.array_equal(numpy_mulmod(a, b), want)
    small = 2**14
    assert np.array_equal(object_mulmod(a[:small], b[:small]), want[:small])
    record(
        "F_p mul",
        f"n=2^{n.bit_length() - 1}",
        "numba mul_mod",
        best_of(lambda: F.mul(a, b)),
        n,
        "elem/s",
    )
    record(
        "F_p mul",
        f"n=2^{n.bit_length() - 1}",
        "numpy (a*b)%p",
        best_of(lambda: numpy_mulmod(a, b)),
        n,
        "elem/s",
    )
    record(
        "F_p mul",
        "n=2^14",
        "object dtype",
        best_of(lambda: object_mulmod(a[:small], b[:small])),
        small,
        "elem/s",
    )

    # Matmuls.
    shapes = [(64, 256, 64)] if args.quick else [(64, 256, 64), (256, 784, 200), (512, 512, 512)]
    for shape in shapes:
        bench_matmuls(rng, shape, record)

    # Lagrange: SESA-like decoding, K nodes -> K targets over d coordinates.
    k_nodes, d = (50, 2**12) if args.quick else (100, 2**16)
    nodes = [int(z) for z in rng.choice(2**31, k_nodes, replace=False)]
    targets = list(range(1, k_nodes + 1))
    values = rng.integers(0, P, (k_nodes, d), dtype=U64)
    matrix = lagrange_matrix(F, nodes, targets)
    cols = 4
    assert F.matmul(matrix, values[:, :cols]).tolist() == bigint_lagrange_apply(
        nodes, targets, values[:, :cols]
    )
    size = f"K={k_nodes}, d=2^{d.bit_length() - 1}"
    record(
        "Lagrange matrix",
        f"K={k_nodes}",
        "numba lagrange_matrix",
        best_of(lambda: lagrange_matrix(F, nodes, targets)),
        k_nodes * k_nodes,
        "entry/s",
    )
    record(
        "Lagrange apply",
        size,
        "numba matmul_mod",
        best_of(lambda: F.matmul(matrix, values)),
        k_nodes * k_nodes * d,
        "MAC/s",
    )
    t_big = best_of(lambda: bigint_lagrange_apply(nodes, targets, values[:, :cols]), 1)
    record(
        "Lagrange build+apply",
        f"K={k_nodes}, d={cols}",
        "Python big ints",
        t_big,
        k_nodes * k_nodes * cols,
        "MAC/s",
    )

    print(f"cpu = {platform.processor() or platform.machine()}, one core, BLAS threads = 1")
    print(f"{'op':<22}{'size':<22}{'implementation':<24}{'best [s]':>11}{'rate':>14}  unit")
    for r in rows:
        print(
            f"{r['op']:<22}{r['size']:<22}{r['impl']:<24}{r['seconds']:>11.5f}"
            f"{r['rate']:>14.3e}  {r['unit']}"
        )
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"quick": args.quick, "rows": rows}, indent=2))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
