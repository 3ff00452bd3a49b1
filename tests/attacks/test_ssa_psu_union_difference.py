"""SSA with ``union="psu"`` (Cui's basic protocol): union differences over rounds decode row sets.

**Attack.** Cui's basic protocol opens each round's union ``U_t`` of the participants' element
sets to both servers (:mod:`flwr_fsl.families.ssa.union`). S0 samples the participants, so each
round is a group test of every row: a row missing from ``U_t`` is held by none of round ``t``'s
participants. The decoder (the one of ``test_sfsl_union_group_testing.py``) marks those
"not a holder", calls a row of ``U_t`` with a single undecided participant "holder", and the
rest "holder" iff they were never ruled out. In index mode a client's rows are fixed by its
data, so the same sets are tested every round.

**Leak at the option** (``SecureRowFedSubAvg(union="psu")``): the real strategy and
``PrivateRows`` on ``InProcessGrid`` with the in-process S1 (its ``PsuSum``), the clients opted
in (node config ``fsl-allow-union = true``), over the rows of
``test_ssa_index_row_least_squares.py`` (8 clients holding 2 of 12 rows each, 4 sampled per
round). S0 records each round's PSU participants and the union it opened. DP stays on: the
exact, noise-free union is released whatever noise the aggregate gets, so DP's protection of
row sets is given up. At ``z = 3`` (clip 1, weights 1; the default budget ε = 20 then allows
30 rounds) the decoder gets at least 95% of (client, row) pairs (the test's sampling seed 11:
99.0%; over 40 sampling seeds 98.5% mean, sd 1.9, min 93.8%); at the default ``z = 1`` the
budget stops the run after 10 rounds and it gets 90.0% (40 seeds, sd 4.5, min 81.3%, max
99.0%). Chance is 83.3% (always guessing "not held"); more rounds, or a larger ``z``, only add
tests.

**Mixed rounds** (``SecureRowFedSubAvg(ModelTables(...), union="psu")``): the same clients'
rows as the primary table ``emb``, a derived table ``cat`` (row ``r`` -> category ``r mod 3``,
public) and a dense tensor, through ``PrivateTables``. S0 records the primary table's opened
union per round; the derived table's union is a public function of it (nothing more to
decode). At ``z = 3 sqrt(3)`` (three parts per round: each round spends what one part at
``z = 3`` spends, so the budget again allows the 30 rounds) the decoder gets at least 95%
(sampling seed 11: 99.0%, as in the one-table case; seeds 1, 2, 3: 100%, 100%, 97.9%). At the
default ``z = 1`` the three parts spend the budget in 3 rounds and the decoder then gets 75.0%
(seed 11), below chance: the leak grows with the rounds the budget allows.

**Defaults** (no PSU phase; index mode's DP on): the real
:class:`~flwr_fsl.families.ssa.index_strategy.SecureRowFedSubAvg` on ``InProcessGrid`` as a
curious S0 that subtracts its own noise; the nearest thing to a union it has is the support of
the released per-row counts (``count > 0.5``). The same decoder on it does no better than
chance plus 10 points (measured over 6 runs: 80.4% mean, sd 2.8, max 84.4%, against the bound
93.3%; the noise is the servers' CSPRNG). Every test here keys the fresh streams (the
servers' noise, the PSU vectors' randomness) by its name
(:func:`~tests.attacks.seeding.seed_fresh_streams`): CI checks one reproducible run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa import index_strategy, mixed_strategy, two_server
from flwr_fsl.families.ssa.dp import INDEX_MODE_DP
from flwr_fsl.families.ssa.index_mod import PrivateRows
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.families.ssa.mixed_mod import PrivateTables
from flwr_fsl.families.ssa.union import NODE_ALLOW_UNION_KEY
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.submodel.tables import ModelTables, RowMap, TableSpec
from flwr_fsl.testing import InProcessGrid
from tests.attacks.seeding import seed_fresh_streams
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


def psu_client_app() -> ClientApp:
    """The attack's clients (``client_app``'s rows and training) answering ``query.psu`` too."""
    rows = PrivateRows("emb", rows=lambda ctx: HOLDS[int(ctx.node_config["partition-id"])])
    app = ClientApp(mods=[rows.mod])
    app.query("psr")(rows.query)
    app.query("psu")(rows.query_psu)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        table = msg.content["arrays"]["emb"].numpy()
        table[HOLDS[int(context.node_config["partition-id"])]] += np.float32(0.01)
        arrays = ArrayRecord({"emb": Array(table)})
        content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1})})
        return Message(content, reply_to=msg)

    return app


def psu_view(
    monkeypatch: pytest.MonkeyPatch, seed: int, z: float = 1.0
) -> list[tuple[list[int], np.ndarray]]:
    """A curious S0 running the real strategy with ``union="psu"`` (DP on, its defaults).

    It records, per round, the participants of the PSU phase and the union it opened (what S0
    legitimately holds: it opens the union itself and announces it to the clients).
    """
    key = SealingKeyPair.generate()
    grid = InProcessGrid(
        psu_client_app(),
        CLIENTS,
        {"ssa-helper-fingerprint": key.fingerprint},
        lambda i: {"partition-id": i, "num-partitions": CLIENTS, NODE_ALLOW_UNION_KEY: True},
    )
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        "emb",
        2,
        fraction_train=0.5,
        min_available_nodes=CLIENTS,
        sampling_seed=seed,
        union="psu",
        dp=replace(INDEX_MODE_DP, noise_multiplier=z),
    )
    real_phase = index_strategy.psu_phase
    view: list[tuple[list[int], np.ndarray]] = []
    nodes: list[int] = []

    def recorded(*args: Any) -> Any:
        union, kept = real_phase(*args)
        present = np.zeros(ROWS, bool)
        present[union.union] = True
        view.append(([nodes.index(n) for n in kept], present))
        return union, kept

    monkeypatch.setattr(index_strategy, "psu_phase", recorded)
    nodes.extend(grid.get_node_ids())
    strategy.start(grid, ArrayRecord({"emb": Array(np.zeros((ROWS, WIDTH), np.float32))}), ROUNDS)
    return view


CATEGORIES = 3
MIXED = ModelTables(
    (
        TableSpec("emb", 2),
        TableSpec("cat", 2, "emb", RowMap.from_lists([[r % CATEGORIES] for r in range(ROWS)])),
    )
)


def mixed_client_app() -> ClientApp:
    """The attack's clients in a mixed model: ``emb`` rows, derived ``cat`` rows, dense ``w``."""
    private = PrivateTables(
        MIXED, rows=lambda ctx: {"emb": HOLDS[int(ctx.node_config["partition-id"])]}
    )
    app = ClientApp(mods=[private.mod])
    app.query("psr")(private.query)
    app.query("psu")(private.query_psu)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = {k: v.numpy().copy() for k, v in msg.content["arrays"].items()}
        rows = MIXED.client_rows({"emb": HOLDS[int(context.node_config["partition-id"])]})
        for name in ("emb", "cat"):
            arrays[name][rows[name]] += np.float32(0.01)
        arrays["w"] += np.float32(0.01)
        reply = ArrayRecord({k: Array(v) for k, v in arrays.items()})
        content = RecordDict({"arrays": reply, "metrics": MetricRecord({"num-examples": 1})})
        return Message(content, reply_to=msg)

    return app


