"""Distributed differential privacy for two-server SSA: each server noises its own share.

**Why.** Totals of rounds with known participation can be differenced: with fixed row sets, a
round with everybody and one where a client dropped out give exactly that client's rows and
weight (``tests/families/ssa/test_two_server.py``). Minimum participation does not prevent it;
noise does.

**Threat model.** Two non-colluding semi-honest servers, as in
:mod:`flwr_fsl.families.ssa.protocol`;
semi-honest clients (they clip as told; a client that does not clip is outside the model, as
one that forges keys is). The released quantity of a round is the reconstructed per-element
vector ``(sums, counts)`` of shape ``(m, τ)``, ``τ = w + 1`` (``w`` the value width). Both
servers see it: S0 reconstructs it, S1 sees it through the published model (and the PSR table
it is given in index mode).

**Mechanism.** When a round's :class:`~flwr_fsl.families.ssa.protocol.SSAParams` carry a
:class:`DistributedDP`, each server adds independent Gaussian noise ``N(0, σ_b²)`` to every
word of its own additive share before it is combined (S0 before ``reconstruct``, S1 in
``FinishRound`` before it returns its share), ``σ_b = z_b · Δ``, encoded on the ring's
fixed-point grid. A server knows its own noise and can subtract it, so what protects the
clients against S0 is **S1's noise alone**, and against S1 **S0's noise alone**: each server's
``σ`` is calibrated so that its noise by itself gives the stated ``(ε, δ)``. Neither server
ever sees the un-noised aggregate. The model carries both servers' noise (variance
``σ_0² + σ_1²``, ``2σ²`` when both use the same multiplier): that is the price of not
trusting either server with the other's noise.

**Guarantee.** Client-level ``(ε, δ)``-DP (neighbouring runs: one client added or removed,
in every round it could take part in) of the sequence of released aggregates, against *each*
server separately, given that the *other* server adds its noise. Nothing beyond the aggregate
is covered here (what each server sees besides it is pseudorandom, see
:mod:`flwr_fsl.families.ssa.protocol`), nor collusion of the servers, nor clients that do not clip.

**Sensitivity.** A client clips (:func:`clip_update`) its update to L2 norm ``C``
(``clip_norm``) over all values of its chosen elements together, and each weight to at most
``W`` (``max_weight``); a client chooses at most ``k`` elements (``num_items``). Its
contribution to the released vector is, per chosen element ``j``, the row
``(c_j · dw_j, c_j)`` (``w`` sum words and one count word), zero elsewhere. Then

    ||contribution||² = Σ_j c_j² ||dw_j||² + Σ_j c_j²  <=  W² Σ_j ||dw_j||² + W² k
                      <=  W² (C² + k),

so the L2 sensitivity under adding or removing one client is ``W · sqrt(C² + k)``. The same
bound holds in both modes: **scalar** (top-k coordinates, ``w = 1``, ``k`` coordinates, ``k``
count words) and **mega-element** (rows, ``w`` = row width, ``k`` rows): each chosen element
adds exactly one count word however wide it is, and the ``C`` bound is over the client's whole
update. The count word is what makes ``k`` appear: revealing per-element weights costs
``sqrt(k)`` in noise. Stochastic rounding to the fixed-point grid moves each of the client's
``k τ`` words by less than ``2^-f`` (``f`` = ``frac_bits``), so the sensitivity of the
*encoded* aggregate, used here, is

    Δ = W · sqrt(C² + k) + 2^-f · sqrt(k τ)        (:func:`sensitivity`).

Cuckoo stash slots and dummy bins change nothing: they reconstruct to zero outside the chosen
elements.

**Accounting.** The Gaussian mechanism with sensitivity ``Δ`` and noise ``σ = z Δ`` is the
round's release, recorded by its noise multiplier ``z`` in a
:class:`~flwr_fsl.core.privacy.PrivacyAccount` (Rényi DP composed by Google's ``dp-accounting``,
Mironov 2017): S0's strategy keeps the account of S0's noise (the guarantee against S1) and
S1 keeps, on disk and per run, the account of its own noise (the guarantee against S0,
:mod:`flwr_fsl.helper.services.ssa`). Both servers add noise of the round's ``z`` (S1 refuses
a round below its own floor instead of silently adding more), so the two accounts list the
same ``z`` and one ``(ε, δ)`` holds against each server separately. Every round counts,
whether the client took part or not (no amplification by sampling is claimed: the sampling
is S0's and S0 is one of the adversaries). A run's :class:`~flwr_fsl.core.privacy.PrivacyBudget`
(``privacy_budget=`` of the strategies, :data:`DEFAULT_BUDGET` by default) stops the run at
S0 before a round that would exceed it, and S1 refuses such a round too.

The zero-concentrated-DP bound (Bun & Steinke 2016, Prop. 1.6 and 1.3), used before, is kept
as a cross-check (:func:`zcdp_rho`, :func:`zcdp_to_epsilon`, :func:`epsilon`): ``ρ = 1/(2 z²)``
per round, ``ρ_T = Σ_t ρ_t``, and ``ε = ρ_T + 2 sqrt(ρ_T ln(1/δ))``; the RDP figure is never
larger (``tests/core/test_privacy.py``, ``tests/families/ssa/test_dp.py``).

**Defaults.** Index mode (:class:`~flwr_fsl.families.ssa.index_strategy.SecureRowFedSubAvg`)
runs with :data:`INDEX_MODE_DP` (``z = 1``, ``C = 1``, ``W = 1``) and :data:`DEFAULT_BUDGET`
(``ε = 20`` at ``δ = 1e-5``: 10 rounds at ``z = 1``) unless told otherwise, because its
rows are fixed by the clients' data and per-row counts over rounds of changing participation
decode who holds which row by least squares
(``tests/attacks/test_ssa_index_row_least_squares.py``); its clients refuse a round promising
less than :data:`INDEX_MODE_NOISE_FLOOR` (node config ``fsl-min-noise-multiplier``). Top-k
mode keeps DP opt-in (:data:`TOPK_MODE_NOISE_FLOOR` = 0).

A DP round's parameters name its run (:class:`RunScope`: the Flower run id and the run's
budget), which is what S1 keys its account by; clients check the run id against their own
Flower run before they answer, and their sealed material is bound to the parameters' hash,
so S0 can neither move a client's material into a fresh account nor replay it past the budget.

**Rounding and sampling.** Each noise word is ``rint(σ · g · 2^f)`` on the ring's signed
fixed-point grid, ``g`` standard normal. The share already holds grid integers, so adding a
rounded noise word equals rounding ``share + σ g 2^f``: post-processing of the Gaussian
mechanism on the encoded aggregate, which costs no privacy. ``g`` comes from Box–Muller on
AES-128-CTR output keyed by :func:`os.urandom` (:class:`~flwr_fsl.crypto.prg.PRGStream`),
with an exponential sampler whose tail is not cut at 2^-53 (a plain ``-ln(u)`` of a 53-bit
uniform would truncate the Gaussian near 8.6σ, which over ``m τ`` words adds to ``δ``);
samples beyond ``64σ`` (probability below ``e^-2000``) are clipped so a word never wraps.
**Floating-point caveat** (Mironov 2012, "On significance of the least significant bits for
differential privacy"): the normal samples are computed in float64, whose non-uniform grid
leaves the sampled distribution slightly off the ideal Gaussian; the guarantee above is the
ideal mechanism's. Rounding to the much coarser fixed-point grid ``2^-f`` removes the
low-order float artefacts Mironov's attack reads, but an exact implementation would use a
discrete Gaussian sampler (Canonne, Kamath & Steinke 2020); not done here.

**Cost.** Noise of std ``sqrt(σ_0² + σ_1²)`` on every sum and count word; counts near zero
make ``sums / counts`` explode, so the released counts are post-processed
(:func:`suppress_small_counts`): an element whose noisy count is below a threshold of
``t`` noise stds is left unchanged, ``t`` chosen so that on average fewer than
:data:`FALSE_POSITIVES` of the ``m`` untouched elements pass it per round (``t`` about 4.6 for
``m = 40``, 6.4 for ``m = 2^20``; an untouched element that passed would move by noise over
noise). Elements chosen by few clients are therefore not updated, and the others are
averaged with relative noise ``~ σ / count``: DP needs many clients per element.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.privacy import DEFAULT_DELTA, PrivacyBudget
from flwr_fsl.crypto.discrete_gaussian import exponential
from flwr_fsl.crypto.fixedpoint import FixedPoint, FixedPointOverflowError
from flwr_fsl.crypto.prg import PRGStream

# The count post-processing is the one of every family with noisy counts (re-exported here).
from flwr_fsl.submodel.aggregate import (
    FALSE_POSITIVES,
    count_threshold_stds,
    suppress_small_counts,
)

__all__ = [
    "DEFAULT_BUDGET",
    "FALSE_POSITIVES",
    "INDEX_MODE_DP",
    "INDEX_MODE_NOISE_FLOOR",
    "MAX_RUN_ID_CHARS",
    "NOISE_CLIP_STDS",
    "TOPK_MODE_NOISE_FLOOR",
    "DistributedDP",
    "RunScope",
    "check_headroom",
    "clip_update",
    "count_threshold_stds",
    "dp_options",
    "epsilon",
    "gaussian",
    "noise_std",
    "noise_words",
    "sensitivity",
    "suppress_small_counts",
    "zcdp_rho",
    "zcdp_to_epsilon",
]

NOISE_CLIP_STDS = 64.0
"""Noise samples are clipped to ``+-64 sigma`` (probability below ``e^-2000``): no word wraps."""

DEFAULT_BUDGET = PrivacyBudget(epsilon=20.0, delta=DEFAULT_DELTA)
"""A DP run's budget unless told otherwise: ``ε = 20`` at ``δ = 1e-5`` (10 rounds at ``z = 1``)."""

