"""Cuckoo and simple hashing for DPF-based secure submodel aggregation and retrieval.

Cui et al. 2023 (§4, Table 3) break a client's ``k`` private indices out of a model of ``m``
weights into ``B = ceil(scale_factor * k)`` bins so that each bin needs one small DPF:

* every round the servers publish a 16-byte **hash key**; it fixes ``num_hashes`` (``η``)
  keyed hash functions ``h_0, ..., h_{η-1}`` onto ``[0, B)``;
* a client **cuckoo-hashes** its ``k`` indices: each index lands in exactly one of its ``η``
  bins (or, if a ``stash_size`` ``σ > 0`` was agreed, possibly in the stash);
* all parties **simple-hash** all ``m`` indices into the same ``B`` bins: each index is
  put into each of its *distinct* candidate bins once, and every bin is sorted;
* for a cuckoo bin ``b`` holding index ``x``, the client's DPF points at ``pos_b``, the rank of
  ``x`` inside simple bin ``b``, over a domain of ``ceil(log2 |simple bin b|)`` bits.

The hash functions are public and keyed; they hide nothing (the DPF keys do). They are

    h_d(x) = floor(B * w / 2**64),   w = first little-endian uint64 of AES_key(block),
    block = LE64(x) || LE64(HASH_TAG | d),

computed with batched AES calls of ``2**14 * η`` blocks (cache-resident; faster than one
call over all ``n * η`` blocks). The key must be fresh per round and chosen after the
clients' index sets (e.g. with :func:`generate_hash_key`), or a client could be given a set
whose cuckoo insertion fails.

Conventions: every index, bin number, offset and position is ``int64``; ``EMPTY = -1``
marks an empty cuckoo bin or stash slot. Indices live in ``[0, domain_size)``.

The round's parameters (hash key, scale factor, :class:`HashParams`) are chosen in
:mod:`flwr_fsl.crypto.hash_params` and re-exported here; this module hashes with them.
"""

from __future__ import annotations

import secrets
import sys
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError, RoundFailedError
from flwr_fsl.crypto.hash_params import (
    DEFAULT_NUM_HASHES,
    DEFAULT_STAT_SECURITY,
    HASH_KEY_BYTES,
    HashParams,
    _check_int,
    choose_scale_factor,
    generate_hash_key,
    num_bins_for,
)
from flwr_fsl.kernels import hashing as _kernels
from flwr_fsl.kernels.aes import BatchedAES

__all__ = [
    "DEFAULT_MAX_EVICTIONS",
    "DEFAULT_NUM_HASHES",
    "DEFAULT_STAT_SECURITY",
    "EMPTY",
    "HASH_KEY_BYTES",
    "HASH_TAG",
    "CuckooInsertionError",
    "CuckooTable",
    "HashParams",
    "SimpleTable",
    "choose_scale_factor",
    "cuckoo_hash",
    "generate_hash_key",
    "hash_bins",
    "num_bins_for",
    "positions_in_bins",
    "simple_hash",
]

EMPTY = _kernels.EMPTY
"""Marker (``-1``) of an empty cuckoo bin or stash slot."""

HASH_TAG = int.from_bytes(b"fslhash\x00", "big")
"""Domain-separation tag in the high word of every hash block; the low byte carries ``d``."""

DEFAULT_MAX_EVICTIONS = 1000
"""Evictions per inserted index before it goes to the stash (or insertion fails)."""

_HASH_CHUNK = 2**14  # indices per AES batch: 2**14 * 3 blocks = 768 KiB, fits in L2


class CuckooInsertionError(RoundFailedError):
    """Cuckoo hashing could not place every index (evictions exhausted, stash full).

    A :class:`~flwr_fsl.core.errors.RoundFailedError` (and so still a ``RuntimeError``): raised
    while a client places its indices, it fails that client's upload (an error reply the server
    drops with a reason), never the run.

    Attributes
    ----------
    index : int
        The index left without a bin when insertion stopped (not necessarily the index whose
        insertion started the eviction walk).
    """

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


