"""place_indices: the packed sort and the ``argsort`` path (wide words) place alike (issue 26)."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
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
