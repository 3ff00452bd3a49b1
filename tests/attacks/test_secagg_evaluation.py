"""Federated evaluation under SecAggFedAvg hands the server what the secure round hides.

Flower's evaluate replies carry each client's metrics and ``num-examples`` in the clear. The
curious server's own ``evaluate_metrics_aggr_fn`` sees every reply.

- default: ``fraction_evaluate=0.0``; no evaluate message reaches any client in 4 rounds, so the
  server reads 0/8 ``num-examples`` (chance: 0/8, it never sees one);
- ``fraction_evaluate > 0`` is refused at construction without ``plaintext_evaluation=True``;
- with ``plaintext_evaluation=True`` (documented leak) the server reads 8/8 exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.strategies import SecAggFedAvg
from tests.attacks.secagg_server import FIRST_NODE, NODES, run_curious

SECRET = [37, 120, 64, 250, 18, 91, 173, 305]
LOSSES = [0.5] * NODES


def _spy(kinds: list[str]):  # type: ignore[no-untyped-def]
    def mod(msg, context, call_next):  # type: ignore[no-untyped-def]
        kinds.append(msg.metadata.message_type)
        return call_next(msg, context)

    return mod


def _curious(read: dict[int, Any]):  # type: ignore[no-untyped-def]
    def aggregate(contents: list[RecordDict], key: str) -> MetricRecord:
        for content in contents:
            metrics = next(iter(content.metric_records.values()))
            read[len(read)] = metrics["num-examples"]
        return MetricRecord()

    return aggregate


def test_by_default_no_evaluate_message_is_sent() -> None:
    kinds: list[str] = []
    read: dict[int, Any] = {}
    strategy, _ = run_curious(
        SECRET, LOSSES, 4, 1, mods=[_spy(kinds)], evaluate_metrics_aggr_fn=_curious(read)
    )
    assert strategy.fraction_evaluate == 0.0
    assert kinds and set(kinds) == {"train"}
    assert read == {}  # 0/8 num-examples read, as a server that sees no reply


def test_fraction_evaluate_is_refused_without_the_opt_in() -> None:
    with pytest.raises(ConfigurationError, match="plaintext_evaluation=True"):
        SecAggFedAvg(fraction_evaluate=1.0)


def test_plaintext_evaluation_hands_the_server_every_num_examples() -> None:
    read: dict[int, Any] = {}
    run_curious(
        SECRET, LOSSES, 1, 1, fraction_evaluate=1.0, plaintext_evaluation=True,
        min_evaluate_nodes=NODES, evaluate_metrics_aggr_fn=_curious(read),
    )  # fmt: skip
    assert sorted(read.values()) == sorted(SECRET)  # 8/8, the documented leak
    assert FIRST_NODE == 1000 and len(np.unique(list(read.values()))) == NODES
