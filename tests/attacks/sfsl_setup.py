"""What the SFSL attack tests share: a tiny row table, clients, and the curious server's record.

The server is :class:`~flwr_fsl.strategies.SFSLFedSubAvg` with
:class:`~flwr_fsl.mods.PerturbedRows` clients on :class:`~flwr_fsl.testing.InProcessGrid`
(or, where a test says so, the family's Flower-free round server with the same view). The
attacker reads only what that server holds after each round: who took part (its own sample
and the rows round's survivors), every client's perturbed set ``S''`` (the perturb replies),
the union, and the per-row sums and counts the round released
(:class:`~flwr_fsl.families.sfsl.server.SFSLResult`); :class:`ServerView` records them by
wrapping the strategy's :meth:`~flwr_fsl.families.sfsl.server.SFSLServer.run`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from numpy.typing import NDArray

from flwr_fsl.families.sfsl.perturb import RRParams
from flwr_fsl.families.sfsl.server import SFSLResult
from flwr_fsl.mods import PerturbedRows
from flwr_fsl.strategies import SFSLFedSubAvg
from flwr_fsl.testing import InProcessGrid
from tests.attacks.seeding import seed_fresh_streams

CLIENTS, ROWS, WIDTH = 5, 40, 2
ROUNDS = 40
PER_ROUND = 3  # fraction_train = 0.6 of 5: the participants change every round
HOLD = 0.3  # each client holds each row with this probability
CPPS = {
    "cpp2": RRParams.symmetric(15 / 16, 1 / 16),
    "cpp4": RRParams.symmetric(3 / 4, 1 / 4),
    "half": RRParams(0.5, 0.5, 0.5, 0.5),  # ε1 = ε∞ = 0: S'' says nothing about S
}
PAPER = {"dp": None, "weighted": True}
"""Niu's protocol as the paper specifies it (the documented leaking option)."""


@pytest.fixture(autouse=True)
def own_flwr_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh ``FLWR_HOME`` per test: the clients' memos persist there (import it, autouse)."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path_factory.mktemp("flwr-home")))


@pytest.fixture(autouse=True)
def seeded_streams(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fresh stream (RR answers, DP noise) keyed by the test's name (import it, autouse).

    The accuracies these tests bound are statistical; seeded, each test checks one reproducible
    run (:func:`~tests.attacks.seeding.seed_fresh_streams`). Left unseeded: the library's
    ``np.random.default_rng()`` stochastic rounding and the ``os.urandom`` row subsets.
    """
    seed_fresh_streams(monkeypatch, f"{request.module.__name__}::{request.node.name}")


def truth() -> NDArray[np.bool_]:
    """``(clients, rows)``: which client really holds which row (fixed seed)."""
    return np.random.default_rng(2026).random((CLIENTS, ROWS)) < HOLD


def delta(pid: int, row: int) -> NDArray[np.float32]:
    """A client's (nonzero) update of one of its rows, the same every round."""
    return (0.05 + 0.1 * np.random.default_rng([pid, row]).random(WIDTH)).astype(np.float32)


def client_app(rr: RRParams, noise_floor: float | None = None) -> ClientApp:
    """PerturbedRows (at its defaults unless ``noise_floor``) around a train that moves its rows."""
    held = truth()

    def rows(context: Context) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        r = np.flatnonzero(held[int(context.node_config["partition-id"])]).astype(np.int64)
        return r, np.ones(r.size)

    mod = PerturbedRows("emb", rows=rows, rr=rr, noise_floor=noise_floor)
    app = ClientApp(mods=[mod.mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        arrays = {k: a.numpy().copy() for k, a in msg.content["arrays"].items()}
        for r in np.flatnonzero(held[pid]):
            arrays["emb"][r] += delta(pid, int(r))
        arrays["fc"] += np.float32(0.01)
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                "metrics": MetricRecord({"num-examples": 10}),
            }
        )
        return Message(content, reply_to=msg)

    return app


@dataclass
class ServerView:
    """Every round's :class:`SFSLResult` as the server computed it (its own state)."""

    results: list[SFSLResult] = field(default_factory=list)

    def attach(self, strategy: SFSLFedSubAvg) -> None:
        """Record each round the strategy's round server runs."""
        run: Callable[..., SFSLResult] = strategy.server.run

        def spy(*args: Any, **kwargs: Any) -> SFSLResult:
            result = run(*args, **kwargs)
            self.results.append(result)
            return result

        strategy.server.run = spy  # type: ignore[method-assign]

    def observations(
        self, row: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        """For one row, per round it was released: participants, count and value sum.

        Returns
        -------
        tuple of numpy.ndarray
            ``(rounds, clients)`` 0/1 participation (rows-round survivors whose ``S''`` held
            the row), ``(rounds,)`` released counts and ``(rounds,)`` summed ``|value sums|``.
        """
        parts, counts, values = [], [], []
        for result in self.results:
            slot = np.searchsorted(result.union, row)
            if slot >= result.union.size or result.union[slot] != row:
                continue  # not in this round's union: nothing released about the row
            assert result.released_counts is not None and result.released_sums is not None
            p = np.zeros(CLIENTS)
            for node in result.clients:
                if row in result.perturbed.get(node, ()):
                    p[pid(node)] = 1.0
            parts.append(p)
            counts.append(float(result.released_counts[slot]))
            values.append(float(np.abs(result.released_sums[slot]).sum()))
        return (
            np.array(parts).reshape(-1, CLIENTS),
            np.array(counts),
            np.array(values),
        )

    def observed(self) -> NDArray[np.bool_]:
        """``(clients, rows)``: pairs in some released row's participant set."""
        seen = np.zeros((CLIENTS, ROWS), dtype=bool)
        for row in range(ROWS):
            participation, _, _ = self.observations(row)
            seen[:, row] = participation.sum(axis=0) > 0
        return seen


def pid(node: int) -> int:
    """The InProcessGrid's node ids are ``1000 + partition-id``."""
    return int(node) - 1000


def run(
    rr: RRParams, rounds: int = ROUNDS, *, noise_floor: float | None = None, **strategy: Any
) -> tuple[SFSLFedSubAvg, ServerView]:
    """Train ``rounds`` rounds on the in-process grid; return the strategy and what it saw."""
    grid = InProcessGrid(client_app(rr, noise_floor), CLIENTS)
    sfsl = SFSLFedSubAvg(
        "emb",
        fraction_train=PER_ROUND / CLIENTS,
        min_train_nodes=PER_ROUND,
        min_available_nodes=CLIENTS,
        sampling_seed=7,
        **strategy,
    )
    view = ServerView()
    view.attach(sfsl)
    initial = ArrayRecord(
        {
            "emb": Array(np.zeros((ROWS, WIDTH), np.float32)),
            "fc": Array(np.zeros(2, np.float32)),
        }
    )
    sfsl.start(grid=grid, initial_arrays=initial, num_rounds=rounds)
    return sfsl, view
