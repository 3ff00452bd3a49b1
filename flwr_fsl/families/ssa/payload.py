"""Client side of SSA's payload: fixed-point words ``(c * value, c)`` of a client's elements.

Split out of :mod:`flwr_fsl.families.ssa.protocol` (which re-exports :func:`payload_words`):
unit weights, DP clipping and the fixed-point bound are applied here, on every client path.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.fixedpoint import FixedPointOverflowError
from flwr_fsl.families.ssa.dp import clip_update
from flwr_fsl.families.ssa.messages import SSAParams

__all__ = ["payload_words"]


def payload_words(
    params: SSAParams,
    values: ArrayLike,
    weights: ArrayLike | float,
    rng: np.random.Generator | None = None,
) -> NDArray[np.uint64]:
    """Fixed-point payload rows ``(c * value, c)`` (or ``value``) of a client's elements.

    Parameters
    ----------
    params : SSAParams
        The round.
    values : array_like
        ``(n, value_width)`` (or ``(n,)`` when the width is 1) update values.
    weights : array_like or float
        The client's weight ``c`` (sample count) or one weight per element; ignored in a
        round with ``params.weighted`` False, where every element's ``c`` is 1.
    rng : numpy.random.Generator, optional
        Stochastic-rounding randomness.

    Returns
    -------
    numpy.ndarray
        ``(n, tau)`` uint64.

    Raises
    ------
    ConfigurationError
        If shapes disagree or weights are not finite and > 0.
    FixedPointOverflowError
        If a payload word exceeds ``max_abs`` (the weight and each ``c * value`` are
        checked before any product is formed, so a huge weight raises this, not a numpy
        overflow warning).

    Notes
    -----
    Unit weights (``params.weighted`` False) and, in a round with ``params.dp``, clipping
    are applied here, so every client path (fresh keys and U-DPF hints) obeys them. Clipping
    is :func:`~flwr_fsl.families.ssa.dp.clip_update` (L2 norm of all rows to ``clip_norm``,
    each weight to ``max_weight``).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1 and params.value_width == 1:
        v = v.reshape(-1, 1)
    if v.ndim != 2 or v.shape[1] != params.value_width:
        raise ConfigurationError(f"values must have shape (n, {params.value_width})")
    if params.count_weighted:
        if not params.weighted:  # unit weights: the count word counts clients, not samples
            weights = 1.0
        try:
            c = np.broadcast_to(np.asarray(weights, dtype=np.float64), (v.shape[0],))
        except ValueError:  # numpy's text would quote both lengths (the set size)
            raise ConfigurationError("weights must be one number or one per value row") from None
        if c.size and (not np.all(np.isfinite(c)) or np.any(c <= 0)):
            raise ConfigurationError("weights must be finite and > 0")
        if params.dp is not None:
            if not np.all(np.isfinite(v)):
                raise ConfigurationError("update values must be finite")
            v, c = clip_update(v, c, params.dp)
        _check_weighted_bound(v, c, params.max_abs)
        v = np.concatenate([v * c[:, None], c[:, None]], axis=1)
    try:
        return params.fixed_point.encode(v, rng)
    except FixedPointOverflowError:
        # The codec's text quotes the offending value: a client's secret.
        raise _payload_overflow(params.max_abs) from None


def _payload_overflow(max_abs: float) -> FixedPointOverflowError:
    """Return the error for a payload word out of range (its text quotes no value: a secret)."""
    return FixedPointOverflowError(f"a payload word is NaN, inf or exceeds max_abs={max_abs}")


def _check_weighted_bound(
    values: NDArray[np.float64], weights: NDArray[np.float64], max_abs: float
) -> None:
    """Check ``|c| <= max_abs`` and ``|c * value| <= max_abs`` without computing ``c * value``.

    A finite but huge weight (``num-examples = 1e308``) times a value overflows float64 to
    inf (numpy warns on the client); comparing ``|value|`` with ``max_abs / c`` instead
    decides the same bound with no arithmetic that can overflow: ``c`` is checked first to
    be finite and in ``(0, max_abs]``, so ``max_abs / c >= 1`` is finite. (Float rounding
    may leave a product a hair above the bound; the fixed-point encoder, which checks every
    word again, rejects it then.)

    Raises
    ------
    FixedPointOverflowError
        If a weight or a weighted value exceeds ``max_abs``, or a value is NaN or inf.
    """
    if weights.size and float(np.max(weights)) > max_abs:
        raise _payload_overflow(max_abs)
    if values.size:
        limit = max_abs / weights  # >= 1 and finite: 0 < c <= max_abs was checked
        with np.errstate(invalid="ignore"):  # NaN compares False, and is rejected below
            inside = np.abs(values) <= limit[:, None]
        if not np.all(inside):
            raise _payload_overflow(max_abs)