def _readonly(array: NDArray[np.int64]) -> NDArray[np.int64]:
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class SimpleTable:
    """Simple-hash table of a set of indices (usually all ``m``), in CSR layout.

    Bin ``b`` is ``bin_items[bin_offsets[b]:bin_offsets[b + 1]]``, sorted ascending; an
    index appears once in each of its distinct candidate bins. Both arrays are int64 and
    read-only.

    Scattering back: if ``values`` concatenates, bin after bin, the first ``|bin b|`` outputs
    of bin ``b``'s full-domain DPF evaluation (output ``j`` belongs to the ``j``-th index of
    the bin), then ``values[t]`` belongs to index ``bin_items[t]``, and the per-index sum over
    its (up to ``η``) bins is ``np.add.at(out, bin_items, values)``;
    :meth:`item_bins` gives the bin of each entry.

    Parameters
    ----------
    params : HashParams
        The round's hashing parameters.
    bin_offsets : numpy.ndarray
        ``(B + 1,)`` int64, ``bin_offsets[0] == 0``, non-decreasing.
    bin_items : numpy.ndarray
        ``(bin_offsets[B],)`` int64 indices.
    """

    params: HashParams
    bin_offsets: NDArray[np.int64]
    bin_items: NDArray[np.int64]

    def __post_init__(self) -> None:
        offsets, items = self.bin_offsets, self.bin_items
        if offsets.dtype != np.int64 or items.dtype != np.int64:
            raise ConfigurationError("bin_offsets and bin_items must be int64")
        if offsets.shape != (self.params.num_bins + 1,) or items.ndim != 1:
            raise ConfigurationError(
                "bin_offsets must have shape (num_bins + 1,), bin_items be 1-D"
            )
        if offsets[0] != 0 or offsets[-1] != items.shape[0] or np.any(np.diff(offsets) < 0):
            raise ConfigurationError(
                "bin_offsets must start at 0, not decrease, end at len(bin_items)"
            )

    @property
    def num_bins(self) -> int:
        """``B``."""
        return self.params.num_bins

    @property
    def bin_sizes(self) -> NDArray[np.int64]:
        """``(B,)`` int64 number of indices in each bin."""
        return np.diff(self.bin_offsets)

    @property
    def max_bin_size(self) -> int:
        """``Θ``, the largest bin size (0 for an empty table)."""
        sizes = self.bin_sizes
        return int(sizes.max()) if sizes.size else 0

    def bin(self, b: int) -> NDArray[np.int64]:
        """Return the sorted indices of bin ``b`` (a read-only view).

        Parameters
        ----------
        b : int
            Bin number in ``[0, B)``.

        Returns
        -------
        numpy.ndarray
            int64 indices of the bin.

        Raises
        ------
        ValueError
            If ``b`` is out of range.
        """
        b = _check_int("bin", b, 0, self.num_bins - 1)
        return self.bin_items[self.bin_offsets[b] : self.bin_offsets[b + 1]]

    def domain_bits(self, min_bits: int = 1) -> NDArray[np.int64]:
        """Return each bin's DPF domain size in bits: ``max(min_bits, ceil(log2 |bin|))``.

        Parameters
        ----------
        min_bits : int, optional
            Lower bound (default 1, so that a bin of 0 or 1 index still gets a one-level DPF;
            pass 0 for the exact ``ceil(log2 |bin|)``).

        Returns
        -------
        numpy.ndarray
            ``(B,)`` int64 bit counts.

        Raises
        ------
        ValueError
            If ``min_bits`` is negative or above 63.
        """
        min_bits = _check_int("min_bits", min_bits, 0, 63)
        # frexp(v)[1] is the bit length of the integer v (exact below 2**53); 0 for v = 0.
        _, bit_length = np.frexp(np.maximum(self.bin_sizes - 1, 0).astype(np.float64))
        return np.maximum(bit_length.astype(np.int64), np.int64(min_bits))

    def item_bins(self) -> NDArray[np.int64]:
        """Return the bin number of every entry of ``bin_items`` (for scattering).

        Returns
        -------
        numpy.ndarray
            ``(len(bin_items),)`` int64; entry ``j`` of ``bin_items`` lies in bin
            ``item_bins()[j]`` at position ``j - bin_offsets[item_bins()[j]]``.
        """
        return np.repeat(np.arange(self.num_bins, dtype=np.int64), self.bin_sizes)


