"""SFSL: a non-finite update leaves the round, never clipped to ±clip (issue 24 item 4)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.families.sfsl.perturb import RRParams
from flwr_fsl.mods import PerturbedRows
from flwr_fsl.strategies import SFSLFedSubAvg
from tests.families.sfsl.test_strategy import (
    MODEL,
    PAPER,
    counts,
    paper_grid,
    real_rows,
    reference,
    row_delta,
)

BAD = 2


def _app(tensor: str, value: float) -> ClientApp:
    """test_strategy's app, whose client BAD trains one non-finite value into ``tensor``."""

    def rows(context: Context):  # type: ignore[no-untyped-def]
        pid = int(context.node_config["partition-id"])
        return real_rows(pid), counts(pid)

    # p1 = 1, p2 = 0: every client uploads exactly its real rows (seen = real_rows).
    app = ClientApp(mods=[PerturbedRows("emb", rows=rows, rr=RRParams.symmetric(1, 0)).mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        arrays = {k: a.numpy().copy() for k, a in msg.content["arrays"].items()}
        for r in real_rows(pid):
            arrays["emb"][r] += row_delta(pid, int(r)).astype(np.float32)
        arrays["fc"] += np.float32(pid)
        if pid == BAD:
            target = (
                arrays[tensor].reshape(-1) if tensor == "fc" else arrays["emb"][real_rows(pid)[0]]
            )
            target[0] = value
        metrics = MetricRecord({"num-examples": 10 * (pid + 1)})
        content = {
            "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            "metrics": metrics,
        }
        return Message(RecordDict(content), reply_to=msg)  # type: ignore[arg-type]

    return app


@pytest.mark.parametrize(("tensor", "value"), [("fc", np.inf), ("emb", -np.inf), ("fc", np.nan)])
def test_a_non_finite_update_drops_the_client_and_the_rest_is_exact(
    tensor: str, value: float
) -> None:
    grid = paper_grid(_app(tensor, value), 5)
    strategy = SFSLFedSubAvg(
        "emb", min_available_nodes=5, fraction_evaluate=0.0, max_count=100.0, **PAPER
    )
    initial = ArrayRecord({k: Array(v.copy()) for k, v in MODEL.items()})
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=1)
    bad_node = list(grid.get_node_ids())[BAD]
    assert set(strategy.dropped[1]) == {bad_node} and not strategy.failed_rounds
    assert "not finite" in strategy.dropped[1][bad_node]
    seen = {p: real_rows(p) for p in range(5)}
    emb, fc = reference([0, 1, 3, 4], seen)
    np.testing.assert_allclose(result.arrays["emb"].numpy(), emb, atol=1e-5)
    np.testing.assert_allclose(result.arrays["fc"].numpy(), fc, atol=1e-5)
