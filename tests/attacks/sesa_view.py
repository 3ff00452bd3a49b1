"""The curious SESA server's view over many rounds, recorded from the real strategy and mods.

:func:`run_rounds` trains a tiny MLP with :class:`~flwr_fsl.families.sesa.strategy.SesaFedAvg`
and :func:`~flwr_fsl.families.sesa.mod.sesa_mod` on :class:`~flwr_fsl.testing.InProcessGrid`
and records, per round, exactly what the server holds after decoding: the survivors ``U3``,
each survivor's number of shards ``K_i`` (:meth:`SesaServer.contributors`, what its message
sizes show) and the decoded count word of every shard (``Σ c`` over the survivors that chose
it) and of the group every client holds (``Σ c`` over all survivors). The truth (each client's
secret shard choice, read out of its ``Context.state``) is recorded beside it for scoring only.

:func:`shard_posterior` is the Bayes-optimal per-round guess of who chose which shard from the
count words alone (unit weights), used by both SESA attack modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.families.sesa import mod as sesa_mod_module
from flwr_fsl.families.sesa.mod import SesaNodeState, sesa_mod
from flwr_fsl.families.sesa.strategy import SesaFedAvg
from flwr_fsl.testing import InProcessGrid

HIDDEN, INPUTS, OUTPUTS, SHARDS = 8, 4, 2, 4
MODEL = {
    "fc1.weight": np.linspace(-1, 1, HIDDEN * INPUTS, dtype=np.float32).reshape(HIDDEN, INPUTS),
    "fc1.bias": np.zeros(HIDDEN, np.float32),
    "fc2.weight": np.linspace(1, -1, OUTPUTS * HIDDEN, dtype=np.float32).reshape(OUTPUTS, HIDDEN),
    "fc2.bias": np.zeros(OUTPUTS, np.float32),
}
MAX_WEIGHT = 100.0


@dataclass
class RoundView:
    """One round as the server holds it, and (for scoring only) the clients' secret choices.

    Attributes
    ----------
    survivors : tuple[int, ...]
        ``U3`` (node ids).
    shards : dict[int, int]
        Node -> its number of hidden shards ``K_i`` (message sizes).
    shard_weights : numpy.ndarray
        ``(S,)``: the decoded count word ``Σ c`` of every hidden shard.
    total_weight : float
        The decoded count word of the group every client holds: ``Σ c`` over ``U3``.
    truth : dict[int, frozenset[int]]
        Node -> the hidden shards it chose (not the server's: read from the node's state).
    """

    survivors: tuple[int, ...]
    shards: dict[int, int]
    shard_weights: np.ndarray
    total_weight: float
    truth: dict[int, frozenset[int]] = field(default_factory=dict)


@dataclass
class Run:
    """A run's views and the clients' fixed properties (node ids in grid order)."""

    nodes: list[int]
    rates: dict[int, float]
    examples: dict[int, int]
    views: list[RoundView]


def _app(examples: Sequence[int], mods: Sequence[Any] = ()) -> ClientApp:
    app = ClientApp(mods=[*mods, sesa_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        rng = np.random.default_rng([pid, rnd])
        arrays = msg.content["arrays"]
        new = {
            k: a.numpy() + (0.05 * rng.normal(size=a.shape)).astype(np.float32)
            for k, a in arrays.items()
        }
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v) for k, v in new.items()}),
                    "metrics": MetricRecord({"num-examples": int(examples[pid])}),
                }
            ),
            reply_to=msg,
        )

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        metrics = MetricRecord({"accuracy": 0.5, "num-examples": int(examples[pid])})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return app


def seed_shard_choices(patch: pytest.MonkeyPatch, run_seed: int) -> None:
    """Draw every client's shard choice from a generator seeded by ``(run_seed, node, round)``.

    Still a fresh, independent choice every round, as with the OS's randomness, but the run is
    reproducible: the tests' statistical bounds are checked on one known run instead of failing
    at random in CI.

    Parameters
    ----------
    patch : pytest.MonkeyPatch
        Where the patch of ``sesa_mod``'s ``choose_shards`` lives (and ends).
    run_seed : int
        Seeds every draw of the run.
    """
    choose = sesa_mod_module.choose_shards
    calls: dict[int, int] = {}

    def seeded(node: int, *args: Any, **kwargs: Any) -> Any:
        calls[node] = calls.get(node, 0) + 1
        kwargs["rng"] = np.random.default_rng([run_seed, node, calls[node]])
        return choose(node, *args, **kwargs)

    patch.setattr(sesa_mod_module, "choose_shards", seeded)


def run_rounds(
    rates: Sequence[float],
    examples: Sequence[int],
    *,
    rounds: int,
    fraction_train: float,
    seed: int = 0,
    mods: Sequence[Any] = (),
    **strategy_kwargs: Any,
) -> Run:
    """Run ``rounds`` SESA rounds on ``len(rates)`` nodes; return the server's recorded view.

    ``strategy_kwargs`` go to :class:`SesaFedAvg` (left out: the library defaults, except the
    sampling knobs, ``max_weight = 100`` and ``max_clients = 64``); ``mods`` run before
    ``sesa_mod`` (a spy).
    """
    n = len(rates)
    grid = InProcessGrid(
        _app(examples, mods),
        n,
        node_config_fn=lambda i: {"partition-id": i, "num-partitions": n, "width-rate": rates[i]},
    )
    strategy_kwargs.setdefault("max_weight", MAX_WEIGHT)
    strategy_kwargs.setdefault("max_clients", 64)
    strategy = SesaFedAvg(
        fraction_train=fraction_train,
        min_train_nodes=2,
        min_available_nodes=n,
        num_shards=SHARDS,
        sampling_seed=seed,
        **strategy_kwargs,
    )
    views: list[RoundView] = []
    aggregate = strategy.server.aggregate
    codec = strategy.codec

    def curious_aggregate(*args: Any, **kwargs: Any) -> Any:
        totals, server = aggregate(*args, **kwargs)
        layout = args[4] if len(args) > 4 else kwargs["layout"]
        counts = [codec.decode(t)[:, g.length] for g, t in zip(layout.groups, totals, strict=True)]
        hidden = next(i for i, g in enumerate(server.params.groups) if g.shards == SHARDS)
        common = next(i for i, g in enumerate(server.params.groups) if g.shards == 1)
        slots = server.contributors()
        views.append(
            RoundView(
                survivors=server.survivors,
                shards={j: slots[j][hidden] for j in server.survivors},
                shard_weights=np.asarray(counts[hidden], dtype=np.float64),
                total_weight=float(counts[common][0]),
                truth={j: _choice(grid, j) for j in server.survivors},
            )
        )
        return totals, server

    strategy.server.aggregate = curious_aggregate  # type: ignore[method-assign]
    record = ArrayRecord({k: Array(v.copy()) for k, v in MODEL.items()})
    strategy.start(grid=grid, initial_arrays=record, num_rounds=rounds)
    nodes = list(grid.get_node_ids())
    pids = {node: int(grid.context(node).node_config["partition-id"]) for node in nodes}
    return Run(
        nodes,
        {node: float(rates[pids[node]]) for node in nodes},
        {node: int(examples[pids[node]]) for node in nodes},
        views,
    )


def _choice(grid: InProcessGrid, node: int) -> frozenset[int]:
    """A node's secret shard choice this round (scoring only: the server never reads it)."""
    raw = grid.context(node).state.config_records["fsl.sesa.client-state"]["bytes"]
    return frozenset(SesaNodeState.from_bytes(raw).selection[0])