INDEX_MODE_NOISE_FLOOR = 1.0
"""Smallest noise multiplier an index-mode client accepts unless its node config says otherwise."""

TOPK_MODE_NOISE_FLOOR = 0.0
"""Smallest noise multiplier a top-k client accepts unless its node config says otherwise."""

MAX_RUN_ID_CHARS = 128
"""Longest run id a DP round may name (S1 keys its account file by it)."""


def _positive_finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be a number, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ConfigurationError(f"{name} must be finite and > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class DistributedDP:
    """Public differential-privacy settings of SSA rounds (every party sees them).

    Parameters
    ----------
    noise_multiplier : float
        ``z``: each server's noise std is ``z · Δ`` (:func:`noise_std`). 0 asks for no noise
        (clients still clip); S1 refuses a round below its floor (``flwr-fsl-helper
        --dp-noise-multiplier``), a client one below its own (node config
        ``fsl-min-noise-multiplier``).
    clip_norm : float
        ``C``: a client's update is clipped to this L2 norm over all its chosen elements'
        values.
    max_weight : float
        ``W``: each of a client's weights (its sample count, or a per-row count) is clipped to
        at most this.
    delta : float
        ``δ`` of the reported ``(ε, δ)``, in ``(0, 1)`` (accounting only; it does not change
        the noise).

    Raises
    ------
    ValueError
        If ``noise_multiplier`` is negative or not finite, ``clip_norm`` or ``max_weight``
        is not finite and > 0, or ``delta`` is not in ``(0, 1)``; the message names the field.
    """

    noise_multiplier: float
    clip_norm: float
    max_weight: float
    delta: float = field(default=1e-5)

    def __post_init__(self) -> None:
        z = self.noise_multiplier
        if isinstance(z, bool) or not isinstance(z, int | float):
            raise ConfigurationError(f"noise_multiplier must be a number, got {z!r}")
        if not (math.isfinite(z) and z >= 0):
            raise ConfigurationError(f"noise_multiplier must be finite and >= 0, got {z!r}")
        _positive_finite("clip_norm", self.clip_norm)
        _positive_finite("max_weight", self.max_weight)
        d = self.delta
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0 < d < 1:
            raise ConfigurationError(f"delta must be in (0, 1), got {d!r}")

    def to_dict(self) -> dict[str, float]:
        """Return the fields as a JSON-ready dict (floats)."""
        return {k: float(v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, raw: Any) -> DistributedDP:
        """Parse :meth:`to_dict` output strictly (exactly these keys, numbers only).

        Raises
        ------
        ClientInputError
            If ``raw`` is not such a dict or a value is not a number.
        ConfigurationError
            If a value is out of range (the dataclass's own checks).
        """
        names = {"noise_multiplier", "clip_norm", "max_weight", "delta"}
        if not isinstance(raw, dict) or set(raw) != names:
            raise ClientInputError(f"dp must be an object with exactly the fields {sorted(names)}")
        for name, value in raw.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ClientInputError(f"dp field {name!r} must be a number")
        return cls(**{k: float(v) for k, v in raw.items()})


INDEX_MODE_DP = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, max_weight=1.0)
"""Index mode's default DP settings: ``z = 1``, update clipped to L2 norm 1, weights to 1."""


@dataclass(frozen=True)
class RunScope:
    """The run a DP round's release counts against, and that run's budget (public).

    S1 keeps its privacy account per run id (on disk), so neither a new session nor a restart
    of S1 resets it; clients check :attr:`run_id` against their own Flower run id.

    Parameters
    ----------
    run_id : str
        The run's identifier (S0 sends the Flower run id): 1 to :data:`MAX_RUN_ID_CHARS`
        printable ASCII characters.
    budget : PrivacyBudget, optional
        The run's budget as S0 announces it (S1 refuses rounds past it, and past its own
        ceiling); None: the run accounts without a budget.

    Raises
    ------
    ConfigurationError
        If ``run_id`` is empty, too long or not printable ASCII, or ``budget`` is not a
        :class:`~flwr_fsl.core.privacy.PrivacyBudget`.
    """

    run_id: str
    budget: PrivacyBudget | None = None

    def __post_init__(self) -> None:
        rid = self.run_id
        if not isinstance(rid, str) or not 1 <= len(rid) <= MAX_RUN_ID_CHARS:
            raise ConfigurationError(
                f"run_id must be a str of 1 to {MAX_RUN_ID_CHARS} characters, got {rid!r}"
            )
        if not (rid.isascii() and rid.isprintable()):
            raise ConfigurationError("run_id must be printable ASCII")
        if self.budget is not None and not isinstance(self.budget, PrivacyBudget):
            raise ConfigurationError(f"budget must be a PrivacyBudget, got {self.budget!r}")

    def to_dict(self) -> dict[str, str | float]:
        """Return ``{"id": ...}`` plus ``epsilon`` and ``delta`` when there is a budget."""
        out: dict[str, str | float] = {"id": self.run_id}
        if self.budget is not None:
            out["epsilon"] = float(self.budget.epsilon)
            out["delta"] = float(self.budget.delta)
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> RunScope:
        """Parse :meth:`to_dict` output strictly.

        Raises
        ------
        ClientInputError
            If ``raw`` is not such a dict (exactly ``id``, or ``id``, ``epsilon`` and
            ``delta``) or a field has the wrong type.
        ConfigurationError
            If a value is out of range (the dataclasses' own checks).
        """
        if not isinstance(raw, dict) or set(raw) not in ({"id"}, {"id", "epsilon", "delta"}):
            raise ClientInputError("run must be an object with id (and epsilon, delta)")
        if not isinstance(raw["id"], str):
            raise ClientInputError("run id must be a string")
        budget = None
        if "epsilon" in raw:
            for name in ("epsilon", "delta"):
                value = raw[name]
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ClientInputError(f"run field {name!r} must be a number")
            budget = PrivacyBudget(float(raw["epsilon"]), float(raw["delta"]))
        return cls(raw["id"], budget)


def dp_options(
    noise_multiplier: float,
    clip_norm: float = 1.0,
    max_weight: float = 1.0,
    budget_epsilon: float = DEFAULT_BUDGET.epsilon,
    delta: float = DEFAULT_DELTA,
) -> dict[str, Any]:
    """Return the SSA strategies' ``dp`` and ``privacy_budget`` arguments from plain numbers.

    For run-config knobs (the examples' ``ssa-dp-*`` keys).

    Parameters
    ----------
    noise_multiplier : float
        ``z``; 0 turns DP off (``dp=None``: the documented leaks return, and index-mode
        clients refuse such rounds unless their node config lowers ``fsl-min-noise-multiplier``).
    clip_norm, max_weight : float
        ``C`` and ``W`` of :class:`DistributedDP`.
    budget_epsilon : float
        The run's budget ``ε`` at ``delta``; 0 accounts without a budget.
    delta : float
        ``δ`` of the budget and of the reported ``(ε, δ)``.

    Returns
    -------
    dict[str, Any]
        ``{"dp": DistributedDP | None, "privacy_budget": PrivacyBudget | None}``.

    Raises
    ------
    ConfigurationError
        If a value is out of range (naming it).
    """
    if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, int | float):
        raise ConfigurationError(f"noise_multiplier must be a number, got {noise_multiplier!r}")
    if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ConfigurationError(f"noise_multiplier must be >= 0, got {noise_multiplier!r}")
    if noise_multiplier == 0:
        return {"dp": None, "privacy_budget": None}
    dp = DistributedDP(float(noise_multiplier), clip_norm, max_weight, delta)
    if not budget_epsilon >= 0:
        raise ConfigurationError(f"budget_epsilon must be >= 0, got {budget_epsilon!r}")
    budget = PrivacyBudget(budget_epsilon, delta) if budget_epsilon > 0 else None
    return {"dp": dp, "privacy_budget": budget}


