"""Least squares over rounds on SecAgg's released train-metric means (issue 20).

The real ``SecAggFedAvg`` + ``secagg_mod``, 8 clients, ``fraction_train=0.6``, 12 rounds. A
train metric the strategy names rides inside the masked vector and the server decodes its sum
over ``U3`` (with unit weights: ``sum m_u``, and ``|U3|`` beside it). A client whose metric stays
the same across rounds (its data does not change; a training loss near convergence nearly
does) is then one unknown of a linear system the server solves, exactly as for weights.

Success = fraction of clients whose metric the estimate gets within 0.01. Chance = guessing the
mean loss for everyone: within 0.01 for 0 of these 8 clients.

- default (``train_metrics=()``): no metric word is in the vector: nothing to solve, 0/8.
- ``train_metrics=("train-loss",)`` (documented leak): 8/8 within 1e-5.
- the same with ``dp=SecAggDP(4, 1)``, ``max_metric=5``: 0/8 (at most 1/8 allowed) and a larger
  error than guessing the mean.
- ``num-examples`` can never be a train metric (refused at both ends).
"""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.secagg.dp import SecAggDP
from flwr_fsl.strategies import SecAggFedAvg
from tests.attacks.secagg_server import NODES, participation, released, run_curious
from tests.attacks.solvers import least_squares_per_client

SIZES = [50] * NODES
LOSSES = np.array([0.31, 2.2, 1.05, 0.62, 1.7, 0.08, 0.9, 1.4])
ROUNDS = 12
SEED = 3


def _hits(estimate: np.ndarray) -> float:
    return float(np.mean(np.abs(estimate - LOSSES) < 0.01))


CHANCE = float(np.mean(np.abs(LOSSES.mean() - LOSSES) < 0.01))


def test_by_default_no_metric_leaves_the_client() -> None:
    strategy, view = run_curious(SIZES, list(LOSSES), ROUNDS, SEED)
    assert strategy.train_metrics == ()
    layout = strategy.settings.layout({"w": (4,)}, ("w",))
    assert layout.length == layout.model_length + 1  # the update and the weight word only
    assert all(total.size == layout.length for total in view.totals.values())
    assert 0.0 <= CHANCE == 0.0  # the attacker has no metric word: it can only guess


def test_a_named_metric_that_stays_the_same_is_recovered() -> None:
    strategy, view = run_curious(SIZES, list(LOSSES), ROUNDS, SEED, train_metrics=("train-loss",))
    design = participation(view)
    assert np.linalg.matrix_rank(design) == NODES
    estimate = least_squares_per_client(design, released(strategy, view, "metric:train-loss"))
    np.testing.assert_allclose(estimate, LOSSES, atol=1e-5)  # the documented leak
    assert _hits(estimate) == 1.0 > CHANCE


def test_distributed_dp_defeats_the_metric_attack() -> None:
    strategy, view = run_curious(
        SIZES, list(LOSSES), ROUNDS, SEED, train_metrics=("train-loss",), max_metric=5.0,
        dp=SecAggDP(noise_multiplier=4.0, clip_norm=1.0),
    )  # fmt: skip
    estimate = least_squares_per_client(
        participation(view), released(strategy, view, "metric:train-loss")
    )
    assert _hits(estimate) <= CHANCE + 1 / NODES
    assert np.abs(estimate - LOSSES).mean() > np.abs(LOSSES - LOSSES.mean()).mean()


def test_num_examples_is_never_a_train_metric() -> None:
    with pytest.raises(ConfigurationError, match="train_metrics"):
        SecAggFedAvg(weighted_by_key="other", train_metrics=("num-examples",))
