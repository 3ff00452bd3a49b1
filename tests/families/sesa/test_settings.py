"""SesaFedAvg: every constructor argument is refused by name before round 1."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.strategies import SesaFedAvg
from flwr_fsl.testing import InProcessGrid
from tests.core.test_settings import counting_app

BAD: list[tuple[str, Any]] = [
    ("num_shards", 0),
    ("num_shards", 2.0),
    ("num_shards", "4"),
    ("num_shards", 10**9),
    ("privacy", 1e6),
    ("privacy", 10**6),
    ("privacy", 0),
    ("privacy", math.nan),
    ("privacy", 1.0),
    ("privacy", "0.5"),
    ("privacy", True),
    ("weighted", 1),
    ("max_weight", math.nan),
    ("max_weight", -1.0),
    ("clipping_range", math.nan),
    ("clipping_range", "8"),
    ("clipping_range", 0.0),
    ("frac_bits", 16.0),
    ("frac_bits", -1),
    ("frac_bits", 64),
    ("max_clients", 1),
    ("max_clients", 2.5),
    ("sampling_seed", "x"),
    ("plaintext_evaluation", 1),
]


@pytest.mark.parametrize(("arg", "value"), BAD, ids=[f"{a}={v!r}" for a, v in BAD])
def test_bad_argument_is_refused_by_name(arg: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=arg):
        SesaFedAvg(**{arg: value})


def test_federation_below_k_max_plus_t_is_refused_before_any_client_trains() -> None:
    import numpy as np
    from flwr.app import Array, ArrayRecord

    rng = np.random.default_rng(0)
    model = {
        "fc1.weight": rng.normal(size=(8, 4)).astype(np.float32),
        "fc1.bias": np.zeros(8, np.float32),
        "fc2.weight": rng.normal(size=(2, 8)).astype(np.float32),
        "fc2.bias": np.zeros(2, np.float32),
    }
    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), 5)
    strategy = SesaFedAvg(num_shards=4, privacy=2)  # K_max + T = 6 > 5 nodes
    with pytest.raises(ConfigurationError, match=r"privacy.*at least 6"):
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord({k: Array(v) for k, v in model.items()}),
            num_rounds=1,
        )
    assert calls == []


def test_an_experiment_refuses_a_sesa_arm_too_big_for_the_federation_before_any_arm() -> None:
    # issue 23: width-mnist at 6 nodes failed SESA only after four other arms had trained.
    from flwr_fsl.experiment import Arm, Experiment
    from flwr_fsl.strategies import FedSubAvg
    from tests.flower_apps import model_record

    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), 5)
    arms = [
        Arm("plain", "FedSubAvg", lambda setup: FedSubAvg(fraction_evaluate=0.0)),
        Arm("sesa", "SesaFedAvg", lambda setup: SesaFedAvg(num_shards=4, privacy=0.5)),
    ]
    experiment = Experiment(
        name="sesa-size", arms=arms, initial_arrays=model_record(), num_rounds=1, sampling_seed=0
    )
    with pytest.raises(ConfigurationError, match=r"arm 'sesa'.*at least 6 clients"):
        experiment.run(grid)
    assert calls == []
