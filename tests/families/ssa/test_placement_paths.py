"""place_indices: the packed sort and the ``argsort`` path (wide words) place alike (issue 26)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.hashing import EMPTY, positions_in_bins
from flwr_fsl.families.ssa import placement
from flwr_fsl.families.ssa.placement import place_indices
from tests.helper.test_helper import K, M, make_params


def _argsort_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "_PACK_BITS", 0)  # no index << s | row word fits: argsort


@pytest.mark.parametrize("checked", [False, True])
def test_packed_and_argsort_paths_place_alike(monkeypatch, checked):
    params = make_params(1, weighted=False, verify=checked, stash_size=1)
    idx = np.random.default_rng(4).choice(M, K, replace=False)
    packed = place_indices(params, idx, rng=np.random.default_rng(1))
    _argsort_path(monkeypatch)
    argsort = place_indices(params, idx, rng=np.random.default_rng(1))
    assert np.array_equal(packed.alphas, argsort.alphas)
    assert np.array_equal(packed.slots, argsort.slots)


@pytest.mark.parametrize("force_argsort", [False, True])
def test_repeated_index_is_refused_on_both_paths(monkeypatch, force_argsort):
    if force_argsort:
        _argsort_path(monkeypatch)
    params = make_params(1)
    with pytest.raises(ConfigurationError, match="distinct") as err:
        place_indices(params, np.array([3, 5, 3]), rng=np.random.default_rng(0))
    assert "3" not in str(err.value)  # the text names no index: it reaches S0


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("threads", [2, 3, 7])
def test_threaded_ranking_places_alike(monkeypatch, checked, threads):
    """The ranking pass over ranges of bins on several threads gives the same placement."""
    monkeypatch.setattr(placement, "_MIN_BINS_PER_THREAD", 1)  # small rounds split too
    params = make_params(1, weighted=False, verify=checked, stash_size=2)
    idx = np.random.default_rng(5).choice(M, K, replace=False)
    one = place_indices(params, idx, rng=np.random.default_rng(2))
    many = place_indices(params, idx, rng=np.random.default_rng(2), threads=threads)
    for name in ("alphas", "slots"):
        assert np.array_equal(getattr(one, name), getattr(many, name))
    assert np.array_equal(one.cuckoo_table.items, many.cuckoo_table.items)
    assert np.array_equal(one.cuckoo_table.hash_ids, many.cuckoo_table.hash_ids)
    assert np.array_equal(one.cuckoo_table.stash, many.cuckoo_table.stash)


@pytest.mark.parametrize("threads", [1, 3])
def test_index_missing_from_its_simple_bin_is_refused_on_any_thread(monkeypatch, threads):
    """A table of other parameters (an index not in its simple bin) is refused by every range."""
    monkeypatch.setattr(placement, "_MIN_BINS_PER_THREAD", 1)
    params = make_params(1)
    table = placement.simple_table_for(params)
    emptied = type(table)(
        table.params, np.zeros_like(table.bin_offsets), np.zeros(0, table.bin_items.dtype)
    )
    with pytest.raises(ConfigurationError, match="missing from its simple bin"):
        place_indices(params, np.arange(5), emptied, np.random.default_rng(0), threads)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(0, K),
    seed=st.integers(0, 2**32 - 1),
    threads=st.sampled_from([1, 2, 3]),
    checked=st.booleans(),
)
def test_ranks_equal_the_binary_search_reference(monkeypatch, n, seed, threads, checked):
    """Every bin's point is its index's rank in its simple bin (``positions_in_bins``), any
    thread count (the unsigned-position count loop against the public API's binary search)."""
    monkeypatch.setattr(placement, "_MIN_BINS_PER_THREAD", 1)
    params = make_params(1, weighted=False, verify=checked, stash_size=2)
    table = placement.simple_table_for(params)
    rng = np.random.default_rng(seed)
    idx = rng.choice(M, n, replace=False)
    placed = place_indices(params, idx, rng=rng, threads=threads)
    items = placed.cuckoo_table.items
    full = np.flatnonzero(items != EMPTY)
    bins = params.hash_params.num_bins
    want = np.where(checked, np.diff(table.bin_offsets), 0).astype(np.uint64)
    want[full] = positions_in_bins(table, full, items[full]).astype(np.uint64)
    assert np.array_equal(placed.alphas[:bins], want)
    assert np.array_equal(
        placed.slots[full], [int(np.flatnonzero(idx == x)[0]) for x in items[full]]
    )


@pytest.mark.parametrize("threads", [1, 3])
def test_index_replaced_inside_its_simple_bin_is_refused(monkeypatch, threads):
    """A bin that holds other indices than the client's (its rank lands on another) is refused."""
    monkeypatch.setattr(placement, "_MIN_BINS_PER_THREAD", 1)
    params = make_params(1)
    table = placement.simple_table_for(params)
    shifted = type(table)(table.params, table.bin_offsets, table.bin_items + M)  # none matches
    with pytest.raises(ConfigurationError, match="missing from its simple bin"):
        place_indices(params, np.arange(5), shifted, np.random.default_rng(0), threads)
    lowered = type(table)(table.params, table.bin_offsets, table.bin_items - M)  # rank past end
    with pytest.raises(ConfigurationError, match="missing from its simple bin"):
        place_indices(params, np.arange(5), lowered, np.random.default_rng(0), threads)
