"""S0 as a curious server: can it tell who chose each coordinate from the counts it reconstructs?

Issue 8 item 1. S0 reconstructs, per coordinate, ``count_j = Σ_{i chose j} c_i``. If it also
knows each client's weight ``c_i`` (Flower's ``num-examples``, sent in the clear), ``count_j`` is
a subset sum of known numbers and S0 decodes the chooser set of nearly every coordinate. The
secure strategies therefore send no weight or metric in the clear: ``c_i`` rides only in the
payload's count word. These tests run the real pipeline (``SecureFedSubAvg`` + ``ssa_mod`` on
the in-process grid), record everything S0 receives, and play the subset-sum decoder:

* given the true weights it recovers the chooser sets (so the decoder is a real attack, and
  this is exactly what the clear ``num-examples`` used to give S0);
* S0's recorded view contains no per-client weight, and with the weights it can only guess (a
  random assignment of the same multiset to the clients) the decoder does no better than
  chance.

What remains, stated in the README: the per-coordinate total weight itself.
"""

from __future__ import annotations

import itertools

import numpy as np
from flwr.app import Context, Message

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.two_server import LeadServer, SSARound
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.mods import ssa_mod, topk_mod
from flwr_fsl.strategies import SecureFedSubAvg
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import make_app, model_record

# Weights with distinct subset sums (as unequal Dirichlet partitions mostly have).
WEIGHTS = [3, 7, 19, 41, 83, 167]


def weight_mod(msg: Message, context: Context, call_next):  # type: ignore[no-untyped-def]
    """Give each client its own (unequal) sample count before ssa_mod encodes the reply."""
    reply = call_next(msg, context)
    if reply.has_content():
        pid = int(context.node_config["partition-id"])
        next(iter(reply.content.metric_records.values()))["num-examples"] = WEIGHTS[pid]
    return reply


class RecordingGrid(InProcessGrid):
    """The in-process grid, keeping every reply S0 receives (S0's whole client-facing view)."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.received: list[Message] = []

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        replies = list(super().pull_messages(message_ids))
        self.received.extend(replies)
        return replies


def run_round() -> tuple[RecordingGrid, SSARound, dict[int, int]]:
    key = SealingKeyPair.generate()
    n = len(WEIGHTS)
    run_config = {"ssa-helper-fingerprint": key.fingerprint, "topk-error-feedback": False}
    grid = RecordingGrid(make_app([ssa_mod, weight_mod, topk_mod]), n, run_config)
    strategy = SecureFedSubAvg(
        InProcessHelper(keypair=key),
        topk_ratio=0.3,
        min_available_nodes=n,
        fraction_evaluate=0.0,
        frac_bits=32,
        max_abs=1e3,
    )
    outcomes: list[SSARound] = []
    lead: LeadServer = strategy.aggregation.lead
    real = lead.aggregate

    def spy(params, uploads):  # type: ignore[no-untyped-def]
        outcomes.append(real(params, uploads))
        return outcomes[-1]

    lead.aggregate = spy  # type: ignore[method-assign]
    strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    node_weight = {node: WEIGHTS[i] for i, node in enumerate(grid.get_node_ids())}
    return grid, outcomes[0], node_weight


def true_choosers(grid: RecordingGrid) -> dict[int, frozenset[int]]:
    """Coordinate -> clients that chose it, from the clients' own top-k (test-side truth)."""
    # The recorded replies are DPF keys (no indices); recompute each client's top-k set.
    from flwr_fsl.submodel import TopKConfig, sparsify
    from flwr_fsl.submodel.layout import FlatLayout
    from tests.flower_apps import MODEL, node_delta

    layout = FlatLayout.of(MODEL)
    k = int(np.ceil(0.3 * layout.size))
    out: dict[int, set[int]] = {}
    for pid, node in enumerate(grid.get_node_ids()):
        deltas = {
            name: node_delta(pid, 1, name, v.shape)
            for name, v in MODEL.items()
            if np.issubdtype(v.dtype, np.floating)
        }
        update, _ = sparsify(deltas, TopKConfig(count=k, error_feedback=False))
        indices, _ = layout.flatten_update(update)
        for j in indices.tolist():
            out.setdefault(j, set()).add(node)
    return {j: frozenset(s) for j, s in out.items()}


def subset_sum_decoder(counts: np.ndarray, weights: dict[int, int]) -> dict[int, frozenset[int]]:
    """For each touched coordinate, the client set whose weights sum to its count (if unique)."""
    sums: dict[int, list[frozenset[int]]] = {}
    nodes = list(weights)
    for r in range(1, len(nodes) + 1):
        for subset in itertools.combinations(nodes, r):
            sums.setdefault(sum(weights[c] for c in subset), []).append(frozenset(subset))
    guess = {}
    for j in np.flatnonzero(counts > 0).tolist():
        found = sums.get(round(float(counts[j])), [])
        if len(found) == 1:
            guess[j] = found[0]
    return guess


def recovery(guess: dict[int, frozenset[int]], truth: dict[int, frozenset[int]]) -> float:
    return sum(guess.get(j) == s for j, s in truth.items()) / len(truth)


def test_s0_cannot_decode_who_chose_what_without_the_weights() -> None:
    grid, outcome, node_weight = run_round()
    truth = true_choosers(grid)
    counts = outcome.result.counts
    assert counts is not None
    assert set(np.flatnonzero(counts > 0).tolist()) == set(truth)  # the aggregate is exact

    # The attack is real: with the weights in hand S0 recovers the chooser sets.
    assert recovery(subset_sum_decoder(counts, node_weight), truth) > 0.95

    # S0's view has no per-client weight: no reply carries a MetricRecord or any number.
    train = [m for m in grid.received if m.metadata.message_type == "train"]
    assert train and all(not m.content.metric_records for m in train)
    assert all(not m.content.array_records for m in train)

    # With the weights unknown, the best S0 can do is guess which client has which weight.
    rng = np.random.default_rng(0)
    nodes = list(node_weight)
    rates = []
    for _ in range(200):
        guessed = dict(
            zip(nodes, rng.permutation(list(node_weight.values())).tolist(), strict=True)
        )
        rates.append(recovery(subset_sum_decoder(counts, guessed), truth))
    chance = np.mean(rates)
    # A random assignment is right with probability 1/6! = 0.14%; partial credit comes only
    # from coordinates whose choosers happen to keep their weights: far from the 95% above.
    assert chance < 0.25, chance


def test_the_metrics_record_of_a_plaintext_reply_is_what_leaked() -> None:
    # Contrast: a plaintext FedSubAvg reply carries num-examples in the clear, which is what
    # made the decoder above work against the earlier secure mode.
    app = make_app([weight_mod, topk_mod])
    grid = RecordingGrid(app, 2, {"topk-error-feedback": False, "topk-ratio": 0.3})
    from flwr_fsl.strategies import FedSubAvg

    FedSubAvg(min_available_nodes=2, fraction_evaluate=0.0).start(
        grid=grid, initial_arrays=model_record(), num_rounds=1
    )
    train = [m for m in grid.received if m.metadata.message_type == "train"]
    seen = {int(next(iter(m.content.metric_records.values()))["num-examples"]) for m in train}
    assert seen == set(WEIGHTS[:2])
