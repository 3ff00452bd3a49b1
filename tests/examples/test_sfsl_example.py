"""examples/sfsl-movielens on the in-process grid: nine arms in one experiment, one ClientApp.

Four MovieLens users, two rounds, every arm (fedavg, fedsubavg, sfsl-cpp1..5, ssa-psr,
secagg) from the same table and client sample. Every arm aggregates every round with no drop;
the arms that compute the same model agree up to fixed-point rounding — SFSL under CPP1
(S'' = S) and CPP5 (S'' = U: the extra rows carry count 0) and SSA/PSR with FedSubAvg (each
row count-weighted, count 1 per user, over the same real rows), SecAgg with dense FedAvg —
and every SFSL arm keeps its own randomized-response memo (``PerturbedRows(session_key=
"training-id")``), drawn with its own CPP.
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
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from flwr_fsl.core.errors import RunFailedError
from flwr_fsl.core.privacy import PrivacyAccount
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.experiment import ExperimentResult
from flwr_fsl.families.sfsl.perturb import PermanentMemo
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.strategies import SFSLFedSubAvg
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


def _memo(client_app: ModuleType, grid: InProcessGrid, node: int, session: str) -> PermanentMemo:
    memo = client_app.perturbed_rows.memo(grid.context(node), session)
    assert memo is not None, session
    return memo


def _sessions(client_app: ModuleType, grid: InProcessGrid, node: int) -> dict[str, str]:
    """Each SFSL arm's training id, from the node's last one (``name/arm@nonce``)."""
    last = str(grid.context(node).state[client_app.USER_STATE][client_app.TRAINING_ID])
    nonce = last.rsplit("@", 1)[1]
    return {f"sfsl-{cpp}": f"sfsl-movielens/sfsl-{cpp}@{nonce}" for cpp in client_app.CPPS}


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
    for arm in ("sfsl-cpp1", "sfsl-cpp5"):
        np.testing.assert_allclose(table[arm], table["fedsubavg"], atol=1e-6, err_msg=arm)
        assert result.arm(arm).record.max_abs_diff < 1e-6
    # SSA/PSR runs with index mode's default DP (z = 1): with four users no row's noisy count
    # passes the threshold, so every row keeps its initial value.
    ssa = result.arm("ssa-psr").strategy
    assert ssa.round_noise_multiplier() == 1.0  # type: ignore[attr-defined]
    initial = task.initial_table(task.Settings.from_run_config(_config()))
    np.testing.assert_array_equal(table["ssa-psr"], initial)
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
    task, client_app, _ = example
    result, grid = _run(example, arms="fedsubavg,sfsl-cpp1")
    union = _union(task)
    seed = task.Settings().seed
    for i, node in enumerate(grid.get_node_ids()):
        rows = task.user_data(i, MAX_ROWS, 0.2, seed).rows
        memo = _memo(client_app, grid, node, _sessions(client_app, grid, node)["sfsl-cpp1"])
        np.testing.assert_array_equal(memo.yes, rows)
        np.testing.assert_array_equal(memo.no, np.setdiff1d(union, rows))
    assert result.arm("sfsl-cpp1").record.max_abs_diff < 1e-6


def test_each_sfsl_arm_keeps_its_own_memo(
    example: Example, everything: tuple[ExperimentResult, InProcessGrid]
) -> None:
    # One PerturbedRows for the five CPPs, its memo scoped by the arm's training id: every
    # arm's permanent answers were drawn with that arm's p1, p2 and none reached another arm.
    # CPP1 (keep 1, flip 0) answers exactly S; CPP5 (p1 = p2 = 1) answers "yes" everywhere —
    # had CPP1..CPP4's memo leaked into it, their (permanent) "no" answers would be there.
    task, client_app, _ = example
    _, grid = everything
    union = _union(task)
    seed = task.Settings().seed
    for i, node in enumerate(grid.get_node_ids()):
        context = grid.context(node)
        sessions = _sessions(client_app, grid, node)
        rows = task.user_data(i, MAX_ROWS, 0.2, seed).rows
        cpp1 = _memo(client_app, grid, node, sessions["sfsl-cpp1"])
        np.testing.assert_array_equal(cpp1.yes, rows)
        np.testing.assert_array_equal(cpp1.no, np.setdiff1d(union, rows))
        cpp5 = _memo(client_app, grid, node, sessions["sfsl-cpp5"])
        assert cpp5.no.size == 0
        np.testing.assert_array_equal(cpp5.yes, union)
        for arm, session in sessions.items():  # every memo answers the whole union once
            memo = _memo(client_app, grid, node, session)
            np.testing.assert_array_equal(np.union1d(memo.yes, memo.no), union, err_msg=arm)
        # One scoped memo per SFSL arm (the five CPPs and sfsl-dp) and no unscoped one.
        slots = [k for k in context.state.config_records if k.startswith("fsl.sfsl.memo")]
        assert len(slots) == len(task.SFSL_ARMS) == 6 and "fsl.sfsl.memo" not in slots
        assert client_app.perturbed_rows.memo(context) is None


def test_stock_sfsl_strategy_uses_the_run_configs_cpp(example: Example) -> None:
    # The library's SFSLFedSubAvg sends the train config with the perturb phase; with no
    # `sfsl-cpp` in it the clients use the run config's, in the memo of the given training id.
    # (The paper's protocol, whose union is exact; this ClientApp accepts it: noise floor 0.)
    task, client_app, _ = example
    config = _config(**{"sfsl-cpp": "cpp5", "num-server-rounds": 1})
    grid = InProcessGrid(client_app.app, USERS, config)
    strategy = SFSLFedSubAvg(
        task.TABLE, min_available_nodes=USERS, fraction_evaluate=0.0, dp=None, weighted=True
    )
    initial = task.initial_table(task.Settings.from_run_config(config))
    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord({task.TABLE: Array(initial)}),
        num_rounds=1,
        train_config=ConfigRecord({client_app.TRAINING_ID: "stock"}),
    )
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}}
    union = _union(task)
    for node in grid.get_node_ids():
        np.testing.assert_array_equal(_memo(client_app, grid, node, "stock").yes, union)


def test_a_training_without_its_id_is_refused(example: Example) -> None:
    # The ClientApp scopes its memo by `training-id`: a server that does not send one gets
    # every client dropped at the perturb phase with the reason, not a shared memo.
    task, client_app, _ = example
    config = _config(**{"num-server-rounds": 1})
    grid = InProcessGrid(client_app.app, USERS, config)
    strategy = SFSLFedSubAvg(task.TABLE, min_available_nodes=USERS)  # the defaults (DP)
    initial = task.initial_table(task.Settings.from_run_config(config))
    with pytest.raises(RunFailedError):  # no round produced a result
        strategy.start(
            grid=grid, initial_arrays=ArrayRecord({task.TABLE: Array(initial)}), num_rounds=1
        )
    assert 1 in strategy.failed_rounds
    assert len(strategy.dropped[1]) == USERS
    assert all("training-id" in reason for reason in strategy.dropped[1].values())
    for node in grid.get_node_ids():
        assert not any(
            k.startswith("fsl.sfsl.memo") for k in grid.context(node).state.config_records
        )


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
    assert eps["sfsl-dp"] == eps["sfsl-cpp2"]  # the run config's CPP
    # The aggregates' DP: none for the paper's arms; the DP arm spent 2 rounds at z = 1.
    dp = {r["arm"]: r["dp_eps"] for r in rows}
    assert dp["sfsl-cpp1"] == dp["sfsl-cpp5"] == "inf" and dp["fedavg"] == "n/a"
    assert float(dp["sfsl-dp"]) == pytest.approx(
        PrivacyAccount(None, noise_multipliers=[1.0] * ROUNDS).epsilon(), abs=0.01
    )
    assert "sfsl-dp" in text
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


def test_tables_download_runs_tiny(example: Example, capsys: pytest.CaptureFixture[str]) -> None:
    """The several-table download measurement (items + derived genres + MLP) on 4 users."""
    from flwr_fsl.data import cache_dir

    if not (cache_dir() / "movielens-items.npz").is_file():  # the genres (recsys data, issue 22)
        pytest.skip("movielens-items.npz (MovieLens genres) not prepared")
    from sfsl_movielens import tables_download

    tables_download.main(["--users", "4", "--rounds", "1", "--arms", "sfsl-cpp2,secagg"])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.split()]
    lines = {cols[0]: cols for cols in rows if cols[0] in tables_download.ARMS}
    assert set(lines) == {"sfsl-cpp2", "secagg"} and "FAILED" not in out
    down = {arm: float(cols[1].replace(",", "")) for arm, cols in lines.items()}
    assert down["sfsl-cpp2"] < down["secagg"]