# -- the unit-weight decoder: exact Bayes posterior of each choice given the count words --------
def shard_posterior(counts: Sequence[int], shards: Sequence[int], num_shards: int) -> np.ndarray:
    """``P(shard n ∈ client i's choice | the per-shard counts, every K_i)``, shape ``(N, S)``.

    Each client picks ``K_i`` of ``S`` shards uniformly and independently (the protocol); the
    server sees how many clients chose each shard and every ``K_i``. Exact: the other clients'
    count distribution over the lattice ``{0..N}^S`` by convolution (clients with the same
    ``K_i`` are exchangeable, so it is computed once per ``K_i``).
    """
    s, n = num_shards, len(shards)
    size = n + 1
    target = tuple(int(c) for c in counts)

    def add(dist: np.ndarray, k: int) -> np.ndarray:
        opts = list(combinations(range(s), k))
        out = np.zeros_like(dist)
        for opt in opts:
            src = tuple(slice(0, size - 1) if a in opt else slice(None) for a in range(s))
            dst = tuple(slice(1, size) if a in opt else slice(None) for a in range(s))
            out[dst] += dist[src] / len(opts)
        return out

    by_k: dict[int, np.ndarray] = {}
    for k in sorted(set(shards)):
        others = np.zeros((size,) * s)
        others[(0,) * s] = 1.0
        rest = list(shards)
        rest.remove(k)
        for j in rest:
            others = add(others, j)
        row = np.zeros(s)
        total = 0.0
        for opt in combinations(range(s), k):
            cell = tuple(t - (1 if a in opt else 0) for a, t in enumerate(target))
            w = 0.0 if min(cell) < 0 else float(others[cell])
            total += w
            for a in opt:
                row[a] += w
        by_k[k] = row / total if total > 0 else np.full(s, k / s)
    return np.stack([by_k[k] for k in shards])


