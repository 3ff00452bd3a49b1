"""SFSLFedSubAvg + PerturbedRows on the in-process grid: PSU, randomized response and the
count-weighted subset SecAgg round give the plaintext count-weighted average over the rows
each client really uploaded; dropouts; memo persistence; what the server sees.

These run Niu's protocol as the paper specifies it (:data:`PAPER`: ``dp=None,
weighted=True``), which clients accept only with a noise floor of 0 (:func:`paper_grid`); the
DP defaults are in ``test_dp.py`` and ``tests/attacks/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.secagg.records import SECAGG_KEY
from flwr_fsl.families.sfsl.perturb import RRParams
from flwr_fsl.mods import PerturbedRows
from flwr_fsl.strategies import SFSLFedSubAvg
from flwr_fsl.testing import InProcessGrid

M, D = 40, 3
PAPER = {"dp": None, "weighted": True}
"""Niu's protocol as specified (no noise, count-weighted): the strategy's explicit option."""
PAPER_NODE = {"fsl-min-noise-multiplier": 0.0}
"""A client that accepts the paper's noiseless rounds (node config)."""


def paper_grid(app: ClientApp, n: int, **kwargs: Any) -> InProcessGrid:
    """An in-process grid whose nodes accept noiseless rounds (floor 0)."""

    def node(i: int) -> dict[str, Any]:
        return {"partition-id": i, "num-partitions": n, **PAPER_NODE}

    return InProcessGrid(app, n, node_config_fn=node, **kwargs)


MODEL = {"emb": np.zeros((M, D), np.float32), "fc": np.ones(5, np.float32)}


def real_rows(pid: int) -> np.ndarray:
    return np.unique(np.random.default_rng(pid).choice(M, size=6 + pid, replace=False))


def counts(pid: int) -> np.ndarray:
    return np.arange(1, real_rows(pid).size + 1, dtype=np.float64) + pid


def row_delta(pid: int, row: int) -> np.ndarray:
    return np.random.default_rng([pid, row]).normal(size=D)


def make_app(
    rr: RRParams,
    seen: dict[int, np.ndarray],
    memo_dir: Path | None = None,
    outer: tuple[Any, ...] = (),
    inner: tuple[Any, ...] = (),
) -> ClientApp:
    def rows(context: Context):  # type: ignore[no-untyped-def]
        pid = int(context.node_config["partition-id"])
        return real_rows(pid), counts(pid)

    mod = PerturbedRows("emb", rows=rows, rr=rr, memo_dir=memo_dir)

    def spy(msg, context, call_next):  # type: ignore[no-untyped-def]
        reply = call_next(msg, context)
        record = reply.content.config_records.get(SECAGG_KEY) if reply.has_content() else None
        if record is not None and "perturbed" in record:
            seen[int(context.node_config["partition-id"])] = np.frombuffer(
                record["perturbed"], "<i8"
            )
        return reply

    app = ClientApp(mods=[*outer, spy, mod.mod, *inner])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        arrays = {k: a.numpy().copy() for k, a in msg.content["arrays"].items()}
        for r in real_rows(pid):
            arrays["emb"][r] += row_delta(pid, int(r)).astype(np.float32)
        arrays["fc"] += np.float32(pid)
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                    "metrics": MetricRecord({"num-examples": 10 * (pid + 1)}),
                }
            ),
            reply_to=msg,
        )

    return app


def run(rr: RRParams, n: int = 5, drop=None, memo_dir=None, **kwargs):  # type: ignore[no-untyped-def]
    seen: dict[int, np.ndarray] = {}
    grid = paper_grid(make_app(rr, seen, memo_dir), n, drop_nodes=drop)
    strategy = SFSLFedSubAvg(
        "emb", min_available_nodes=n, fraction_evaluate=0.0, max_count=100.0, **PAPER, **kwargs
    )
    initial = ArrayRecord({k: Array(v.copy()) for k, v in MODEL.items()})
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=1)
    return strategy, result, seen


