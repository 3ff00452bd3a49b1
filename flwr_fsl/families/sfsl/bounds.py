"""Plausibility bounds on SFSL's decoded sums: a sum no honest clients can build fails the round.

Secure aggregation hides every client's words, so the server cannot check one client's input;
it can check the *sum*. Each honest client encodes bounded values (its counts and weight in
``(0, max_count]`` — 1 each when unweighted, ``count_clip`` scaled by ``γ`` with DP — and each
update coordinate within ``clip`` times its count, or quantizer levels in ``[0, γ_q - 1]``
times it). A masked input not made for this round (a replay from another round, words shifted
or corrupted after masking) unmasks to words uniform in ``Z_2^64``, far outside those bounds
except with a chance of about ``bound / 2^64`` per word. A sum outside them fails the round
(:class:`~flwr_fsl.core.errors.RoundFailedError`, model unchanged): the server cannot tell
which survivor sent the bad input, so none is applied and the reason names every survivor. A
client that deviates *within* the bounds (a wrong but plausible update or count) is not
caught: secure aggregation gives the server nothing to check it against.

Each bound has an allowance for honest error: one fixed-point unit per summand (stochastic
rounding) and, with DP, ``NOISE_STDS`` standard deviations of the summed noise (SFSL's noise is
not clipped; a Gaussian beyond 64 standard deviations has probability below ``e^-2000``).

**The PSU union** of the paper (no DP) sums uniform nonzero words, so it has no bound: a bad
union input can only turn empty filter positions nonzero (probability ``1 - 2^-64`` each), so
the union grows — never loses a row — and the rows round stays exact over the honest inputs.
With DP the union counts are bounded like the rows (:func:`check_union_counts`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import RoundFailedError
from flwr_fsl.families.secagg.vector import unattributed
from flwr_fsl.families.sfsl.messages import SFSLSettings
from flwr_fsl.families.sfsl.protocol import RowVector

__all__ = ["NOISE_STDS", "check_rows_sum", "check_union_counts"]

NOISE_STDS = 64.0
"""Standard deviations of summed DP noise allowed beyond a bound (false alarm below e^-2000)."""


def _outside(what: str, survivors: Sequence[int]) -> RoundFailedError:
    return RoundFailedError(
        f"the aggregate is outside its bounds: {what}; {unattributed(survivors)}"
    )


def check_union_counts(counts: NDArray[np.float64], std: float, survivors: Sequence[int]) -> None:
    """Check a DP union's holder counts: each in ``[0, survivors]`` up to its noise.

    Parameters
    ----------
    counts : numpy.ndarray
        The decoded noisy holder count of every table row.
    std : float
        The standard deviation of one summed count (holder units).
    survivors : sequence of int
        The clients whose inputs the sum holds.

    Raises
    ------
    RoundFailedError
        If a count is outside the bounds.
    """
    n = len(survivors)
    eps = NOISE_STDS * std + n * 2.0**-20
    if counts.size and not (float(counts.min()) >= -eps and float(counts.max()) <= n + eps):
        raise _outside(f"a union count is not in [0, {n} survivors]", survivors)


def check_rows_sum(
    layout: RowVector,
    values: NDArray[np.float64],
    settings: SFSLSettings,
    alive: NDArray[np.int64],
    survivors: Sequence[int],
    noise: tuple[NDArray[np.float64], float] | None = None,
) -> None:
    """Check a decoded rows sum (rows part, then dense part with its weight last).

    Parameters
    ----------
    layout : RowVector
        The round's rows layout.
    values : numpy.ndarray
        The decoded words (real units, before any DP post-processing).
    settings : SFSLSettings
        The round's settings (``max_count``, ``clip``, quantizer, ``weighted``, ``dp``).
    alive : numpy.ndarray
        Per union row: how many survivors contributed at it.
    survivors : sequence of int
        The rows round's survivors (their inputs are in the sum).
    noise : tuple, optional
        With DP: the standard deviation of each row's summed noise and of the dense part's
        (real units).

    Raises
    ------
    RoundFailedError
        If the sum is outside its bounds.
    """
    n = len(survivors)
    width = layout.width
    unit = 1.0 / layout.codec.scale
    rows = values[: layout.length].reshape(layout.union.size, width + 1)
    dense = values[layout.length :]
    row_std, dense_std = noise if noise is not None else (np.zeros(rows.shape[0]), 0.0)
    row_eps = alive * unit + NOISE_STDS * row_std
    dense_eps = n * unit + NOISE_STDS * dense_std
    dp = settings.dp
    # Per summand: the largest count (scaled by γ with DP) and the largest word per count.
    if dp is not None:
        gamma = dp.count_scale(dp.rows_k(layout.union.size))
        top, per_count, low = gamma * dp.count_clip, min(settings.clip, dp.clip_norm) / gamma, 0.0
    else:
        top = settings.max_count if settings.weighted else 1.0
        quantizer = layout.quantizer
        per_count = settings.clip if quantizer is None else float(quantizer.levels - 1)
        low = 0.0
    count = rows[:, width]
    if not np.all((count >= low - row_eps) & (count <= alive * top + row_eps)):
        raise _outside(f"a row count is not in [0, its participants x {top:g}]", survivors)
    reach = np.maximum(count, 0.0) + row_eps
    words = rows[:, :width]
    ok = layout.quantizer is None or dp is not None or bool(np.all(words >= -row_eps[:, None]))
    if not (ok and np.all(np.abs(words) <= per_count * reach[:, None] + row_eps[:, None])):
        raise _outside("a row's update words exceed clip x its count", survivors)
    weight = float(dense[-1])
    if dp is None and not settings.weighted:
        if not abs(weight - n) <= dense_eps:
            raise _outside(f"the dense weight {weight:.6g} is not the {n} survivors'", survivors)
    elif not -dense_eps <= weight <= n * top + dense_eps:
        raise _outside(f"the dense weight {weight:.6g} is not in [0, {n} x {top:g}]", survivors)
    clip = settings.clip if dp is None else min(settings.clip, dp.clip_norm) / gamma
    if (
        dense.size > 1
        and not float(np.max(np.abs(dense[:-1])))
        <= clip * (max(weight, 0.0) + dense_eps) + dense_eps
    ):
        raise _outside("a dense update word exceeds clip x the dense weight", survivors)
    if not math.isfinite(weight):
        raise _outside("the dense weight is not finite", survivors)
