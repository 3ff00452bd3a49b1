"""Numba kernels for cuckoo and simple hashing (Cui et al. 2023, §4).

These are the hot loops behind :mod:`flwr_fsl.crypto.hashing`; nothing here validates its
inputs, the public API does that. Conventions:

* indices, bin numbers, offsets and positions are ``int64``; ``EMPTY = -1`` marks an empty
  cuckoo bin or stash slot, or an index that a position lookup did not find;
* hash words (AES output) are ``uint64``; every constant mixed with them is ``np.uint64`` so
  numba never promotes to float64;
* the number of bins is below ``2**32`` so that :func:`_fastrange` is exact without 128-bit
  arithmetic.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.typing import NDArray

EMPTY = -1
"""Marker for an empty cuckoo bin, an empty stash slot, or a position not found."""

_U32 = np.uint64(32)
_LOW32 = np.uint64(0xFFFFFFFF)
_PARTITION_ENTRIES = 8192  # entries per partition of the two-level simple-table sort


@njit(cache=True, nogil=True, inline="always")
def first_at_least(items: NDArray[np.int64], start: int, stop: int, bound: int) -> int:
    """Return the first ``j`` in ``[start, stop)`` with ``items[j] >= bound`` (else ``stop``).

    ``items[start:stop]`` is sorted ascending (one bin of a simple table's CSR layout).
    """
    while start < stop:
        mid = (start + stop) >> 1
        if items[mid] < bound:
            start = mid + 1
        else:
            stop = mid
    return start


@njit(cache=True, inline="always")
def _fastrange(word: np.uint64, n: np.uint64) -> np.uint64:  # pragma: no cover - jitted
    """Return ``floor(word * n / 2**64)``, a near-uniform map of ``word`` onto ``[0, n)``.

    Lemire's multiply-shift reduction; exact for ``n < 2**32`` (no intermediate overflows).
    """
    hi = word >> _U32
    lo = word & _LOW32
    return (hi * n + ((lo * n) >> _U32)) >> _U32


@njit(cache=True, inline="always")
def _splitmix64(state: np.uint64) -> tuple[np.uint64, np.uint64]:  # pragma: no cover - jitted
    """Advance a SplitMix64 state; return ``(new_state, output)``."""
    state = state + np.uint64(0x9E3779B97F4A7C15)
    z = state
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return state, z ^ (z >> np.uint64(31))


@njit(cache=True)
def fill_hash_blocks(
    indices: NDArray[np.int64], tag: np.uint64, blocks: NDArray[np.uint64]
) -> None:  # pragma: no cover - jitted
    """Write the AES input block ``(index, tag | d)`` for every index and hash function ``d``.

    Parameters
    ----------
    indices : numpy.ndarray
        ``(n,)`` int64 indices.
    tag : numpy.uint64
        Domain-separation tag; its low 8 bits must be zero (they carry ``d``).
    blocks : numpy.ndarray
        ``(n, num_hashes, 2)`` uint64 output: word 0 is the index, word 1 is ``tag | d``.
    """
    n = blocks.shape[0]
    num_hashes = blocks.shape[1]
    for i in range(n):
        x = np.uint64(indices[i])
        for d in range(num_hashes):
            blocks[i, d, 0] = x
            blocks[i, d, 1] = tag | np.uint64(d)


@njit(cache=True, inline="always")
def _is_repeat(candidates: NDArray[np.int64], i: int, d: int) -> bool:  # pragma: no cover
    """Whether hash function ``d`` maps item ``i`` to a bin an earlier one already gave."""
    b = candidates[i, d]
    for e in range(d):
        if candidates[i, e] == b:
            return True
    return False


@njit(cache=True)
def reduce_to_bins(
    ciphertext: NDArray[np.uint64],
    num_bins: np.uint64,
    out: NDArray[np.int64],
    bin_counts: NDArray[np.int64],
) -> None:  # pragma: no cover - jitted
    """Map the first word of every ciphertext block onto a bin in ``[0, num_bins)``.

    Parameters
    ----------
    ciphertext : numpy.ndarray
        ``(n, num_hashes, 2)`` uint64 AES output.
    num_bins : numpy.uint64
        Number of bins ``B`` (``1 <= B < 2**32``).
    out : numpy.ndarray
        ``(n, num_hashes)`` int64; receives ``h_d(index_i)``.
    bin_counts : numpy.ndarray
        Either empty (no counting) or ``(B + 1,)`` int64 to which this adds, at ``b + 1``, one
        for each item with ``b`` among its *distinct* bins (the first pass of simple
        hashing, fused here while the chunk is in cache).
    """
    n = ciphertext.shape[0]
    num_hashes = ciphertext.shape[1]
    count = bin_counts.shape[0] > 0
    for i in range(n):
        for d in range(num_hashes):
            b = np.int64(_fastrange(ciphertext[i, d, 0], num_bins))
            out[i, d] = b
            if count and not _is_repeat(out, i, d):
                bin_counts[b + 1] += 1


@njit(cache=True)
def cuckoo_insert(  # noqa: C901
    candidates: NDArray[np.int64],
    max_evictions: np.int64,
    seed: np.uint64,
    table: NDArray[np.int64],
    stash: NDArray[np.int64],
) -> np.int64:  # pragma: no cover - jitted
    """Cuckoo-insert items ``0..n-1`` (rows of ``candidates``) by random-walk eviction.

    Each item first takes a free bin among its candidate bins (lowest hash function first).
    If all are taken it evicts the occupant of a uniformly random *distinct* candidate bin
    other than the one it was just evicted from (unless that is its only bin: then it evicts
    its evictor back), and the evicted item continues the walk.
    After ``max_evictions`` evictions the homeless item goes to the stash; if the stash is
    full the insertion stops.

    Parameters
    ----------
    candidates : numpy.ndarray
        ``(n, num_hashes)`` int64 candidate bins of each item.
    max_evictions : numpy.int64
        Evictions allowed per inserted item (``0``: first free bin or stash).
    seed : numpy.uint64
        Seed of the SplitMix64 stream that picks the bins to evict from.
    table : numpy.ndarray
        ``(B,)`` int64, all ``EMPTY`` on entry; receives the item number held by each bin.
    stash : numpy.ndarray
        ``(stash_size,)`` int64, all ``EMPTY`` on entry; receives stashed item numbers.

    Returns
    -------
    numpy.int64
        ``EMPTY`` on success, else the number of the item left homeless (stash full).
    """
    n = candidates.shape[0]
    num_hashes = candidates.shape[1]
    stash_size = stash.shape[0]
    choices = np.empty(num_hashes, np.int64)
    state = seed
    num_stashed = 0
    for i in range(n):
        current = np.int64(i)
        previous_bin = np.int64(EMPTY)
        evictions = 0
        placed = False
        while True:
            for d in range(num_hashes):
                b = candidates[current, d]
                if table[b] == EMPTY:
                    table[b] = current
                    placed = True
                    break
            if placed or evictions >= max_evictions:
                break
            # Distinct candidate bins, minus the one ``current`` was just evicted from.
            num_choices = 0
            for d in range(num_hashes):
                b = candidates[current, d]
                if b == previous_bin:
                    continue
                seen = False
                for e in range(num_choices):
                    if choices[e] == b:
                        seen = True
                        break
                if not seen:
                    choices[num_choices] = b
                    num_choices += 1
            if num_choices == 0:
                # Every hash function maps ``current`` to the bin it just left: it can only
                # evict its evictor back, which then walks on to one of its other bins.
                choices[0] = previous_bin
                num_choices = 1
            state, word = _splitmix64(state)
            b = choices[np.int64(_fastrange(word, np.uint64(num_choices)))]
            evicted = table[b]
            table[b] = current
            current = evicted
            previous_bin = b
            evictions += 1
        if not placed:
            if num_stashed < stash_size:
                stash[num_stashed] = current
                num_stashed += 1
            else:
                return current
    return np.int64(EMPTY)


@njit(cache=True)
def resolve_cuckoo_table(
    items: NDArray[np.int64],
    candidates: NDArray[np.int64],
    table: NDArray[np.int64],
    stash: NDArray[np.int64],
    hash_ids: NDArray[np.int64],
) -> None:  # pragma: no cover - jitted
    """Turn the item numbers of :func:`cuckoo_insert` into indices, and record hash ids.

    Parameters
    ----------
    items : numpy.ndarray
        ``(n,)`` int64 indices (row ``i`` of ``candidates`` belongs to ``items[i]``).
    candidates : numpy.ndarray
        ``(n, num_hashes)`` int64 candidate bins.
    table : numpy.ndarray
        ``(B,)`` int64 item numbers or ``EMPTY``; overwritten with the indices.
    stash : numpy.ndarray
        ``(stash_size,)`` int64 item numbers or ``EMPTY``; overwritten with the indices.
    hash_ids : numpy.ndarray
        ``(B,)`` int64 output: the lowest ``d`` with ``candidates[i, d] == b`` for the item
        ``i`` in bin ``b``, or ``EMPTY``.
    """
    num_hashes = candidates.shape[1]
    for b in range(table.shape[0]):
        i = table[b]
        hash_ids[b] = EMPTY
        if i != EMPTY:
            for d in range(num_hashes):
                if candidates[i, d] == b:
                    hash_ids[b] = d
                    break
            table[b] = items[i]
    for s in range(stash.shape[0]):
        if stash[s] != EMPTY:
            stash[s] = items[stash[s]]


@njit(cache=True)
def fill_simple_bins(
    items: NDArray[np.int64],
    candidates: NDArray[np.int64],
    bin_offsets: NDArray[np.int64],
    bin_items: NDArray[np.int64],
    scratch: NDArray[np.uint64],
) -> None:  # pragma: no cover - jitted
    """Second pass of simple hashing: put every item into each of its distinct bins once.

    A stable two-level counting sort, so ascending ``items`` give sorted bins. Scattering
    ``n * η`` entries straight to ``B`` random bins misses the cache on almost every write;
    instead pass 1 streams each entry to its *partition*, a run of ``2**shift`` consecutive
    bins holding about ``_PARTITION_ENTRIES`` entries, packed as one word
    ``item << shift | (bin - first bin of the partition)``, and pass 2 sorts each partition
    into its bins inside the cache. ``shift`` is lowered if the largest item needs more
    than ``63 - shift`` bits (only for indices near ``2**62``; still correct, just slower).
    The output arrays are allocated by the caller (numpy puts large arrays on huge pages;
    numba's allocator faults on every 4 KiB page).

    Parameters
    ----------
    items : numpy.ndarray
        ``(n,)`` int64 items, ascending, non-negative.
    candidates : numpy.ndarray
        ``(n, num_hashes)`` int64 candidate bins of each item.
    bin_offsets : numpy.ndarray
        ``(B + 1,)`` int64 CSR offsets (prefix sums of the counts of :func:`reduce_to_bins`).
    bin_items : numpy.ndarray
        ``(bin_offsets[B],)`` int64 output.
    scratch : numpy.ndarray
        ``(bin_offsets[B],)`` uint64 scratch for the packed entries between the passes.
    """
    n = candidates.shape[0]
    num_hashes = candidates.shape[1]
    num_bins = bin_offsets.shape[0] - 1
    total = bin_offsets[num_bins]
    # Largest power-of-two run of bins with at most _PARTITION_ENTRIES entries on average
    # (no larger than the table; each test's product is at most 2**46, no overflow) ...
    shift = 0
    while (np.int64(2) << shift) <= num_bins and (
        np.int64(2) << shift
    ) * total <= _PARTITION_ENTRIES * num_bins:
        shift += 1
    # ... whose in-partition bin offset fits beside the largest item in 63 bits.
    item_bits = 0
    if n > 0:
        while item_bits < 63 and (np.int64(1) << item_bits) <= items[n - 1]:
            item_bits += 1
    shift = min(shift, 63 - item_bits)
    ushift = np.uint64(shift)
    low_mask = (np.uint64(1) << ushift) - np.uint64(1)
    num_parts = ((num_bins - 1) >> shift) + 1
    part_cursor = np.empty(num_parts, np.int64)
    for q in range(num_parts):
        part_cursor[q] = bin_offsets[q << shift]
    for i in range(n):
        word = np.uint64(items[i]) << ushift
        for d in range(num_hashes):
            if not _is_repeat(candidates, i, d):
                b = candidates[i, d]
                q = b >> shift
                j = part_cursor[q]
                scratch[j] = word | (np.uint64(b) & low_mask)
                part_cursor[q] = j + 1
    cursor = bin_offsets[:num_bins].copy()
    for q in range(num_parts):
        first_bin = q << shift
        for j in range(
            bin_offsets[first_bin], bin_offsets[min(first_bin + (1 << shift), num_bins)]
        ):
            b = first_bin + np.int64(scratch[j] & low_mask)
            bin_items[cursor[b]] = np.int64(scratch[j] >> ushift)
            cursor[b] += 1


@njit(cache=True)
def lookup_positions(
    bin_offsets: NDArray[np.int64],
    bin_items: NDArray[np.int64],
    bins: NDArray[np.int64],
    indices: NDArray[np.int64],
    out: NDArray[np.int64],
) -> np.int64:  # pragma: no cover - jitted
    """Binary-search each ``indices[q]`` inside its sorted simple bin ``bins[q]``.

    Parameters
    ----------
    bin_offsets, bin_items : numpy.ndarray
        The CSR simple table (bins sorted ascending).
    bins : numpy.ndarray
        ``(n,)`` int64 bin numbers, each in ``[0, B)``.
    indices : numpy.ndarray
        ``(n,)`` int64 indices to find.
    out : numpy.ndarray
        ``(n,)`` int64; receives the rank of ``indices[q]`` in bin ``bins[q]`` or ``EMPTY``.

    Returns
    -------
    numpy.int64
        The first query number that was not found, or ``EMPTY`` if all were found.
    """
    first_missing = np.int64(EMPTY)
    for q in range(bins.shape[0]):
        b = bins[q]
        x = indices[q]
        start = bin_offsets[b]
        stop = bin_offsets[b + 1]
        lo = first_at_least(bin_items, start, stop, x)
        if lo < stop and bin_items[lo] == x:
            out[q] = lo - start
        else:
            out[q] = EMPTY
            if first_missing == EMPTY:
                first_missing = np.int64(q)
    return first_missing


@njit(cache=True, nogil=True)
def place_in_bins(
    items: NDArray[np.int64],
    order: NDArray[np.int64],
    candidates: NDArray[np.integer],
    inserted: NDArray[np.integer],
    table_index: tuple[NDArray[np.int64], NDArray[np.int64]],
    dummy: np.int64,
    outs: tuple[
        NDArray[np.int64],
        NDArray[np.int64],
        NDArray[np.int64],
        NDArray[np.uint64],
        NDArray[np.int64],
    ],
    bins: tuple[int, int],
) -> np.int64:  # pragma: no cover - jitted
    """Finish a client's placement after :func:`cuckoo_insert`: the bins ``bins[0]:bins[1]``.

    ``inserted`` (``(B,)``, any integer type) holds :func:`cuckoo_insert`'s item numbers (rows
    of the sorted, distinct ``items``) and ``table_index`` is the round's simple table
    ``(bin_offsets, bin_items)``. ``outs`` is ``(table, stash, hash_ids, alphas, slots)``:
    ``table`` (``(B,)`` int64) receives each bin's index and ``stash`` (``(σ,)``), which holds
    :func:`cuckoo_insert`'s item numbers, is overwritten with the indices, as
    :func:`resolve_cuckoo_table` does, which also gives ``hash_ids``. Each key's DPF point goes
    to ``alphas`` (``(B + σ,)``): a bin's point is the rank of its index in its simple bin
    (one linear pass over the bin), a stash slot's the index itself; an unused key's is its
    dummy slot (the bin's size, ``m`` for a stash slot) when ``dummy`` is ``m`` (a checked
    round), else 0 (``dummy < 0``). ``slots`` receives each key's row in the client's own index list
    (``order[i]`` for item ``i``) or ``EMPTY``.

    Only the bins ``bins = (lo, hi)`` are written (and the stash slots when ``hi`` is the
    number of bins), so disjoint ranges covering every bin run on several threads (``nogil``;
    each writes its own bins' words): the ranks stream the simple table, the call's largest
    cost.

    Returns
    -------
    numpy.int64
        The range's first bin whose index is not in its simple bin, or ``EMPTY`` if none.
    """
    table, stash, hash_ids, alphas, slots = outs
    # Two passes over the range: one pass doing both ran 3-4x slower than the two (issue 26,
    # m = 2**20: ~35 ms against ~10 ms), its many streams and random reads beside the ranks.
    _resolve_bins(items, order, candidates, inserted, (table, hash_ids, slots), bins)
    first_missing = _rank_bins(table, table_index, bool(dummy >= 0), alphas, bins)
    num_bins = table.shape[0]
    if bins[1] != num_bins:
        return first_missing
    for s in range(stash.shape[0]):
        i = stash[s]
        if i == EMPTY:
            slots[num_bins + s] = EMPTY
            alphas[num_bins + s] = np.uint64(dummy) if dummy >= 0 else np.uint64(0)
        else:
            stash[s] = items[i]
            slots[num_bins + s] = order[i]
            alphas[num_bins + s] = np.uint64(items[i])
    return first_missing


@njit(cache=True, nogil=True)
def _resolve_bins(
    items: NDArray[np.int64],
    order: NDArray[np.int64],
    candidates: NDArray[np.integer],
    inserted: NDArray[np.integer],
    outs: tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]],
    bins: tuple[int, int],
) -> None:  # pragma: no cover - jitted
    """:func:`place_in_bins`' first pass: each bin's index, hash function and client row."""
    table, hash_ids, slots = outs
    num_hashes = candidates.shape[1]
    for b in range(bins[0], bins[1]):
        i = np.int64(inserted[b])
        if i == EMPTY:
            table[b] = EMPTY
            hash_ids[b] = EMPTY
            slots[b] = EMPTY
            continue
        for d in range(num_hashes):
            if candidates[i, d] == b:
                hash_ids[b] = d
                break
        table[b] = items[i]
        slots[b] = order[i]


@njit(cache=True, nogil=True)
def _rank_bins(
    table: NDArray[np.int64],
    table_index: tuple[NDArray[np.int64], NDArray[np.int64]],
    checked: bool,
    alphas: NDArray[np.uint64],
    bins: tuple[int, int],
) -> np.int64:  # pragma: no cover - jitted
    """:func:`place_in_bins`' second pass: each bin's point; the first missing index's bin.

    A bin's point is the rank of its index ``table[b]`` in its simple bin (one linear pass over
    that bin); an empty bin's is the bin's size (its dummy slot) when ``checked``, else 0.
    """
    bin_offsets, bin_items = table_index
    first_missing = np.int64(EMPTY)
    for b in range(bins[0], bins[1]):
        x = table[b]
        # Unsigned positions: numba wraps a negative signed index, and that check kept the
        # count loop scalar (issue 26, m = 2**20: 4.1-5.6 ms, this form 3.2-3.4 ms).
        start = np.uint64(bin_offsets[b])
        stop = np.uint64(bin_offsets[b + 1])
        if x == EMPTY:
            alphas[b] = stop - start if checked else np.uint64(0)
            continue
        rank = np.uint64(0)
        p = start
        while p < stop:
            rank += np.uint64(bin_items[p] < x)
            p += np.uint64(1)
        alphas[b] = rank
        at = start + rank
        if (at >= stop or bin_items[at] != x) and first_missing == EMPTY:
            first_missing = np.int64(b)
    return first_missing
