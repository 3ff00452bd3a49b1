"""Federated evaluation under SesaFedAvg hands the server what the secure round hides.

Flower's evaluate replies carry each client's metrics and ``num-examples`` in the clear; the
curious server's own ``evaluate_metrics_aggr_fn`` sees every reply. With every client's
weight known, ``weighted=True`` count words decode as subset sums without any least squares
(``test_sesa_weights_subset_sum.py``).

- default: ``fraction_evaluate=0.0``; no evaluate message reaches any client in 3 rounds, so
  the server reads 0 of 8 ``num-examples`` (chance: 0 of 8, it never sees one);
- ``fraction_evaluate > 0`` is refused at construction without ``plaintext_evaluation=True``;
- with ``plaintext_evaluation=True`` (documented leak) it reads 8 of 8 exactly.

The real :class:`~flwr_fsl.families.sesa.strategy.SesaFedAvg` and ``sesa_mod`` on
``InProcessGrid``.
"""

from __future__ import annotations

from typing import Any

import pytest
from flwr.app import MetricRecord, RecordDict

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.strategies import SesaFedAvg
from tests.attacks.sesa_view import run_rounds

RATES = [1.0, 0.5, 0.25, 0.5, 0.25, 1.0, 0.25, 0.5]
SECRET = [37, 12, 64, 95, 18, 91, 73, 30]


def _spy(kinds: list[str]):  # type: ignore[no-untyped-def]
    def mod(msg, context, call_next):  # type: ignore[no-untyped-def]
        kinds.append(msg.metadata.message_type)
        return call_next(msg, context)

    return mod


def _curious(read: list[Any]):  # type: ignore[no-untyped-def]
    def aggregate(contents: list[RecordDict], key: str) -> MetricRecord:
        for content in contents:
            read.append(next(iter(content.metric_records.values()))["num-examples"])
        return MetricRecord()

    return aggregate


def test_by_default_no_evaluate_message_is_sent() -> None:
    kinds: list[str] = []
    read: list[Any] = []
    run = run_rounds(
        RATES, SECRET, rounds=3, fraction_train=1.0, privacy=2, mods=[_spy(kinds)],
        evaluate_metrics_aggr_fn=_curious(read),
    )  # fmt: skip
    assert len(run.views) == 3
    assert kinds and set(kinds) == {"train"}
    assert read == []  # 0 of 8 num-examples read


def test_fraction_evaluate_is_refused_without_the_opt_in() -> None:
    with pytest.raises(ConfigurationError, match="plaintext_evaluation=True"):
        SesaFedAvg(fraction_evaluate=1.0)


def test_plaintext_evaluation_hands_the_server_every_num_examples() -> None:
    read: list[Any] = []
    run_rounds(
        RATES, SECRET, rounds=1, fraction_train=1.0, privacy=2, fraction_evaluate=1.0,
        plaintext_evaluation=True, min_evaluate_nodes=len(RATES),
        evaluate_metrics_aggr_fn=_curious(read),
    )  # fmt: skip
    assert sorted(read) == sorted(SECRET)  # 8 of 8: the documented leak
