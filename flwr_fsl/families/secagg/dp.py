"""Distributed differential privacy inside SecAgg's masked vector (opt-in: ``dp=SecAggDP(...)``).

**Why.** The server decodes the sum of the survivors' vectors. Each round's sum is of fresh
updates, and with unit weights (the default, ``weighted=False``) the weight word is the number
of survivors, which the server knows anyway; so SecAgg adds no noise by default. Noise is what
protects what *stays* the same across rounds: with ``weighted=True`` the total weight
``sum c`` over changing participant sets is a linear system in every client's ``num-examples``
(``tests/attacks/test_secagg_weights.py`` solves it), and a train metric that a client reports
unchanged round after round is recovered the same way (``tests/attacks/test_secagg_metrics.py``).

**Mechanism** (Kairouz, Liu & Steinke, ICML 2021, "The Distributed Discrete Gaussian
Mechanism"). Each client clips its update to L2 norm ``C`` (``clip_norm``, after the
per-coordinate ``clipping_range``), its weight to ``W`` (``max_weight`` when ``weighted``, else
the weight is 1) and each metric to ``|m| <= M`` (``max_metric``), encodes the vector
(:class:`~flwr_fsl.families.secagg.vector.WeightedVector`, stochastic rounding to ``2^-f``) and
adds independent discrete Gaussian noise
(:func:`~flwr_fsl.crypto.discrete_gaussian.sample_discrete_gaussian`) of std ``σ_c`` to *every*
word (values, weight word, metric words) before masking. ``σ_c = z Δ / sqrt(t)``
(:func:`~flwr_fsl.crypto.discrete_gaussian.per_client_sigma`), ``t`` SecAgg's reconstruction
threshold: an honest client refuses to unmask a set ``U3`` smaller than ``t``, so every decoded
sum holds the noise of at least ``t`` clients, of variance ``>= t σ_c² = (z Δ)²``.

**Who can remove noise.** Only its owner: the server never sees a client's noise, only the
sum. But clients that collude with the server can subtract their own noise from the sum: with
``k`` colluders among the ``t`` the remaining noise has std ``z Δ sqrt((t - k) / t)``; the
guarantee below is for a server colluding with no client (choose ``z`` larger to cover ``k``).

**Sensitivity** (integer units of the encoded vector, add/remove one client, as
:mod:`flwr_fsl.families.ssa.dp`). A client's encoded vector is ``2^f (c·Δw, c, c·m_j, c·h_j)``
plus rounding, with ``||Δw|| <= C``, ``0 < c <= W``, ``|m_j| <= M``, ``h_j in {0, 1}`` for each
of the ``k`` metrics, and stochastic rounding moves each of its ``L`` words by less than 1::

    Δ = 2^f · W · sqrt(C² + 1 + k (M² + 1)) + sqrt(L)            (:func:`sensitivity`)

A metric word costs ``M`` as much as the whole update: with ``dp`` pass ``train_metrics=()``
or a small ``max_metric``.

**Accounting.** The sum of ``n >= t`` clients' discrete Gaussians of ``σ_c`` is ``ρ``-zCDP with
``ρ = Δ² / (2 n σ_c²) + τ d / 4`` (:func:`~flwr_fsl.crypto.discrete_gaussian.distributed_sum_rho`,
Kairouz et al. Thm. 1; ``τ`` is negligible once ``σ_c`` is a few integer units, and it is
here by many orders), so a round is a Gaussian release of effective noise multiplier
``z_eff = 1 / sqrt(2ρ) <= z`` (:func:`effective_noise_multiplier`, computed for the worst
round the settings allow). :class:`~flwr_fsl.core.privacy.PrivacyAccount` composes the rounds
(Rényi DP, Google's ``dp-accounting``); a run's budget stops it before the round that would
exceed it. Every round counts (no amplification by sampling: the server samples).

**Ring headroom.** Each client's noise word is clipped to ``±ceil(64 σ_c)`` (probability below
``e^-2000`` per word of changing anything), and the settings are refused unless
``max_clients · (ceil(largest · 2^f) + ceil(64 σ_c)) <= 2^63 - 1`` for the largest per-client
``σ_c`` (``t = 2``) and vector (:func:`check_headroom`): noise never wraps the decoded sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.privacy import rho_to_noise_multiplier
from flwr_fsl.crypto.discrete_gaussian import (
    MAX_SIGMA,
    distributed_sum_rho,
    per_client_sigma,
    sample_discrete_gaussian,
)
from flwr_fsl.crypto.prg import PRGStream

__all__ = [
    "NOISE_CLIP_STDS",
    "SecAggDP",
    "add_noise",
    "check_headroom",
    "client_sigma",
    "effective_noise_multiplier",
    "sensitivity",
]

NOISE_CLIP_STDS = 64.0
"""A client's noise word is clipped to 64 of its standard deviations (probability < e^-2000)."""