def sensitivity(dp: DistributedDP, num_items: int, value_width: int, frac_bits: int) -> float:
    """L2 sensitivity ``Δ`` of the encoded ``(sums, counts)`` aggregate to one client.

    Parameters
    ----------
    dp : DistributedDP
        Clip norm ``C`` and weight bound ``W``.
    num_items : int
        ``k``: elements (coordinates or rows) one client may choose.
    value_width : int
        ``w``: words per element's value (1 for coordinates, the row width for rows).
    frac_bits : int
        ``f``: fixed-point fractional bits (stochastic rounding moves a word by < ``2^-f``).

    Returns
    -------
    float
        ``W · sqrt(C² + k) + 2^-f · sqrt(k (w + 1))`` (derivation in the module docstring).

    Raises
    ------
    ConfigurationError
        If ``num_items``, ``value_width`` or ``frac_bits`` is out of range.
    """
    if num_items < 1 or value_width < 1 or frac_bits < 0:
        raise ConfigurationError("num_items and value_width must be >= 1 and frac_bits >= 0")
    k, tau = num_items, value_width + 1
    return dp.max_weight * math.sqrt(dp.clip_norm**2 + k) + 2.0**-frac_bits * math.sqrt(k * tau)


def noise_std(
    dp: DistributedDP,
    num_items: int,
    value_width: int,
    frac_bits: int,
    noise_multiplier: float | None = None,
) -> float:
    """One server's noise std per word: ``σ = z · Δ``.

    Parameters
    ----------
    dp : DistributedDP
        The round's settings.
    num_items, value_width, frac_bits : int
        As in :func:`sensitivity`.
    noise_multiplier : float, optional
        ``z`` to use instead of ``dp.noise_multiplier`` (S1's floor).

    Returns
    -------
    float
        ``σ`` in real units (before the fixed-point scale).
    """
    z = dp.noise_multiplier if noise_multiplier is None else float(noise_multiplier)
    return z * sensitivity(dp, num_items, value_width, frac_bits)


