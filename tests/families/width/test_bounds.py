"""WidthFedAvg bounds what one client's reply can do (issue 24 item 4).

Weights are bounded by ``max_weight`` (above it: dropped), each coordinate's change by
``clipping_range`` (the secure strategies' setting: a larger finite change is clipped), and a
non-finite value drops the client, never clipped.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, RecordDict

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.strategies import WidthFedAvg
from tests.families.width.test_strategy import _arrays, _corrupt, _grid, _initial, _record


def _hostile(value: float, weight: float = 1e9):  # type: ignore[no-untyped-def]
    def corrupt(c: RecordDict) -> RecordDict:
        arrays = next(iter(c.array_records.values()))
        for name in list(arrays.keys()):
            arrays[name] = Array(np.full_like(arrays[name].numpy(), value))
        c["metrics"]["num-examples"] = weight
        return c

    return corrupt


def _run(value: float, rounds: int = 3, **kwargs: object) -> tuple[WidthFedAvg, dict]:  # type: ignore[type-arg]
    grid = _grid(6, mods=[_corrupt(4, _hostile(value))])
    strategy = WidthFedAvg(min_available_nodes=6, weighted=True, fraction_evaluate=0.0, **kwargs)  # type: ignore[arg-type]
    result = strategy.start(grid, _record(_initial()), num_rounds=rounds)
    return strategy, _arrays(result.arrays)


def test_finite_huge_values_at_max_weight_are_clipped_to_the_range() -> None:
    strategy, model = _run(1e30)
    assert not any(strategy.dropped.values()) and not strategy.failed_rounds
    for name, value in _initial().items():
        assert np.all(np.abs(model[name].astype(np.float64) - value) <= 3 * 8.0 + 1e-4), name


def test_without_a_range_the_same_client_moves_the_model_arbitrarily_far() -> None:
    _, model = _run(1e30, clipping_range=None)
    assert max(float(np.max(np.abs(v))) for v in model.values()) > 1e29


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_a_non_finite_value_drops_the_client_never_clipped(value: float) -> None:
    strategy, model = _run(value, rounds=1)
    assert len(strategy.dropped[1]) == 1
    assert all(np.all(np.isfinite(v)) for v in model.values())


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "8", True])
def test_clipping_range_is_validated(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="clipping_range"):
        WidthFedAvg(clipping_range=bad)  # type: ignore[arg-type]
