"""Discrete Gaussian sampler and distributed-sum accounting: law, bounds and every error path."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.discrete_gaussian import (
    distributed_sum_rho,
    distributed_tau,
    per_client_sigma,
    sample_discrete_gaussian,
)
from flwr_fsl.crypto.prg import PRGStream


def _pmf(sigma: float, support: np.ndarray) -> np.ndarray:
    weights = np.exp(-(support.astype(np.float64) ** 2) / (2 * sigma * sigma))
    big = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41)
    return weights / np.exp(-(big.astype(np.float64) ** 2) / (2 * sigma * sigma)).sum()


@pytest.mark.parametrize("sigma", [0.4, 1.0, 2.5, 7.0])
def test_small_sigma_matches_the_pmf(sigma: float) -> None:
    # Chi-square goodness of fit against the exact pmf on the support where it has mass.
    n = 200_000
    draws = sample_discrete_gaussian(sigma, n, PRGStream(bytes(range(16))))
    lo, hi = int(-6 * sigma) - 1, int(6 * sigma) + 1
    support = np.arange(lo, hi + 1)
    observed = np.array([(draws == v).sum() for v in support], dtype=np.float64)
    expected = _pmf(sigma, support) * n
    keep = expected > 20
    chi2 = float((((observed - expected) ** 2) / expected)[keep].sum())
    dof = int(keep.sum()) - 1
    # 99.9% quantile of chi-square is below dof + 4.5 sqrt(2 dof) + 10 for these dof.
    assert chi2 < dof + 4.5 * math.sqrt(2 * dof) + 10, (chi2, dof)


def test_large_sigma_moments() -> None:
    sigma = 123_456.7
    draws = sample_discrete_gaussian(sigma, 100_000, PRGStream(bytes(16)))
    assert draws.dtype == np.int64
    assert abs(draws.mean()) < 5 * sigma / math.sqrt(100_000)
    assert abs(draws.std() / sigma - 1) < 0.02


def test_zero_sigma_and_empty() -> None:
    assert not sample_discrete_gaussian(0.0, 5).any()
    assert sample_discrete_gaussian(3.0, 0).shape == (0,)


def test_fresh_streams_differ() -> None:
    a = sample_discrete_gaussian(1000.0, 64)
    b = sample_discrete_gaussian(1000.0, 64)
    assert not np.array_equal(a, b)


@pytest.mark.parametrize(
    ("sigma", "size"),
    [
        (-1.0, 3),
        (math.nan, 3),
        (math.inf, 3),
        (2.0**53, 3),
        (True, 3),
        ("1", 3),
        (1.0, -1),
        (1.0, 2.5),
    ],
)
def test_bad_arguments_are_refused(sigma: object, size: object) -> None:
    with pytest.raises(ConfigurationError):
        sample_discrete_gaussian(sigma, size)  # type: ignore[arg-type]


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 1e9), st.integers(0, 300))
def test_any_sigma_and_size_give_that_many_integers(sigma: float, size: int) -> None:
    out = sample_discrete_gaussian(sigma, size)
    assert out.shape == (size,)
    assert np.all(np.abs(out) <= 64 * sigma + 64)


def test_per_client_sigma_sums_to_the_total() -> None:
    sc = per_client_sigma(100.0, 4)
    assert sc == 50.0
    assert 4 * sc * sc == pytest.approx(100.0**2)
    with pytest.raises(ConfigurationError, match="min_contributors"):
        per_client_sigma(1.0, 0)
    with pytest.raises(ConfigurationError, match="min_contributors"):
        per_client_sigma(1.0, 2.0)  # type: ignore[arg-type]


def test_distributed_rho_is_the_gaussian_rho_when_tau_vanishes() -> None:
    # Large client sigma: tau is below float resolution and rho = Δ² / (2 n σ_c²).
    assert distributed_tau(50.0, 10) == 0.0
    assert distributed_sum_rho(100.0, 50.0, 4, 10**6) == pytest.approx(100.0**2 / (2 * 4 * 2500))
    # Small client sigma: tau is not negligible and is charged per word.
    tau = distributed_tau(0.5, 3)
    assert tau > 0.05
    assert distributed_sum_rho(1.0, 0.5, 3, 10) == pytest.approx(1 / (2 * 3 * 0.25) + tau * 10 / 4)
    assert distributed_sum_rho(1.0, 0.0, 3, 10) == math.inf
    with pytest.raises(ConfigurationError, match="sensitivity"):
        distributed_sum_rho(0.0, 1.0, 3, 10)