def zcdp_rho(noise_multiplier: float) -> float:
    """Return the zCDP ``ρ = Δ²/(2σ²) = 1/(2 z²)`` of one Gaussian release (``inf`` for ``z = 0``).

    Raises
    ------
    ConfigurationError
        If ``noise_multiplier`` is negative or not finite.
    """
    z = float(noise_multiplier)
    if not (math.isfinite(z) and z >= 0):
        raise ConfigurationError(
            f"noise_multiplier must be finite and >= 0, got {noise_multiplier!r}"
        )
    return math.inf if z == 0 else 1.0 / (2.0 * z * z)


def zcdp_to_epsilon(rho: float, delta: float) -> float:
    """``ε = ρ + 2 sqrt(ρ ln(1/δ))``: ``ρ``-zCDP implies ``(ε, δ)``-DP.

    Raises
    ------
    ConfigurationError
        If ``rho`` < 0 or ``delta`` is not in ``(0, 1)``.
    """
    if not rho >= 0:
        raise ConfigurationError(f"rho must be >= 0, got {rho!r}")
    if not 0 < delta < 1:
        raise ConfigurationError(f"delta must be in (0, 1), got {delta!r}")
    if math.isinf(rho):
        return math.inf
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def epsilon(noise_multiplier: float, rounds: int, delta: float) -> float:
    """``ε`` after ``rounds`` rounds at a fixed noise multiplier (``δ`` given).

    Parameters
    ----------
    noise_multiplier : float
        ``z`` of the server whose noise protects against the other.
    rounds : int
        ``T``: rounds released so far (every round counts).
    delta : float
        ``δ`` in ``(0, 1)``.

    Returns
    -------
    float
        ``ε`` with ``ρ_T = T / (2 z²)`` (0 for no round).

    Raises
    ------
    ConfigurationError
        If ``rounds`` < 0 or another argument is out of range.
    """
    if rounds < 0:
        raise ConfigurationError(f"rounds must be >= 0, got {rounds}")
    if rounds == 0:
        return 0.0
    return zcdp_to_epsilon(rounds * zcdp_rho(noise_multiplier), delta)


