"""The curious SecAgg server of the attack tests: the real strategy, and what it holds.

:func:`run_curious` runs :class:`~flwr_fsl.strategies.SecAggFedAvg` with ``secagg_mod`` on the
in-process grid and keeps, for every round, the unmasked sum the server computes
(``SecAggPhases.unmask``'s return value: the server's own view) and the survivors ``U3`` it
unmasked. :func:`released` decodes the words the attacks read with the layout the server
itself sent. Nothing here reads a client's state or reply beyond what the strategy receives.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod
from numpy.typing import NDArray

from flwr_fsl.families.secagg import strategy as secagg_strategy
from flwr_fsl.mods import secagg_mod
from flwr_fsl.strategies import SecAggFedAvg
from flwr_fsl.testing import InProcessGrid

SHAPE = (4,)
NODES = 8
FIRST_NODE = 1000
"""``InProcessGrid``'s first node id (partition ``i`` is node ``1000 + i``)."""


@dataclass
class View:
    """What the server kept: per round, the unmasked sum and who is in it."""

    totals: dict[int, NDArray[np.uint64]] = field(default_factory=dict)
    survivors: dict[int, tuple[int, ...]] = field(default_factory=dict)


@contextmanager
def watching(view: View) -> Iterator[None]:
    """Record what ``SecAggPhases.unmask`` returns to the server (its unmasked sum)."""
    original = secagg_strategy.SecAggPhases.unmask

    def unmask(self: Any, grid: Any, state: Any, server: Any) -> NDArray[np.uint64]:
        total = original(self, grid, state, server)
        view.totals[state.server_round] = total.copy()
        view.survivors[state.server_round] = tuple(server.survivors)
        return total

    secagg_strategy.SecAggPhases.unmask = unmask  # type: ignore[method-assign]
    try:
        yield
    finally:
        secagg_strategy.SecAggPhases.unmask = original  # type: ignore[method-assign]


def app(
    num_examples: Sequence[int], losses: Sequence[float], mods: Sequence[Mod] = ()
) -> ClientApp:
    """A ClientApp whose clients hold secret ``num-examples`` and a constant ``train-loss``.

    The update is fresh every round; the two metrics are the same in every round (a client's
    data does not change), which is what least squares over rounds exploits.
    """
    client = ClientApp(mods=[*mods, secagg_mod])

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        w = msg.content["arrays"]["w"].numpy()
        step = np.random.default_rng([pid, rnd]).normal(scale=0.1, size=w.shape)
        metrics = MetricRecord({"num-examples": int(num_examples[pid]), "train-loss": losses[pid]})
        content = RecordDict({"arrays": ArrayRecord({"w": Array(w + step.astype(w.dtype))})})
        content["metrics"] = metrics
        return Message(content, reply_to=msg)

    @client.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        metrics = MetricRecord({"num-examples": int(num_examples[pid]), "eval-loss": losses[pid]})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return client


def run_curious(
    num_examples: Sequence[int],
    losses: Sequence[float],
    rounds: int,
    seed: int,
    mods: Sequence[Mod] = (),
    **kwargs: Any,
) -> tuple[SecAggFedAvg, View]:
    """Run SecAggFedAvg (``fraction_train=0.6`` of :data:`NODES`) as the curious server."""
    grid = InProcessGrid(app(num_examples, losses, mods), NODES)
    strategy = SecAggFedAvg(
        fraction_train=0.6, min_available_nodes=NODES, sampling_seed=seed, **kwargs
    )
    view = View()
    initial = ArrayRecord({"w": Array(np.zeros(SHAPE, np.float32))})
    with watching(view):
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds)
    return strategy, view


def released(strategy: SecAggFedAvg, view: View, word: str) -> NDArray[np.float64]:
    """Decode one released word per round: ``"weight"`` or ``"metric:<name>"`` (its sum)."""
    layout = strategy.settings.layout({"w": SHAPE}, ("w",))
    if word == "weight":
        index = layout.model_length
    else:
        index = layout.model_length + 1 + 2 * layout.metrics.index(word.split(":", 1)[1])
    return np.array([layout.codec.decode(view.totals[r])[index] for r in sorted(view.totals)])


def participation(view: View) -> NDArray[np.float64]:
    """``(rounds, NODES)``: 1 where a node's vector is in that round's sum (``U3``)."""
    rows = []
    for r in sorted(view.totals):
        row = np.zeros(NODES)
        for node in view.survivors[r]:
            row[node - FIRST_NODE] = 1.0
        rows.append(row)
    return np.array(rows)
