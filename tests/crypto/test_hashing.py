"""Tests of cuckoo and simple hashing (flwr_fsl.crypto.hashing)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.hashing import (
    EMPTY,
    HASH_TAG,
    CuckooInsertionError,
    CuckooTable,
    HashParams,
    SimpleTable,
    choose_scale_factor,
    cuckoo_hash,
    generate_hash_key,
    hash_bins,
    num_bins_for,
    positions_in_bins,
    simple_hash,
)

KEY = bytes(range(16))


def _key(seed: int) -> bytes:
    return np.random.default_rng(seed).bytes(16)


def _reference_bins(params: HashParams, indices: list[int]) -> list[list[int]]:
    """The documented hash functions, one block at a time through ``cryptography``."""
    encryptor = Cipher(algorithms.AES(params.key), modes.ECB()).encryptor()
    rows = []
    for x in indices:
        row = []
        for d in range(params.num_hashes):
            block = x.to_bytes(8, "little") + (HASH_TAG | d).to_bytes(8, "little")
            word = int.from_bytes(encryptor.update(block)[:8], "little")
            row.append(word * params.num_bins >> 64)
        rows.append(row)
    return rows


def _check_simple_table(table: SimpleTable, indices: np.ndarray) -> None:
    params = table.params
    offsets, items = table.bin_offsets, table.bin_items
    assert offsets.dtype == np.int64 and items.dtype == np.int64
    assert offsets.shape == (params.num_bins + 1,)
    assert offsets[0] == 0 and offsets[-1] == items.size
    assert np.all(np.diff(offsets) >= 0)
    candidates = hash_bins(params, indices)
    expected: list[list[int]] = [[] for _ in range(params.num_bins)]
    for x, row in zip(indices.tolist(), candidates.tolist(), strict=True):
        for b in sorted(set(row)):  # once per distinct bin: η times minus collisions
            expected[b].append(x)
    for b in range(params.num_bins):
        assert table.bin(b).tolist() == sorted(expected[b])
    assert items.size == sum(len(set(row)) for row in candidates.tolist())


def _check_cuckoo_table(table: CuckooTable, indices: np.ndarray) -> None:
    params = table.params
    assert table.items.shape == (params.num_bins,) and table.items.dtype == np.int64
    assert table.stash.shape == (params.stash_size,) and table.stash.dtype == np.int64
    held = table.items[table.occupied]
    stashed = table.stashed
    # Every index exactly once, nothing dropped, nothing invented.
    assert sorted(np.concatenate([held, stashed]).tolist()) == sorted(indices.tolist())
    assert table.num_items == indices.size
    # Stash: stashed entries first, then padding.
    assert np.all(table.stash[: stashed.size] == stashed)
    assert np.all(table.stash[stashed.size :] == EMPTY)
    # Each held index sits in one of its candidate bins; hash_ids names the lowest such d.
    bins = np.flatnonzero(table.occupied)
    if bins.size:
        candidates = hash_bins(params, held)
        for b, row, d in zip(bins, candidates, table.hash_ids[bins], strict=True):
            assert b in row
            assert d == row.tolist().index(b)
    assert np.all(table.hash_ids[~table.occupied] == EMPTY)


# --------------------------------------------------------------------------- hash functions


def test_hash_bins_match_documented_definition() -> None:
    params = HashParams(domain_size=2**40, num_bins=1237, key=KEY, num_hashes=4)
    indices = [0, 1, 2, 77, 2**33 + 5, 2**40 - 1]
    assert hash_bins(params, indices).tolist() == _reference_bins(params, indices)


def test_hash_bins_large_batch_spans_chunks() -> None:
    params = HashParams(domain_size=2**16, num_bins=2**31 + 11, key=KEY)
    indices = np.arange(0, 2**16, 3)  # more than one AES chunk
    bins = hash_bins(params, indices)
    assert bins.shape == (indices.size, 3) and bins.dtype == np.int64
    assert bins.min() >= 0 and bins.max() < params.num_bins
    sample = [0, 3, 3 * 5000, 3 * (indices.size - 1)]
    rows = [int(np.flatnonzero(indices == x)[0]) for x in sample]
    assert bins[rows].tolist() == _reference_bins(params, sample)


def test_hash_bins_depend_on_key_and_are_deterministic() -> None:
    indices = np.arange(1000)
    a = HashParams(domain_size=1000, num_bins=997, key=_key(1))
    b = HashParams(domain_size=1000, num_bins=997, key=_key(2))
    assert np.array_equal(hash_bins(a, indices), hash_bins(a, indices))
    assert not np.array_equal(hash_bins(a, indices), hash_bins(b, indices))


def test_hash_bins_roughly_uniform() -> None:
    params = HashParams(domain_size=2**15, num_bins=16, key=KEY)
    counts = np.bincount(hash_bins(params, np.arange(2**15)).ravel(), minlength=16)
    expected = 3 * 2**15 / 16
    assert np.all(np.abs(counts - expected) < 6 * math.sqrt(expected))


def test_generate_hash_key() -> None:
    key = generate_hash_key()
    assert isinstance(key, bytes) and len(key) == 16
    assert generate_hash_key() != key


# --------------------------------------------------------------------------- simple hashing


@settings(max_examples=40, deadline=None)
@given(
    domain_size=st.integers(1, 400),
    num_bins=st.integers(1, 300),
    num_hashes=st.integers(1, 5),
    key_seed=st.integers(0, 2**32),
)
def test_simple_table_holds_every_index_once_per_distinct_bin(
    domain_size: int, num_bins: int, num_hashes: int, key_seed: int
) -> None:
    params = HashParams(domain_size, num_bins, _key(key_seed), num_hashes=num_hashes)
    table = simple_hash(params)
    _check_simple_table(table, np.arange(domain_size))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), domain_size=st.integers(1, 300), num_bins=st.integers(1, 50))
def test_simple_table_of_a_subset(data: st.DataObject, domain_size: int, num_bins: int) -> None:
    subset = data.draw(st.sets(st.integers(0, domain_size - 1), max_size=domain_size))
    params = HashParams(domain_size, num_bins, KEY)
    shuffled = np.random.default_rng(0).permutation(np.array(sorted(subset), dtype=np.int64))
    table = simple_hash(params, shuffled)
    _check_simple_table(table, np.array(sorted(subset), dtype=np.int64))


@pytest.mark.parametrize("num_bins", [1, 7, 1000, 2**20])
def test_simple_table_of_huge_indices(num_bins: int) -> None:
    # Indices near 2**62 leave few bits to pack the in-partition bin: the sort still holds.
    rng = np.random.default_rng(num_bins)
    indices = np.unique(
        np.concatenate(
            [rng.integers(2**61, 2**62, 3000), [0, 1, 12345, 2**40, 2**62 - 2, 2**62 - 1]]
        )
    )
    params = HashParams(domain_size=2**62, num_bins=num_bins, key=KEY)
    table = simple_hash(params, indices)
    if num_bins <= 1000:
        _check_simple_table(table, indices)
    else:
        item_bins = table.item_bins()
        candidates = hash_bins(params, table.bin_items)
        assert np.all(np.any(candidates == item_bins[:, None], axis=1))
        assert table.bin_items.size == sum(len(set(row)) for row in hash_bins(params, indices))
        for b in np.flatnonzero(table.bin_sizes > 1)[:200]:
            assert np.all(np.diff(table.bin(int(b))) > 0)


def test_simple_table_single_bin_collapses_collisions() -> None:
    params = HashParams(domain_size=10, num_bins=1, key=KEY, num_hashes=3)
    table = simple_hash(params)
    assert table.bin(0).tolist() == list(range(10))  # once, although all η hashes collide
    assert table.max_bin_size == 10


def test_simple_table_helpers() -> None:
    params = HashParams(domain_size=3000, num_bins=64, key=KEY)
    table = simple_hash(params)
    sizes = table.bin_sizes
    assert sizes.sum() == table.bin_items.size and table.max_bin_size == sizes.max()
    assert table.num_bins == 64
    item_bins = table.item_bins()
    assert item_bins.dtype == np.int64 and item_bins.size == table.bin_items.size
    for b in (0, 17, 63):
        assert np.all(item_bins[table.bin_offsets[b] : table.bin_offsets[b + 1]] == b)
    bits = table.domain_bits()
    assert np.all(2**bits >= sizes) and np.all((sizes <= 1) | (2 ** (bits - 1) < sizes))
    with pytest.raises(ValueError, match="read-only"):
        table.bin_items[0] = 5


@pytest.mark.parametrize(
    ("sizes", "min_bits", "expected"),
    [
        ([0, 1, 2, 3, 4, 5, 8, 9, 1024, 1025], 0, [0, 0, 1, 2, 2, 3, 3, 4, 10, 11]),
        ([0, 1, 2, 3, 4, 5, 8, 9, 1024, 1025], 1, [1, 1, 1, 2, 2, 3, 3, 4, 10, 11]),
        ([0, 1, 2, 3], 3, [3, 3, 3, 3]),
    ],
)
def test_domain_bits(sizes: list[int], min_bits: int, expected: list[int]) -> None:
    params = HashParams(domain_size=10**6, num_bins=len(sizes), key=KEY)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    table = SimpleTable(params, offsets, np.zeros(offsets[-1], dtype=np.int64))
    assert table.domain_bits(min_bits).tolist() == expected


def test_simple_table_errors() -> None:
    params = HashParams(domain_size=20, num_bins=4, key=KEY)
    with pytest.raises(ConfigurationError, match="distinct"):
        simple_hash(params, [1, 2, 2])
    with pytest.raises(ConfigurationError, match=r"\[0, 20\)"):
        simple_hash(params, [1, 20])
    table = simple_hash(params)
    with pytest.raises(ConfigurationError, match="bin"):
        table.bin(4)
    with pytest.raises(ConfigurationError, match="min_bits"):
        table.domain_bits(-1)
    offsets = np.array([0, 1, 1, 2, 3], dtype=np.int64)
    items = np.arange(3, dtype=np.int64)
    with pytest.raises(ConfigurationError, match="int64"):
        SimpleTable(params, offsets.astype(np.int32), items)
    with pytest.raises(ConfigurationError, match="shape"):
        SimpleTable(params, offsets[:-1], items)
    with pytest.raises(ConfigurationError, match="start at 0"):
        SimpleTable(params, np.array([0, 2, 1, 2, 3], dtype=np.int64), items)
    with pytest.raises(ConfigurationError, match="start at 0"):
        SimpleTable(params, offsets, items[:2])


# --------------------------------------------------------------------------- cuckoo hashing


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    domain_size=st.integers(1, 2000),
    num_hashes=st.integers(1, 4),
    scale_factor=st.floats(1.0, 3.0),
    stash_size=st.integers(0, 4),
    key_seed=st.integers(0, 2**32),
    seed=st.integers(0, 2**64 - 1),
)
def test_cuckoo_places_every_index_in_a_candidate_bin_or_stash(
    data: st.DataObject,
    domain_size: int,
    num_hashes: int,
    scale_factor: float,
    stash_size: int,
    key_seed: int,
    seed: int,
) -> None:
    num_items = data.draw(st.integers(0, min(domain_size, 300)))
    params = HashParams.for_items(
        domain_size,
        num_items,
        _key(key_seed),
        num_hashes=num_hashes,
        stash_size=stash_size,
        scale_factor=scale_factor,
    )
    indices = np.random.default_rng(key_seed).choice(domain_size, num_items, replace=False)
    try:
        table = cuckoo_hash(indices, params, seed=seed)
    except CuckooInsertionError as error:
        # Legitimate only when the stash overflowed; never a silent drop.
        assert error.index in indices.tolist()
        assert f"stash of size {stash_size} is full" in str(error)
        return
    _check_cuckoo_table(table, indices)
    simple = simple_hash(params)
    positions = table.positions(simple)
    for b in range(params.num_bins):
        if table.items[b] == EMPTY:
            assert positions[b] == EMPTY
        else:
            assert simple.bin(b)[positions[b]] == table.items[b]


@pytest.mark.parametrize(("num_items", "key_seed"), [(2**10, 1), (3000, 2), (2**12, 3)])
def test_cuckoo_with_chosen_scale_factor_is_stashless(num_items: int, key_seed: int) -> None:
    params = HashParams.for_items(2**16, num_items, _key(key_seed))
    indices = np.random.default_rng(key_seed).choice(2**16, num_items, replace=False)
    table = cuckoo_hash(indices, params, seed=key_seed)
    _check_cuckoo_table(table, indices)
    assert table.stash.size == 0


def test_cuckoo_is_deterministic_and_order_independent() -> None:
    params = HashParams.for_items(5000, 500, KEY)
    indices = np.random.default_rng(5).choice(5000, 500, replace=False)
    first = cuckoo_hash(indices, params, seed=7)
    again = cuckoo_hash(indices[::-1].copy(), params, seed=7)
    from_generator = cuckoo_hash(indices, params, seed=np.random.default_rng(3))
    from_generator_again = cuckoo_hash(indices, params, seed=np.random.default_rng(3))
    assert np.array_equal(first.items, again.items)
    assert np.array_equal(first.hash_ids, again.hash_ids)
    assert np.array_equal(from_generator.items, from_generator_again.items)
    _check_cuckoo_table(cuckoo_hash(indices, params), indices)  # fresh random seed


def test_cuckoo_evictions_depend_on_seed() -> None:
    params = HashParams.for_items(5000, 1000, KEY, scale_factor=1.15)
    indices = np.random.default_rng(6).choice(5000, 1000, replace=False)
    tables = [cuckoo_hash(indices, params, seed=s).items for s in range(4)]
    assert any(not np.array_equal(tables[0], t) for t in tables[1:])


def test_cuckoo_edge_cases() -> None:
    # k = 0: one empty bin, empty stash.
    empty = cuckoo_hash([], HashParams.for_items(10, 0, KEY))
    assert empty.items.tolist() == [EMPTY] and empty.num_items == 0
    # m = 1, k = 1.
    params = HashParams.for_items(1, 1, KEY)
    table = cuckoo_hash([0], params)
    assert table.num_items == 1 and table.positions(simple_hash(params)).max() == 0
    # k = m.
    params = HashParams.for_items(300, 300, KEY)
    indices = np.arange(300)
    table = cuckoo_hash(indices, params, seed=1)
    _check_cuckoo_table(table, indices)
    positions = table.positions(simple_hash(params))
    assert np.all((positions == EMPTY) == (table.items == EMPTY))
    # One bin: all hash functions collide; the second index needs the stash.
    params = HashParams(domain_size=5, num_bins=1, key=KEY, stash_size=1)
    table = cuckoo_hash([3, 1], params, seed=0)
    _check_cuckoo_table(table, np.array([1, 3]))
    assert table.stashed.size == 1 and table.occupied.tolist() == [True]


def _placement_exists(candidates: np.ndarray, num_bins: int) -> bool:
    rows = [set(row.tolist()) for row in candidates]
    return any(
        all(b in row for b, row in zip(bins, rows, strict=True))
        for bins in itertools.permutations(range(num_bins), len(rows))
    )


def test_cuckoo_finds_a_placement_whenever_one_exists() -> None:
    # Tiny tables, many keys: the walk must succeed whenever a perfect placement exists, in
    # particular when an index whose hash functions all collide is evicted from its only bin.
    single_bin_cases = 0
    for key_seed in range(400):
        num_bins = 2 + key_seed % 3
        params = HashParams(domain_size=40, num_bins=num_bins, key=_key(key_seed))
        indices = np.random.default_rng(key_seed).choice(40, num_bins, replace=False)
        candidates = hash_bins(params, indices)
        single_bin_cases += any(len(set(row.tolist())) == 1 for row in candidates)
        if _placement_exists(candidates, num_bins):
            _check_cuckoo_table(cuckoo_hash(indices, params, seed=key_seed), indices)
        else:
            with pytest.raises(CuckooInsertionError):
                cuckoo_hash(indices, params, seed=key_seed)
    assert single_bin_cases > 20


def _colliding_pair(params: HashParams) -> list[int]:
    bins = hash_bins(params, np.arange(params.domain_size))[:, 0]
    first_seen: dict[int, int] = {}
    for x, b in enumerate(bins.tolist()):
        if b in first_seen:
            return [first_seen[b], x]
        first_seen[b] = x
    raise AssertionError("no collision")  # pragma: no cover


def test_cuckoo_failure_raises_and_stash_catches_it() -> None:
    params = HashParams(domain_size=1000, num_bins=50, key=KEY, num_hashes=1)
    pair = _colliding_pair(params)
    with pytest.raises(CuckooInsertionError, match=r"index \d+ found no free bin") as info:
        cuckoo_hash(pair, params, seed=0)
    assert info.value.index in pair
    assert "stash of size 0 is full" in str(info.value)
    stashed = HashParams(domain_size=1000, num_bins=50, key=KEY, num_hashes=1, stash_size=2)
    table = cuckoo_hash(pair, stashed, seed=0)
    _check_cuckoo_table(table, np.array(pair))
    assert table.stashed.size == 1 and table.stash[1] == EMPTY


def test_cuckoo_max_evictions_zero_stashes_instead_of_evicting() -> None:
    params = HashParams.for_items(4000, 400, KEY, scale_factor=1.1, stash_size=400)
    indices = np.random.default_rng(8).choice(4000, 400, replace=False)
    greedy = cuckoo_hash(indices, params, seed=0, max_evictions=0)
    _check_cuckoo_table(greedy, indices)
    assert greedy.stashed.size > 0  # at load 0.9 greedy placement leaves some homeless
    walked = cuckoo_hash(indices, params, seed=0)
    _check_cuckoo_table(walked, indices)
    assert walked.stashed.size < greedy.stashed.size


def test_cuckoo_input_errors() -> None:
    params = HashParams.for_items(100, 10, KEY)
    with pytest.raises(ConfigurationError, match="distinct"):
        cuckoo_hash([1, 5, 5], params)
    with pytest.raises(ConfigurationError, match="1-D"):
        cuckoo_hash([[1, 2]], params)
    with pytest.raises(ConfigurationError, match="integer dtype"):
        cuckoo_hash([1.0, 2.0], params)
    with pytest.raises(ConfigurationError, match=r"\[0, 100\), found -1"):
        cuckoo_hash([-1, 2], params)
    with pytest.raises(ConfigurationError, match=r"\[0, 100\), found 100"):
        cuckoo_hash([1, 100], params)
    with pytest.raises(ConfigurationError, match="cannot fit"):
        cuckoo_hash(np.arange(params.num_bins + 1), params)
    with pytest.raises(ConfigurationError, match="seed"):
        cuckoo_hash([1], params, seed=-1)
    with pytest.raises(ConfigurationError, match="seed"):
        cuckoo_hash([1], params, seed=True)
    with pytest.raises(ConfigurationError, match="seed"):
        cuckoo_hash([1], params, seed="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_evictions"):
        cuckoo_hash([1], params, max_evictions=-1)


def test_cuckoo_table_validation() -> None:
    params = HashParams(domain_size=10, num_bins=3, key=KEY, stash_size=1)
    items = np.array([EMPTY, 2, EMPTY], dtype=np.int64)
    stash = np.array([EMPTY], dtype=np.int64)
    CuckooTable(params, items, items.copy(), stash)
    with pytest.raises(ConfigurationError, match="shape"):
        CuckooTable(params, items[:2], items[:2], stash)
    with pytest.raises(ConfigurationError, match="stash"):
        CuckooTable(params, items, items, stash[:0])
    with pytest.raises(ConfigurationError, match="int64"):
        CuckooTable(params, items.astype(np.int32), items, stash)


# --------------------------------------------------------------------------- positions


def test_positions_in_bins_agree_with_list_lookup() -> None:
    params = HashParams(domain_size=2000, num_bins=101, key=KEY)
    simple = simple_hash(params)
    indices = np.arange(0, 2000, 7)
    candidates = hash_bins(params, indices)
    positions = positions_in_bins(simple, candidates, np.repeat(indices[:, None], 3, axis=1))
    assert positions.shape == candidates.shape and positions.dtype == np.int64
    for x, row, pos in zip(indices, candidates, positions, strict=True):
        for b, p in zip(row, pos, strict=True):
            assert simple.bin(int(b)).tolist().index(int(x)) == p
    assert positions_in_bins(simple, [], []).shape == (0,)


def test_positions_errors() -> None:
    params = HashParams(domain_size=200, num_bins=40, key=KEY)
    simple = simple_hash(params)
    x = 5
    wrong_bin = next(b for b in range(40) if b not in hash_bins(params, [x])[0])
    with pytest.raises(ConfigurationError, match=f"index {x} is not in simple bin {wrong_bin}"):
        positions_in_bins(simple, [wrong_bin], [x])
    with pytest.raises(ConfigurationError, match="same shape"):
        positions_in_bins(simple, [1, 2], [3])
    with pytest.raises(ConfigurationError, match=r"bins must be in \[0, 40\)"):
        positions_in_bins(simple, [40], [3])
    # A simple table of a subset lacks the client's index.
    subset = simple_hash(params, [1, 2, 3])
    table = cuckoo_hash([7], params, seed=0)
    with pytest.raises(ConfigurationError, match="index 7 is not in simple bin"):
        table.positions(subset)
    other = HashParams(domain_size=200, num_bins=40, key=_key(9))
    with pytest.raises(ConfigurationError, match="different HashParams"):
        table.positions(simple_hash(other))


# --------------------------------------------------------------------------- parameters


@pytest.mark.parametrize(("log_items", "epsilon"), [(10, 1.25), (15, 1.25), (20, 1.27), (25, 1.28)])
def test_scale_factor_reproduces_cui_table_3(log_items: int, epsilon: float) -> None:
    assert choose_scale_factor(2**log_items) == pytest.approx(epsilon, abs=1e-9)
    assert choose_scale_factor(2**log_items, stash_size=2) == pytest.approx(epsilon, abs=1e-9)


def test_scale_factor_shape() -> None:
    # Between table points: linear in log2 n.
    assert choose_scale_factor(round(2**12.5)) == pytest.approx(1.25)
    assert choose_scale_factor(round(2**22.5)) == pytest.approx(1.275, abs=1e-6)
    # Beyond 2**25 and below 2**10: the cryptoTools fit (λ = 240 ε - log2 n - 256, lines).
    assert choose_scale_factor(2**30) == pytest.approx(1.28 + 5 / 240)
    assert choose_scale_factor(2**9) == pytest.approx((40 + 256 + 9) / 240)
    assert choose_scale_factor(2**8) == pytest.approx((40 + 158) / 142)
    assert choose_scale_factor(1) == pytest.approx((40 - 6.35) / 5.5)
    small = [choose_scale_factor(n) for n in (1, 8, 16, 32, 64, 128, 256)]
    assert small == sorted(small, reverse=True)
    # More security needs more bins; the slope is the fit's.
    assert choose_scale_factor(2**20, stat_security=80) == pytest.approx(1.27 + 40 / 240)
    assert choose_scale_factor(2**20, stat_security=20) < choose_scale_factor(2**20)
    assert choose_scale_factor(2**20, stat_security=1) >= 1.1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_items": 0}, "num_items"),
        ({"num_items": 2**32 + 1}, "num_items"),
        ({"num_items": 1.5}, "num_items"),
        ({"num_items": True}, "bool"),
        ({"num_items": 100, "num_hashes": 2}, "num_hashes = 3"),
        ({"num_items": 100, "num_hashes": 0}, "num_hashes"),
        ({"num_items": 100, "stash_size": -1}, "stash_size"),
        ({"num_items": 100, "stat_security": 0}, "stat_security"),
        ({"num_items": 100, "stat_security": 129}, "stat_security"),
        ({"num_items": 100, "stat_security": "40"}, "stat_security"),
    ],
)
def test_scale_factor_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        choose_scale_factor(**kwargs)  # type: ignore[arg-type]


def test_num_bins_for() -> None:
    assert num_bins_for(100, 1.27) == 127
    assert num_bins_for(1000, 1.25) == 1250
    assert num_bins_for(3, 1.25) == 4
    assert num_bins_for(0, 1.25) == 1
    for bad in (0.99, float("nan"), float("inf"), "1.2", True):
        with pytest.raises(ConfigurationError, match="scale_factor"):
            num_bins_for(10, bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="num_items"):
        num_bins_for(-1, 1.25)
    with pytest.raises(ConfigurationError, match="too many"):
        num_bins_for(2**32, 1.25)


def test_hash_params_for_items() -> None:
    params = HashParams.for_items(2**20, 2**17, KEY)
    assert params.num_bins == math.ceil(choose_scale_factor(2**17) * 2**17)
    assert (params.num_hashes, params.stash_size) == (3, 0)
    assert HashParams.for_items(10, 4, KEY, scale_factor=2.0).num_bins == 8
    assert HashParams.for_items(10, 0, KEY).num_bins == 1
    assert "key" not in repr(params)
    assert params == HashParams.for_items(2**20, 2**17, bytearray(KEY))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="num_items"):
        HashParams.for_items(10, 11, KEY)
    with pytest.raises(ConfigurationError, match="num_hashes = 3"):
        HashParams.for_items(10, 5, KEY, num_hashes=2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"domain_size": 0}, "domain_size"),
        ({"domain_size": 2**62 + 1}, "domain_size"),
        ({"domain_size": True}, "bool"),
        ({"num_bins": 0}, "num_bins"),
        ({"num_bins": 2**32}, "num_bins"),
        ({"key": b"short"}, "16 bytes, got 5"),
        ({"key": "x" * 16}, "16 bytes, got str"),
        ({"num_hashes": 0}, "num_hashes"),
        ({"num_hashes": 9}, "num_hashes"),
        ({"stash_size": -1}, "stash_size"),
    ],
)
def test_hash_params_errors(kwargs: dict[str, object], match: str) -> None:
    fields: dict[str, object] = {"domain_size": 10, "num_bins": 4, "key": KEY}
    fields.update(kwargs)
    with pytest.raises(ConfigurationError, match=match):
        HashParams(**fields)  # type: ignore[arg-type]


def test_hash_bins_errors() -> None:
    params = HashParams(domain_size=10, num_bins=4, key=KEY)
    with pytest.raises(ConfigurationError, match="integer dtype"):
        hash_bins(params, np.array([True]))
    with pytest.raises(ConfigurationError, match=r"\[0, 10\)"):
        hash_bins(params, [10])
    assert hash_bins(params, []).shape == (0, 3)
