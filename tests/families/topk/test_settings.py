"""FedSubAvg: its constructor is FedAvg's plus sampling_seed and max_weight (all in
tests/core/test_settings.py); here, the run-level checks on a topk app."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.strategies import FedSubAvg

BAD: list[tuple[str, Any]] = [
    ("fraction_train", "0.5"),
    ("fraction_train", 1.5),
    ("min_train_nodes", 1.5),
    ("weighted_by_key", 5),
    ("sampling_seed", "x"),
    ("max_weight", math.nan),
]


@pytest.mark.parametrize(("arg", "value"), BAD, ids=[f"{a}={v!r}" for a, v in BAD])
def test_bad_argument_is_refused_by_name(arg: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=arg):
        FedSubAvg(**{arg: value})
