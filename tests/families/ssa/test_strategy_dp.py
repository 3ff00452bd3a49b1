"""Distributed DP through the Flower layer: settings validated before round 1, clients clip
(top-k and index mode, U-DPF hints included), ``dp-epsilon`` reported per round, and S1's
policy refusing a run without DP."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError, RunFailedError
from flwr_fsl.core.privacy import PrivacyAccount
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.dp import DistributedDP, clip_update, epsilon
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.helper.limits import HelperLimits
from flwr_fsl.mods import ssa_mod, topk_mod
from flwr_fsl.strategies import SecureFedSubAvg, SSASettings
from flwr_fsl.testing import InProcessGrid
from tests.families.ssa.test_index_strategy import (
    ROWS,
    TABLE,
    client_rows,
    initial,
    make_index_app,
    no_floor,
    row_delta,
)
from tests.flower_apps import MODEL, make_app, model_record

DP = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, max_weight=1.0, delta=1e-5)


@pytest.fixture(scope="module")
def key() -> SealingKeyPair:
    return SealingKeyPair.generate()


def test_settings_are_validated_before_round_1_naming_the_setting() -> None:
    with pytest.raises(ConfigurationError, match=r"dp\.noise_multiplier"):
        SSASettings(dp=DistributedDP(0.0, 1.0, 1.0))
    with pytest.raises(ConfigurationError, match="dp must be a DistributedDP"):
        SSASettings(dp=1.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_abs"):
        SSASettings(max_abs=10.0, dp=DistributedDP(1.0, clip_norm=5.0, max_weight=3.0))
    helper = InProcessHelper()
    with pytest.raises(ConfigurationError, match=r"dp\.noise_multiplier"):
        SecureFedSubAvg(helper, topk_ratio=0.2, dp=DistributedDP(0.0, 1.0, 1.0))
    with pytest.raises(ConfigurationError, match="max_abs"):
        SecureRowFedSubAvg(helper, "emb", 4, max_abs=1.0, dp=DistributedDP(1.0, 2.0, 1.0))


def test_topk_run_with_dp_reports_epsilon_per_round(key: SealingKeyPair) -> None:
    run_config = {"ssa-helper-fingerprint": key.fingerprint, "topk-error-feedback": False}
    grid = InProcessGrid(make_app([ssa_mod, topk_mod]), 4, run_config)
    helper = InProcessHelper(keypair=key, limits=HelperLimits(dp=DP))
    strategy = SecureFedSubAvg(
        helper, topk_ratio=0.2, min_available_nodes=4, frac_bits=24, max_abs=1e3, dp=DP
    )
    result = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=2)
    assert strategy.failed_rounds == {}
    for r in (1, 2):
        metrics = result.train_metrics_clientapp[r]
        # The run's RDP account (dp-accounting), never above the zCDP cross-check.
        rdp = PrivacyAccount(noise_multipliers=[1.0] * r).epsilon()
        assert metrics["dp-epsilon"] == pytest.approx(rdp)
        assert rdp <= epsilon(1.0, r, 1e-5)
        assert metrics["dp-delta"] == 1e-5
    for name, value in MODEL.items():
        assert np.all(np.isfinite(result.arrays[name].numpy()))
        assert result.arrays[name].numpy().shape == value.shape


def test_s1_with_a_dp_policy_refuses_a_run_without_dp(key: SealingKeyPair) -> None:
    run_config = {"ssa-helper-fingerprint": key.fingerprint, "topk-error-feedback": False}
    grid = InProcessGrid(make_app([ssa_mod, topk_mod]), 3, run_config)
    helper = InProcessHelper(keypair=key, limits=HelperLimits(dp=DP))
    strategy = SecureFedSubAvg(helper, topk_ratio=0.2, min_available_nodes=3)
    with pytest.raises(RunFailedError) as failed:  # no round produced a result
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    result = failed.value.result
    assert "--dp-noise-multiplier" in strategy.failed_rounds[1]
    for name, value in MODEL.items():
        np.testing.assert_array_equal(result.arrays[name].numpy(), value)


def test_index_mode_clients_clip_rows_and_weights_also_in_udpf_hints(key: SealingKeyPair) -> None:
    # Negligible noise (z = 1e-9) so the clipped plaintext average is visible exactly: every
    # client's row deltas are scaled to L2 norm <= C and its per-row counts (1..3) cut to W.
    dp = DistributedDP(noise_multiplier=1e-9, clip_norm=0.5, max_weight=2.0)
    nodes, rounds = 4, 3
    # The clients accept z = 1e-9 only with their floor lowered, and the run only without a
    # budget (one such round spends more than any budget).
    grid = InProcessGrid(
        make_index_app(True),
        nodes,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=no_floor(nodes),
    )
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        "emb",
        6,
        frac_bits=32,
        max_abs=1e3,
        min_available_nodes=nodes,
        fraction_evaluate=0.0,
        dp=dp,
        privacy_budget=None,
    )
    result = strategy.start(grid=grid, initial_arrays=initial(), num_rounds=rounds)
    assert strategy.failed_rounds == {}
    assert [result.train_metrics_clientapp[r]["udpf-clients"] for r in (1, 2, 3)] == [0, 4, 4]
    table = TABLE.astype(np.float64)
    for rnd in range(1, rounds + 1):
        num, den = np.zeros_like(table), np.zeros(ROWS)
        for pid in range(nodes):
            idx, counts = client_rows(pid, rnd, True)
            delta = row_delta(pid, rnd, idx).astype(np.float32).astype(np.float64)
            v, w = clip_update(delta, counts, dp)
            num[idx] += w[:, None] * v
            den[idx] += w
        touched = den > 0
        table[touched] += num[touched] / den[touched, None]
        table = table.astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(result.arrays["emb"].numpy(), table, atol=1e-5)
    eps = result.train_metrics_clientapp[3]["dp-epsilon"]
    assert eps > 1e10  # no privacy at z=1e-9
    assert not math.isnan(eps)
