"""Least squares over rounds on SecAgg's released total weight (issue 20).

The curious server runs the real ``SecAggFedAvg`` + ``secagg_mod`` on the in-process grid: 8
clients with secret ``num-examples``, ``fraction_train=0.6`` (4 sampled per round, ``t = 3``),
12 rounds. Each round it unmasks ``sum_{u in U3} x_u`` and reads the weight word; it chose the
sample, so it knows who is in each sum. One least-squares solve over the rounds
(:func:`tests.attacks.solvers.least_squares_per_client`) estimates every client's weight.

Success = the fraction of clients whose ``num-examples`` the rounded estimate gets exactly.
Chance = what a server gets without looking at any release: guessing the mean ``num-examples``
(rounded) for everyone, exact for 0 of these 8 clients.

- ``weighted=True`` (documented leak): 8/8 exact.
- default (unit weights): the released weight word is the survivor count in every round,
  whatever the clients hold (the same view for another secret vector): 0/8, at chance.
- ``weighted=True`` with ``dp=SecAggDP(4, 1)`` (``max_weight=400``): noise of std about 2,600
  on each total, estimates off by 1,200-2,300 on average (5 runs): 0/8 exact (at most 1/8
  allowed: each hit has probability below 1e-3) and a mean error larger than guessing the mean
  (83; below it only if all eight errors are, probability far under 1e-6).
"""

from __future__ import annotations

import numpy as np

from flwr_fsl.families.secagg.dp import SecAggDP
from tests.attacks.secagg_server import NODES, participation, released, run_curious
from tests.attacks.solvers import least_squares_per_client

SECRET = np.array([37, 120, 64, 250, 18, 91, 173, 305])
OTHER = np.array([300, 12, 45, 45, 180, 77, 9, 260])
LOSSES = [0.5] * NODES
ROUNDS = 12
SEED = 3


def _exact(estimate: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean(np.rint(estimate) == truth))


def _chance(truth: np.ndarray) -> float:
    return _exact(np.full(truth.shape, np.rint(truth.mean())), truth)


def _attack(**kwargs):  # type: ignore[no-untyped-def]
    strategy, view = run_curious(SECRET, LOSSES, ROUNDS, SEED, train_metrics=(), **kwargs)
    design = participation(view)
    assert design.shape == (ROUNDS, NODES) and np.linalg.matrix_rank(design) == NODES
    totals = released(strategy, view, "weight")
    return least_squares_per_client(design, totals), design, totals


def test_weighted_totals_give_every_clients_num_examples() -> None:
    estimate, _, _ = _attack(weighted=True)
    assert _exact(estimate, SECRET) == 1.0  # the documented leak of weighted=True
    assert _chance(SECRET) == 0.0


def test_unit_weights_release_only_the_survivor_count() -> None:
    estimate, design, totals = _attack()
    np.testing.assert_allclose(totals, design.sum(axis=1), atol=1e-6)  # |U3| every round
    np.testing.assert_allclose(estimate, 1.0, atol=1e-6)
    assert _exact(estimate, SECRET) <= _chance(SECRET) == 0.0
    # The server's view of the weight word does not depend on the secret at all.
    strategy, view = run_curious(OTHER, LOSSES, ROUNDS, SEED, train_metrics=())
    np.testing.assert_array_equal(released(strategy, view, "weight"), totals)


def test_distributed_dp_defeats_the_weighted_attack() -> None:
    dp = SecAggDP(noise_multiplier=4.0, clip_norm=1.0)
    estimate, _, _ = _attack(weighted=True, dp=dp, max_weight=400.0)
    assert _exact(estimate, SECRET) <= _chance(SECRET) + 1 / NODES
    mean_guess_error = np.abs(SECRET - SECRET.mean()).mean()
    assert np.abs(estimate - SECRET).mean() > mean_guess_error