def gaussian(n: int, stream: PRGStream | None = None) -> NDArray[np.float64]:
    """``n`` standard normal samples from a CSPRNG (Box–Muller on AES-CTR output).

    Parameters
    ----------
    n : int
        How many samples.
    stream : PRGStream, optional
        The randomness (tests pass a keyed one); a fresh ``os.urandom``-keyed stream by
        default.

    Returns
    -------
    numpy.ndarray
        ``(n,)`` float64.
    """
    stream = stream if stream is not None else PRGStream.fresh()
    pairs = (n + 1) // 2
    radius = np.sqrt(2.0 * exponential(stream, pairs))
    angle = (stream.words(pairs) >> np.uint64(11)).astype(np.float64) * (2.0 * math.pi * 2.0**-53)
    out = np.empty(2 * pairs)
    out[0::2] = radius * np.cos(angle)
    out[1::2] = radius * np.sin(angle)
    return out[:n]


def check_headroom(fixed_point: FixedPoint, sigma: float, parties: int = 2) -> None:
    """Check that the aggregate plus ``parties`` noise words of std ``sigma`` cannot wrap.

    Raises
    ------
    FixedPointOverflowError
        If ``max_summands · max_abs + parties · 64σ`` (scaled) exceeds the ring's range.
    """
    scale = fixed_point.scale
    data = fixed_point.max_summands * math.ceil(fixed_point.max_abs * scale)
    noise = parties * math.ceil(NOISE_CLIP_STDS * sigma * scale)
    if data + noise > fixed_point.ring.max_signed:
        raise FixedPointOverflowError(
            f"DP noise of std {sigma:.4g} at {fixed_point.frac_bits} fractional bits does not "
            "fit the ring beside the aggregate: lower frac_bits, max_abs or the noise"
        )