@dataclass(frozen=True, eq=False)
class CuckooTable:
    """A client's cuckoo table: at most one index per bin, plus the stash.

    Parameters
    ----------
    params : HashParams
        The round's hashing parameters.
    items : numpy.ndarray
        ``(B,)`` int64: the index held by bin ``b``, or ``EMPTY`` (``-1``).
    hash_ids : numpy.ndarray
        ``(B,)`` int64: the lowest ``d`` with ``h_d(items[b]) == b``, or ``EMPTY``.
    stash : numpy.ndarray
        ``(σ,)`` int64: stashed indices first, then ``EMPTY`` padding (the stash always has
        ``stash_size`` slots, so its size does not depend on the data).
    """

    params: HashParams
    items: NDArray[np.int64]
    hash_ids: NDArray[np.int64]
    stash: NDArray[np.int64]

    def __post_init__(self) -> None:
        shape = (self.params.num_bins,)
        if self.items.shape != shape or self.hash_ids.shape != shape:
            raise ConfigurationError(f"items and hash_ids must have shape {shape}")
        if self.stash.shape != (self.params.stash_size,):
            raise ConfigurationError(f"stash must have shape ({self.params.stash_size},)")
        if any(a.dtype != np.int64 for a in (self.items, self.hash_ids, self.stash)):
            raise ConfigurationError("items, hash_ids and stash must be int64")

    @property
    def occupied(self) -> NDArray[np.bool_]:
        """``(B,)`` bool mask of the bins that hold an index."""
        return self.items != EMPTY

    @property
    def stashed(self) -> NDArray[np.int64]:
        """The stashed indices (without padding)."""
        return self.stash[self.stash != EMPTY]

    @property
    def num_items(self) -> int:
        """Number of indices held, in bins and stash."""
        return int(np.count_nonzero(self.occupied)) + int(self.stashed.size)

    def positions(self, simple_table: SimpleTable) -> NDArray[np.int64]:
        """Return ``pos_b`` for every bin: the rank of ``items[b]`` in simple bin ``b``.

        Parameters
        ----------
        simple_table : SimpleTable
            The round's simple table (same parameters).

        Returns
        -------
        numpy.ndarray
            ``(B,)`` int64 positions, ``EMPTY`` for empty bins.

        Raises
        ------
        ConfigurationError
            If the tables' parameters differ or an index is missing from its simple bin
            (e.g. a simple table built from a subset that lacks it).
        """
        if simple_table.params != self.params:
            raise ConfigurationError("cuckoo and simple table were built with different HashParams")
        out = np.full(self.params.num_bins, EMPTY, dtype=np.int64)
        occupied = np.flatnonzero(self.occupied).astype(np.int64)
        out[occupied] = positions_in_bins(simple_table, occupied, self.items[occupied])
        return out


def _as_indices(indices: ArrayLike, domain_size: int, name: str = "indices") -> NDArray[np.int64]:
    """Return ``indices`` as a 1-D int64 array in ``[0, domain_size)`` or raise ``ValueError``."""
    array = np.asarray(indices)
    if array.ndim != 1:
        raise ConfigurationError(f"{name} must be 1-D, got shape {array.shape}")
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise ConfigurationError(f"{name} must have an integer dtype, got {array.dtype}")
    low, high = array.min(), array.max()
    if low < 0 or high >= domain_size:
        bad = low if low < 0 else high
        raise ConfigurationError(f"{name} must be in [0, {domain_size}), found {int(bad)}")
    return np.ascontiguousarray(array, dtype=np.int64)


def _candidate_bins(
    params: HashParams,
    indices: NDArray[np.int64],
    bin_counts: NDArray[np.int64] | None = None,
) -> NDArray[np.int64]:
    """Return the ``(n, η)`` int64 candidate bins of validated int64 ``indices``.

    If ``bin_counts`` (``(B + 1,)`` int64, zeroed) is given, it also counts each index into
    ``bin_counts[b + 1]`` for each of its distinct bins ``b`` (simple hashing's first pass).

    The AES input is built and encrypted in chunks of ``_HASH_CHUNK`` indices in one reused,
    cache-resident buffer (one ``m * η``-block buffer would be 48 MB at ``m = 2**20``).
    """
    n, num_hashes = indices.shape[0], params.num_hashes
    aes = BatchedAES(params.key)
    tag = np.uint64(HASH_TAG)
    num_bins = np.uint64(params.num_bins)
    chunk = max(1, min(n, _HASH_CHUNK))
    blocks = np.empty((chunk, num_hashes, 2), dtype=np.uint64)
    bins = np.empty((n, num_hashes), dtype=np.int64)
    counts = np.empty(0, dtype=np.int64) if bin_counts is None else bin_counts
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        block_view = blocks[: stop - start]
        _kernels.fill_hash_blocks(indices[start:stop], tag, block_view)
        if sys.byteorder != "little":  # pragma: no cover - the hash is defined on LE words
            block_view.byteswap(inplace=True)
        aes.encrypt_into(block_view, block_view)
        if sys.byteorder != "little":  # pragma: no cover
            block_view.byteswap(inplace=True)
        _kernels.reduce_to_bins(block_view, num_bins, bins[start:stop], counts)
    return bins


