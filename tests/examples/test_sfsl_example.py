"""examples/sfsl-movielens on the in-process grid: nine arms in one experiment, one ClientApp.

Four MovieLens users, two rounds, every arm (fedavg, fedsubavg, sfsl-cpp1..5, ssa-psr,
secagg) from the same table and client sample. Every arm aggregates every round with no drop;
the arms that compute the same model agree up to fixed-point rounding — SFSL under CPP1
(S'' = S) and CPP5 (S'' = U: the extra rows carry count 0) and SSA/PSR with FedSubAvg (each
row count-weighted, count 1 per user, over the same real rows), SecAgg with dense FedAvg —
and every SFSL arm starts with a fresh randomized-response memo.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.experiment import ExperimentResult
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.strategies import SFSLFedSubAvg
from flwr_fsl.submodel.perturb import PermanentMemo
from flwr_fsl.testing import InProcessGrid
from tests.prepared_data import require_prepared

APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "sfsl-movielens"
USERS = 4
ROUNDS = 2
MAX_ROWS = 16

Example = tuple[ModuleType, ModuleType, ModuleType]


@pytest.fixture(scope="module")
def example() -> Iterator[Example]:
    require_prepared("movielens")
    sys.path.insert(0, str(APP_DIR))
    try:
        from sfsl_movielens import client_app, server_app, task

        yield task, client_app, server_app
    finally:
        sys.path.remove(str(APP_DIR))


def _config(**extra: Any) -> dict[str, Any]:
    return {
        "num-server-rounds": ROUNDS,
        "local-epochs": 2,
        "max-rows": MAX_ROWS,
        "min-nodes": USERS,
        **extra,
    }


def _run(example: Example, **extra: Any) -> tuple[ExperimentResult, InProcessGrid]:
    _, client_app, server_app = example
    key = SealingKeyPair.generate()
    config = _config(**{"ssa-helper-fingerprint": key.fingerprint, **extra})
    grid = InProcessGrid(client_app.app, USERS, config)
    result = server_app.run_experiment(grid, config, helper=InProcessHelper(keypair=key))
    return result, grid


@pytest.fixture(scope="module")
def everything(example: Example) -> tuple[ExperimentResult, InProcessGrid]:
    return _run(example)


def _union(task: ModuleType) -> np.ndarray:
    settings = task.Settings.from_run_config(_config())
    return np.unique(
        np.concatenate([task.user_data(u, MAX_ROWS, 0.2, settings.seed).rows for u in range(USERS)])
    )


def _memo(grid: InProcessGrid, node: int) -> PermanentMemo:
    return PermanentMemo.from_bytes(grid.context(node).state["fsl.sfsl.memo"]["bytes"])


def test_every_arm_aggregates_every_round(
    example: Example, everything: tuple[ExperimentResult, InProcessGrid]
) -> None:
    task, _, _ = example
    result, _ = everything
    assert [r.arm.key for r in result.runs] == list(task.ARMS)
    for run in result.runs:
        assert run.record.aggregated_rounds == list(range(1, ROUNDS + 1)), run.arm.key
        assert run.strategy.failed_rounds == {}, run.arm.key
        assert all(not d for d in run.strategy.dropped.values()), run.arm.key
        for r in run.record.rounds:
            assert r.clients == USERS and not r.failed and not r.dropped, run.arm.key
            # Federated evaluation of every round: MSE, one pooled AUC, the clients' time.
            assert {"mse", "auc", "client-s"} <= set(r.evaluate_metrics), run.arm.key
            assert 0.0 < r.evaluate_metrics["auc"] < 1.0
            assert r.evaluate_metrics["client-s"] > 0.0


def test_equivalent_arms_compute_the_same_model(
    example: Example, everything: tuple[ExperimentResult, InProcessGrid]
) -> None:
    task, _, server_app = example
    result, _ = everything
    table = {run.arm.key: run.arrays[task.TABLE] for run in result.runs}
    # Row-count-weighted averages of the same real rows (count 1 per user): SFSL with keep = 1
    # (CPP1: S'' = S; CPP5: S'' = U, the rows of U \ S go up as zero with count 0) and SSA/PSR
    # equal FedSubAvg up to their fixed point (24 fractional bits).
    for arm in ("sfsl-cpp1", "sfsl-cpp5", "ssa-psr"):
        np.testing.assert_allclose(table[arm], table["fedsubavg"], atol=1e-6, err_msg=arm)
        assert result.arm(arm).record.max_abs_diff < 1e-6
    # Dense SecAgg is FedAvg on the whole table (each coordinate over every client by weight).
    np.testing.assert_allclose(table["secagg"], table["fedavg"], atol=1e-6)
    # FedAvg dilutes a row's update by the clients that do not hold it: another model.
    assert np.max(np.abs(table["fedavg"] - table["fedsubavg"])) > 1e-3
    for arm in ("sfsl-cpp1", "sfsl-cpp5"):
        assert result.arm(arm).record.final(server_app.AUC) == pytest.approx(
            result.arm("fedsubavg").record.final(server_app.AUC), abs=1e-4
        )


def test_sfsl_cpp1_counts_the_rows_fedsubavg_counts(
    example: Example, everything: tuple[ExperimentResult, InProcessGrid]
) -> None:
    task, _, _ = example
    result, _ = everything
    union = _union(task)
    width = task.Settings().dim + 1
    size = task.num_items() * width
    sfsl, plain = result.arm("sfsl-cpp1"), result.arm("fedsubavg")
    for rnd in range(1, ROUNDS + 1):
        # Both update exactly the union of the users' row sets: every union row has a
        # participant with a positive count in SFSL, and FedSubAvg touches the same rows.
        report = sfsl.strategy.reports[rnd]
        assert report["union"] == report["rows-updated"] == union.size
        assert report["fpr"] == 0.0
        touched = plain.result.train_metrics_clientapp[rnd]["touched-fraction"]
        assert touched * size == pytest.approx(union.size * width)
        assert sfsl.result.train_metrics_clientapp[rnd]["sfsl-clients"] == USERS
    # Rows outside the union never move; every union row moved in both arms.
    initial = task.initial_table(task.Settings.from_run_config(_config()))
    for run in (sfsl, plain):
        moved = np.flatnonzero(np.any(run.arrays[task.TABLE] != initial, axis=1))
        assert np.array_equal(moved, union)


def test_cpp1_perturbed_set_is_the_real_set(example: Example) -> None:
    # CPP1 (keep 1, flip 0): the permanent answers are exactly "yes" on S, "no" on U \ S, so
    # S'' = S and SFSL's per-row weights are FedSubAvg's (count 1 per user holding the row).
    task, _, _ = example
    result, grid = _run(example, arms="fedsubavg,sfsl-cpp1")
    union = _union(task)
    seed = task.Settings().seed
    for i, node in enumerate(grid.get_node_ids()):
        rows = task.user_data(i, MAX_ROWS, 0.2, seed).rows
        memo = _memo(grid, node)
        np.testing.assert_array_equal(memo.yes, rows)
        np.testing.assert_array_equal(memo.no, np.setdiff1d(union, rows))
    assert result.arm("sfsl-cpp1").record.max_abs_diff < 1e-6


def test_each_sfsl_arm_starts_with_a_fresh_memo(
    example: Example, everything: tuple[ExperimentResult, InProcessGrid]
) -> None:
    # The last SFSL arm is CPP5 (p1 = p2 = 1: every index answered "yes"). Had CPP1..CPP4's
    # memo leaked into it, the "no" answers they drew (permanent) would still be there.
    task, client_app, _ = example
    _, grid = everything
    union = _union(task)
    for node in grid.get_node_ids():
        memo = _memo(grid, node)
        assert memo.no.size == 0
        np.testing.assert_array_equal(memo.yes, union)
        rr = grid.context(node).state[client_app.RR_STATE]
        assert rr[client_app.CPP_KEY] == "cpp5"
        assert str(rr[client_app.TRAINING_ID]).startswith("sfsl-movielens/sfsl-cpp5@")


def test_stock_sfsl_strategy_uses_the_run_configs_cpp(example: Example) -> None:
    # Without ArmSFSL the perturb message carries no config: the clients use `sfsl-cpp`.
    task, client_app, _ = example
    config = _config(**{"sfsl-cpp": "cpp5", "num-server-rounds": 1})
    grid = InProcessGrid(client_app.app, USERS, config)
    strategy = SFSLFedSubAvg(task.TABLE, min_available_nodes=USERS, fraction_evaluate=0.0)
    initial = task.initial_table(task.Settings.from_run_config(config))
    strategy.start(
        grid=grid, initial_arrays=ArrayRecord({task.TABLE: Array(initial)}), num_rounds=1
    )
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}}
    union = _union(task)
    for node in grid.get_node_ids():
        np.testing.assert_array_equal(_memo(grid, node).yes, union)


def test_comparison_table_has_every_arm_and_its_epsilons(
    example: Example, everything: tuple[ExperimentResult, InProcessGrid]
) -> None:
    task, _, server_app = example
    result, _ = everything
    text, rows = server_app.comparison_table(result)
    assert [r["arm"] for r in rows] == list(task.ARMS)
    assert result.record.extra["comparison"] == rows
    eps = {r["arm"]: (r["eps1"], r["eps_inf"]) for r in rows}
    assert eps["sfsl-cpp1"] == ("inf", "inf")
    assert eps["sfsl-cpp2"] == ("2.02", "2.71")  # ln(p5/p6) with p5 = 113/128, p6 = 15/128
    assert eps["sfsl-cpp5"] == ("0.00", "0.00")
    assert eps["fedavg"] == eps["secagg"] == ("n/a", "n/a")
    by_arm = {r["arm"]: r for r in rows}
    # Row-sparse plaintext uploads are far smaller than the dense table; SSA/PSR downloads
    # two PSR answers instead of the table.
    assert by_arm["fedsubavg"]["up_bytes"] < by_arm["fedavg"]["up_bytes"] / 10
    assert by_arm["ssa-psr"]["down_bytes"] < by_arm["fedavg"]["down_bytes"]
    for line, arm in zip(text.splitlines()[2:], task.ARMS, strict=True):
        assert line.startswith(arm)
    assert "aggregate only (two non-colluding servers)" in text


def test_auc_and_pooled_evaluation(example: Example) -> None:
    task, _, server_app = example
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 60).astype(float)  # many ties
    labels = rng.integers(0, 2, 60)
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = [1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)]
    assert task.auc(scores, labels) == pytest.approx(sum(pairs) / len(pairs))
    assert task.auc([1.0, 2.0], [1, 1]) is None
    replies = [
        RecordDict(
            {
                "metrics": MetricRecord(
                    {
                        "mse": 1.0 + i,
                        "mean-only-mse": 2.0,
                        "scores": [float(s) for s in scores[30 * i : 30 * (i + 1)]],
                        "labels": [int(v) for v in labels[30 * i : 30 * (i + 1)]],
                        "num-examples": 30 * (i + 1),
                        "client-s": 0.5 * (i + 1),
                    }
                )
            }
        )
        for i in range(2)
    ]
    pooled = server_app.evaluate_metrics(replies, "num-examples")
    assert pooled["auc"] == pytest.approx(task.auc(scores, labels))
    assert pooled["mse"] == pytest.approx((30 * 1.0 + 60 * 2.0) / 90)
    assert pooled["client-s"] == pytest.approx(0.75)
    assert pooled["ratings"] == 60


def test_settings_validation(example: Example) -> None:
    task, _, _ = example
    with pytest.raises(ValueError, match="arms must be"):
        task.Settings.from_run_config({"arms": "fedavg,sfsl-cpp9"})
    with pytest.raises(ValueError, match="arms must be"):
        task.Settings.from_run_config({"arms": "fedavg,fedavg"})
    with pytest.raises(ValueError, match="sfsl-cpp"):
        task.Settings.from_run_config({"sfsl-cpp": "cpp0"})
    assert task.rr_params("cpp2").epsilon_permanent == pytest.approx(math.log(15))
