r"""Distributed differential privacy for SFSL: every word a client contributes carries its noise.

**Why.** Niu et al.'s Alg. 1 releases, every round, each union row's sum ``(Σ v Δ, Σ v)`` over
that row's participants, and Alg. 3 releases the union of the round's real row sets. A client's
count word is fixed by its data and the participants change every round, so one least-squares
solve per row over the rounds gives every client's counts (``tests/attacks/
test_sfsl_count_least_squares.py``: 100% of (client, row) memberships at any randomized-response
setting, even ``p1 = p2 = ½``); the value sums are exactly zero where no participant truly holds
the row (``test_sfsl_value_zero_pattern.py``) and the union is a group test of the participants'
sets (``test_sfsl_union_group_testing.py``). Randomized response protects only the perturbed
sets, not these aggregates. Here each client adds integer noise inside its masked vectors
(Kairouz, Liu & Steinke, ICML 2021), so every released sum carries noise that no single party
knows; the server suppresses rows whose noisy count is small.

**Threat model.** SFSL's (:mod:`flwr_fsl.families.sfsl.strategy`): one honest-but-curious
server; semi-honest clients that clip as told. The guarantee is client-level ``(ε, δ)``-DP
(neighbouring runs: one client's contribution added or removed in every round) of the released
sums (the noisy union counts and the rows round's sums), accounted by
:class:`~flwr_fsl.core.privacy.PrivacyAccount` over the run. The perturbed sets ``S''`` are
still sent in the clear: they are ``ε∞``-LDP by randomized response (over the memo's lifetime,
:mod:`flwr_fsl.families.sfsl.mod`), which adds to the ``(ε, δ)``. The noise a client adds is
what protects it: noise of clients colluding with the server does not count, and a sum whose
contributors all collude is theirs.

**Clipping.** With ``k = min(max_rows, |U|)`` (``|U|`` public), a client contributes at most
``k`` real rows (a uniformly random ``k`` of ``S'' ∩ S`` when it has more; the union step:
``k`` of ``S``). Its value deltas — its rows' ``Δ_j`` and the dense tensors' ``Δ`` together —
are clipped to L2 norm ``C`` (``clip_norm``), each count ``v_j`` and its weight ``w`` to ``W``
(``count_clip``; ``v = w = 1`` when the strategy is unweighted). The count words are scaled by
``γ = C / sqrt(k + 1)`` (:meth:`SFSLDP.count_scale`), which balances the two halves of the
vector: a client contributes ``(v_j Δ_j, γ v_j)`` per row and ``(w Δ, γ w)`` for the dense
part, so

    ||contribution||² = Σ_j v_j² ||Δ_j||² + w² ||Δ||² + γ² (Σ_j v_j² + w²)
                      <= W² C² + γ² W² (k + 1) = 2 W² C².

**Sensitivity** in integer units (the ring's fixed point ``2^f``): stochastic rounding moves
each of the at most ``k (d + 1) + D + 1`` words a client sets by less than one unit, so

    Δ_rows  = 2^f · W · C · sqrt(2) + sqrt(k (d + 1) + D + 1)    (SFSLDP.rows_sensitivity),
    Δ_union = 2^f · sqrt(k)                                       (SFSLDP.union_sensitivity),

the union vector being the exact indicator of the client's ``k`` rows scaled by ``2^f``
(integers, no rounding). ``2^f`` keeps every client's noise many integer units wide, so the
sum of discrete Gaussians is a discrete Gaussian to within Kairouz et al.'s ``τ``.

**Noise.** A round's noise multiplier ``z`` (``noise_multiplier``) is split between the two
releases: the union gets ``z_u = z / sqrt(0.2)``, the rows ``z_r = z / sqrt(0.8)``
(:data:`UNION_SHARE`), so their zCDP costs ``1/(2 z_u²) + 1/(2 z_r²) = 1/(2 z²)`` add up to one
Gaussian round at ``z``. The sums have ``σ = z · Δ``. Each client draws discrete Gaussian noise
(:func:`~flwr_fsl.crypto.discrete_gaussian.sample_discrete_gaussian`, CSPRNG) for every word it
sends — values and counts, on every row of ``S''`` it uploads whether or not the row is real,
and on every word of the union vector — of

* ``σ / sqrt(t)`` on the union vector and the dense part, which every survivor of the round
  adds (``t`` the SecAgg decode threshold: at least ``t`` survive or nothing is decoded), and
* ``σ / sqrt(t_j)`` on row ``j``, ``t_j = max(1, ceil(m_j t / n))``, where ``m_j`` is the
  number of clients whose ``S''`` holds ``j`` (each client reads it from its masked-input
  request: the peers it shares positions of ``j`` with) and ``n`` the round's sharers. A row's
  sum is over its own participants only, so the decode threshold ``t`` says nothing about it;
  the server refuses to unmask a round in which some row kept fewer than ``t_j`` of its
  participants (:func:`short_rows`), so every released row sum carries variance ``>= σ²``. A
  row with one participant gets that client's full ``σ``.

(:func:`~flwr_fsl.crypto.discrete_gaussian.per_client_sigma`). The accounting
(:meth:`SFSLDP.round_rho`) is Kairouz et al.'s Thm. 1 for each release,
``ρ = Δ²/(2σ²) + τ d / 4``, with ``τ`` taken at its largest over the settings
(``max_clients`` contributors, ``2^30`` words), so the round's effective multiplier
``1/sqrt(2ρ)`` (:meth:`SFSLDP.round_noise_multiplier`) is known before the round; it is ``z``
to float precision at ``frac_bits >= 8``.

**Post-processing** (free): the union is the rows whose noisy holder count exceeds
:data:`UNION_THRESHOLD_STDS` of its noise std (a coarse filter: about 2% of the rows nobody
holds pass it; rows held by few clients do not); in the rows round a row moves only where its
noisy count exceeds :func:`~flwr_fsl.submodel.aggregate.count_threshold_stds` of its own noise
std (:func:`~flwr_fsl.submodel.aggregate.suppress_small_counts`). With ``z = 1``, ``C = W = 1``
and ``k = 32`` a row's count noise is about ``1.6 · sqrt(k + 1) ≈ 9`` clients wide: DP
needs many clients per row, and rows held by fewer are not trained.

**Not covered.** Quantization (Niu's App. B) and the Bloom-filter union: both are refused with
DP (their words are not bounded the way the noise needs); the union runs in exact mode.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.privacy import PrivacyBudget, rho_to_noise_multiplier
from flwr_fsl.crypto.discrete_gaussian import (
    distributed_sum_rho,
    per_client_sigma,
    sample_discrete_gaussian,
)
from flwr_fsl.families.sfsl.protocol import RowVector, rows_vector
from flwr_fsl.families.sfsl.psu import PSUParams, client_vector
from flwr_fsl.submodel.aggregate import count_threshold_stds, suppress_small_counts

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_NOISE_MULTIPLIER",
    "SFSLDP",
    "UNION_SHARE",
    "UNION_THRESHOLD_STDS",
    "NoisySums",
    "RowsRound",
    "add_noise",
    "clip_contribution",
    "keep_rows",
    "noisy_row_sums",
    "noisy_rows_vector",
    "noisy_union_vector",
    "participants_per_row",
    "row_thresholds",
    "rows_input",
    "short_rows",
    "union_from_counts",
    "union_input",
]

DEFAULT_NOISE_MULTIPLIER = 1.0
"""The family's default ``z`` (and a client's default floor)."""
DEFAULT_BUDGET = PrivacyBudget(epsilon=20.0, delta=1e-5)
"""The default run budget: 10 rounds at ``z = 1`` (the run stops before the 11th)."""
UNION_SHARE = 0.2
"""Fraction of a round's zCDP rho spent on the union's noisy counts (the rows get the rest)."""
UNION_THRESHOLD_STDS = 2.0
"""A row enters the union when its noisy holder count exceeds this many noise stds."""
_ACCOUNT_DIMENSION = 1 << 30
"""Words per vector assumed by the accounting's ``τ`` term (SecAgg's largest vector)."""
_NOISE_HEADROOM_STDS = 64.0
"""Headroom kept below the ring's range, in noise stds of the sum (beyond it: ``< e^-2000``)."""


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"dp {name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ConfigurationError(f"dp {name} must be finite and > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class SFSLDP:
    """Public DP settings of SFSL rounds (they travel in the settings record).

    Parameters
    ----------
    noise_multiplier : float
        ``z`` of a round (both releases together, module docstring). Default 1.
    clip_norm : float
        ``C``: L2 bound of a client's value deltas (its rows and the dense tensors). Default 1.
    count_clip : float
        ``W``: largest per-row count and client weight. Default 1.
    max_rows : int
        ``k``: most real rows a client contributes per round. Default 32.

    Raises
    ------
    ConfigurationError
        If a setting is out of range (the message names it).
    """

    noise_multiplier: float = DEFAULT_NOISE_MULTIPLIER
    clip_norm: float = 1.0
    count_clip: float = 1.0
    max_rows: int = 32

    def __post_init__(self) -> None:
        for name in ("noise_multiplier", "clip_norm", "count_clip"):
            object.__setattr__(self, name, _positive(name, getattr(self, name)))
        k = self.max_rows
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 0xFFFFFFFF:
            raise ConfigurationError(f"dp max_rows must be an int in [1, 2^32), got {k!r}")

    # -- the two releases' noise ----------------------------------------------------------
    @property
    def union_multiplier(self) -> float:
        """``z_u = z / sqrt(UNION_SHARE)``."""
        return self.noise_multiplier / math.sqrt(UNION_SHARE)

    @property
    def rows_multiplier(self) -> float:
        """``z_r = z / sqrt(1 - UNION_SHARE)``."""
        return self.noise_multiplier / math.sqrt(1.0 - UNION_SHARE)

    def rows_k(self, union_size: int) -> int:
        """``k = min(max_rows, |U|)`` (at least 1)."""
        return max(1, min(self.max_rows, int(union_size)))

    def count_scale(self, k: int) -> float:
        """``γ = C / sqrt(k + 1)``: the scale of the count words."""
        return self.clip_norm / math.sqrt(k + 1)

    def rows_sensitivity(self, k: int, frac_bits: int, words: int) -> float:
        """``Δ_rows = 2^f W C sqrt(2) + sqrt(words)`` (integer units; ``words`` a client sets)."""
        del k  # the balanced count scale makes the bound independent of k
        scale = 2.0**frac_bits
        return scale * self.count_clip * self.clip_norm * math.sqrt(2.0) + math.sqrt(words)

    def rows_sigma(self, k: int, frac_bits: int, words: int) -> float:
        """``σ = z_r Δ_rows`` of a row sum (integer units)."""
        return self.rows_multiplier * self.rows_sensitivity(k, frac_bits, words)

    def union_sensitivity(self, k: int, frac_bits: int) -> float:
        """``Δ_union = 2^f sqrt(k)`` (integer units)."""
        return 2.0**frac_bits * math.sqrt(k)

    def union_sigma(self, k: int, frac_bits: int) -> float:
        """``σ = z_u Δ_union`` of a union count (integer units)."""
        return self.union_multiplier * self.union_sensitivity(k, frac_bits)

    # -- accounting -----------------------------------------------------------------------
    def round_rho(self, frac_bits: int, max_clients: int) -> float:
        """Return the zCDP ``ρ`` of one round (both releases), its ``τ`` terms at their largest.

        ``τ`` grows with the contributors and the dimension and shrinks with each client's
        ``σ``: it is taken at ``max_clients`` contributors of ``σ / sqrt(max_clients)`` (the
        smallest per-client ``σ`` any row or the union may get, with ``k = 1`` and no rounding
        term) over ``2^30`` words, so a round's actual ``ρ`` is never larger.
        """
        n = max(int(max_clients), 1)
        rows = self.rows_sensitivity(1, frac_bits, 0)
        union = self.union_sensitivity(1, frac_bits)
        rho = 0.0
        for delta, z in ((rows, self.rows_multiplier), (union, self.union_multiplier)):
            rho += distributed_sum_rho(delta, per_client_sigma(z * delta, n), n, _ACCOUNT_DIMENSION)
        return rho

    def round_noise_multiplier(self, frac_bits: int, max_clients: int) -> float:
        """Return the round's effective multiplier ``1 / sqrt(2 ρ)`` (what the account spends)."""
        return rho_to_noise_multiplier(self.round_rho(frac_bits, max_clients))

    def check_headroom(self, max_abs: float, frac_bits: int, max_clients: int) -> None:
        """Check that the sum of ``max_clients`` vectors plus their noise cannot wrap.

        Raises
        ------
        ConfigurationError
            If ``max_clients (max_abs 2^f + 64 σ)`` exceeds ``2^63`` (σ the largest a client
            may add, on a row it alone holds).
        """
        scale = 2.0**frac_bits
        sigma = max(
            self.rows_sigma(1, frac_bits, _ACCOUNT_DIMENSION), self.union_sigma(1, frac_bits)
        )
        worst = max_clients * (max_abs * scale + _NOISE_HEADROOM_STDS * sigma)
        if not worst < 2.0**63:
            raise ConfigurationError(
                "dp: the noise does not fit the ring beside the aggregate at "
                f"frac_bits={frac_bits}: lower frac_bits, max_count, clip or max_clients"
            )


