"""SFSLFedSubAvg / SFSLDP: every constructor argument is refused by name before round 1."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.sfsl.dp import SFSLDP
from flwr_fsl.strategies import SFSLFedSubAvg
from flwr_fsl.testing import InProcessGrid
from tests.core.test_settings import counting_app
from tests.flower_apps import model_record

NO_DP: dict[str, Any] = {"dp": None, "privacy_budget": None}
BAD: list[tuple[str, Any, dict[str, Any]]] = [
    ("table", 5, {}),
    ("table", "", {}),
    ("reconstruction_threshold", math.nan, {}),
    ("reconstruction_threshold", math.inf, {}),
    ("reconstruction_threshold", 1, {}),
    ("reconstruction_threshold", 1.5, {}),
    ("reconstruction_threshold", "0.6", {}),
    ("bloom_fpr", math.nan, NO_DP),
    ("bloom_fpr", 0.0, NO_DP),
    ("bloom_fpr", 1.0, NO_DP),
    ("bloom_fpr", "0.01", NO_DP),
    ("bloom_fpr", 0.01, {}),  # Bloom needs dp=None
    ("expected_union", 0, NO_DP | {"bloom_fpr": 0.01}),
    ("expected_union", 1.5, NO_DP | {"bloom_fpr": 0.01}),
    ("expected_union", "100", NO_DP | {"bloom_fpr": 0.01}),
    ("expected_union", 10**12, NO_DP | {"bloom_fpr": 0.01}),
    ("expected_union", 0, {}),
    ("partitions", 0, NO_DP | {"bloom_fpr": 0.01}),
    ("partitions", 2.5, NO_DP | {"bloom_fpr": 0.01}),
    ("partitions", "64", {}),
    ("partitions", 10**12, NO_DP | {"bloom_fpr": 0.01}),
    ("clip", math.nan, {}),
    ("clip", 0.0, {}),
    ("clip", "8", {}),
    ("max_count", math.nan, {}),
    ("max_count", 0.0, {}),
    ("frac_bits", 2.0, {}),
    ("frac_bits", -1, {}),
    ("max_clients", 1.5, {}),
    ("max_clients", 0, {}),
    ("quantization_levels", 1, NO_DP),
    ("quantization_levels", 2.0, NO_DP),
    ("quantization_levels", 16, {}),  # needs dp=None
    ("sampling_seed", "x", {}),
    ("weighted", 1, {}),
    ("dp", 1.0, {}),
    ("privacy_budget", 1.0, {}),
    ("plaintext_evaluation", "yes", {}),
]


@pytest.mark.parametrize(
    ("arg", "value", "extra"), BAD, ids=[f"{a}={v!r}{'+' if e else ''}" for a, v, e in BAD]
)
def test_bad_argument_is_refused_by_name(arg: str, value: Any, extra: dict[str, Any]) -> None:
    kwargs = {"table": "emb", **extra, arg: value}
    table = kwargs.pop("table")
    with pytest.raises(ConfigurationError, match=arg):
        SFSLFedSubAvg(table, **kwargs)


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("noise_multiplier", math.nan),
        ("noise_multiplier", 0.0),
        ("clip_norm", "1"),
        ("count_clip", -1.0),
        ("max_rows", 0),
        ("max_rows", 2.5),
    ],
)
def test_bad_dp_field_is_refused_by_name(arg: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=arg):
        SFSLDP(**{arg: value})


def test_threshold_above_the_round_sample_is_refused_before_any_client_trains() -> None:
    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), 3)
    strategy = SFSLFedSubAvg("emb.weight", reconstruction_threshold=4)
    with pytest.raises(ConfigurationError, match=r"reconstruction_threshold.*at least 4"):
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert calls == []


def test_model_without_the_table_is_refused_before_any_client_trains() -> None:
    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), 3)
    with pytest.raises(ConfigurationError, match="table"):
        SFSLFedSubAvg("no-such-table").start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert calls == []