def hash_bins(params: HashParams, indices: ArrayLike) -> NDArray[np.int64]:
    """Evaluate the ``η`` public hash functions on ``indices``.

    Parameters
    ----------
    params : HashParams
        The round's hashing parameters (key, ``B``, ``η``).
    indices : array_like
        1-D integer indices in ``[0, m)``.

    Returns
    -------
    numpy.ndarray
        ``(n, η)`` int64: column ``d`` holds ``h_d(index)`` in ``[0, B)``; a row may repeat a
        bin when two hash functions collide.

    Raises
    ------
    ValueError
        If ``indices`` is not 1-D integer data in ``[0, m)``.
    """
    return _candidate_bins(params, _as_indices(indices, params.domain_size))


def _seed_from(seed: int | np.random.Generator | None) -> np.uint64:
    if seed is None:
        return np.uint64(secrets.randbits(64))
    if isinstance(seed, np.random.Generator):
        return np.uint64(seed.integers(0, 2**64, dtype=np.uint64))
    return np.uint64(_check_int("seed", seed, 0, 2**64 - 1))


def cuckoo_hash(
    indices: ArrayLike,
    params: HashParams,
    *,
    seed: int | np.random.Generator | None = None,
    max_evictions: int = DEFAULT_MAX_EVICTIONS,
    rows: NDArray[np.int64] | None = None,
) -> CuckooTable:
    """Cuckoo-hash a client's distinct indices into ``params.num_bins`` bins.

    Indices are inserted in ascending order, so the table depends only on the index set,
    the parameters and ``seed``. An index whose candidate bins are all taken evicts the
    occupant of a random candidate bin (not the bin it was just evicted from, unless it has no
    other: then it evicts its evictor back); after
    ``max_evictions`` evictions the homeless index goes to the stash.

    Parameters
    ----------
    indices : array_like
        1-D distinct integer indices in ``[0, m)``; ``k = len(indices)`` may be 0.
    params : HashParams
        The round's hashing parameters.
    seed : int, numpy.random.Generator or None, optional
        Seed of the eviction choices (an int in ``[0, 2**64)`` or a generator to draw one
        from); ``None`` draws a fresh one. Equal seeds give equal tables.
    max_evictions : int, optional
        Evictions allowed per inserted index, default 1000.
    rows : numpy.ndarray, optional
        ``(B,)`` int64; if given, receives each bin's index as its row in the sorted indices
        (``EMPTY`` for an empty bin), so a caller that sorted its indices maps bins back to
        its own rows without a search.

    Returns
    -------
    CuckooTable
        Every index is in one of its candidate bins or in the stash.

    Raises
    ------
    ValueError
        If ``indices`` are not distinct 1-D integers in ``[0, m)``, there are more than
        ``B + σ`` of them, or ``seed`` / ``max_evictions`` is invalid.
    CuckooInsertionError
        If an index is left homeless after ``max_evictions`` evictions and the stash is full
        (no index is ever dropped silently).
    """
    items = np.sort(_as_indices(indices, params.domain_size))
    max_evictions = _check_int("max_evictions", max_evictions, 0, 2**62)
    duplicated = np.flatnonzero(items[1:] == items[:-1])
    if duplicated.size:
        raise ConfigurationError(
            f"indices must be distinct, {int(items[duplicated[0]])} is repeated"
        )
    capacity = params.num_bins + params.stash_size
    if items.size > capacity:
        raise ConfigurationError(
            f"{items.size} indices cannot fit into {params.num_bins} bins and a stash of "
            f"{params.stash_size}"
        )
    rng_seed = _seed_from(seed)
    candidates = _candidate_bins(params, items)
    table = np.full(params.num_bins, EMPTY, dtype=np.int64)
    stash = np.full(params.stash_size, EMPTY, dtype=np.int64)
    homeless = int(
        _kernels.cuckoo_insert(candidates, np.int64(max_evictions), rng_seed, table, stash)
    )
    if homeless != EMPTY:
        index = int(items[homeless])
        raise CuckooInsertionError(
            f"cuckoo hashing failed: index {index} found no free bin among its "
            f"{params.num_hashes} candidate bins after {max_evictions} evictions and the stash "
            f"of size {params.stash_size} is full ({items.size} indices into "
            f"{params.num_bins} bins); use a larger scale_factor or stash_size, or a new key",
            index,
        )
    if rows is not None:
        rows[:] = table
    hash_ids = np.empty(params.num_bins, dtype=np.int64)
    _kernels.resolve_cuckoo_table(items, candidates, table, stash, hash_ids)
    return CuckooTable(
        params=params,
        items=_readonly(table),
        hash_ids=_readonly(hash_ids),
        stash=_readonly(stash),
    )


