"""place_indices: the dense slot map and the sort path (large domains) place alike (issue 26)."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.ssa import placement
from flwr_fsl.families.ssa.placement import place_indices
from tests.helper.test_helper import K, M, make_params


def _sort_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "_DENSE_SLOTS_MAX", 0)  # every domain takes the sort path


@pytest.mark.parametrize("checked", [False, True])
def test_dense_and_sorted_slot_maps_place_alike(monkeypatch, checked):
    params = make_params(1, weighted=False, verify=checked, stash_size=1)
    idx = np.random.default_rng(4).choice(M, K, replace=False)
    dense = place_indices(params, idx, rng=np.random.default_rng(1))
    _sort_path(monkeypatch)
    sort = place_indices(params, idx, rng=np.random.default_rng(1))
    assert np.array_equal(dense.alphas, sort.alphas)
    assert np.array_equal(dense.slots, sort.slots)


@pytest.mark.parametrize("force_sort", [False, True])
def test_repeated_index_is_refused_on_both_paths(monkeypatch, force_sort):
    if force_sort:
        _sort_path(monkeypatch)
    params = make_params(1)
    with pytest.raises(ConfigurationError, match="distinct"):
        place_indices(params, np.array([3, 5, 3]), rng=np.random.default_rng(0))