_I64_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class SecAggDP:
    """Distributed DP settings of SecAgg rounds (module docstring); every party sees them.

    Parameters
    ----------
    noise_multiplier : float
        ``z > 0``: the decoded sum carries noise of std at least ``z Δ`` (``Δ``:
        :func:`sensitivity`).
    clip_norm : float
        ``C > 0``: a client clips its update ``w_i - w`` to this L2 norm (over all arrays).

    Raises
    ------
    ConfigurationError
        If a field is not a finite number > 0 (the message names it).
    """

    noise_multiplier: float
    clip_norm: float

    def __post_init__(self) -> None:
        for name in ("noise_multiplier", "clip_norm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"SecAggDP {name} must be a number, got {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(f"SecAggDP {name} must be finite and > 0, got {value!r}")
            object.__setattr__(self, name, float(value))


def sensitivity(
    dp: SecAggDP, weight_bound: float, metrics: int, max_metric: float, frac_bits: int, length: int
) -> float:
    """L2 sensitivity ``Δ`` of one client's encoded vector, in integer units (module docstring).

    Parameters
    ----------
    dp : SecAggDP
        The clip norm ``C``.
    weight_bound : float
        ``W``: the largest weight (1 for unit weights).
    metrics : int
        ``k``: metrics inside the vector.
    max_metric : float
        ``M``: the largest ``|metric|``.
    frac_bits : int
        ``f``.
    length : int
        ``L``: words of the vector.

    Returns
    -------
    float
        ``2^f W sqrt(C² + 1 + k (M² + 1)) + sqrt(L)``.
    """
    inner = dp.clip_norm**2 + 1.0 + metrics * (max_metric**2 + 1.0)
    return 2.0**frac_bits * weight_bound * math.sqrt(inner) + math.sqrt(length)


def client_sigma(dp: SecAggDP, delta: float, threshold: int) -> float:
    """Each client's noise std ``σ_c = z Δ / sqrt(t)`` in integer units (``delta``: ``Δ``).

    Raises
    ------
    ConfigurationError
        If ``z Δ`` is beyond what the sampler draws (``2^52``).
    """
    total = dp.noise_multiplier * delta
    if not total <= MAX_SIGMA:
        raise ConfigurationError(
            f"SecAgg dp: the noise std {total:.3g} exceeds 2^52 integer units; lower "
            "noise_multiplier, max_weight, max_metric or frac_bits"
        )
    return per_client_sigma(total, threshold)


def effective_noise_multiplier(
    dp: SecAggDP, base_sensitivity: float, max_clients: int, max_length: int
) -> float:
    """Return the round's Gaussian-equivalent ``z_eff = 1/sqrt(2ρ)`` for the worst round allowed.

    ``ρ`` is :func:`~flwr_fsl.crypto.discrete_gaussian.distributed_sum_rho`; its first term is
    ``1/(2z²)`` for every ``t`` and ``n >= t``, and its ``τ d / 4`` term is largest at the
    smallest ``σ_c`` (``t = max_clients``, ``Δ`` without the rounding term), the most
    contributors and the longest vector, which is what this evaluates.

    Parameters
    ----------
    dp : SecAggDP
        The settings.
    base_sensitivity : float
        ``Δ`` without its ``sqrt(L)`` term (a lower bound on every round's ``Δ``).
    max_clients : int
        Most clients of a round.
    max_length : int
        Longest vector.

    Returns
    -------
    float
        ``z_eff`` (slightly below ``z`` only if ``τ`` is not negligible).
    """
    sigma_c = per_client_sigma(dp.noise_multiplier * base_sensitivity, max_clients)
    first = 1.0 / (2.0 * dp.noise_multiplier**2)
    tau_term = distributed_sum_rho(base_sensitivity, sigma_c, max_clients, max_length) - (
        base_sensitivity**2 / (2.0 * max_clients * sigma_c * sigma_c)
    )
    return rho_to_noise_multiplier(first + max(tau_term, 0.0))


def check_headroom(largest_word: int, sigma_c: float, max_clients: int) -> None:
    """Refuse settings whose noisy sum could leave the signed range of ``Z_2^64``.

    Parameters
    ----------
    largest_word : int
        ``ceil(largest · 2^f)``: the largest magnitude of one client's encoded word.
    sigma_c : float
        The largest per-client noise std (integer units).
    max_clients : int
        Most clients summed.

    Raises
    ------
    ConfigurationError
        If ``max_clients · (largest_word + ceil(64 σ_c)) > 2^63 - 1``, or ``σ_c`` is beyond what
        the sampler draws (``2^52``); the message names the settings to lower.
    """
    if not sigma_c <= MAX_SIGMA:
        raise ConfigurationError(
            f"SecAgg dp: the per-client noise std {sigma_c:.3g} exceeds 2^52 integer units; "
            "lower noise_multiplier, max_weight, max_metric or frac_bits"
        )
    noise = math.ceil(NOISE_CLIP_STDS * sigma_c)
    if max_clients * (largest_word + noise) > _I64_MAX:
        bits = math.log2(max_clients * (largest_word + noise))
        raise ConfigurationError(
            f"SecAgg dp: {max_clients} clients' words with noise clipped at 64 std reach "
            f"2^{bits:.1f} >= 2^63; lower max_clients, frac_bits, max_weight, max_metric or "
            "noise_multiplier"
        )


def add_noise(
    words: NDArray[np.uint64], sigma_c: float, stream: PRGStream | None = None
) -> NDArray[np.uint64]:
    """Return ``words`` plus discrete Gaussian noise of std ``sigma_c`` on every word (mod 2^64).

    Each noise word is clipped to ``±ceil(64 σ_c)`` (:data:`NOISE_CLIP_STDS`).

    Parameters
    ----------
    words : numpy.ndarray
        The encoded vector (uint64, two's complement).
    sigma_c : float
        Integer units.
    stream : PRGStream, optional
        The randomness (tests pass a keyed one); a fresh ``os.urandom``-keyed one by default.

    Returns
    -------
    numpy.ndarray
        A new uint64 array.
    """
    noise = sample_discrete_gaussian(sigma_c, int(words.size), stream)
    bound = math.ceil(NOISE_CLIP_STDS * sigma_c)
    np.clip(noise, -bound, bound, out=noise)
    return np.asarray(words, dtype=np.uint64) + noise.view(np.uint64)