def noise_words(
    shape: tuple[int, ...],
    sigma: float,
    fixed_point: FixedPoint,
    stream: PRGStream | None = None,
) -> NDArray[np.uint64]:
    """Gaussian noise ``N(0, σ²)`` per word, on the fixed-point grid, as ring words.

    Parameters
    ----------
    shape : tuple of int
        The share's shape, ``(m, τ)``.
    sigma : float
        Noise std in real units (>= 0; 0 gives zeros).
    fixed_point : FixedPoint
        The round's codec (scale and ring).
    stream : PRGStream, optional
        Randomness (a fresh CSPRNG stream by default).

    Returns
    -------
    numpy.ndarray
        uint64 words ``rint(σ g 2^f)`` (``|g| <= 64``) in the ring's signed encoding; add them
        to a share.

    Raises
    ------
    ConfigurationError
        If ``sigma`` is negative or not finite.
    FixedPointOverflowError
        If the noise does not fit beside the aggregate (:func:`check_headroom`).
    """
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ConfigurationError(f"sigma must be finite and >= 0, got {sigma!r}")
    n = math.prod(shape)
    if sigma == 0 or n == 0:
        return np.zeros(shape, np.uint64)
    check_headroom(fixed_point, sigma)
    g = np.clip(gaussian(n, stream), -NOISE_CLIP_STDS, NOISE_CLIP_STDS)
    scaled = np.rint(g * (sigma * fixed_point.scale)).astype(np.int64)
    return fixed_point.ring.encode_signed(scaled).reshape(shape)


def clip_update(
    values: NDArray[np.float64], weights: NDArray[np.float64], dp: DistributedDP
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Clip a client's update for DP: L2 norm of all values to ``C``, each weight to ``W``.

    Parameters
    ----------
    values : numpy.ndarray
        ``(n, w)`` values of the client's ``n`` chosen elements.
    weights : numpy.ndarray
        ``(n,)`` positive weights (sample count broadcast, or per-element counts).
    dp : DistributedDP
        ``clip_norm`` and ``max_weight``.

    Returns
    -------
    tuple[numpy.ndarray, numpy.ndarray]
        ``values · min(1, C / ||values||)`` and ``min(weights, W)``.
    """
    v = np.asarray(values, np.float64)
    # Scale by the largest magnitude first: sum(v*v) overflows to inf for |v| > 1e154, which
    # would clip a huge (hostile) update to zero with a RuntimeWarning instead of to norm C.
    scale = float(np.max(np.abs(v))) if v.size else 0.0
    norm = scale * float(np.sqrt(np.sum((v / scale) ** 2))) if scale > 0 else 0.0
    if norm > dp.clip_norm:
        v = v * (dp.clip_norm / norm)
        # Float rounding may leave the norm a hair above C; shrink by one ulp-scale step.
        v = v * (1.0 - 1e-12)
    return v, np.minimum(np.asarray(weights, np.float64), dp.max_weight)
