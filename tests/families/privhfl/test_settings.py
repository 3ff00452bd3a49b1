"""PrivHFL: every constructor argument is refused by name before round 1."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.privhfl.strategy import PrivHFL

BAD: list[tuple[str, Any]] = [
    ("expansion", "rotate"),
    ("expansion", 5),
    ("pool_size", 0),
    ("pool_size", 10.5),
    ("pool_size", "5000"),
    ("num_queries", 0),
    ("num_queries", 10_000),  # > pool_size
    ("num_queries", 2.5),
    ("selection", "best"),
    ("fraction_answer", 0.0),
    ("fraction_answer", math.nan),
    ("fraction_answer", "1"),
    ("fraction_answer", 1.5),
    ("temperature", 0.0),
    ("temperature", math.inf),
    ("local_epochs", -1),
    ("local_epochs", 1.5),
    ("local_lr", math.nan),
    ("local_lr", 0.0),
    ("local_batch_size", 0),
    ("local_optimizer", "rmsprop"),
    ("retrain_epochs", -1),
    ("retrain_lr", "0.1"),
    ("retrain_batch_size", 2.0),
    ("num_classes", 1),
    ("num_classes", "10"),
    ("image_shape", ()),
    ("image_shape", (1, 0, 28)),
    ("image_shape", "1x28x28"),
    ("max_abs_input", math.nan),
    ("max_abs_input", 0.0),
    ("max_abs_logit", -1.0),
    ("evaluate_local", 1),
    ("answering", "magic"),
    ("comparison", "magic"),
    ("frac_bits", 2.5),
    ("frac_bits", -1),
    ("frac_bits", 200),
    ("bound_bits", 1000),
    ("bound_bits", "40"),
    ("seed", -1),
    ("seed", "0"),
    ("sampling_seed", "x"),
]


@pytest.mark.parametrize(("arg", "value"), BAD, ids=[f"{a}={v!r}" for a, v in BAD])
def test_bad_argument_is_refused_by_name(arg: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=arg):
        PrivHFL(**{arg: value})
