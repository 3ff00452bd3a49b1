"""Run the real two-server SSA strategy + mods on the in-process grid and record S0's view.

Shared by the SSA attack modules (``test_ssa_*.py``); not a test module itself. S0's view is
what the ServerApp legitimately holds:

- the reconstructed aggregate of every round: per element the sum ``Σ c·Δ`` and the count word
  ``Σ c`` over the clients that chose it (S0 reconstructs both to divide);
- the participation it chose (the round's accepted clients);
- every reply it received (train replies: DPF keys, no metrics; evaluate replies: Flower's
  metrics, ``num-examples`` included).

The test-side truth (each client's chosen coordinates and values per round, its weight) is
recorded by a spy mod inside the client, beside the real ``ssa_mod``: the attacks never read it,
only compare with it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from numpy.typing import NDArray

from flwr_fsl.core.errors import RunFailedError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.two_server import LeadServer, SSARound
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.mods import ssa_mod, topk_mod
from flwr_fsl.strategies import SecureFedSubAvg
from flwr_fsl.submodel.layout import FlatLayout
from flwr_fsl.submodel.mega_layout import MegaLayout
from flwr_fsl.testing import InProcessGrid

DeltaFn = Callable[[int, int, NDArray[np.float32]], NDArray[np.float32]]
"""``(partition id, server round, current flat model) -> the client's flat update``."""


def random_deltas(size: int) -> DeltaFn:
    """A fresh pseudo-random update per client and round (top-k sets unrelated across rounds)."""

    def delta(pid: int, server_round: int, model: NDArray[np.float32]) -> NDArray[np.float32]:
        rng = np.random.default_rng([pid, server_round, 7])
        return rng.normal(size=size).astype(np.float32)

    return delta


def distinct_weights(n: int, seed: int = 0) -> list[int]:
    """``n`` unequal sample counts in [50, 5000) (what Dirichlet partitions look like)."""
    rng = np.random.default_rng(seed)
    return [int(w) for w in rng.choice(np.arange(50, 5000), size=n, replace=False)]


@dataclass
class S0View:
    """What S0 holds after the run, and the test-side truth beside it.

    Attributes
    ----------
    nodes : list[int]
        The grid's node ids, in partition order (S0 knows the node ids).
    rounds : list[SSARound]
        Each round's outcome: ``accepted`` participation and the reconstructed
        ``result.sums`` / ``result.counts`` (S0's view).
    evaluate_weights : dict[int, dict[int, float]]
        Round -> node -> ``num-examples`` of its evaluate reply (S0's view; empty when
        federated evaluation is off).
    replies : list[Message]
        Every reply S0 received (S0's view).
    chosen : dict[int, dict[int, NDArray[np.int64]]]
        Round -> node -> the coordinates the client uploaded (truth, never read by an attack).
    values : dict[int, dict[int, NDArray[np.float64]]]
        Round -> node -> the values of those coordinates (truth).
    metrics : dict[int, dict[int, dict[str, float]]]
        Round -> node -> the metrics its train function returned (truth).
    """

    nodes: list[int]
    rounds: list[SSARound] = field(default_factory=list)
    evaluate_weights: dict[int, dict[int, float]] = field(default_factory=dict)
    replies: list[Message] = field(default_factory=list)
    chosen: dict[int, dict[int, NDArray[np.int64]]] = field(default_factory=dict)
    values: dict[int, dict[int, NDArray[np.float64]]] = field(default_factory=dict)
    metrics: dict[int, dict[int, dict[str, float]]] = field(default_factory=dict)

    def participation(self) -> NDArray[np.float64]:
        """``(rounds, clients)`` 0/1: who was in each round's aggregate (S0 chose it)."""
        index = {node: i for i, node in enumerate(self.nodes)}
        out = np.zeros((len(self.rounds), len(self.nodes)))
        for r, outcome in enumerate(self.rounds):
            for node in outcome.accepted:
                out[r, index[node]] = 1.0
        return out

    def counts(self) -> NDArray[np.float64]:
        """``(rounds, elements)``: the count word S0 reconstructed per element and round."""
        rows = []
        for outcome in self.rounds:
            assert outcome.result.counts is not None
            rows.append(np.asarray(outcome.result.counts, np.float64).reshape(-1))
        return np.stack(rows)


