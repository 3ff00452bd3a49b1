"""SFSL with a derived table: least squares over rounds on the *derived* rows' count words.

**Setting.** Two tables (``item`` 40 rows, primary; ``genre`` 24 rows, derived from the items
by a public map, one or two genres per item) plus a dense tensor, through the real
:class:`~flwr_fsl.strategies.SFSLFedSubAvg` and :class:`~flwr_fsl.mods.PerturbedRows` with
``ModelTables`` on :class:`~flwr_fsl.testing.InProcessGrid` (3 of 5 clients per round). A
client's genre set is the map of its items; the server derives each ``S''_genre`` from the
perturbed items, so the genre *sets* tell it nothing new (``tests/families/sfsl/
test_tables.py``) — but a genre row's count word is the client's real data, aggregated like
any row's.

**Attack.** As :mod:`tests.attacks.test_sfsl_count_least_squares`, per genre row: solve
``counts ≈ participation @ x`` over the rounds it was released, call client ``i`` a holder of
genre ``g`` when ``x_i > 0.5``.

**Leak at the paper option** (``dp=None, weighted=True``): the true genre sets, ≥ 95% of
(client, genre) pairs, under CPP2 and at ``p = ½``. **Defaults** (DP ``z = 1``, budget
``ε = 20``): no better than the majority-class baseline within 0.10.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.families.sfsl.perturb import RRParams
from flwr_fsl.mods import PerturbedRows
from flwr_fsl.strategies import SFSLFedSubAvg
from flwr_fsl.submodel.tables import ModelTables, RowMap, TableSpec
from flwr_fsl.testing import InProcessGrid
from tests.attacks import sfsl_setup as sfsl
from tests.attacks.sfsl_setup import own_flwr_home as own_flwr_home  # autouse fixture
from tests.attacks.sfsl_setup import seeded_streams as seeded_streams  # autouse fixture
from tests.attacks.solvers import (
    chance_membership_accuracy,
    least_squares_per_client,
    membership_accuracy,
)

ITEMS, GENRES, HOLD = 40, 24, 0.17
MARGIN = 0.10


def genre_map() -> RowMap:
    rng = np.random.default_rng(5)
    return RowMap.from_lists(
        [rng.choice(GENRES, size=int(rng.integers(1, 3)), replace=False) for _ in range(ITEMS)]
    )


TABLES = ModelTables((TableSpec("item", ITEMS), TableSpec("genre", GENRES, "item", genre_map())))


def held_items() -> np.ndarray:
    return np.random.default_rng(2027).random((sfsl.CLIENTS, ITEMS)) < HOLD


def true_genres() -> np.ndarray:
    held = held_items()
    out = np.zeros((sfsl.CLIENTS, GENRES), dtype=bool)
    for c in range(sfsl.CLIENTS):
        out[c, TABLES.client_rows({"item": np.flatnonzero(held[c])})["genre"]] = True
    return out


def client_app(rr: RRParams, noise_floor: float | None) -> ClientApp:
    held = held_items()

    def rows(context: Context) -> dict[str, np.ndarray]:
        return {"item": np.flatnonzero(held[int(context.node_config["partition-id"])])}

    mod = PerturbedRows(TABLES, rows=rows, rr=rr, noise_floor=noise_floor)
    app = ClientApp(mods=[mod.mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        arrays = {k: a.numpy().copy() for k, a in msg.content["arrays"].items()}
        real = TABLES.client_rows({"item": np.flatnonzero(held[pid])})
        for name, idx in real.items():
            arrays[name][idx] += np.float32(0.1)
        arrays["fc"] += np.float32(0.01)
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                "metrics": MetricRecord({"num-examples": 10}),
            }
        )
        return Message(content, reply_to=msg)

    return app


def run(rr: RRParams, noise_floor: float | None = None, **strategy: object) -> sfsl.ServerView:
    grid = InProcessGrid(client_app(rr, noise_floor), sfsl.CLIENTS)
    strat = SFSLFedSubAvg(
        TABLES,
        fraction_train=sfsl.PER_ROUND / sfsl.CLIENTS,
        min_train_nodes=sfsl.PER_ROUND,
        min_available_nodes=sfsl.CLIENTS,
        sampling_seed=7,
        **strategy,  # type: ignore[arg-type]
    )
    view = sfsl.ServerView()
    view.attach(strat)
    initial = ArrayRecord(
        {
            "item": Array(np.zeros((ITEMS, 2), np.float32)),
            "genre": Array(np.zeros((GENRES, 2), np.float32)),
            "fc": Array(np.zeros(2, np.float32)),
        }
    )
    strat.start(grid=grid, initial_arrays=initial, num_rounds=sfsl.ROUNDS)
    return view


def genre_attack(view: sfsl.ServerView) -> np.ndarray:
    """The server's estimate of every client's count on every genre (virtual row ITEMS + g)."""
    estimate = np.zeros((sfsl.CLIENTS, GENRES))
    for g in range(GENRES):
        participation, counts, _ = view.observations(ITEMS + g)
        if counts.size:
            estimate[:, g] = least_squares_per_client(participation, counts)
    return estimate


@pytest.mark.parametrize("cpp", ["cpp2", "half"])
def test_the_paper_protocol_leaks_the_true_genres(cpp: str) -> None:
    view = run(sfsl.CPPS[cpp], noise_floor=0.0, **sfsl.PAPER)
    assert len(view.results) == sfsl.ROUNDS
    truth = true_genres()
    assert 0.2 < truth.mean() < 0.8  # both classes present
    accuracy = membership_accuracy(genre_attack(view), truth)
    assert accuracy >= 0.95


def test_at_defaults_the_genre_attack_is_at_chance() -> None:
    view = run(sfsl.CPPS["half"])
    assert len(view.results) == 10  # ε = 20 at z = 1: the run stopped
    truth = true_genres()
    accuracy = membership_accuracy(genre_attack(view), truth)
    assert accuracy <= chance_membership_accuracy(truth) + MARGIN
