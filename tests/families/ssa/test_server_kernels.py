"""The SSA servers' ring kernels against plain references (session 30): exact, any shape.

:func:`~flwr_fsl.kernels.ring.key_sums_rows` (each key's word sums and the running-sum add in
one pass, inside the key check's segments) against ``np.add.reduceat`` and ``np.add``;
:func:`~flwr_fsl.kernels.ring.scatter_rows_window` (a window's adds, a bin's run found by
binary search, rows prefetched ahead) against one point at a time; and
:func:`~flwr_fsl.families.ssa.verify.segments` (compiled since session 31) against its old loop.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.families.ssa.verify import segments
from flwr_fsl.kernels.ring import (
    _run_after,
    _step,
    key_sums_rows,
    scatter_rows_window,
    sorted_bins,
)

U64 = np.uint64


@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=40),
    tau=st.integers(1, 5),
    data=st.data(),
)
def test_key_sums_are_reduceat_and_the_add(
    lengths: list[int], tau: int, data: st.DataObject
) -> None:
    width = data.draw(st.integers(1, tau))
    col = data.draw(st.integers(0, tau - 1))
    parts = data.draw(st.tuples(st.booleans(), st.booleans(), st.booleans()))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    big = np.array([2**64 - 1, 2**63, 1], U64)  # wrap-arounds
    values = np.concatenate(
        [rng.integers(0, 2**64, (int(starts[-1]) - 1, tau), U64), [big[:1].repeat(tau)]]
    )
    running = rng.integers(0, 2**64, values.shape, U64)
    none = np.zeros((0, tau), U64)
    sums = np.zeros((len(lengths), width), U64) if parts[0] else none[:, :1]
    counts = np.zeros(len(lengths), U64) if parts[1] else none[:, 0]
    into = running.copy() if parts[2] else none
    key_sums_rows(values, starts, sums, counts, col, into)
    ref = np.add.reduceat(values, starts[:-1], axis=0)
    if parts[0]:
        assert np.array_equal(sums, ref[:, :width])
    if parts[1]:
        assert np.array_equal(counts, ref[:, col])
    if parts[2]:
        assert np.array_equal(into, running + values)


def test_key_sums_of_a_key_range_start_anywhere() -> None:
    values = np.arange(20, dtype=U64).reshape(10, 2)
    sums, counts = np.zeros((2, 1), U64), np.zeros(2, U64)
    key_sums_rows(values, np.array([3, 5, 9], np.int64), sums, counts, 1, np.zeros((0, 2), U64))
    assert sums[:, 0].tolist() == [6 + 8, 10 + 12 + 14 + 16]
    assert counts.tolist() == [7 + 9, 11 + 13 + 15 + 17]


@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=30),
    rows=st.integers(1, 60),
    tau=st.integers(1, 3),
    shift=st.integers(0, 1),
    data=st.data(),
)
def test_scatter_windows_add_what_one_point_at_a_time_adds(
    sizes: list[int], rows: int, tau: int, shift: int, data: st.DataObject
) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    items = np.concatenate(
        [np.sort(rng.choice(rows, min(n, rows), replace=False)) for n in sizes]
        + [np.zeros(0, np.int64)]
    ).astype(np.int64)
    bins = np.concatenate([[0], np.cumsum([min(n, rows) for n in sizes])]).astype(np.int64)
    values = rng.integers(0, 2**64, (items.shape[0] + shift * len(sizes), tau + 1), U64)
    want = np.zeros((rows, tau), U64)
    for b in range(len(sizes)):
        for j in range(int(bins[b]), int(bins[b + 1])):
            want[items[j]] += values[j + shift * b, :tau]
    cuts = sorted({0, rows, *data.draw(st.lists(st.integers(0, rows), max_size=4))})
    got = np.zeros_like(want)
    for lo, hi in itertools.pairwise(cuts):
        scatter_rows_window(got, items, values, bins, shift, (lo, hi))
    assert sorted_bins(items, bins)
    assert np.array_equal(got, want)


def test_unsorted_bins_are_found_and_scatter_whole() -> None:
    items = np.array([3, 1, 2, 0, 4], np.int64)
    bins = np.array([0, 2, 5], np.int64)
    assert not sorted_bins(items, bins)
    assert sorted_bins(np.array([1, 3, 0, 2, 4], np.int64), bins)
    values = np.arange(1, 6, dtype=U64).reshape(5, 1)
    got = np.zeros((5, 1), U64)
    scatter_rows_window(got, items, values, bins, 0, (0, 5))  # one window holding every row
    assert got[:, 0].tolist() == [4, 2, 3, 1, 5]


@given(
    lengths=st.lists(st.integers(1, 40), max_size=60),
    points=st.integers(1, 100),
)
def test_segments_cut_as_the_greedy_loop(lengths: list[int], points: int) -> None:
    want: list[tuple[int, int]] = []  # the Python loop segments() was before session 31
    start, acc = 0, 0
    for j, n in enumerate(lengths):
        if acc and acc + n > points:
            want.append((start, j))
            start, acc = j, 0
        acc += n
    if lengths:
        want.append((start, len(lengths)))
    assert segments(np.array(lengths, np.int64), points) == want


@given(
    sizes=st.lists(st.integers(0, 12), max_size=30),
    rows=st.integers(1, 60),
    data=st.data(),
)
def test_the_prefetch_cursor_walks_the_window_items_in_scatter_order(
    sizes: list[int], rows: int, data: st.DataObject
) -> None:
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    counts = [min(n, rows) for n in sizes]
    items = np.concatenate(
        [np.sort(rng.choice(rows, n, replace=False)) for n in counts] + [np.zeros(0, np.int64)]
    ).astype(np.int64)
    bins = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    lo = data.draw(st.integers(0, rows))
    window = (lo, data.draw(st.integers(lo, rows)))
    want = [
        j
        for b in range(len(counts))
        for j in range(int(bins[b]), int(bins[b + 1]))
        if window[0] <= items[j] < window[1]
    ]
    got = []
    cursor = _run_after(items, bins, -1, window)
    while cursor[1] < cursor[2]:
        got.append(int(cursor[1]))
        cursor = _step(items, bins, cursor, window)
    assert got == want
    assert cursor == (len(counts), 0, 0)  # past the last item: it stays there
    assert _step(items, bins, cursor, window) == cursor
