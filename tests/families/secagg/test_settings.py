"""SecAggFedAvg / SecAggDP: every constructor argument is refused by name before round 1."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.privacy import PrivacyBudget
from flwr_fsl.families.secagg.dp import SecAggDP
from flwr_fsl.strategies import SecAggFedAvg
from flwr_fsl.testing import InProcessGrid
from tests.core.test_settings import counting_app
from tests.flower_apps import model_record

BAD: list[tuple[str, Any]] = [
    ("reconstruction_threshold", math.nan),
    ("reconstruction_threshold", 1),
    ("reconstruction_threshold", 0.0),
    ("reconstruction_threshold", 1.5),
    ("reconstruction_threshold", "0.6"),
    ("reconstruction_threshold", True),
    ("clipping_range", math.nan),
    ("clipping_range", math.inf),
    ("clipping_range", 0.0),
    ("clipping_range", -1.0),
    ("clipping_range", "8"),
    ("max_weight", math.nan),
    ("max_weight", 0),
    ("train_metrics", "train_loss"),
    ("train_metrics", (5,)),
    ("train_metrics", ("num-examples",)),
    ("max_metric", math.nan),
    ("max_metric", 0.0),
    ("max_metric", "1e3"),
    ("frac_bits", 24.0),
    ("frac_bits", -1),
    ("frac_bits", 80),
    ("frac_bits", "24"),
    ("max_clients", 1.5),
    ("max_clients", 0),
    ("max_clients", "10"),
    ("sampling_seed", "x"),
    ("weighted", 1),
    ("weighted", "false"),
    ("plaintext_evaluation", 1),
    ("plaintext_evaluation", "yes"),
    ("dp", 1.0),
    ("privacy_budget", 1.0),
    ("train_metrics_aggr_fn", lambda records, key: None),
]


# Ids without memory addresses (a lambda's repr has one): pytest-xdist workers must agree on them.
BAD_IDS = [f"{a}=<function>" if callable(v) else f"{a}={v!r}" for a, v in BAD]


@pytest.mark.parametrize(("arg", "value"), BAD, ids=BAD_IDS)
def test_bad_argument_is_refused_by_name(arg: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=arg):
        SecAggFedAvg(**{arg: value})


def test_privacy_budget_needs_dp() -> None:
    with pytest.raises(ConfigurationError, match="privacy_budget"):
        SecAggFedAvg(privacy_budget=PrivacyBudget(1.0))


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("noise_multiplier", math.nan),
        ("noise_multiplier", 0.0),
        ("noise_multiplier", "1"),
        ("clip_norm", math.inf),
        ("clip_norm", -1.0),
        ("clip_norm", True),
    ],
)
def test_bad_dp_field_is_refused_by_name(arg: str, value: Any) -> None:
    kwargs = {"noise_multiplier": 1.0, "clip_norm": 1.0, arg: value}
    with pytest.raises(ConfigurationError, match=arg):
        SecAggDP(**kwargs)


def test_threshold_above_the_round_sample_is_refused_before_any_client_trains() -> None:
    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), 3)
    strategy = SecAggFedAvg(reconstruction_threshold=5)
    with pytest.raises(ConfigurationError, match=r"reconstruction_threshold.*at least 5"):
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert calls == []
