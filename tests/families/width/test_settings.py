"""WidthFedAvg: every constructor argument is refused by name before round 1."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.strategies import WidthFedAvg

BAD: list[tuple[str, Any, dict[str, Any]]] = [
    ("extraction", "diagonal", {}),
    ("extraction", 5, {}),
    ("capacity", "always", {}),
    ("capacity", None, {}),
    ("capacity_mix", None, {"capacity": "dynamic"}),
    ("capacity_mix", "z1", {"capacity": "dynamic"}),
    ("capacity_mix", "", {"capacity": "dynamic"}),
    ("capacity_mix", 5, {"capacity": "dynamic"}),
    ("capacity_mix", "a1-e1", {}),  # only with capacity='dynamic'
    ("global_rate", math.nan, {}),
    ("global_rate", 0.0, {}),
    ("global_rate", 1.5, {}),
    ("global_rate", "1", {}),
    ("num_shards", 0, {}),
    ("num_shards", 2.5, {}),
    ("num_shards", "4", {}),
    ("weighted", 1, {}),
    ("seed", "x", {}),
    ("seed", 1.5, {}),
    ("seed", -1, {}),
    ("spec", {"a": 1}, {}),
    ("sampling_seed", "x", {}),
    ("max_weight", math.inf, {}),
]


@pytest.mark.parametrize(
    ("arg", "value", "extra"), BAD, ids=[f"{a}={v!r}{'+' if e else ''}" for a, v, e in BAD]
)
def test_bad_argument_is_refused_by_name(arg: str, value: Any, extra: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match=arg):
        WidthFedAvg(**{**extra, arg: value})
