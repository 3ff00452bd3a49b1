"""SSA with ``union="psu"`` (Cui's basic protocol): union differences over rounds decode row sets.

**Attack.** Cui's basic protocol opens each round's union ``U_t`` of the participants' element
sets to both servers (:mod:`flwr_fsl.families.ssa.union`). S0 samples the participants, so each
round is a group test of every row: a row missing from ``U_t`` is held by none of round ``t``'s
participants. The decoder (the one of ``test_sfsl_union_group_testing.py``) marks those
"not a holder", calls a row of ``U_t`` with a single undecided participant "holder", and the
rest "holder" iff they were never ruled out. In index mode a client's rows are fixed by its
data, so the same sets are tested every round.

**Leak at the option** (``union="psu"``): the curious servers' view is the real PSU of
:mod:`flwr_fsl.families.ssa.union` (each client's two shares, the servers' sums, the opened
union) over the rows of ``test_ssa_index_row_least_squares.py`` (8 clients holding 2 of 12
rows each, 4 sampled per round, 30 rounds): at least 95% of (client, row) pairs decoded
(the participation is seeded; over 40 participation seeds 99.1% mean, sd 1.2, min 94.8%;
chance is 83.3%, always guessing "not held"). The exact, noise-free union is
released whether or not DP noises the aggregate: the option gives up the DP protection of
row sets that index mode has by default. Not yet driven through Flower: the strategies do not
have the option yet (this test runs the PSU phase that they would run, in one process).

**Defaults** (no PSU phase; index mode's DP on): the real
:class:`~flwr_fsl.families.ssa.index_strategy.SecureRowFedSubAvg` on ``InProcessGrid`` as a
curious S0 that subtracts its own noise; the nearest thing to a union it has is the support of
the released per-row counts (``count > 0.5``). The same decoder on it does no better than
chance plus 10 points (measured over 6 runs: 80.4% mean, sd 2.8, max 84.4%, against the bound
93.3%; the noise is the servers' CSPRNG, not seeded).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.psu import PSUParams
from flwr_fsl.families.ssa import two_server
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.families.ssa.union import UnionParty, open_union, share_set
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.testing import InProcessGrid
from tests.attacks.solvers import chance_membership_accuracy
from tests.attacks.test_ssa_index_row_least_squares import (
    CLIENTS,
    HOLDS,
    ROUNDS,
    ROWS,
    TRUTH,
    WIDTH,
    client_app,
)

SAMPLED = CLIENTS // 2
MARGIN = 0.10


def group_testing(rounds: list[tuple[list[int], np.ndarray]]) -> np.ndarray:
    """Decode membership from each round's participants and its union (a row mask)."""
    negative = np.zeros((CLIENTS, ROWS), bool)
    for members, present in rounds:
        negative[np.ix_(members, np.flatnonzero(~present))] = True
    holder = np.zeros_like(negative)
    maybe = np.zeros_like(negative)
    for members, present in rounds:
        m = np.asarray(members)
        for row in np.flatnonzero(present):
            candidates = m[~negative[m, row]]
            if candidates.size == 1:
                holder[candidates, row] = True
            else:
                maybe[candidates, row] = True
    return holder | (maybe & ~negative)


def psu_view(seed: int) -> list[tuple[list[int], np.ndarray]]:
    """The servers' view of ROUNDS rounds of the PSU phase: participants and opened union."""
    rng = np.random.default_rng(seed)
    psu = PSUParams.exact(ROWS)
    view = []
    for _ in range(ROUNDS):
        members = sorted(rng.choice(CLIENTS, SAMPLED, replace=False).tolist())
        lead, helper = UnionParty(psu, 0), UnionParty(psu, 1)
        for c in members:
            share = share_set(psu, HOLDS[c])
            lead.add(c, share.lead_vector)
            helper.add(c, share.helper_seed)
        present = np.zeros(ROWS, bool)
        present[open_union(psu, lead.total, helper.total)] = True
        view.append((members, present))
    return view


def default_view(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], np.ndarray]]:
    """A curious S0 at default settings: participants and the support of the released counts."""
    key = SealingKeyPair.generate()
    grid = InProcessGrid(
        client_app(),
        CLIENTS,
        {"ssa-helper-fingerprint": key.fingerprint},
        lambda i: {"partition-id": i, "num-partitions": CLIENTS},
    )
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        "emb",
        2,
        fraction_train=0.5,
        min_available_nodes=CLIENTS,
        sampling_seed=3,
    )
    own: dict[str, np.ndarray] = {}
    real_noise = two_server.noise_words

    def s0_noise(shape, sigma, fixed_point, stream=None):  # type: ignore[no-untyped-def]
        words = real_noise(shape, sigma, fixed_point, stream)
        own["counts"] = fixed_point.decode(words)[:, -1]
        return words

    monkeypatch.setattr(two_server, "noise_words", s0_noise)
    lead = strategy.aggregation.lead
    real_aggregate = lead.aggregate
    views: dict[int, tuple[list[int], np.ndarray]] = {}

    def recorded(params: Any, uploads: Any) -> Any:
        own.pop("counts", None)
        outcome = real_aggregate(params, uploads)
        counts = np.array(outcome.result.counts, np.float64) - own.get("counts", 0.0)
        views[params.round_id] = (list(outcome.accepted), counts > 0.5)
        return outcome

    lead.aggregate = recorded  # type: ignore[method-assign]
    strategy.start(grid, ArrayRecord({"emb": Array(np.zeros((ROWS, WIDTH), np.float32))}), ROUNDS)
    nodes = list(grid.get_node_ids())
    return [([nodes.index(n) for n in members], support) for members, support in views.values()]


def test_at_the_psu_option_union_differences_decode_every_clients_rows() -> None:
    accuracy = float(np.mean(group_testing(psu_view(seed=11)) == TRUTH))
    chance = chance_membership_accuracy(TRUTH)
    assert chance == pytest.approx(1 - 2 / ROWS)
    assert accuracy >= 0.95 > chance + MARGIN, accuracy


def test_at_default_settings_there_is_no_union_to_difference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = default_view(monkeypatch)
    assert 0 < len(view) <= 10  # the default budget stops the run after 10 rounds
    accuracy = float(np.mean(group_testing(view) == TRUTH))
    assert accuracy <= chance_membership_accuracy(TRUTH) + MARGIN, accuracy