def membership_scores(
    guesses: Sequence[tuple[int, np.ndarray, frozenset[int]]], num_shards: int
) -> tuple[float, float, int]:
    """Accuracy of thresholded guesses, the prior-only baseline, and the pairs scored.

    ``guesses`` holds ``(K_i, P(n chosen) per shard, the true choice)`` for clients with
    ``K_i < S`` (a client holding every shard has no choice to hide). The baseline is the best
    guess from ``K_i`` alone: every shard "in" if ``K_i / S > 1/2``, else "out" (at ``1/2`` both
    are right half the time).
    """
    right = base = 0.0
    pairs = 0
    for k, prob, truth in guesses:
        held = np.array([n in truth for n in range(num_shards)])
        right += float(np.sum((prob > 0.5) == held))
        base += num_shards * max(k / num_shards, 1 - k / num_shards)
        pairs += num_shards
    return right / pairs, base / pairs, pairs


# -- the weighted decoder: per-shard subset sums joined under every client's shard count --------
def decode_assignment(
    view: RoundView, weights: dict[int, float], *, tolerance: float, limit: int = 2
) -> list[dict[int, frozenset[int]]]:
    """Every assignment of shards to survivors consistent with the round's count words.

    Shard ``n``'s chooser set must be a subset of ``U3`` whose ``weights`` sum to its count word
    (:func:`tests.attacks.solvers.subset_sum`), and each survivor must appear in exactly
    ``K_i`` of them. Stops after ``limit`` assignments (one is an exact decode).
    """
    from tests.attacks.solvers import subset_sum

    survivors = list(view.survivors)
    w = [weights[j] for j in survivors]
    candidates = [
        [frozenset(survivors[i] for i in sub) for sub in subset_sum(total, w, tolerance=tolerance)]
        for total in view.shard_weights
    ]
    found: list[dict[int, frozenset[int]]] = []
    left = {j: view.shards[j] for j in survivors}
    chosen: list[frozenset[int]] = []

    def walk(n: int) -> None:
        if len(found) >= limit:
            return
        if n == len(candidates):
            if all(v == 0 for v in left.values()):
                found.append(
                    {j: frozenset(m for m, s in enumerate(chosen) if j in s) for j in survivors}
                )
            return
        rest = len(candidates) - n
        if any(v > rest for v in left.values()):
            return
        for sub in candidates[n]:
            if all(left[j] > 0 for j in sub):
                for j in sub:
                    left[j] -= 1
                chosen.append(sub)
                walk(n + 1)
                chosen.pop()
                for j in sub:
                    left[j] += 1

    walk(0)
    return found


def simulated_count_leak(
    survivors: int, rounds: int, seed: int = 0
) -> dict[int, tuple[float, float]]:
    """Per ``K_i``: the posterior's accuracy and the ``K_i``-only baseline, counts simulated.

    The counts of ``rounds`` rounds of ``survivors`` clients (capacities 1, 1/2, 1/4 in turn,
    ``S = 4``) are drawn as the protocol draws the choices, without running it (the protocol
    decodes exactly these counts: ``test_sesa_shard_least_squares.py``), so larger rounds
    than the Flower tests run are affordable.
    """
    rng = np.random.default_rng(seed)
    ks = [(SHARDS, SHARDS // 2, SHARDS // 4)[i % 3] for i in range(survivors)]
    by_k: dict[int, list[tuple[int, np.ndarray, frozenset[int]]]] = {}
    for _ in range(rounds):
        truth = [frozenset(rng.choice(SHARDS, k, replace=False).tolist()) for k in ks]
        counts = [sum(n in t for t in truth) for n in range(SHARDS)]
        post = shard_posterior(counts, ks, SHARDS)
        for i, k in enumerate(ks):
            if k < SHARDS:
                by_k.setdefault(k, []).append((k, post[i], truth[i]))
    return {k: membership_scores(g, SHARDS)[:2] for k, g in sorted(by_k.items())}


if __name__ == "__main__":  # python -m tests.attacks.sesa_view: the docs' scaling figures
    for n, r in ((12, 400), (24, 80), (36, 20)):
        for k, (acc, base) in simulated_count_leak(n, r).items():
            print(f"{n} survivors, K_i = {k} of {SHARDS}: {acc:.3f} right vs {base:.3f} from K_i")