# -- the client's side -------------------------------------------------------------------------
def keep_rows(rows: NDArray[np.int64], k: int) -> NDArray[np.int64]:
    """Return ``rows`` (sorted) when at most ``k``, else a uniformly random ``k`` of them.

    The choice uses the OS's randomness: it is the client's, and the server must not predict it.
    """
    r = np.asarray(rows, dtype=np.int64)
    if r.size <= k:
        return np.sort(r)
    rng = np.random.default_rng(int.from_bytes(os.urandom(32), "little"))
    return np.sort(rng.choice(r, size=k, replace=False))


def clip_contribution(
    row_deltas: NDArray[np.float64], dense_delta: NDArray[np.float64], clip_norm: float
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Clip a client's row deltas and dense delta together to L2 norm ``clip_norm``.

    Parameters
    ----------
    row_deltas : numpy.ndarray
        ``(k, d)`` deltas of the rows it contributes.
    dense_delta : numpy.ndarray
        ``(D,)`` the dense tensors' delta, flattened.
    clip_norm : float
        ``C``.

    Returns
    -------
    tuple[numpy.ndarray, numpy.ndarray]
        Both scaled by ``min(1, C / ||(rows, dense)||)`` (a hair below, against rounding).
    """
    rows = np.asarray(row_deltas, dtype=np.float64)
    dense = np.asarray(dense_delta, dtype=np.float64)
    flat = np.concatenate([rows.reshape(-1), dense.reshape(-1)])
    # Scale by the largest magnitude first: a sum of squares of |x| > 1e154 overflows to inf.
    peak = float(np.max(np.abs(flat))) if flat.size else 0.0
    norm = peak * float(np.sqrt(np.sum((flat / peak) ** 2))) if peak > 0 else 0.0
    if norm > clip_norm:
        factor = clip_norm / norm * (1.0 - 1e-12)
        return rows * factor, dense * factor
    return rows, dense


def add_noise(words: NDArray[np.uint64], sigmas: NDArray[np.float64]) -> NDArray[np.uint64]:
    """Add independent discrete Gaussian noise of std ``sigmas[i]`` to ``words[i]`` (mod 2^64).

    Words of equal ``σ`` are sampled in one batch (CSPRNG-keyed,
    :func:`~flwr_fsl.crypto.discrete_gaussian.sample_discrete_gaussian`).
    """
    out = np.asarray(words, dtype=np.uint64).copy()
    s = np.asarray(sigmas, dtype=np.float64)
    for sigma in np.unique(s):
        where = np.flatnonzero(s == sigma)
        noise = sample_discrete_gaussian(float(sigma), int(where.size))
        out[where] += noise.astype(np.uint64)  # two's complement: wraps mod 2^64
    return out


def participants_per_row(
    own_slots: NDArray[np.int64],
    shared: Mapping[int, NDArray[np.int64]],
    width: int,
    rows_length: int,
) -> NDArray[np.int64]:
    """``m_j`` for each of a client's union slots: itself plus the peers sharing row ``j``.

    Parameters
    ----------
    own_slots : numpy.ndarray
        The client's rows as union slots (sorted, distinct).
    shared : Mapping[int, numpy.ndarray]
        Peer -> the vector positions it shares with this client (its masked-input request).
    width : int
        ``d``: a row occupies ``d + 1`` positions.
    rows_length : int
        Where the dense part starts (positions beyond are shared with every sharer).

    Returns
    -------
    numpy.ndarray
        ``(len(own_slots),)`` participant counts, each >= 1.
    """
    count = np.ones(own_slots.size, dtype=np.int64)
    for positions in shared.values():
        p = np.asarray(positions, dtype=np.int64)
        slots = np.unique(p[p < rows_length] // (width + 1))
        count += np.isin(own_slots, slots, assume_unique=True)
    return count


def row_thresholds(
    participants: NDArray[np.int64], threshold: int, sharers: int
) -> NDArray[np.int64]:
    """``t_j = max(1, ceil(m_j t / n))``: the fewest survivors row ``j``'s noise counts on."""
    m = np.asarray(participants, dtype=np.int64)
    n = max(int(sharers), 1)
    return np.maximum(1, -(-(m * int(threshold)) // n))


def short_rows(
    perturbed: Mapping[int, NDArray[np.int64]],
    sharers: Sequence[int],
    survivors: Sequence[int],
    union: NDArray[np.int64],
    threshold: int,
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """Return the server's per-row view, checked before it unmasks a DP rows round.

    Parameters
    ----------
    perturbed : Mapping[int, numpy.ndarray]
        Every client's ``S''``.
    sharers, survivors : Sequence[int]
        The rows round's ``U2`` and ``U3``.
    union : numpy.ndarray
        ``U``.
    threshold : int
        The round's SecAgg ``t``.

    Returns
    -------
    tuple of numpy.ndarray
        Per union row: the participants ``m_j`` (in ``U2``), the survivors among them and
        ``t_j``; a row with ``0 < survivors < t_j`` must not be released.
    """
    members = np.zeros(union.size, dtype=np.int64)
    alive = np.zeros(union.size, dtype=np.int64)
    kept = set(survivors)
    for node in sharers:
        slots = np.searchsorted(union, np.asarray(perturbed.get(node, ()), dtype=np.int64))
        members[slots] += 1
        if node in kept:
            alive[slots] += 1
    return members, alive, row_thresholds(members, threshold, len(sharers))


def noisy_union_vector(
    domain: int, rows: NDArray[np.int64], dp: SFSLDP, frac_bits: int, threshold: int
) -> NDArray[np.uint64]:
    """Return a client's DP union input: ``2^f`` at ``k`` of its rows, plus noise on every word.

    Raises
    ------
    ClientInputError
        If a row lies outside ``[0, domain)``.
    """
    r = np.unique(np.asarray(rows, dtype=np.int64))
    if r.size and (r[0] < 0 or r[-1] >= domain):
        raise ClientInputError("a real row lies outside the table")
    k = dp.rows_k(domain)
    vector = np.zeros(domain, dtype=np.int64)
    vector[keep_rows(r, k)] = 1 << frac_bits
    sigma = per_client_sigma(dp.union_sigma(k, frac_bits), max(int(threshold), 1))
    return add_noise(vector.astype(np.uint64), np.full(domain, sigma))


def union_from_counts(
    total: NDArray[np.uint64], dp: SFSLDP, frac_bits: int, threshold: int, survivors: int
) -> tuple[NDArray[np.int64], float]:
    """Return the server's union: the rows whose noisy holder count passes the threshold.

    Returns
    -------
    tuple
        ``U`` (sorted rows) and the threshold in holders.
    """
    counts = total.view(np.int64).astype(np.float64) / 2.0**frac_bits
    k = dp.rows_k(total.size)
    sigma = dp.union_sigma(k, frac_bits) / 2.0**frac_bits
    std = sigma * math.sqrt(max(survivors, 1) / max(threshold, 1))
    cut = UNION_THRESHOLD_STDS * std
    return np.flatnonzero(counts > cut).astype(np.int64), cut


@dataclass(frozen=True)
class RowsRound:
    """What a client knows of its rows round: the settings it encodes with and its peers.

    Parameters
    ----------
    table : str
        The row table's name.
    clip : float
        Largest ``|Δ|`` per coordinate.
    dp : SFSLDP or None
        The round's DP settings (None: the paper's noiseless vector).
    threshold : int
        SecAgg's ``t``.
    sharers : int
        ``n = |U2|``.
    shared : Mapping[int, numpy.ndarray]
        Peer -> the positions it shares with this client.
    max_count : float
        Without DP: the largest count and weight a client may send (the settings'
        ``max_count``; the server's bounds assume it, :mod:`flwr_fsl.families.sfsl.bounds`).
    """

    table: str
    clip: float
    dp: SFSLDP | None
    threshold: int
    sharers: int
    shared: Mapping[int, NDArray[np.int64]]
    max_count: float = math.inf


def _words_set(k: int, width: int, dense_size: int) -> int:
    """Words one client may set nonzero: ``k (d + 1) + D + 1``."""
    return k * (width + 1) + dense_size + 1


def noisy_rows_vector(
    layout: RowVector,
    perturbed: NDArray[np.int64],
    deltas: tuple[Mapping[int, NDArray[np.float64]], NDArray[np.float64]],
    real: tuple[NDArray[np.int64], NDArray[np.float64]],
    weight: float,
    dp: SFSLDP,
    rows_round: RowsRound,
) -> NDArray[np.uint64]:
    """Return a client's DP rows-round words at ``R_i`` (module docstring), noise included.

    Parameters
    ----------
    layout : RowVector
        The round's rows layout (its codec encodes the dense part too).
    perturbed : numpy.ndarray
        ``S''`` (sorted rows of ``U``).
    deltas : tuple
        Row -> ``Δ_j`` for every real row of ``S''``, and the dense tensors' ``Δ`` flattened.
    real : tuple
        ``S`` (sorted) and one positive count per row (ones when unweighted).
    weight : float
        The client's weight (1 when unweighted).
    dp : SFSLDP
        The round's DP settings.
    rows_round : RowsRound
        The per-coordinate clip (applied before the L2 clip), ``t``, ``n`` and the shared
        positions (for each row's ``t_j``).

    Returns
    -------
    numpy.ndarray
        The words of the rows of ``S''`` then of the dense part (weight last).
    """
    clip = rows_round.clip
    rows, counts = real
    row_deltas, dense = deltas
    width = layout.width
    k = dp.rows_k(layout.union.size)
    chosen = keep_rows(np.asarray(sorted(row_deltas), dtype=np.int64), k)
    grid = np.array([row_deltas[int(r)] for r in chosen], dtype=np.float64).reshape(-1, width)
    values, dense_values = clip_contribution(
        np.clip(grid, -clip, clip), np.clip(dense, -clip, clip), dp.clip_norm
    )
    v = np.minimum(counts[np.searchsorted(rows, chosen)], dp.count_clip)
    w = min(float(weight), dp.count_clip)
    gamma = dp.count_scale(k)
    block = np.zeros((perturbed.size, width + 1))
    where = np.searchsorted(perturbed, chosen)
    block[where, :width] = v[:, None] * values
    block[where, width] = gamma * v
    flat = np.concatenate([block.reshape(-1), w * dense_values, [gamma * w]])
    words = layout.codec.encode(flat)
    # Noise on every word sent: a row's by its own contributors, the dense part's by all of them.
    frac_bits = layout.codec.frac_bits
    sigma = dp.rows_sigma(k, frac_bits, _words_set(k, width, int(dense.size)))
    slots = np.searchsorted(layout.union, perturbed)
    members = participants_per_row(slots, rows_round.shared, width, layout.length)
    t_rows = row_thresholds(members, rows_round.threshold, rows_round.sharers)
    sigmas = np.concatenate(
        [
            np.repeat([per_client_sigma(sigma, int(t)) for t in t_rows], width + 1),
            np.full(dense.size + 1, per_client_sigma(sigma, max(rows_round.threshold, 1))),
        ]
    )
    return add_noise(words, sigmas)


@dataclass(frozen=True)
class NoisySums:
    """The server's decoded DP rows round, after the count post-processing.

    Attributes
    ----------
    sums, counts : numpy.ndarray
        ``(|U|, d)`` and ``(|U|,)`` per union row, zero where suppressed (counts in count units).
    released_sums, released_counts : numpy.ndarray
        The same before suppression: exactly what the round released.
    count_std : numpy.ndarray
        ``(|U|,)`` each row's count noise std (0 where no participant survived).
    dense_sum : numpy.ndarray
        ``(D,)`` the dense tensors' noisy weighted sum.
    dense_weight : float
        Its divisor (the survivors when unweighted; 0: suppressed).
    """

    sums: NDArray[np.float64]
    counts: NDArray[np.float64]
    released_sums: NDArray[np.float64]
    released_counts: NDArray[np.float64]
    count_std: NDArray[np.float64]
    dense_sum: NDArray[np.float64]
    dense_weight: float


def noisy_row_sums(
    layout: RowVector,
    total: NDArray[np.uint64],
    dp: SFSLDP,
    alive: NDArray[np.int64],
    t_rows: NDArray[np.int64],
    survivors: int,
    threshold: int,
    weighted: bool,
) -> NoisySums:
    """Decode a DP rows round's sum and suppress the rows (and weight) with small noisy counts.

    Parameters
    ----------
    layout : RowVector
        The round's rows layout.
    total : numpy.ndarray
        The unmasked sum (rows part, dense part, weight).
    dp : SFSLDP
        The round's DP settings.
    alive, t_rows : numpy.ndarray
        Per union row: its surviving participants and ``t_j`` (:func:`short_rows`).
    survivors, threshold : int
        ``|U3|`` and ``t``.
    weighted : bool
        Whether the dense divisor is the noisy weight (else ``survivors · min(1, W)``).

    Returns
    -------
    NoisySums
        The post-processed sums (module docstring).
    """
    width, codec = layout.width, layout.codec
    values = codec.decode(total)
    rows = values[: layout.length].reshape(layout.union.size, width + 1)
    dense = values[layout.length :]
    k = dp.rows_k(layout.union.size)
    gamma = dp.count_scale(k)
    sigma = dp.rows_sigma(k, codec.frac_bits, _words_set(k, width, dense.size - 1))
    sigma_real = sigma / codec.scale
    ratio = np.where(alive > 0, alive / np.maximum(t_rows, 1), 0.0)
    count_std = sigma_real * np.sqrt(ratio) / gamma
    released_counts = rows[:, width] / gamma
    sums, counts, _ = suppress_small_counts(
        rows[:, :width], released_counts, count_std, count_threshold_stds(layout.union.size)
    )
    if weighted:
        weight = float(dense[-1]) / gamma
        std = sigma_real * math.sqrt(survivors / max(threshold, 1)) / gamma
        if not weight > count_threshold_stds(1) * std:
            weight = 0.0
    else:
        weight = survivors * min(1.0, dp.count_clip)
    return NoisySums(
        sums, counts, rows[:, :width].copy(), released_counts, count_std, dense[:-1], weight
    )


# -- one entry point per phase for both clients (the mod and the in-process party) -------------
def union_input(
    psu: PSUParams, rows: NDArray[np.int64], dp: SFSLDP | None, frac_bits: int, threshold: int
) -> NDArray[np.uint64]:
    """Return a client's union-phase vector: Alg. 3's filter (``dp`` None) or noisy counts."""
    if dp is None:
        return client_vector(psu, rows)
    return noisy_union_vector(psu.domain_size, rows, dp, frac_bits, threshold)


def rows_input(
    layout: RowVector,
    rows_round: RowsRound,
    perturbed: NDArray[np.int64],
    model: Mapping[str, NDArray[np.generic]],
    trained: Mapping[str, NDArray[np.generic]],
    weight: float,
    real: tuple[NDArray[np.int64], NDArray[np.float64]],
    vector_length: int,
) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Return a client's rows-round words and positions ``R_i``: Alg. 1's, or with DP noise.

    ``dp`` None is :func:`~flwr_fsl.families.sfsl.protocol.rows_vector` (the paper); else the
    clipped, count-scaled and noised vector of :func:`noisy_rows_vector` at the same positions.

    Raises
    ------
    ClientInputError
        If the trained model does not match the received one or a delta is not finite.
    """
    table, dp = rows_round.table, rows_round.dp
    if dp is None:
        if not (weight <= rows_round.max_count and np.all(real[1] <= rows_round.max_count)):
            raise ClientInputError(
                f"a count or the weight exceeds max_count = {rows_round.max_count:g} (the "
                "client leaves the round; raise SFSLFedSubAvg(max_count=...))"
            )
        return rows_vector(
            layout, table, rows_round.clip, perturbed, model, trained, weight, real, vector_length
        )
    if set(trained) != set(model) or any(trained[k].shape != model[k].shape for k in model):
        raise ClientInputError("the train reply's arrays do not match the model")
    rows = real[0]
    base = np.asarray(model[table], dtype=np.float64)
    new = np.asarray(trained[table], dtype=np.float64)
    deltas = {int(r): new[r] - base[r] for r in rows[np.isin(rows, perturbed)]}
    parts = [
        (np.asarray(trained[k], np.float64) - np.asarray(model[k], np.float64)).reshape(-1)
        for k in model
        if k != table
    ]
    dense = np.concatenate(parts) if parts else np.zeros(0)
    if not (np.all(np.isfinite(dense)) and all(np.all(np.isfinite(d)) for d in deltas.values())):
        raise ClientInputError("a trained row or tensor is not finite")
    words = noisy_rows_vector(layout, perturbed, (deltas, dense), real, weight, dp, rows_round)
    positions = np.concatenate(
        [layout.positions(perturbed), np.arange(layout.length, vector_length, dtype=np.int64)]
    )
    return words, positions
