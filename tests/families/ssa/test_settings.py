"""SecureFedSubAvg / SecureRowFedSubAvg / DistributedDP: every argument refused by name."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.dp import DistributedDP
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.strategies import SecureFedSubAvg, SecureRowFedSubAvg

_KEY = SealingKeyPair.generate()

COMMON: list[tuple[str, Any]] = [
    ("helper", None),
    ("helper", "localhost:9000"),
    ("helper_fingerprint", 5),
    ("frac_bits", 24.0),
    ("frac_bits", -1),
    ("frac_bits", 100),
    ("max_abs", math.nan),
    ("max_abs", 0.0),
    ("max_abs", "1e4"),
    ("stash_size", -1),
    ("stash_size", 1.5),
    ("num_hashes", 0),
    ("num_hashes", 2.5),
    ("min_clients", 0),
    ("min_clients", 1.5),
    ("dp", 1.0),
    ("privacy_budget", 1.0),
    ("weighted", 1),
    ("plaintext_evaluation", "yes"),
    ("sampling_seed", "x"),
    ("fraction_train", "0.5"),
    ("min_train_nodes", 1.5),
    ("clipping_range", 8.0),  # FedSubAvg's plaintext clip: no effect on secure aggregation
]
TOPK: list[tuple[str, Any]] = [
    ("topk_ratio", 0.0),
    ("topk_ratio", math.nan),
    ("topk_ratio", "0.1"),
    ("topk_ratio", 1.5),
]
ROWS: list[tuple[str, Any]] = [
    ("table", 5),
    ("table", ""),
    ("max_rows", 0),
    ("max_rows", 2.5),
    ("max_rows", "4"),
    ("udpf", 1),
    ("psr_timeout", math.nan),
    ("psr_timeout", 0.0),
    ("psr_timeout", "10"),
]


def _topk(**kwargs: Any) -> SecureFedSubAvg:
    args = {"helper": InProcessHelper(keypair=_KEY), "topk_ratio": 0.2, **kwargs}
    return SecureFedSubAvg(**args)


def _rows(**kwargs: Any) -> SecureRowFedSubAvg:
    args = {"helper": InProcessHelper(keypair=_KEY), "table": "emb", "max_rows": 4, **kwargs}
    return SecureRowFedSubAvg(**args)


@pytest.mark.parametrize(
    ("arg", "value"), COMMON + TOPK, ids=[f"{a}={v!r}" for a, v in COMMON + TOPK]
)
def test_secure_fedsubavg_bad_argument(arg: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=arg):
        _topk(**{arg: value})


@pytest.mark.parametrize(
    ("arg", "value"), COMMON + ROWS, ids=[f"{a}={v!r}" for a, v in COMMON + ROWS]
)
def test_secure_row_fedsubavg_bad_argument(arg: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=arg):
        _rows(**{arg: value})


@pytest.mark.parametrize(
    ("arg", "value"),
    [
        ("noise_multiplier", math.nan),
        ("noise_multiplier", -1.0),
        ("clip_norm", 0.0),
        ("clip_norm", "1"),
        ("max_weight", math.inf),
        ("delta", 1.0),
        ("delta", math.nan),
    ],
)
def test_bad_dp_field_is_refused_by_name(arg: str, value: Any) -> None:
    kwargs = {"noise_multiplier": 1.0, "clip_norm": 1.0, "max_weight": 1.0, arg: value}
    with pytest.raises(ConfigurationError, match=arg):
        DistributedDP(**kwargs)
