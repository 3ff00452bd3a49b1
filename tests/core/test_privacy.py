"""Run-level accounting (dp-accounting RDP, cross-checked against the zCDP formula), budgets,
persistence and the client's floors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError, RoundFailedError
from flwr_fsl.core.privacy import (
    NODE_MIN_NOISE_KEY,
    NODE_WEIGHT_KEYS_KEY,
    PrivacyAccount,
    PrivacyBudget,
    PrivacyBudgetExhaustedError,
    check_noise_floor,
    check_weight_key,
    node_noise_floor,
    node_weight_keys,
    refuse_plaintext_evaluation,
    rho_to_noise_multiplier,
)
from flwr_fsl.families.ssa.dp import epsilon as zcdp_epsilon


@pytest.mark.parametrize(("z", "rounds"), [(0.7, 1), (1.0, 10), (2.0, 60), (5.0, 200)])
def test_rdp_is_never_looser_than_the_zcdp_conversion(z: float, rounds: int) -> None:
    account = PrivacyAccount()
    for _ in range(rounds):
        account.spend(z)
    rdp = account.epsilon()
    zcdp = zcdp_epsilon(z, rounds, 1e-5)
    assert 0 < rdp <= zcdp
    # Same mechanism, two bounds of it: they agree to within the conversion's slack.
    assert rdp > 0.6 * zcdp


def test_known_figure_of_the_rdp_accountant() -> None:
    # z = 1, 10 rounds, delta = 1e-5: dp-accounting's RDP bound.
    account = PrivacyAccount(noise_multipliers=[1.0] * 10)
    assert account.epsilon() == pytest.approx(19.05, abs=0.05)


def test_budget_stops_before_the_round_that_would_exceed_it() -> None:
    account = PrivacyAccount(PrivacyBudget(epsilon=20.0, delta=1e-5))
    spent = 0
    while account.refusal(1.0) is None:
        account.spend(1.0)
        spent += 1
    assert spent == 10  # epsilon(10) = 19.05, epsilon(11) > 20
    assert account.epsilon() <= 20.0
    with pytest.raises(PrivacyBudgetExhaustedError, match="budget 20"):
        account.spend(1.0)
    assert issubclass(PrivacyBudgetExhaustedError, RoundFailedError)
    assert account.rounds == 10


def test_zero_noise_is_infinite_epsilon_and_refused_by_any_budget() -> None:
    assert PrivacyAccount(noise_multipliers=[0.0]).epsilon() == math.inf
    assert PrivacyAccount(PrivacyBudget(1e6)).refusal(0.0) is not None
    assert PrivacyAccount().refusal(0.0) is None  # no budget: accounted, not stopped


def test_account_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "run-7.json"
    first = PrivacyAccount(PrivacyBudget(30.0), path=path)
    for _ in range(5):
        first.spend(1.0)
    again = PrivacyAccount(PrivacyBudget(30.0), path=path)
    assert again.rounds == 5
    assert again.epsilon() == pytest.approx(first.epsilon())


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[]",
        b'{"version": 2, "noise_multipliers": []}',
        b'{"version": 1}',
        b'{"version": 1, "noise_multipliers": [-1]}',
        b'{"version": 1, "noise_multipliers": ["x"]}',
        b'{"version": 1, "noise_multipliers": {}}',
        b"\xff",
    ],
)
def test_bad_account_files_are_refused(raw: bytes) -> None:
    with pytest.raises(ConfigurationError):
        PrivacyAccount.decode(raw)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_account_decoder_fuzz(raw: bytes) -> None:
    try:
        out = PrivacyAccount.decode(raw)
    except ConfigurationError:
        return
    assert all(z >= 0 for z in out)


@pytest.mark.parametrize(
    ("eps", "delta"), [(0, 1e-5), (-1, 1e-5), (math.inf, 1e-5), (1, 0), (1, 1), ("1", 1e-5)]
)
def test_bad_budgets_name_the_field(eps: object, delta: object) -> None:
    with pytest.raises(ConfigurationError, match=r"epsilon|delta"):
        PrivacyBudget(eps, delta)  # type: ignore[arg-type]


def test_rho_to_noise_multiplier_round_trips() -> None:
    assert rho_to_noise_multiplier(0.5) == pytest.approx(1.0)
    assert rho_to_noise_multiplier(0.0) == math.inf
    assert rho_to_noise_multiplier(math.inf) == 0.0
    with pytest.raises(ConfigurationError):
        rho_to_noise_multiplier(-1.0)


def test_noise_floor_from_node_config() -> None:
    assert node_noise_floor({}, 1.0) == 1.0
    assert node_noise_floor({NODE_MIN_NOISE_KEY: "2.5"}, 1.0) == 2.5
    assert node_noise_floor({NODE_MIN_NOISE_KEY: 0}, 1.0) == 0.0
    for bad in ("abc", -1.0, True, math.nan):
        with pytest.raises(ConfigurationError, match=NODE_MIN_NOISE_KEY):
            node_noise_floor({NODE_MIN_NOISE_KEY: bad}, 1.0)
    check_noise_floor(1.0, 1.0, what="SecAgg")
    with pytest.raises(ConfigurationError, match=NODE_MIN_NOISE_KEY):
        check_noise_floor(0.5, 1.0, what="SecAgg")
    with pytest.raises(ConfigurationError):
        check_noise_floor(math.nan, 0.0, what="SecAgg")


def test_weight_keys_from_node_config() -> None:
    assert node_weight_keys({}) == {"num-examples"}
    assert node_weight_keys({NODE_WEIGHT_KEYS_KEY: "a, b,,"}) == {"num-examples", "a", "b"}
    check_weight_key("num-examples", {})
    with pytest.raises(ConfigurationError, match="train_loss"):
        check_weight_key("train_loss", {})
    check_weight_key("train_loss", {NODE_WEIGHT_KEYS_KEY: "train_loss"})
    with pytest.raises(ConfigurationError, match=NODE_WEIGHT_KEYS_KEY):
        node_weight_keys({NODE_WEIGHT_KEYS_KEY: 3})


def test_plaintext_evaluation_needs_the_opt_in() -> None:
    refuse_plaintext_evaluation("X", 0.0, False)
    refuse_plaintext_evaluation("X", 1.0, True)
    with pytest.raises(ConfigurationError, match="evaluate_fn"):
        refuse_plaintext_evaluation("X", 0.5, False)