@pytest.fixture(autouse=True)
def _seeded_streams(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    seed_fresh_streams(monkeypatch, f"{__name__}::{request.node.name}")


def mixed_psu_view(
    monkeypatch: pytest.MonkeyPatch, seed: int, z: float
) -> list[tuple[list[int], np.ndarray]]:
    """A curious S0 running a mixed model with ``union="psu"``: the primary table's unions."""
    key = SealingKeyPair.generate()
    grid = InProcessGrid(
        mixed_client_app(),
        CLIENTS,
        {"ssa-helper-fingerprint": key.fingerprint},
        lambda i: {"partition-id": i, "num-partitions": CLIENTS, NODE_ALLOW_UNION_KEY: True},
    )
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        MIXED,
        fraction_train=0.5,
        min_available_nodes=CLIENTS,
        sampling_seed=seed,
        union="psu",
        dp=replace(INDEX_MODE_DP, noise_multiplier=z),
    )
    real_phase = mixed_strategy.mixed_psu_phase
    view: list[tuple[list[int], np.ndarray]] = []
    nodes: list[int] = []

    def recorded(*args: Any) -> Any:
        unions, kept = real_phase(*args)
        present = np.zeros(ROWS, bool)
        present[unions["emb"].union] = True
        view.append(([nodes.index(n) for n in kept], present))
        return unions, kept

    monkeypatch.setattr(mixed_strategy, "mixed_psu_phase", recorded)
    nodes.extend(grid.get_node_ids())
    model = {
        "emb": np.zeros((ROWS, WIDTH), np.float32),
        "cat": np.zeros((CATEGORIES, WIDTH), np.float32),
        "w": np.zeros(3, np.float32),
    }
    strategy.start(grid, ArrayRecord({k: Array(v) for k, v in model.items()}), ROUNDS)
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


def test_at_the_psu_option_union_differences_decode_every_clients_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = psu_view(monkeypatch, seed=11, z=3.0)
    assert len(view) == ROUNDS  # DP on at z = 3: the default budget allows the 30 rounds
    accuracy = float(np.mean(group_testing(view) == TRUTH))
    chance = chance_membership_accuracy(TRUTH)
    assert chance == pytest.approx(1 - 2 / ROWS)
    assert accuracy >= 0.95 > chance + MARGIN, accuracy


def test_mixed_rounds_at_the_psu_option_leak_the_primary_rows_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = mixed_psu_view(monkeypatch, seed=11, z=3.0 * np.sqrt(3.0))
    assert len(view) == ROUNDS
    accuracy = float(np.mean(group_testing(view) == TRUTH))
    assert accuracy >= 0.95 > chance_membership_accuracy(TRUTH) + MARGIN, accuracy


def test_at_default_settings_there_is_no_union_to_difference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = default_view(monkeypatch)
    assert 0 < len(view) <= 10  # the default budget stops the run after 10 rounds
    accuracy = float(np.mean(group_testing(view) == TRUTH))
    assert accuracy <= chance_membership_accuracy(TRUTH) + MARGIN, accuracy