def simple_hash(params: HashParams, indices: ArrayLike | None = None) -> SimpleTable:
    """Simple-hash indices (default: all ``m``) into the ``params.num_bins`` bins.

    Each index goes into each of its distinct candidate bins once (so ``η`` times minus
    same-bin collisions); every bin is sorted ascending.

    Parameters
    ----------
    params : HashParams
        The round's hashing parameters.
    indices : array_like or None, optional
        1-D distinct integer indices in ``[0, m)`` to hash instead of all of ``range(m)``
        (e.g. a private-set-union result); any order.

    Returns
    -------
    SimpleTable
        The CSR table.

    Raises
    ------
    ConfigurationError
        If ``indices`` are not distinct 1-D integers in ``[0, m)``.
    """
    if indices is None:
        items = np.arange(params.domain_size, dtype=np.int64)
    else:
        items = np.sort(_as_indices(indices, params.domain_size))
        duplicated = np.flatnonzero(items[1:] == items[:-1])
        if duplicated.size:
            raise ConfigurationError(
                f"indices must be distinct, {int(items[duplicated[0]])} is repeated"
            )
    bin_offsets = np.zeros(params.num_bins + 1, dtype=np.int64)
    candidates = _candidate_bins(params, items, bin_offsets)
    np.cumsum(bin_offsets, out=bin_offsets)
    total = int(bin_offsets[-1])
    bin_items = np.empty(total, dtype=np.int64)
    _kernels.fill_simple_bins(
        items, candidates, bin_offsets, bin_items, np.empty(total, dtype=np.uint64)
    )
    return SimpleTable(
        params=params, bin_offsets=_readonly(bin_offsets), bin_items=_readonly(bin_items)
    )


def positions_in_bins(
    simple_table: SimpleTable, bins: ArrayLike, indices: ArrayLike
) -> NDArray[np.int64]:
    """Return the rank of each ``indices[q]`` inside simple bin ``bins[q]`` (``pos``).

    Parameters
    ----------
    simple_table : SimpleTable
        The round's simple table.
    bins : array_like
        Integer bin numbers in ``[0, B)``.
    indices : array_like
        Integer indices, same shape as ``bins``.

    Returns
    -------
    numpy.ndarray
        int64 positions, shape of ``bins``.

    Raises
    ------
    ConfigurationError
        If the shapes differ, a bin is out of range, or an index is not in its bin.
    """
    bins_array = np.asarray(bins)
    indices_array = np.asarray(indices)
    if bins_array.shape != indices_array.shape:
        raise ConfigurationError(
            f"bins and indices must have the same shape, got {bins_array.shape} and "
            f"{indices_array.shape}"
        )
    shape = bins_array.shape
    flat_bins = _as_indices(bins_array.reshape(-1), simple_table.num_bins, "bins")
    flat_indices = _as_indices(indices_array.reshape(-1), simple_table.params.domain_size)
    out = np.empty(flat_bins.shape[0], dtype=np.int64)
    missing = int(
        _kernels.lookup_positions(
            simple_table.bin_offsets, simple_table.bin_items, flat_bins, flat_indices, out
        )
    )
    if missing != EMPTY:
        raise ConfigurationError(
            f"index {int(flat_indices[missing])} is not in simple bin {int(flat_bins[missing])}"
        )
    return out.reshape(shape)
