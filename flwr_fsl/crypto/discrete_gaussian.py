"""Discrete Gaussian noise on the integers, for distributed DP inside masked vectors.

**Why.** In single-server secure aggregation (SecAgg, SFSL) no trusted party exists to add the
noise after summing. Each client therefore adds integer noise to its own encoded vector before
masking, and the server only ever decodes the sum: the noise in the aggregate is the sum of the
survivors' noise, which no single party (the server included) knows or can remove. Integer noise
is what a ring of integers can carry exactly; the sum of independent discrete Gaussians is close
to a discrete Gaussian (Kairouz, Liu & Steinke, "The Distributed Discrete Gaussian Mechanism
for Federated Learning with Secure Aggregation", ICML 2021), which is what
:func:`distributed_sum_rho` accounts.

**Sampler.** Canonne, Kamath & Steinke ("The Discrete Gaussian for Differential Privacy",
NeurIPS 2020, Algorithm 3), vectorized: a discrete Laplace proposal of scale
``t = floor(σ) + 1`` (the difference of two geometrics, each ``floor(t · E)`` with ``E``
exponential), accepted with probability ``exp(-(|y| - σ²/t)² / (2σ²))``. The randomness is
AES-128-CTR output keyed by :func:`os.urandom` (:class:`~flwr_fsl.crypto.prg.PRGStream`): noise
a party could predict could be subtracted. **Floating-point caveat** (as in
:mod:`flwr_fsl.families.ssa.dp`): the exponential and the acceptance test are computed in float64,
not with CKS's exact rational Bernoulli sampler, so the sampled law is the discrete Gaussian up to
float64 rounding of those two steps; the output itself is an exact integer, so no low-order float
bits are released (Mironov 2012's attack reads those).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.prg import PRGStream

__all__ = [
    "distributed_sum_rho",
    "distributed_tau",
    "exponential",
    "per_client_sigma",
    "sample_discrete_gaussian",
]

TINY_SIGMA = 0.025
"""Below it ``P(y != 0) < 2 exp(-800)``: the sampler returns zeros."""

MAX_SIGMA = 2.0**52
"""Largest sigma sampled: beyond it the proposal's float64 arithmetic loses integer precision."""


def exponential(stream: PRGStream, n: int) -> NDArray[np.float64]:
    """``n`` Exp(1) samples, ``-ln(u)`` with ``u`` refined 64 bits at a time below ``2^-64``.

    A plain ``-ln(u)`` of a 53-bit uniform would cut the tail near ``36.7``; refining the
    uniform when its 64 bits are all zero keeps the tail exact in distribution.

    Parameters
    ----------
    stream : PRGStream
        The randomness.
    n : int
        How many samples.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` float64, all finite and > 0.
    """
    words = stream.words(n)
    out = -np.log((words.astype(np.float64) + 0.5) * 2.0**-64)
    zero = np.flatnonzero(words == 0)  # u < 2^-64 (probability 2^-64 each): go deeper
    for i in zero:
        extra = 0.0
        w = 0
        while w == 0:
            extra += 64 * math.log(2.0)
            w = int(stream.words(1)[0])
        out[i] = extra - math.log((w + 0.5) * 2.0**-64)
    return out


def _check_sigma(sigma: float) -> float:
    if isinstance(sigma, bool) or not isinstance(sigma, int | float):
        raise ConfigurationError(f"sigma must be a number, got {sigma!r}")
    if not (math.isfinite(sigma) and 0 <= sigma <= MAX_SIGMA):
        raise ConfigurationError(f"sigma must be finite and in [0, 2^52], got {sigma!r}")
    return float(sigma)


