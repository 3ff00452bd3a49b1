"""S0 names the weight key: ``weighted_by_key="train_loss"`` reads each client's train loss.

The attack (issue 20): the weight key travels to the clients in the train message
(``fsl.weight-key``) and ``ssa_mod`` used whatever metric it named as the count word. S0 asked
for ``train_loss`` and read every participant's exact train loss from the count words (a
coordinate one client chose carries that client's loss alone; the others are subset sums,
:func:`~tests.attacks.solvers.summand_generators` gives the round's losses back).

Now a client uses as weight only ``num-examples`` or a key its own node config allows
(``fsl-weight-keys``): by default it refuses the round, before training, with one line naming
the key, and S0 learns no loss. A client whose node config allows ``train_loss`` keeps the old
behaviour, which the second test asserts (the documented leak of that option). At default
settings S0 cannot even ask: ``weighted_by_key`` is refused without ``weighted=True``.

Setting: 8 clients, all in every round, 3 rounds, a 200-coordinate model, top-k 10%.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.privacy import NODE_WEIGHT_KEYS_KEY
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.strategies import SecureFedSubAvg
from tests.attacks.solvers import summand_generators
from tests.attacks.ssa_harness import S0View, distinct_weights, random_deltas, run_topk

CLIENTS, ROUNDS, SIZE, RATIO = 8, 3, 200, 0.1
MODEL = {"w": np.zeros(SIZE, np.float32)}


def train_loss(pid: int, server_round: int) -> float:
    """Each client's (secret) train loss in each round: distinct, with six decimals."""
    return round(0.4 + 0.1371 * pid + 0.0519 * server_round + 0.000113 * pid * pid, 6)


def _run(
    node_config: dict[str, str] | None = None, run_fails: bool = False
) -> tuple[S0View, SecureFedSubAvg]:
    return run_topk(
        distinct_weights(CLIENTS, seed=4),
        rounds=ROUNDS,
        fraction_train=1.0,
        model=MODEL,
        delta=random_deltas(SIZE),
        topk_ratio=RATIO,
        node_config=node_config,
        train_loss=train_loss,
        weighted=True,
        weighted_by_key="train_loss",
        run_fails=run_fails,
    )


def test_clients_refuse_a_weight_key_their_node_config_does_not_allow() -> None:
    view, strategy = _run(run_fails=True)  # no round trains: start raises RunFailedError
    assert not view.metrics  # refused before training: no client trained
    assert not view.rounds  # nothing was aggregated, so no count word exists
    for rnd in range(1, ROUNDS + 1):
        reasons = list(strategy.dropped[rnd].values())
        assert len(reasons) == CLIENTS
        for reason in reasons:
            assert "weight key 'train_loss'" in reason and NODE_WEIGHT_KEYS_KEY in reason
            assert "\n" not in reason.strip()
    # S0's whole view holds no loss: no reply carries a metric, no error text a number
    # other than the node config's key list.
    assert all(not m.content.metric_records for m in view.replies if m.has_content())
    losses = {f"{train_loss(p, r):.4f}"[:5] for p in range(CLIENTS) for r in range(1, 4)}
    for message in view.replies:
        text = message.error.reason if message.has_error() else ""
        assert not any(value in text for value in losses)
        assert not re.search(r"\d\.\d", text)


def test_a_node_config_that_allows_the_key_gives_s0_every_loss() -> None:
    view, strategy = _run({NODE_WEIGHT_KEYS_KEY: "train_loss"})
    assert strategy.failed_rounds == {} and not any(strategy.dropped.values())
    index = {node: pid for pid, node in enumerate(view.nodes)}
    read = total = 0
    for rnd, outcome in enumerate(view.rounds, start=1):
        recovered = summand_generators(np.asarray(outcome.result.counts), tolerance=1e-5)
        for node in outcome.accepted:
            total += 1
            read += any(abs(v - train_loss(index[node], rnd)) < 1e-5 for v in recovered)
    assert total == CLIENTS * ROUNDS and read >= 0.95 * total, (read, total)  # issue: 60/60


def test_default_strategy_cannot_name_a_weight_key() -> None:
    with pytest.raises(ConfigurationError, match="weighted_by_key='train_loss'"):
        SecureFedSubAvg(InProcessHelper(), topk_ratio=0.1, weighted_by_key="train_loss")
