"""Index mode's DP defaults through the Flower layer: the run-level budget stops the run at S0,
S1's refusal stops it too, every run logs its (ε, δ), and clients refuse rounds that promise
less noise than their floor or name another run.

S1 here is the in-process twin; ``tests/helper/test_helper_privacy.py`` checks S1's own account
(its persistence across restarts and sessions) and the real ``flwr-fsl-helper`` process.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.supercore.run import Run

from flwr_fsl.core.errors import RunFailedError
from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY, PrivacyAccount, PrivacyBudget
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.dp import DEFAULT_BUDGET, INDEX_MODE_DP, DistributedDP
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.helper import HelperLimits, InProcessHelper
from flwr_fsl.mods import ssa_mod, topk_mod
from flwr_fsl.strategies import SecureFedSubAvg
from flwr_fsl.testing import InProcessGrid
from tests.families.ssa.test_index_strategy import TABLE, K, initial, make_index_app, no_floor
from tests.flower_apps import make_app, model_record

NODES = 4


@pytest.fixture(scope="module")
def key() -> SealingKeyPair:
    return SealingKeyPair.generate()


def index_run(
    key: SealingKeyPair, helper: InProcessHelper | None = None, **kwargs: object
) -> tuple[InProcessGrid, SecureRowFedSubAvg, InProcessHelper]:
    """Default index-mode clients and a default ``SecureRowFedSubAvg`` (``kwargs`` override)."""
    grid = InProcessGrid(make_index_app(True), NODES, {"ssa-helper-fingerprint": key.fingerprint})
    helper = helper or InProcessHelper(keypair=key)
    options: dict[str, object] = {
        "max_abs": 1e3,
        "min_available_nodes": NODES,
        "fraction_evaluate": 0.0,
        **kwargs,
    }
    strategy = SecureRowFedSubAvg(helper, "emb", K, **options)  # type: ignore[arg-type]
    return grid, strategy, helper


def test_index_mode_defaults_are_dp_on_with_the_default_budget(key: SealingKeyPair) -> None:
    _, strategy, _ = index_run(key)
    assert strategy.aggregation.settings.dp == INDEX_MODE_DP
    assert strategy.aggregation.settings.budget == DEFAULT_BUDGET
    assert strategy.round_noise_multiplier() == 1.0
    assert strategy.privacy_account is strategy.aggregation.privacy_account
    assert strategy.privacy_account.budget == PrivacyBudget(20.0, 1e-5)
    topk = SecureFedSubAvg(InProcessHelper(keypair=key), topk_ratio=0.2)
    assert topk.round_noise_multiplier() is None  # top-k mode: DP stays opt-in
    assert "no noise is added" in topk.aggregation.describe_privacy()


def test_the_default_budget_stops_the_run_at_s0_and_logs_why(
    key: SealingKeyPair, caplog: pytest.LogCaptureFixture
) -> None:
    grid, strategy, helper = index_run(key)
    with caplog.at_level(logging.INFO):
        result = strategy.start(grid=grid, initial_arrays=initial(), num_rounds=12)
    # z = 1: 10 rounds spend epsilon 19.05 <= 20, an 11th would spend 20.26.
    assert sorted(strategy.rounds) == list(range(1, 11))
    assert strategy.failed_rounds == {}
    assert sorted(result.train_metrics_clientapp) == list(range(1, 11))
    assert strategy.privacy_account.rounds == 10
    assert result.train_metrics_clientapp[10]["dp-epsilon"] == pytest.approx(19.054, abs=1e-3)
    assert "stopping the run before round 11" in caplog.text
    assert "budget 20" in caplog.text
    assert "(epsilon, delta) = (19.05, 1e-05) of budget epsilon=20" in caplog.text
    # S1 spent the same rounds on its own account of the run (the Flower run id, 1 here).
    assert helper.service.accounts.rounds("run:1") == [1.0] * 10
    assert "(19.1, 1e-05) against each server" in strategy.aggregation.describe_privacy()


def test_s1_refusing_a_round_past_its_ceiling_stops_the_run(
    key: SealingKeyPair, caplog: pytest.LogCaptureFixture
) -> None:
    # S0 accounts without a budget; S1's operator ceiling (--dp-budget-epsilon 10) allows three
    # rounds at z = 1 (epsilon 9.01; a fourth would spend 10.73).
    limits = HelperLimits(dp_budget=PrivacyBudget(10.0, 1e-5))
    helper = InProcessHelper(keypair=key, limits=limits)
    grid, strategy, _ = index_run(key, helper, privacy_budget=None)
    with caplog.at_level(logging.INFO):
        result = strategy.start(grid=grid, initial_arrays=initial(), num_rounds=8)
    assert sorted(strategy.rounds) == [1, 2, 3, 4]
    assert list(strategy.failed_rounds) == [4]
    assert "HelperBudgetExhaustedError" in strategy.failed_rounds[4]
    assert "S1's ceiling" in strategy.failed_rounds[4]
    assert "stopping the run before round 5: S1 refused round 4" in caplog.text
    # Round 4 failed at its opening on S1: no client was asked anything, the table is that of
    # round 3, and S1 spent nothing on it.
    assert not strategy.rounds[4].traffic
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert helper.service.accounts.rounds("run:1") == [1.0] * 3


def test_a_run_without_dp_logs_that_no_noise_is_added(
    key: SealingKeyPair, caplog: pytest.LogCaptureFixture
) -> None:
    grid = InProcessGrid(
        make_app([ssa_mod, topk_mod]), 3, {"ssa-helper-fingerprint": key.fingerprint}
    )
    strategy = SecureFedSubAvg(InProcessHelper(keypair=key), topk_ratio=0.2, min_available_nodes=3)
    with caplog.at_level(logging.INFO):
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert strategy.failed_rounds == {}
    assert "Differential privacy of this run: none (epsilon = inf: no noise is added)" in (
        caplog.text
    )


def test_default_index_clients_refuse_a_round_without_noise(key: SealingKeyPair) -> None:
    # S0 turns DP off (z = 0 promised). Every default index-mode client refuses the round at
    # its retrieval phase, naming its node-config key; nothing is aggregated.
    grid, strategy, _ = index_run(key, dp=None)
    with pytest.raises(RunFailedError) as failed:  # no round produced a result
        strategy.start(grid=grid, initial_arrays=initial(), num_rounds=1)
    result = failed.value.result
    reasons = list(strategy.dropped[1].values())
    assert len(reasons) == NODES
    for reason in reasons:
        assert NODE_MIN_NOISE_KEY in reason and "noise multiplier 0 is below" in reason
    assert 1 not in result.train_metrics_clientapp
    np.testing.assert_array_equal(result.arrays["emb"].numpy(), TABLE)
    # With their floor lowered by their operator (node config), the same clients take part.
    plain = InProcessGrid(
        make_index_app(True),
        NODES,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=no_floor(NODES),
    )
    _, strategy, _ = index_run(key, dp=None)
    strategy.start(grid=plain, initial_arrays=initial(), num_rounds=1)
    assert not strategy.dropped[1] and strategy.failed_rounds == {}


def test_clients_refuse_a_round_below_their_own_floor(key: SealingKeyPair) -> None:
    # z = 1.5 promised; two clients' operators set a floor of 2.
    def floors(i: int) -> dict[str, object]:
        floor = 2.0 if i < 2 else 1.0
        return {"partition-id": i, "num-partitions": NODES, NODE_MIN_NOISE_KEY: floor}

    grid = InProcessGrid(
        make_index_app(True),
        NODES,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=floors,
    )
    _, strategy, _ = index_run(key, dp=DistributedDP(1.5, 1.0, 1.0))
    strategy.start(grid=grid, initial_arrays=initial(), num_rounds=1)
    nodes = list(grid.get_node_ids())
    assert set(strategy.dropped[1]) == set(nodes[:2])
    assert all("floor 2" in r for r in strategy.dropped[1].values())


def test_clients_refuse_a_dp_round_that_names_another_run(key: SealingKeyPair) -> None:
    # S0 names run 99 (S1 would account the round there); the clients are in run 1.
    grid, strategy, _ = index_run(key)
    grid.set_run(Run.create_empty(99))
    with pytest.raises(RunFailedError):  # no round produced a result
        strategy.start(grid=grid, initial_arrays=initial(), num_rounds=1)
    reasons = list(strategy.dropped[1].values())
    assert len(reasons) == NODES
    assert all("names run '99', not this client's run 1" in r for r in reasons)


def test_top_k_dp_is_opt_in_and_accounted_in_both_modes(key: SealingKeyPair) -> None:
    # Top-k clients accept rounds without DP by default (floor 0), and a DP run is accounted
    # and stopped by the same machinery: z = 2 and budget epsilon 5 allow 4 rounds.
    grid = InProcessGrid(
        make_app([ssa_mod, topk_mod]), 3, {"ssa-helper-fingerprint": key.fingerprint}
    )
    strategy = SecureFedSubAvg(
        InProcessHelper(keypair=key),
        topk_ratio=0.2,
        min_available_nodes=3,
        max_abs=1e3,
        dp=DistributedDP(2.0, 1.0, 1.0),
        privacy_budget=PrivacyBudget(5.0),
    )
    strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=6)
    assert sorted(strategy.rounds) == [1, 2, 3, 4] and strategy.failed_rounds == {}
    expected = PrivacyAccount(noise_multipliers=[2.0] * 4).epsilon()
    assert strategy.privacy_account.epsilon() == pytest.approx(expected)
