"""SecAgg's privacy settings: unit weights, the client's floors, evaluation, settings v1/v2, DP.

- the settings record: version 1 (weighted, no dp) is still read and written byte for byte,
  version 2 carries ``weighted`` and ``dp``; both decoders are strict;
- ``fraction_evaluate`` is 0 by default and refused above 0 without ``plaintext_evaluation``;
- a key-weighted round uses only keys the client's node config allows, and a client refuses a
  round whose promised noise is below its floor (``fsl-min-noise-multiplier``);
- with ``dp`` the decoded sum is the plaintext sum plus noise of std ``z Δ`` (``t`` survivors),
  the budget stops the run, and noise never wraps the ring (refused at construction).
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY, NODE_WEIGHT_KEYS_KEY, PrivacyBudget
from flwr_fsl.core.wireformat import WireFormatError
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.families.secagg.dp import NOISE_CLIP_STDS, SecAggDP, add_noise
from flwr_fsl.families.secagg.messages import SETTINGS_MAGIC, SecAggParams, SecAggSettings
from flwr_fsl.families.secagg.rounds import run_round
from flwr_fsl.families.secagg.strategy import SecAggFedAvg
from tests.families.secagg.test_strategy import _secagg
from tests.strict_codec import check_strict_decoder
from tests.vectors import generate

FROZEN = json.loads(generate.PATH.read_text())["secagg-settings"]


# -- the settings record ---------------------------------------------------------------------
def test_version_1_settings_are_still_read_and_written_byte_for_byte() -> None:
    for name in ("v1-default", "full"):
        data = bytes.fromhex(FROZEN[name])
        assert data[4] == 1
        settings = SecAggSettings.from_bytes(data)
        assert settings.weighted and settings.dp is None
        assert settings.to_bytes() == data


def test_version_2_carries_unit_weights_and_dp() -> None:
    default = SecAggSettings()
    assert not default.weighted and default.to_bytes()[4] == 2
    assert SecAggSettings.from_bytes(default.to_bytes()) == default
    dp = SecAggSettings(metrics=(), dp=SecAggDP(1.3, 0.5), weighted=True, max_weight=100.0)
    assert SecAggSettings.from_bytes(dp.to_bytes()) == dp
    for sample in (default.to_bytes(), dp.to_bytes(), bytes.fromhex(FROZEN["full"])):
        check_strict_decoder(sample, SecAggSettings.from_bytes, error=WireFormatError)
    data = default.to_bytes()
    with pytest.raises(WireFormatError, match="0 or 1"):
        SecAggSettings.from_bytes(data[:-2] + b"\x02\x00")
    # Weighted without dp is written as version 1 only: its version-2 spelling is refused.
    with pytest.raises(WireFormatError, match="version 2"):
        SecAggSettings.from_bytes(data[:-2] + b"\x01\x00")
    assert data.startswith(SETTINGS_MAGIC)


def test_settings_refuse_num_examples_as_a_metric_and_bad_dp() -> None:
    # The mean of num-examples over changing survivors gives each client's by least squares.
    with pytest.raises(ConfigurationError, match="train_metrics"):
        SecAggSettings(metrics=("num-examples",), weight_key="other")
    with pytest.raises(ConfigurationError, match="clip_norm"):
        SecAggDP(1.0, 0.0)
    with pytest.raises(ConfigurationError, match="noise_multiplier"):
        SecAggDP(math.nan, 1.0)
    with pytest.raises(ConfigurationError, match="dp"):
        SecAggSettings(dp=(1.0, 1.0))  # type: ignore[arg-type]


# -- the strategy's construction -------------------------------------------------------------
def test_federated_evaluation_is_off_and_refused_without_the_opt_in() -> None:
    assert SecAggFedAvg().fraction_evaluate == 0.0
    with pytest.raises(ConfigurationError, match="evaluate_fn"):
        SecAggFedAvg(fraction_evaluate=0.5)
    assert SecAggFedAvg(fraction_evaluate=0.5, plaintext_evaluation=True).plaintext_evaluation
    with pytest.raises(ConfigurationError, match="privacy_budget needs dp"):
        SecAggFedAvg(privacy_budget=PrivacyBudget(1.0))
    with pytest.raises(ConfigurationError, match="train_metrics"):
        SecAggFedAvg(weighted_by_key="w", train_metrics=("num-examples",))


def test_noise_that_could_wrap_the_ring_is_refused_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="2\\^63"):
        SecAggFedAvg(weighted=True, max_weight=1e5, dp=SecAggDP(30.0, 8.0), train_metrics=())
    with pytest.raises(ConfigurationError, match="exceeds 2\\^52"):
        SecAggFedAvg(weighted=True, max_weight=1e5, dp=SecAggDP(1e3, 8.0), train_metrics=())
    # The same noise with unit weights fits easily.
    SecAggFedAvg(dp=SecAggDP(1e3, 8.0), train_metrics=())


# -- what a client accepts -------------------------------------------------------------------
def _config(extra: dict[str, object]):  # type: ignore[no-untyped-def]
    return lambda i: {"partition-id": i, "num-partitions": 5, **extra}


def test_a_weight_key_the_node_does_not_allow_is_refused_naming_the_key() -> None:
    strategy, _, _ = _secagg(5, weighted=True, weighted_by_key="train-loss", train_metrics=())
    assert "threshold" in strategy.failed_rounds[1]
    reasons = set(strategy.dropped[1].values())
    assert all("'train-loss'" in r and NODE_WEIGHT_KEYS_KEY in r for r in reasons)
    # Allowed by the node config: the round runs (client 0's weight 0 is refused as a weight).
    strategy, _, _ = _secagg(
        5, weighted=True, weighted_by_key="train-loss", train_metrics=(),
        node_config=_config({NODE_WEIGHT_KEYS_KEY: "train-loss"}),
    )  # fmt: skip
    assert strategy.failed_rounds == {} and set(strategy.dropped[1]) == {1000}
    # Unit weights never read the key.
    strategy, _, _ = _secagg(5, weighted_by_key="train-loss", train_metrics=())
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}}


def test_a_client_refuses_a_round_below_its_noise_floor() -> None:
    floor = _config({NODE_MIN_NOISE_KEY: 0.5})
    strategy, _, _ = _secagg(5, node_config=floor, train_metrics=())  # no dp: z = 0
    assert "threshold" in strategy.failed_rounds[1]
    assert all("below this client's floor" in r for r in strategy.dropped[1].values())
    strategy, _, _ = _secagg(5, node_config=floor, train_metrics=(), dp=SecAggDP(0.4, 4.0))
    assert "threshold" in strategy.failed_rounds[1]
    strategy, _, _ = _secagg(5, node_config=floor, train_metrics=(), dp=SecAggDP(0.6, 4.0))
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}}


# -- distributed DP --------------------------------------------------------------------------
def test_dp_noise_is_clipped_and_wraps_mod_2_64() -> None:
    words = np.array([0, 2**64 - 1], dtype=np.uint64)
    out = add_noise(words, 3.0, PRGStream(bytes(16)))
    signed = out.view(np.int64) - words.view(np.int64)
    assert np.all(np.abs(signed) <= math.ceil(NOISE_CLIP_STDS * 3.0))


def test_dp_sum_is_the_plaintext_sum_plus_noise_of_std_z_delta() -> None:
    # t = 4 clients, all survive: the decoded sum carries exactly t client noises, std z·Δ.
    dp = SecAggDP(noise_multiplier=0.8, clip_norm=1.0)
    settings = SecAggSettings(metrics=(), dp=dp, names=("w",), max_clients=10)
    length = 6000
    layout = settings.layout({"w": (length,)})
    params = SecAggParams(1, bytes(16), 4, layout.length)
    rng = np.random.default_rng(0)
    model = {"w": np.zeros(length, np.float32)}
    clean, noisy = {}, {}
    for u in range(1, 5):
        trained = {"w": rng.normal(scale=0.01, size=length).astype(np.float32)}
        clean[u], _ = layout.encode(model, trained, 1.0, {})
        noisy[u] = layout.add_noise(clean[u], params.threshold)
    total = run_round(noisy, params).total
    plain = sum(w.view(np.int64) for w in clean.values())
    noise = (total.view(np.int64) - plain).astype(np.float64)
    expected = dp.noise_multiplier * layout.sensitivity
    # Sample std over 6001 words: relative standard error 1/sqrt(2·6001) ≈ 0.9%; 4% allowed.
    assert abs(noise.std() / expected - 1) < 0.04
    assert abs(noise.mean()) < 4 * expected / math.sqrt(noise.size)
    # The update itself: the sum decodes to the plaintext sum within the noise.
    decoded = layout.codec.decode(total)[:length]
    reference = layout.codec.decode(np.asarray(plain, dtype=np.int64).view(np.uint64))[:length]
    assert np.std(decoded - reference) == pytest.approx(expected / 2**settings.frac_bits, rel=0.04)


def test_dp_rounds_are_accounted_and_the_budget_stops_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dp = SecAggDP(noise_multiplier=2.0, clip_norm=4.0)
    probe = SecAggFedAvg(dp=dp)
    z = probe.round_noise_multiplier()
    assert z is not None and z == pytest.approx(2.0, rel=1e-9)  # τ is negligible here
    assert probe.privacy_account is not None
    two = probe.privacy_account.epsilon_after(z)
    probe.privacy_account.spend(z)
    budget = PrivacyBudget((probe.privacy_account.epsilon_after(z) + two) / 2)
    with caplog.at_level(logging.INFO):
        strategy, result, _ = _secagg(5, rounds=4, dp=dp, privacy_budget=budget, train_metrics=())
    account = strategy.privacy_account
    assert account is not None and account.rounds == 1
    assert sorted(strategy.rounds) == [1] and strategy.failed_rounds == {}
    assert "stopping the run before round 2" in caplog.text
    assert "Differential privacy of this run: 1 round(s)" in caplog.text
    # A noised round moved the model (the noise on ~120 words is not zero).
    assert result.arrays is not None


def test_without_dp_the_run_logs_that_no_noise_protects_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        strategy, _, _ = _secagg(3, train_metrics=())
    assert strategy.privacy_account is None and strategy.round_noise_multiplier() is None
    assert "epsilon = inf" in caplog.text
