"""Cross-round least squares on secure top-k with mega-elements: whose rows are these?

``SecureFedSubAvg(groups=("emb",))`` sends whole embedding rows chosen by L1 norm (Cui §6,
§7.4). On an embedding table a client's update is zero outside the rows of its own words, so
its top-k rows are always drawn from its own vocabulary — whatever error feedback rotates,
the support stays data-dependent. With unit weights a row's count word is the number of the
round's clients that chose it; S0 chose each round's participants, so least squares over the
rounds (:func:`~tests.attacks.solvers.least_squares_per_client`, as in
``test_ssa_topk_cross_round.py``) estimates how often each client chooses each row, and a row
with count 1 in a round — whose value S0 reads as ``sum / count`` — gets a name.

Setup: a 48-row x 4 embedding table plus a 4-word bias (the bias as single coordinates,
zero-padded to the row width), 20 clients with 6 words each drawn from 48, 10 clients per
round, 40 rounds, top-k 10% (5 rows + 1 bias coordinate), ``topk_mod``'s default error
feedback. Measured:

- ``groups`` with ``dp=None`` (flat top-k mode's default; with ``groups`` the default is
  ``INDEX_MODE_DP`` because of this test): S0 names the lone chooser of a
  row 86% of the time against a chance of 1/10 — **a leak** of the non-default ``groups``
  option whenever the grouped tensor's support is data-dependent (embedding rows), even with
  error feedback;
- with distributed DP (``dp=DistributedDP(noise_multiplier=1.0, ...)``, each server noising
  its share) the noisy counts name the lone chooser 15–19% of the time (z = 3: 10–19%):
  **bounded, not at chance** — what is left is what the run's ``(ε, δ)`` allows.

The DP runs key every fresh stream (the servers' noise) from a run seed
(:func:`~tests.attacks.seeding.seed_fresh_streams`): CI checks one reproducible run.
"""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.families.ssa.dp import DistributedDP
from tests.attacks.seeding import seed_fresh_streams
from tests.attacks.solvers import least_squares_per_client
from tests.attacks.ssa_harness import S0View, run_topk

CLIENTS, FRACTION, ROUNDS, RATIO = 20, 0.5, 40, 0.1
ROWS, WIDTH, WORDS = 48, 4, 6
MODEL = {"emb": np.zeros((ROWS, WIDTH), np.float32), "b": np.zeros(WIDTH, np.float32)}
DP_BOUND = 0.35  # naming success allowed under DP (z = 1: 0.17-0.28 over 6 unseeded runs)
VOCAB = [
    np.random.default_rng([1, pid]).choice(ROWS, WORDS, replace=False) for pid in range(CLIENTS)
]


def train_delta(pid: int, server_round: int, flat: np.ndarray) -> np.ndarray:
    """Gradient-like change: nonzero only on the client's own word rows (and the bias)."""
    rng = np.random.default_rng([pid, server_round])
    emb = np.zeros((ROWS, WIDTH))
    emb[VOCAB[pid]] = rng.normal(size=(WORDS, WIDTH)) * 0.1
    return np.concatenate([emb.ravel(), rng.normal(size=WIDTH) * 0.01]).astype(np.float32)


def _run(**kwargs: object) -> S0View:
    view, strategy = run_topk(
        [1] * CLIENTS,
        rounds=ROUNDS,
        fraction_train=FRACTION,
        model=MODEL,
        delta=train_delta,
        topk_ratio=RATIO,
        error_feedback=True,  # topk_mod's default
        groups=("emb",),
        **kwargs,
    )
    assert strategy.failed_rounds == {}
    return view


def attack(view: S0View, min_named: int = 50) -> tuple[float, float]:
    """S0's decoder; returns (lone chooser named, chance) over the rows one client chose.

    S0 solves ``counts ≈ participation @ X`` over the rounds and names, for a row a single
    participant chose (truth: scored only on those), the participant with the largest
    estimated ``X``. Chance is ``1 / participants``.
    """
    participation, counts = view.participation(), view.counts()
    estimate = least_squares_per_client(participation, counts)
    index = {node: i for i, node in enumerate(view.nodes)}
    named, odds = [], []
    for r, outcome in enumerate(view.rounds):
        members = [index[n] for n in outcome.accepted]
        chosen = view.chosen[r + 1]
        for j in range(ROWS):  # the row elements (the bias coordinates come after them)
            choosers = [index[n] for n, idx in chosen.items() if j in idx]
            if len(choosers) == 1:
                named.append(members[int(np.argmax(estimate[members, j]))] == choosers[0])
                odds.append(1 / len(members))
    assert len(named) > min_named, len(named)
    return float(np.mean(named)), float(np.mean(odds))


def test_grouped_rows_without_dp_name_the_lone_chooser() -> None:
    named, chance = attack(_run(dp=None))
    assert named >= 0.6 and named > 5 * chance, (named, chance)


def test_distributed_dp_bounds_row_naming(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = seed_fresh_streams(monkeypatch, "ssa-topk-mega-rows")
    dp = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, max_weight=1.0)
    named, chance = attack(_run(dp=dp, privacy_budget=None))
    assert drawn() > 0  # the noise came from the seeded streams
    assert named <= DP_BOUND, (named, chance)


def test_default_settings_with_groups_add_noise_and_stop_at_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # groups= turns distributed DP on by default (INDEX_MODE_DP, budget ε = 20): the run stops
    # at its budget, and what S0 decodes from the rounds it ran is bounded like the DP case.
    drawn = seed_fresh_streams(monkeypatch, "ssa-topk-mega-rows")
    view, strategy = run_topk(
        [1] * CLIENTS,
        rounds=ROUNDS,
        fraction_train=FRACTION,
        model=MODEL,
        delta=train_delta,
        topk_ratio=RATIO,
        error_feedback=True,
        groups=("emb",),
    )
    assert strategy.aggregation.settings.dp is not None and drawn() > 0
    assert 0 < len(view.rounds) < ROUNDS  # the default budget ended the run early
    named, chance = attack(view, min_named=10)
    assert named <= DP_BOUND, (named, chance)
