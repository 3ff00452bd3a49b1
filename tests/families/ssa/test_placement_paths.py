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
