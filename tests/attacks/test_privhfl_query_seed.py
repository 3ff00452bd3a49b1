"""Attack: the server recomputes which private images a querier mixed, and with which λ.

**Before this test** the querier expanded its private images and selected its queries with the
seed the server put in the ``generate`` record (``PhaseConfig.seed``). A server that knows a
node's number of private images — the ``num-examples`` of its local-phase reply — re-runs
:func:`~flwr_fsl.families.privhfl.queries.expand` and
:func:`~flwr_fsl.families.privhfl.queries.select` on placeholders of that count with that seed
and reads off every query's ``(i, j, lam)``: which two private images it mixes and how; with a
public partition (as in simulation) the query images themselves, which the secure arm exists to
hide. Now the querier draws its own seed
(:meth:`~flwr_fsl.families.privhfl.mod.PrivHFLClient.query_seed`: ``os.urandom`` by default).

**Setting.** The real :class:`~flwr_fsl.families.privhfl.strategy.PrivHFL` strategy
(its defaults: ``answering="secure"``, the DCF comparison) and
:class:`~flwr_fsl.families.privhfl.mod.PrivHFLClient` at its defaults on an
:class:`~flwr_fsl.testing.InProcessGrid` that records what the server sends and receives: 4
nodes with 24 private images each, a mixup pool of 45, 10 random queries per querier and
round, 3 rounds: 120 queries. The attacker reads only the server's view (the records it sent,
the replies it got), and is handed each node's number of private images: a default client's
``local`` reply no longer carries its ``num-examples`` (``privhfl-report-train-metrics``), but a
server may know it anyway (a public partition scheme, as in simulation), and a stronger
attacker makes the default's figure safer. The old client reports it, as every client did
before issue 20, and the attacker reads it there. The scorer decodes each query's true
``(i, j, lam)`` from the querier's query images against its private images (the attacker sees
neither).

**Figures.** Default: the server names the right pair for 0-2 of the 120 queries (chance: one
pair in ``24 * 23 / 2 = 276`` per query, 0.43 expected; the test allows 5, which chance
exceeds with probability below 1e-5). The old behaviour (a client that uses the server's seed,
as the code did before issue 20): 120 of 120 pairs and ``lam`` exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from torch import nn

from flwr_fsl.families.privhfl.mod import (
    PRIVHFL_KEY,
    REPORT_TRAIN_METRICS_KEY,
    PhaseConfig,
    PrivateData,
    PrivHFLClient,
)
from flwr_fsl.families.privhfl.queries import MIXUP_LAMBDAS, expand, select
from flwr_fsl.families.privhfl.strategy import PrivHFL
from flwr_fsl.models import set_torch_threads
from flwr_fsl.testing import InProcessGrid
from tests.attacks.seeding import seed_fresh_streams

SHAPE = (1, 8, 8)
CLASSES = 4
PRIVATE = 24
ROUNDS, NODES, QUERIES = 3, 4, 10
PAIRS = PRIVATE * (PRIVATE - 1) // 2

Query = tuple[int, int, float]  # (lower index, higher index, weight of the lower one)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    set_torch_threads(1)


@pytest.fixture(autouse=True)
def _seeded(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """One reproducible run per test: the OS randomness (query seeds, ``Sk_*`` seeds, DCF keys)
    keyed by the test's name (:func:`~tests.attacks.seeding.seed_fresh_streams`)."""
    seed_fresh_streams(monkeypatch, f"{__name__}::{request.node.name}", os_random=True)


