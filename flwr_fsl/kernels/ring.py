"""Ring (Z_2^64) kernels: the servers' scatter and inner-product steps, and a wrap-around matmul."""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.typing import NDArray


@njit(cache=True, nogil=True)
def scatter_add_rows(
    share: NDArray[np.uint64], items: NDArray[np.int64], values: NDArray[np.uint64]
) -> None:  # pragma: no cover - compiled
    """``share[items[j]] += values[j]`` (row-wise, mod 2^64), duplicates allowed."""
    tau = share.shape[1]
    for j in range(items.shape[0]):
        row = items[j]
        for t in range(tau):
            share[row, t] += values[j, t]


@njit(cache=True, nogil=True)
def binned_inner_products(
    database: NDArray[np.uint64],
    items: NDArray[np.int64],
    offsets: NDArray[np.int64],
    selectors: NDArray[np.uint64],
    out: NDArray[np.uint64],
) -> None:  # pragma: no cover - compiled
    """``out[b] = sum_j selectors[j] * database[items[j]]`` over bin ``b``'s entries (mod 2^64).

    ``selectors`` is one column of DPF output shares laid out like ``items`` (CSR by bin).
    """
    tau = database.shape[1]
    for b in range(offsets.shape[0] - 1):
        for t in range(tau):
            out[b, t] = np.uint64(0)
        for j in range(offsets[b], offsets[b + 1]):
            s = selectors[j]
            row = items[j]
            for t in range(tau):
                out[b, t] += s * database[row, t]


@njit(cache=True, nogil=True)
def matmul_wrap(  # noqa: C901
    a: NDArray[np.uint64], b: NDArray[np.uint64], out: NDArray[np.uint64]
) -> None:  # pragma: no cover - compiled
    """``out = a @ b`` modulo 2^64 (uint64 wrap-around), ``a`` of shape (m, k), ``b`` (k, n).

    Unsigned overflow in numba (LLVM) is defined wrap-around, so every product and partial sum
    is exact modulo 2^64. Four rows of ``a`` at a time share each row of ``b`` (read
    contiguously) and accumulate in a local buffer written to ``out`` once: 1.5-3x the
    one-row i-l-j loop on PrivHFL's layer shapes (``benchmarks/privhfl_bench.py``).
    """
    m, k = a.shape
    n = b.shape[1]
    acc = np.zeros((4, n), dtype=np.uint64)
    i = 0
    while i + 4 <= m:
        for j in range(n):
            acc[0, j] = np.uint64(0)
            acc[1, j] = np.uint64(0)
            acc[2, j] = np.uint64(0)
            acc[3, j] = np.uint64(0)
        for t in range(k):
            x0 = a[i, t]
            x1 = a[i + 1, t]
            x2 = a[i + 2, t]
            x3 = a[i + 3, t]
            for j in range(n):
                y = b[t, j]
                acc[0, j] += x0 * y
                acc[1, j] += x1 * y
                acc[2, j] += x2 * y
                acc[3, j] += x3 * y
        for r in range(4):
            for j in range(n):
                out[i + r, j] = acc[r, j]
        i += 4
    while i < m:
        for j in range(n):
            acc[0, j] = np.uint64(0)
        for t in range(k):
            x = a[i, t]
            for j in range(n):
                acc[0, j] += x * b[t, j]
        for j in range(n):
            out[i, j] = acc[0, j]
        i += 1


@njit(cache=True, nogil=True)
def scatter_rows_window(
    share: NDArray[np.uint64],
    items: NDArray[np.int64],
    values: NDArray[np.uint64],
    bins: NDArray[np.int64],
    window: tuple[int, int],
) -> None:  # pragma: no cover - compiled
    """Do the adds of a scatter that fall in rows ``[lo, hi)`` (threads take disjoint windows).

    ``bins`` empty: ``share[items[j]] += values[j]`` (:func:`scatter_add_rows`); else the CSR
    bin offsets of a checked round (point ``j`` of bin ``b`` is row ``bins[b] + b + j`` of
    ``values``: each bin's dummy slot is skipped). Only the first ``share.shape[1]`` words of a
    point are added. Every thread reads every item; each writes only its own rows, so windows
    that cover the share add exactly what one whole scatter adds.
    """
    lo, hi = window
    if bins.shape[0] == 0:
        _window_run(share, items, values, 0, items.shape[0], 0, lo, hi)
    for b in range(bins.shape[0] - 1):
        _window_run(share, items, values, bins[b], bins[b + 1], b, lo, hi)


@njit(cache=True, nogil=True, inline="always")
def _window_run(
    share: NDArray[np.uint64],
    items: NDArray[np.int64],
    values: NDArray[np.uint64],
    start: int,
    stop: int,
    shift: int,
    lo: int,
    hi: int,
) -> None:  # pragma: no cover - compiled
    """Items ``start..stop-1`` (points ``j + shift``): their adds in rows ``[lo, hi)``.

    Branch-free (a window's rows are random): an item outside the window adds zero to the
    window's first row.
    """
    tau = share.shape[1]
    for j in range(start, stop):
        row = items[j]
        inside = (row >= lo) & (row < hi)
        mask = np.uint64(0) - np.uint64(inside)
        dst = row if inside else lo
        p = j + shift
        for t in range(tau):
            share[dst, t] += values[p, t] & mask
