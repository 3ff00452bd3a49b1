"""Ring (Z_2^64) kernels: the servers' scatter, key sums and inner products; a wrapping matmul."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic
from numpy.typing import NDArray

from flwr_fsl.kernels.hashing import first_at_least

SCATTER_AHEAD = 64
"""Items the scatter looks ahead to prefetch a share row (:func:`scatter_rows_window`)."""


@intrinsic
def _prefetch_row(typingctx, arr, row):  # type: ignore[no-untyped-def]
    """Prefetch row ``row`` of a 2-D array for writing (LLVM ``llvm.prefetch``; only a hint).

    The address is computed, never dereferenced, so a row outside the array is harmless;
    callers still pass rows inside it.
    """
    if not (isinstance(arr, types.Array) and arr.ndim == 2):
        return None
    sig = types.void(arr, types.int64)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        byte = ir.IntType(8).as_pointer()
        step = builder.mul(args[1], builder.extract_value(ary.strides, 0))
        address = builder.gep(builder.bitcast(ary.data, byte), [step])
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32])
        fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=fnty)
        builder.call(fn, [address, i32(1), i32(3), i32(1)])  # write, keep in cache, data
        return context.get_dummy_value()

    return sig, codegen


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
    shift: int,
    window: tuple[int, int],
) -> None:  # pragma: no cover - compiled
    """Do the adds of a scatter that fall in rows ``[lo, hi)`` (threads take disjoint windows).

    Bin ``b`` holds items ``bins[b]:bins[b + 1]``, sorted ascending (a simple-hash table's
    CSR layout); item ``j`` of bin ``b`` adds row ``j + shift * b`` of ``values`` to row
    ``items[j]`` of ``share`` (``shift`` 1 skips each bin's dummy slot in a checked round,
    0 has none). Only the first ``share.shape[1]`` words of a point are added. A bin's items
    in the window are one run, found by binary search, so a thread reads only its own items'
    values; windows that cover the share add exactly what one whole scatter adds (with
    unsorted bins only a window holding every row, ``(0, len(share))``, is exact).

    Each add prefetches the row of the window's item :data:`SCATTER_AHEAD` places later:
    the random read-modify-writes overlap instead of waiting on one cache miss each (session
    31: a whole ``m = 2**20``, ``tau = 2`` scatter of 3.1M items took 134-156 ms of CPU
    without, 27-36 ms with, on a 2-core EPYC VM at load ~3). A second cursor walks the
    window's runs that many items ahead (:func:`_step`): looking ``SCATTER_AHEAD`` places
    ahead in the whole item array instead found another window's row half the time with two
    windows, and each half-window then took longer than one whole scatter (a window of
    every row still looks ahead in the array: the same items, no cursor). A prefetch
    changes no value: the share is the same.
    """
    lo, hi = window
    tau = share.shape[1]
    last = items.shape[0] - 1
    whole = lo <= 0 and hi >= share.shape[0]  # every item is this window's: no cursor
    ahead = _run_after(items, bins, bins.shape[0] - 1 if whole else -1, window)
    for _ in range(0 if whole else SCATTER_AHEAD):
        ahead = _step(items, bins, ahead, window)
    for b in range(bins.shape[0] - 1):
        end = bins[b + 1]
        start = first_at_least(items, bins[b], end, lo)
        stop = first_at_least(items, start, end, hi)
        offset = shift * b
        for j in range(start, stop):
            row = items[j]
            # The adds are random rows: one cache miss each (about 45 ns at m = 2**20)
            # unless the row is prefetched SCATTER_AHEAD items before (past the window's
            # last item: this one again).
            if whole:
                _prefetch_row(share, items[min(j + SCATTER_AHEAD, last)])  # type: ignore[call-arg]
            else:
                _prefetch_row(share, items[ahead[1]] if ahead[1] < ahead[2] else row)  # type: ignore[call-arg]
                ahead = _step(items, bins, ahead, window)
            for t in range(tau):
                share[row, t] += values[j + offset, t]


@njit(cache=True, nogil=True)
def _run_after(
    items: NDArray[np.int64], bins: NDArray[np.int64], b: int, window: tuple[int, int]
) -> tuple[int, int, int]:  # pragma: no cover - compiled
    """Return the first nonempty run ``(bin, start, stop)`` of a window's items after bin ``b``.

    ``(len(bins) - 1, 0, 0)`` when there is none (the cursor is past the window's last item).
    """
    lo, hi = window
    last = bins.shape[0] - 1
    b += 1
    while b < last:
        start = first_at_least(items, bins[b], bins[b + 1], lo)
        stop = first_at_least(items, start, bins[b + 1], hi)
        if start < stop:
            return b, start, stop
        b += 1
    return last, 0, 0


@njit(cache=True, nogil=True)
def _step(
    items: NDArray[np.int64],
    bins: NDArray[np.int64],
    cursor: tuple[int, int, int],
    window: tuple[int, int],
) -> tuple[int, int, int]:  # pragma: no cover - compiled
    """Move a ``(bin, item, run stop)`` cursor to the window's next item (in scatter order)."""
    b, j, stop = cursor
    if j + 1 < stop:
        return b, j + 1, stop
    return _run_after(items, bins, b, window)


@njit(cache=True, nogil=True)
def sorted_bins(items: NDArray[np.int64], bins: NDArray[np.int64]) -> bool:  # pragma: no cover
    """Whether every bin ``items[bins[b]:bins[b + 1]]`` is sorted ascending."""
    for b in range(bins.shape[0] - 1):
        for j in range(bins[b] + 1, bins[b + 1]):
            if items[j] < items[j - 1]:
                return False
    return True


@njit(cache=True, nogil=True)
def key_sums_rows(
    values: NDArray[np.uint64],
    starts: NDArray[np.int64],
    value_sums: NDArray[np.uint64],
    counts: NDArray[np.uint64],
    col: int,
    add_into: NDArray[np.uint64],
) -> None:  # pragma: no cover - compiled
    """Sum each key's rows of ``values``; optionally add the rows into a running sum.

    Key ``q``'s rows are ``starts[q]:starts[q + 1]`` (at least one each). ``value_sums[q]``
    receives the sum of the key's first ``value_sums.shape[1]`` words, ``counts[q]`` that of
    its word ``col`` (the count word of a checked point), and every row read is added to the
    same row of ``add_into``: one pass over rows still in cache (the key check's segment),
    where ``np.add.reduceat`` and ``np.add`` took two. An empty ``value_sums``, ``counts`` or
    ``add_into`` (zero rows) switches that part off. All sums wrap modulo ``2**64``.
    """
    if values.shape[1] == 2:  # one value word and the count (the default round)
        _key_sums_two(values.reshape(-1), starts, value_sums, counts, col, add_into.reshape(-1))
    else:
        _key_sums_any(values, starts, value_sums, counts, col, add_into)


@njit(cache=True, nogil=True)
def _key_sums_two(
    flat: NDArray[np.uint64],
    starts: NDArray[np.int64],
    value_sums: NDArray[np.uint64],
    counts: NDArray[np.uint64],
    col: int,
    into: NDArray[np.uint64],
) -> None:  # pragma: no cover - compiled
    """:func:`key_sums_rows` of two-word rows (flattened), the two sums in registers."""
    do_add = into.shape[0] > 0
    for q in range(starts.shape[0] - 1):
        s0 = np.uint64(0)
        s1 = np.uint64(0)
        for p in range(starts[q], starts[q + 1]):
            v0 = flat[2 * p]
            v1 = flat[2 * p + 1]
            s0 += v0
            s1 += v1
            if do_add:
                into[2 * p] += v0
                into[2 * p + 1] += v1
        if value_sums.shape[0]:
            value_sums[q, 0] = s0
            if value_sums.shape[1] > 1:
                value_sums[q, 1] = s1
        if counts.shape[0]:
            counts[q] = s1 if col else s0


@njit(cache=True, nogil=True)
def _key_sums_any(
    values: NDArray[np.uint64],
    starts: NDArray[np.int64],
    value_sums: NDArray[np.uint64],
    counts: NDArray[np.uint64],
    col: int,
    add_into: NDArray[np.uint64],
) -> None:  # pragma: no cover - compiled
    """:func:`key_sums_rows` of rows of any width."""
    tau = values.shape[1]
    acc = np.zeros(tau, np.uint64)
    for q in range(starts.shape[0] - 1):
        acc[:] = 0
        for p in range(starts[q], starts[q + 1]):
            for t in range(tau):
                acc[t] += values[p, t]
        if add_into.shape[0]:
            for p in range(starts[q], starts[q + 1]):
                for t in range(tau):
                    add_into[p, t] += values[p, t]
        for t in range(value_sums.shape[1] if value_sums.shape[0] else 0):
            value_sums[q, t] = acc[t]
        if counts.shape[0]:
            counts[q] = acc[col]


@njit(cache=True, nogil=True)
def im2col_nhwc(
    x: np.ndarray, kernel: int, stride: int, padding: int, out: np.ndarray
) -> None:  # pragma: no cover - numba
    """Write the im2col matrix of an ``(N, H, W, C)`` batch into ``out`` (PrivHFL's convolutions).

    ``out[(n * OH + oh) * OW + ow, (c * k + kh) * k + kw] = x[n, oh s + kh - p, ow s + kw - p,
    c]``, zero outside the image: torch's ``(C, kh, kw)`` column order, the words of
    :func:`~flwr_fsl.families.privhfl.inference.nhwc_patches` (whose numpy reshape of a
    window view copies word by word at a stride of ``8 C`` bytes, after a padded copy). One
    pass: each row (``C k^2`` words) is written in L1, reading ``C`` contiguous words at a time.
    """
    nb, h, w, ch = x.shape
    k = kernel
    kk = k * k
    oh_n = (h + 2 * padding - k) // stride + 1
    ow_n = (w + 2 * padding - k) // stride + 1
    zero = out.dtype.type(0)
    for n in range(nb):
        for oh in range(oh_n):
            for ow in range(ow_n):
                row = (n * oh_n + oh) * ow_n + ow
                for kh in range(k):
                    y = oh * stride + kh - padding
                    for kw in range(k):
                        col = kh * k + kw
                        xx = ow * stride + kw - padding
                        if 0 <= y < h and 0 <= xx < w:
                            for c in range(ch):
                                out[row, c * kk + col] = x[n, y, xx, c]
                        else:
                            for c in range(ch):
                                out[row, c * kk + col] = zero
