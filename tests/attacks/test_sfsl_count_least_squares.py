"""SFSL: least squares per row over rounds on the released count words.

**Attack.** A client's count word on row ``j`` is fixed by its data (``v_j`` if it holds ``j``,
0 for a perturbed-in row) and the rows round releases, per row, the sum over that row's
participants — clients whose ``S''`` holds ``j`` — which change every round (3 of 5 clients
sampled per round, and randomized response). Over 40 rounds the curious server solves, per
row, ``counts ≈ participation @ x`` by least squares (:func:`tests.attacks.solvers.
least_squares_per_client`) and calls client ``i`` a holder of ``j`` when ``x_i > 0.5``.

**Leak at the paper option** (``dp=None, weighted=True``: Niu's Alg. 1 as specified): 100% of
(client, row) memberships, under CPP2, CPP4 and even ``p1 = p2 = p3 = p4 = ½``
(``ε1 = ε∞ = 0``): randomized response hides ``S''``, not the counts.

**Defaults** (the real strategy and mods at their defaults: DP with ``z = 1``, run budget
``ε = 20``): the run stops after 10 rounds, and the attacker does no better than the
majority-class baseline (:func:`tests.attacks.solvers.chance_membership_accuracy`: always
guess "not a holder", 0.74 here) within a margin of 0.10. Most rows never enter the noisy
union with 5 clients, so nothing is released about them; :func:`test_noise_alone_defeats_it`
releases every row every round for 40 rounds (the same rows-round noise, the union step
skipped, on the family's Flower-free round server with the server's exact view) and the attack
is still at chance.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.attacks import sfsl_setup as sfsl
from tests.attacks.sfsl_setup import own_flwr_home as own_flwr_home  # autouse fixture
from tests.attacks.sfsl_setup import seeded_streams as seeded_streams  # autouse fixture
from tests.attacks.solvers import (
    chance_membership_accuracy,
    identifiable_clients,
    least_squares_per_client,
    membership_accuracy,
)

MARGIN = 0.10


def count_attack(view: sfsl.ServerView) -> np.ndarray:
    """The server's estimate of every client's count on every row (0 where never observed)."""
    estimate = np.zeros((sfsl.CLIENTS, sfsl.ROWS))
    for row in range(sfsl.ROWS):
        participation, counts, _ = view.observations(row)
        if counts.size:
            estimate[:, row] = least_squares_per_client(participation, counts)
    return estimate


@pytest.mark.parametrize("cpp", ["cpp2", "cpp4", "half"])
def test_the_paper_protocol_leaks_every_clients_rows(cpp: str) -> None:
    strategy, view = sfsl.run(sfsl.CPPS[cpp], noise_floor=0.0, **sfsl.PAPER)
    assert len(view.results) == sfsl.ROUNDS and strategy.failed_rounds == {}
    truth = sfsl.truth()
    right = (count_attack(view) > 0.5) == truth
    # Every pair the releases determine is decoded exactly. A holder whose permanent answer is
    # "no" may never upload the row (CPP2: 1/16 of its rows, each then in S'' with p = 1/16
    # per round); that pair is called "not a holder". In some runs (about 1 in 7) two clients
    # were released together in every round a row was: their split is not determined, and
    # least squares gives each half.
    determined = np.zeros_like(truth)
    for row in range(sfsl.ROWS):
        participation, _, _ = view.observations(row)
        if participation.size:
            determined[:, row] = identifiable_clients(participation)
    covered = view.observed()
    assert right[covered & determined].all()
    assert (covered & ~determined).sum() <= 0.05 * truth.size  # 0-6 of 200 pairs in 25 runs
    assert right.mean() >= 0.97


def test_at_defaults_the_attack_is_at_chance() -> None:
    # The strategy's and the mod's defaults; RR at ½ so that S'' (ε∞-LDP, documented) adds
    # nothing and any advantage would come from the released aggregates.
    strategy, view = sfsl.run(sfsl.CPPS["half"])
    account = strategy.privacy_account
    assert account is not None and account.budget is not None
    assert len(view.results) == account.rounds == 10  # ε = 20 at z = 1: the run stopped
    assert account.epsilon() <= account.budget.epsilon
    truth = sfsl.truth()
    accuracy = membership_accuracy(count_attack(view), truth)
    assert accuracy <= chance_membership_accuracy(truth) + MARGIN


def test_noise_alone_defeats_it() -> None:
    from tests.attacks.sfsl_driver import drive

    view = drive(sfsl.CPPS["half"], sfsl.ROUNDS, union="all")
    assert len(view.results) == sfsl.ROUNDS
    truth = sfsl.truth()
    accuracy = membership_accuracy(count_attack(view), truth)
    assert accuracy <= chance_membership_accuracy(truth) + MARGIN