def sample_discrete_gaussian(
    sigma: float, size: int, stream: PRGStream | None = None
) -> NDArray[np.int64]:
    """Draw ``size`` independent samples of the discrete Gaussian ``N_Z(0, σ²)``.

    ``P(y) ∝ exp(-y² / (2σ²))`` over the integers ``y``.

    Parameters
    ----------
    sigma : float
        ``σ`` in integer units (the ring's fixed-point grid), ``0 <= σ <= 2^52``; 0 gives zeros.
    size : int
        How many samples (>= 0).
    stream : PRGStream, optional
        The randomness (tests pass a keyed one); a fresh ``os.urandom``-keyed stream by default.

    Returns
    -------
    numpy.ndarray
        ``(size,)`` int64.

    Raises
    ------
    ConfigurationError
        If ``sigma`` or ``size`` is out of range.
    """
    s = _check_sigma(sigma)
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 0:
        raise ConfigurationError(f"size must be an int >= 0, got {size!r}")
    out = np.zeros(int(size), dtype=np.int64)
    if s < TINY_SIGMA or size == 0:
        # P(y != 0) < 2 exp(-1/(2 σ²)) underflows float64: the law is 0 to machine precision
        # (and the acceptance test below would divide by σ² = 0).
        return out
    stream = stream if stream is not None else PRGStream.fresh()
    t = math.floor(s) + 1
    filled = 0
    while filled < size:
        # The acceptance rate is at least about 1/1.6 for every sigma (CKS, Prop. 5 and 6).
        batch = max(64, int(1.7 * (size - filled)) + 16)
        g1 = np.floor(t * exponential(stream, batch))
        g2 = np.floor(t * exponential(stream, batch))
        y = g1 - g2  # discrete Laplace of scale t: P(y) ∝ exp(-|y|/t)
        gap = np.abs(y) - s * s / t
        accept_p = np.exp(-(gap * gap) / (2.0 * s * s))
        u = (stream.words(batch) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        kept = y[u < accept_p]
        take = min(kept.size, size - filled)
        out[filled : filled + take] = kept[:take].astype(np.int64)
        filled += take
    return out


def per_client_sigma(total_sigma: float, min_contributors: int) -> float:
    """Each client's ``σ`` so that any ``min_contributors`` of them sum to ``total_sigma``.

    Variances add: ``n`` clients of ``σ_c = σ / sqrt(n_min)`` give a sum of variance
    ``n σ_c² >= σ²`` whenever ``n >= n_min``. ``n_min`` is the fewest survivors a round may
    decode with (SecAgg's threshold): a round with fewer fails, so the released sum always
    carries at least ``σ²`` — counting only honest clients' noise (a client colluding with the
    server can subtract its own, which the caller's ``n_min`` must then not count).

    Parameters
    ----------
    total_sigma : float
        ``σ`` the sum must carry, integer units.
    min_contributors : int
        ``n_min >= 1``.

    Returns
    -------
    float
        ``σ / sqrt(n_min)``.

    Raises
    ------
    ConfigurationError
        If an argument is out of range.
    """
    s = _check_sigma(total_sigma)
    if isinstance(min_contributors, bool) or not isinstance(min_contributors, int):
        raise ConfigurationError(f"min_contributors must be an int, got {min_contributors!r}")
    if min_contributors < 1:
        raise ConfigurationError(f"min_contributors must be >= 1, got {min_contributors}")
    return s / math.sqrt(min_contributors)


def distributed_tau(client_sigma: float, contributors: int) -> float:
    """Kairouz et al.'s ``τ = 10 Σ_{k=1}^{n-1} exp(-2π² σ_c² k / (k+1))``.

    The distance (in their Thm. 1) between the sum of ``n`` discrete Gaussians of ``σ_c`` and one
    discrete Gaussian of ``n σ_c²``; it vanishes fast once ``σ_c`` is a few integer units.

    Parameters
    ----------
    client_sigma : float
        ``σ_c``, integer units.
    contributors : int
        ``n >= 1``.

    Returns
    -------
    float
        ``τ`` (0 for ``n = 1``).
    """
    s = _check_sigma(client_sigma)
    return 10.0 * sum(
        math.exp(-2.0 * math.pi**2 * s * s * k / (k + 1)) for k in range(1, max(contributors, 1))
    )


def distributed_sum_rho(
    sensitivity: float, client_sigma: float, contributors: int, dimension: int
) -> float:
    """Return the zCDP ``ρ`` of ``n`` clients' summed discrete Gaussian noise on ``d`` words.

    Kairouz, Liu & Steinke (ICML 2021), Thm. 1: the sum is ``ε²/2``-concentrated DP with
    ``ε = sqrt(Δ²/(n σ_c²) + τ d / 2)``, so ``ρ = Δ² / (2 n σ_c²) + τ d / 4``, where ``Δ`` is
    the L2 sensitivity of the integer (encoded) vector.

    Parameters
    ----------
    sensitivity : float
        ``Δ`` in integer units (> 0).
    client_sigma : float
        ``σ_c`` (> 0).
    contributors : int
        ``n``: the fewest noise-adding clients in a decoded round.
    dimension : int
        ``d``: words per client vector.

    Returns
    -------
    float
        ``ρ`` (``inf`` if ``σ_c = 0``).

    Raises
    ------
    ConfigurationError
        If ``sensitivity`` is not finite and > 0.
    """
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ConfigurationError(f"sensitivity must be finite and > 0, got {sensitivity!r}")
    s = _check_sigma(client_sigma)
    if s == 0.0:
        return math.inf
    n = max(int(contributors), 1)
    return sensitivity**2 / (2.0 * n * s * s) + distributed_tau(s, n) * dimension / 4.0
