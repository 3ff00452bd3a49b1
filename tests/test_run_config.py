"""settings_from_run_config: dashed keys, defaults, and every type error."""

from dataclasses import dataclass

import pytest

from flwr_fsl.run_config import settings_from_run_config


@dataclass
class _S:
    num_rounds: int = 3
    lr: float = 0.1
    name: str = "x"
    flag: bool = False


def test_reads_dashed_keys_and_keeps_defaults() -> None:
    s = settings_from_run_config(_S, {"num-rounds": 5, "lr": 1, "other": "ignored"})
    assert s == _S(num_rounds=5, lr=1.0)
    assert settings_from_run_config(_S, {"num-rounds": 2.0}).num_rounds == 2


@pytest.mark.parametrize(
    "config, match",
    [
        ({"flag": 1}, "true or false"),
        ({"num-rounds": 2.5}, "integer"),
        ({"num-rounds": True}, "integer"),
        ({"lr": "fast"}, "float"),
    ],
)
def test_type_errors(config: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        settings_from_run_config(_S, config)
