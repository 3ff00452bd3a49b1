"""SFSL: group testing on the zero pattern of the released value sums.

**Attack.** A client uploads a zero update (and count) for the rows of ``S''`` it does not
really hold (Alg. 1), and a real update otherwise. So a row's released value sum is exactly
zero in a round where none of its participants holds it, and nonzero where one does: each
(round, row) is a group test of the participants. The curious server marks every participant of
a zero test "not a holder", then every lone remaining candidate of a nonzero test "holder";
the pairs left undecided it calls "holder" if they sit in some nonzero test, else "not".

**Leak at the paper option** (``dp=None, weighted=True``): at ``p1 = p2 = p3 = p4 = ½``
(``ε1 = ε∞ = 0``, so ``S''`` says nothing about ``S``) the decode is right for at least 95% of
(client, row) pairs over 40 rounds (about 97–100% in runs; chance is 0.74), without ever
reading a count.

**Defaults** (the real strategy and mods: every word of every uploaded row carries noise, so no
released sum is exactly zero, and the run stops after 10 rounds on its budget): no better than
the majority-class baseline (:func:`tests.attacks.solvers.chance_membership_accuracy`) plus
0.10; also when every row is released every round for 40 rounds (the Flower-free round server
of :mod:`tests.attacks.sfsl_driver`, union step skipped).
"""

from __future__ import annotations

import numpy as np

from tests.attacks import sfsl_setup as sfsl
from tests.attacks.sfsl_setup import own_flwr_home as own_flwr_home  # autouse fixture
from tests.attacks.sfsl_setup import seeded_streams as seeded_streams  # autouse fixture
from tests.attacks.solvers import chance_membership_accuracy

MARGIN = 0.10


def zero_pattern_attack(view: sfsl.ServerView) -> np.ndarray:
    """Decode membership from which released value sums are exactly zero."""
    guess = np.zeros((sfsl.CLIENTS, sfsl.ROWS), dtype=bool)
    for row in range(sfsl.ROWS):
        participation, _, values = view.observations(row)
        tests = [(np.flatnonzero(p), v != 0.0) for p, v in zip(participation, values, strict=True)]
        negative = np.zeros(sfsl.CLIENTS, dtype=bool)
        for members, positive in tests:
            if not positive:
                negative[members] = True
        holder = np.zeros(sfsl.CLIENTS, dtype=bool)
        maybe = np.zeros(sfsl.CLIENTS, dtype=bool)
        for members, positive in tests:
            candidates = members[~negative[members]]
            if positive and candidates.size == 1:
                holder[candidates] = True
            elif positive:
                maybe[candidates] = True
        guess[:, row] = holder | (maybe & ~negative)
    return guess


def test_the_paper_protocol_leaks_through_zeros() -> None:
    _, view = sfsl.run(sfsl.CPPS["half"], noise_floor=0.0, **sfsl.PAPER)
    truth = sfsl.truth()
    accuracy = float(np.mean(zero_pattern_attack(view) == truth))
    assert accuracy >= 0.95 > chance_membership_accuracy(truth) + MARGIN


def test_at_defaults_no_sum_is_zero_and_the_attack_is_at_chance() -> None:
    from tests.attacks.sfsl_driver import drive

    truth = sfsl.truth()
    chance = chance_membership_accuracy(truth)
    _, view = sfsl.run(sfsl.CPPS["half"])  # the strategy's and the mod's defaults
    assert len(view.results) == 10
    assert float(np.mean(zero_pattern_attack(view) == truth)) <= chance + MARGIN
    every_row = drive(sfsl.CPPS["half"], sfsl.ROUNDS, union="all")
    for result in every_row.results:  # every row someone uploaded carries noise: never zero
        uploaded = np.zeros(result.union.size, dtype=bool)
        for node in result.clients:
            uploaded[np.searchsorted(result.union, result.perturbed[node])] = True
        assert result.released_sums is not None
        assert np.all(np.abs(result.released_sums[uploaded]).sum(axis=1) > 0)
    assert float(np.mean(zero_pattern_attack(every_row) == truth)) <= chance + MARGIN
