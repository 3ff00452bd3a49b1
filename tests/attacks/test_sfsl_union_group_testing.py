"""SFSL: group testing on the round's union (Niu's Alg. 3 releases it in the clear).

**Attack.** The private set union opens ``U``, the union of the round's participants' real row
sets — not which client holds a row, but with the participants changing every round (3 of 5)
each round is a group test of every row: a row missing from ``U`` is held by none of the
round's participants. The curious server marks those "not a holder", then a row of ``U`` with
a single participant left undecided "holder"; the rest it calls "holder" if they sat in some
round whose union had the row, else "not". Randomized response plays no part: the union is
of the *real* sets.

**Leak at the paper option** (``dp=None``, exact PSU): at least 95% of (client, row) pairs
over 40 rounds (about 97% in runs; chance is 0.74).

**Defaults**: the union is the rows whose noisy holder count (every client's noise on every
table row, :func:`flwr_fsl.families.sfsl.dp.noisy_union_vector`) passes a threshold, which
with 5 clients is mostly noise; the attack is no better than the majority-class baseline
(:func:`tests.attacks.solvers.chance_membership_accuracy`) plus 0.10.
"""

from __future__ import annotations

import numpy as np

from tests.attacks import sfsl_setup as sfsl
from tests.attacks.sfsl_setup import own_flwr_home as own_flwr_home  # autouse fixture
from tests.attacks.sfsl_setup import seeded_streams as seeded_streams  # autouse fixture
from tests.attacks.solvers import chance_membership_accuracy

MARGIN = 0.10


def union_attack(view: sfsl.ServerView) -> np.ndarray:
    """Decode membership from the rounds' unions and who took part in them."""
    tests = []
    for result in view.results:
        members = np.array(sorted(sfsl.pid(n) for n in result.perturbed), dtype=np.int64)
        present = np.zeros(sfsl.ROWS, dtype=bool)
        present[result.union[result.union < sfsl.ROWS]] = True
        tests.append((members, present))
    negative = np.zeros((sfsl.CLIENTS, sfsl.ROWS), dtype=bool)
    for members, present in tests:
        negative[np.ix_(members, np.flatnonzero(~present))] = True
    holder = np.zeros_like(negative)
    maybe = np.zeros_like(negative)
    for members, present in tests:
        for row in np.flatnonzero(present):
            candidates = members[~negative[members, row]]
            if candidates.size == 1:
                holder[candidates, row] = True
            else:
                maybe[candidates, row] = True
    return holder | (maybe & ~negative)


def test_the_paper_protocols_union_leaks_every_clients_rows() -> None:
    _, view = sfsl.run(sfsl.CPPS["half"], noise_floor=0.0, **sfsl.PAPER)
    truth = sfsl.truth()
    accuracy = float(np.mean(union_attack(view) == truth))
    assert accuracy >= 0.95 > chance_membership_accuracy(truth) + MARGIN


def test_at_defaults_the_noisy_union_is_at_chance() -> None:
    _, view = sfsl.run(sfsl.CPPS["half"])
    truth = sfsl.truth()
    accuracy = float(np.mean(union_attack(view) == truth))
    assert accuracy <= chance_membership_accuracy(truth) + MARGIN