def reference(pids, seen):  # type: ignore[no-untyped-def]
    num = np.zeros((M, D))
    den = np.zeros(M)
    for pid in pids:
        rows, c = real_rows(pid), counts(pid)
        for r, v in zip(rows, c, strict=True):
            if r in seen[pid]:
                num[r] += v * row_delta(pid, int(r))
                den[r] += v
    emb = np.zeros((M, D))
    touched = den > 0
    emb[touched] = num[touched] / den[touched, None]
    weights = np.array([10 * (p + 1) for p in pids], dtype=np.float64)
    fc = 1 + float((weights * np.array(pids)).sum() / weights.sum())
    return emb, fc


@pytest.mark.parametrize(
    "rr",
    [RRParams.symmetric(1, 0), RRParams.symmetric(15 / 16, 1 / 16), RRParams.symmetric(1, 1)],
    ids=["CPP1", "CPP2", "CPP5"],
)
def test_sfsl_equals_the_plaintext_count_weighted_average(rr: RRParams) -> None:
    strategy, result, seen = run(rr)
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}}
    emb, fc = reference(range(5), seen)
    np.testing.assert_allclose(result.arrays["emb"].numpy(), emb, atol=1e-5)
    np.testing.assert_allclose(result.arrays["fc"].numpy(), fc, atol=1e-5)
    union = np.unique(np.concatenate([real_rows(p) for p in range(5)]))
    assert strategy.reports[1]["union"] == union.size and strategy.reports[1]["fpr"] == 0.0
    if rr.p2 == 1.0:  # CPP5: everybody uploads the whole union
        assert all(np.array_equal(s, union) for s in seen.values())


def test_a_client_lost_after_sharing_is_unmasked_away() -> None:
    def drop(node: int, msg: Message) -> bool:
        record = msg.content.config_records.get(SECAGG_KEY)
        return (
            node == 1002
            and record is not None
            and record.get("instance") == "rows"
            and record.get("phase") == "train"
        )

    strategy, result, seen = run(RRParams.symmetric(7 / 8, 1 / 8), drop=drop)
    assert set(strategy.dropped[1]) == {1002}
    emb, fc = reference([0, 1, 3, 4], seen)
    np.testing.assert_allclose(result.arrays["emb"].numpy(), emb, atol=1e-5)
    np.testing.assert_allclose(result.arrays["fc"].numpy(), fc, atol=1e-5)


def test_bloom_mode_psu(tmp_path: Path) -> None:
    strategy, result, seen = run(
        RRParams.symmetric(1, 0), bloom_fpr=1e-3, expected_union=60, partitions=4
    )
    assert strategy.failed_rounds == {}
    emb, _ = reference(range(5), seen)
    np.testing.assert_allclose(result.arrays["emb"].numpy(), emb, atol=1e-5)


def test_permanent_answers_survive_a_restart(tmp_path: Path) -> None:
    rr = RRParams(0.5, 0.5, 1.0, 0.0)  # S'' = the permanent "yes" answers
    _, _, first = run(rr, memo_dir=tmp_path)
    _, _, again = run(rr, memo_dir=tmp_path)  # fresh Context.state: only the files remain
    for pid in first:
        np.testing.assert_array_equal(first[pid], again[pid])
    assert len(list(tmp_path.glob("node-*.rr"))) == 5


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="table"):
        SFSLFedSubAvg("")
    with pytest.raises(ConfigurationError, match="bloom_fpr"):
        SFSLFedSubAvg("emb", bloom_fpr=2.0)
    with pytest.raises(ConfigurationError, match="reconstruction_threshold"):
        SFSLFedSubAvg("emb", reconstruction_threshold=1)


def test_gamma_quantized_rows_stay_within_one_level_of_the_average() -> None:
    strategy, result, seen = run(RRParams.symmetric(1, 0), quantization_levels=2**15, clip=4.0)
    assert strategy.failed_rounds == {}
    emb, fc = reference(range(5), seen)
    unit = 8.0 / (2**15 - 1)
    np.testing.assert_allclose(result.arrays["emb"].numpy(), emb, atol=unit + 1e-6)
    np.testing.assert_allclose(result.arrays["fc"].numpy(), fc, atol=1e-5)