class ServerViewGrid(InProcessGrid):
    """An in-process grid that keeps every (message sent, reply) pair: the server's view."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.view: list[tuple[Message, Message]] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        sent = list(messages)
        ids = list(super().push_messages(sent))
        for msg, msg_id in zip(sent, ids, strict=True):
            for reply in self._replies.get(msg_id, []):
                self.view.append((msg, reply))
        return ids


def _blobs(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    protos = np.random.default_rng(99).random((CLASSES, *SHAPE)).astype(np.float32)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=n).astype(np.int64)
    x = protos[y] + rng.normal(0, 0.35, size=(n, *SHAPE)).astype(np.float32)
    return np.clip(x, 0, 1).astype(np.float32), y


def _model(context: Context) -> nn.Sequential:
    torch.manual_seed(int(context.node_config["partition-id"]))
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def _data(context: Context) -> PrivateData:
    x, y = _blobs(PRIVATE, seed=int(context.node_config["partition-id"]))
    return PrivateData(x, y, *_blobs(20, seed=1000))


class ServerSeededClient(PrivHFLClient):
    """The behaviour before issue 20: the query seed is the server's ``PhaseConfig.seed`` (and
    the ``local`` reply reports ``num-examples``: :func:`_run` opts its nodes in)."""

    def query_seed(self, context: Context, config: PhaseConfig, data: PrivateData) -> int:
        return config.seed


class QuerySets:
    """Scoring only: the query set each querier made (a client mod; the attacker never sees it)."""

    def __init__(self) -> None:
        self.sets: dict[tuple[int, int], np.ndarray] = {}

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        reply = call_next(msg, context)
        record = msg.content.config_records[PRIVHFL_KEY]
        if record["phase"] == "generate":
            x = context.state.array_records["fsl.privhfl.query-set"]["x"].numpy()
            self.sets[int(record["server-round"]), context.node_id] = x
        return reply


def _canonical(i: int, j: int, lam: float) -> Query:
    lam = round(float(lam), 1)
    return (i, j, lam) if i < j else (j, i, round(1.0 - lam, 1))


# -- the attacker: the server's view only -----------------------------------------------------
def server_guess(
    view: list[tuple[Message, Message]], known_size: int | None = None
) -> dict[tuple[int, int], list[Query]]:
    """Per (round, querier): the queries a server predicts from the seed it sent.

    It reads each node's ``num-examples`` from its local-phase reply where the reply carries
    it, else takes ``known_size`` (its outside knowledge), and each ``generate`` record it
    sent; it re-runs the querier's expansion and selection on placeholder images.
    """
    sizes: dict[int, int] = {}
    guesses: dict[tuple[int, int], list[Query]] = {}
    for msg, reply in view:
        config = PhaseConfig.from_record(msg.content.config_records[PRIVHFL_KEY])
        node = msg.metadata.dst_node_id
        if config.phase == "local" and not reply.has_error():
            metrics = list(reply.content.metric_records.values())
            if metrics:
                sizes[node] = int(metrics[0]["num-examples"])
        if config.phase == "generate":
            size = sizes.get(node, known_size)
            assert size is not None, "the attacker must know the node's data size"
            placeholders = np.zeros((size, *SHAPE), dtype=np.float32)
            pool = expand(placeholders, config.expansion, config.pool_size, config.seed)
            k = min(config.num_queries, len(pool))
            chosen = select(config.selection, k, len(pool), seed=config.seed)
            guesses[config.server_round, node] = [
                _canonical(int(pool.first[c]), int(pool.second[c]), float(pool.lam[c]))
                for c in chosen
            ]
    return guesses


# -- the scorer's truth -----------------------------------------------------------------------
def decode_query(query: np.ndarray, private: np.ndarray) -> Query:
    """The ``(i, j, lam)`` a mixup query is made of, found among every pair and ``lam``."""
    flat = private.reshape(len(private), -1)
    q = query.reshape(-1)
    best: tuple[float, Query] | None = None
    for lam in MIXUP_LAMBDAS:
        lam32 = np.float32(lam)
        mixed = lam32 * flat[:, None, :] + (np.float32(1) - lam32) * flat[None, :, :]
        err = np.abs(mixed - q).max(axis=-1)
        np.fill_diagonal(err, np.inf)
        i, j = np.unravel_index(int(np.argmin(err)), err.shape)
        if best is None or err[i, j] < best[0]:
            best = (float(err[i, j]), _canonical(int(i), int(j), lam))
    assert best is not None and best[0] < 1e-5, "every query is a mixup of two private images"
    return best[1]


def _run(client_type: type[PrivHFLClient], known_size: int | None = None) -> tuple[int, int, int]:
    """Run the rounds; return (queries, pairs the server named right, pair and lam right)."""
    sets = QuerySets()
    app = ClientApp(mods=[sets])
    client_type(_model, _data, num_classes=CLASSES, image_shape=SHAPE).register(app)
    old = client_type is ServerSeededClient  # every client reported num-examples before
    grid = ServerViewGrid(
        app, NODES, node_config_fn=lambda i: {"partition-id": i, REPORT_TRAIN_METRICS_KEY: old}
    )
    strategy = PrivHFL(
        expansion="mixup", selection="random", pool_size=45,
        num_queries=QUERIES, local_epochs=1, retrain_epochs=1, num_classes=CLASSES,
        image_shape=SHAPE, min_available_nodes=NODES, fraction_evaluate=0.0,
        evaluate_local=False, sampling_seed=0,
    )  # fmt: skip
    assert strategy.answering == "secure" and strategy.secure_config.comparison == "dcf"
    strategy.run(grid, num_rounds=ROUNDS)
    assert not any(strategy.dropped.values()), strategy.dropped
    guesses = server_guess(grid.view, known_size)
    assert set(guesses) == set(sets.sets)
    total = pair_hits = exact_hits = 0
    for (rnd, node), queries in sets.sets.items():
        private = _data(grid.context(node)).x_train
        truth = [decode_query(q, private) for q in queries]
        for guessed, true in zip(guesses[rnd, node], truth, strict=True):
            total += 1
            pair_hits += guessed[:2] == true[:2]
            exact_hits += guessed == true
    return total, pair_hits, exact_hits


def test_server_cannot_recompute_the_mixup_at_default() -> None:
    total, pairs, exact = _run(PrivHFLClient, known_size=PRIVATE)  # (not in its replies)
    assert total == ROUNDS * NODES * QUERIES
    chance = total / PAIRS
    print(f"default: server names {pairs}/{total} pairs, {exact} with lam (chance {chance:.2f})")
    assert pairs <= 5  # chance: 0.43 expected; P(>= 6) < 1e-5


def test_old_server_chosen_seed_gives_every_pair_and_lambda() -> None:
    total, pairs, exact = _run(ServerSeededClient)
    print(f"server's seed: server names {pairs}/{total} pairs, {exact} with lam")
    assert pairs == exact == total == ROUNDS * NODES * QUERIES