class RecordingGrid(InProcessGrid):
    """The in-process grid, keeping every reply S0 receives."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.received: list[Message] = []

    def pull_messages(self, message_ids: Any) -> Any:
        """Pull as the grid does, and keep a copy of what S0 got."""
        replies = list(super().pull_messages(message_ids))
        self.received.extend(replies)
        return replies


def _truth_mod(view: S0View, layout: FlatLayout | MegaLayout) -> Callable[..., Message]:
    """A client-side spy between ``ssa_mod`` and ``topk_mod``: records the sparse update."""
    from flwr_fsl.core.records import decode_update

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        reply = call_next(msg, context)
        if msg.metadata.message_type == "train" and reply.has_content():
            rnd = int(msg.content["config"]["server-round"])
            received = {k: v.numpy() for k, v in msg.content["arrays"].items()}
            update = decode_update(reply.content, received, 1.0)
            elements = layout.elements(update)
            node = int(context.node_id)
            view.chosen.setdefault(rnd, {})[node] = np.asarray(elements.indices).copy()
            view.values.setdefault(rnd, {})[node] = np.asarray(elements.values).reshape(-1).copy()
            metrics = next(iter(reply.content.metric_records.values()))
            view.metrics.setdefault(rnd, {})[node] = {k: float(v) for k, v in metrics.items()}  # type: ignore[arg-type]
        return reply

    return mod


def attack_app(
    view: S0View,
    weights: list[int],
    delta: DeltaFn,
    model: Mapping[str, NDArray[np.float32]],
    train_loss: Callable[[int, int], float] | None = None,
    groups: tuple[str, ...] = (),
) -> ClientApp:
    """A ClientApp with ``[ssa_mod, truth spy, topk_mod]`` whose train adds ``delta``.

    With ``groups`` (``SecureFedSubAvg(groups=...)``) the spy records mega-element ids
    (:class:`~flwr_fsl.submodel.mega_layout.MegaLayout`), the element space S0 sees.

    Train and evaluate replies report the client's ``num-examples`` (its weight) as Flower
    apps do; train also reports a ``train_loss`` (``train_loss(pid, round)``).
    """
    layout = FlatLayout.of(dict(model))
    spy_layout = MegaLayout.of(dict(model), groups) if groups else layout
    app = ClientApp(mods=[ssa_mod, _truth_mod(view, spy_layout), topk_mod])
    loss = train_loss or (lambda pid, rnd: 0.1 + 0.01 * pid + 0.001 * rnd)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        arrays = {k: v.numpy() for k, v in msg.content["arrays"].items()}
        flat = np.concatenate([arrays[name].reshape(-1) for name in layout.names])
        new = flat + delta(pid, rnd, flat.astype(np.float32))
        out, offset = {}, 0
        for name in layout.names:
            size = arrays[name].size
            out[name] = Array(
                new[offset : offset + size].reshape(arrays[name].shape).astype(np.float32)
            )
            offset += size
        metrics = MetricRecord({"num-examples": weights[pid], "train_loss": loss(pid, rnd)})
        return Message(RecordDict({"arrays": ArrayRecord(out), "metrics": metrics}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        metrics = MetricRecord({"num-examples": weights[pid], "eval_loss": 0.5})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return app


def run_topk(
    weights: list[int],
    *,
    rounds: int,
    fraction_train: float,
    model: Mapping[str, NDArray[np.float32]],
    delta: DeltaFn,
    topk_ratio: float,
    seed: int = 0,
    node_config: Mapping[str, Any] | None = None,
    train_loss: Callable[[int, int], float] | None = None,
    error_feedback: bool = False,
    run_fails: bool = False,
    **strategy_kwargs: Any,
) -> tuple[S0View, SecureFedSubAvg]:
    """Run ``SecureFedSubAvg`` + ``ssa_mod`` with an in-process S1; return S0's view.

    ``error_feedback`` is ``topk_mod``'s setting (the README's drop-in turns it on).
    ``run_fails``: every round is expected to produce nothing, so ``start`` raises
    :class:`~flwr_fsl.core.errors.RunFailedError` (asserted here).
    ``strategy_kwargs`` go to :class:`SecureFedSubAvg` (its defaults otherwise, except the
    fixed-point range: ``max_abs = 1e6`` so every ``weight * value`` fits).
    """
    n = len(weights)
    key = SealingKeyPair.generate()
    view_nodes = [1000 + i for i in range(n)]  # InProcessGrid's node ids
    view = S0View(nodes=view_nodes)
    extra = dict(node_config or {})
    grid = RecordingGrid(
        attack_app(view, weights, delta, model, train_loss, strategy_kwargs.get("groups", ())),
        n,
        {"ssa-helper-fingerprint": key.fingerprint, "topk-error-feedback": error_feedback},
        node_config_fn=lambda i: {"partition-id": i, "num-partitions": n, **extra},
    )
    assert list(grid.get_node_ids()) == view_nodes
    kwargs: dict[str, Any] = {
        "fraction_train": fraction_train,
        "min_available_nodes": n,
        "min_train_nodes": 2,
        "sampling_seed": seed,
        "max_abs": 1e6,
        **strategy_kwargs,
    }
    strategy = SecureFedSubAvg(InProcessHelper(keypair=key), topk_ratio=topk_ratio, **kwargs)
    lead: LeadServer = strategy.aggregation.lead
    real = lead.aggregate

    def spy(params: Any, uploads: Any) -> SSARound:
        outcome = real(params, uploads)
        view.rounds.append(outcome)
        return outcome

    lead.aggregate = spy  # type: ignore[method-assign]
    initial = ArrayRecord({k: Array(np.asarray(v).copy()) for k, v in model.items()})
    try:
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds)
        assert not run_fails, "the run was expected to fail (no round produced a result)"
    except RunFailedError:
        if not run_fails:
            raise
    view.replies = grid.received
    for reply in grid.received:
        if reply.metadata.message_type == "evaluate" and reply.has_content():
            rnd = reply.metadata.group_id
            metrics = next(iter(reply.content.metric_records.values()))
            view.evaluate_weights.setdefault(int(rnd), {})[reply.metadata.src_node_id] = float(
                metrics["num-examples"]  # type: ignore[arg-type]
            )
    return view, strategy
