"""Count-weighted submodel averaging (Niu et al., Alg. 1 and App. C), written once, Flower-free.

Each element of a layout (see :mod:`flwr_fsl.submodel.layout`) is averaged only over the
clients that actually updated it, weighted by their sample counts (or by per-index counts when
sent); an element no client touched keeps its value::

    w'[j] = w[j] + S[j] / C[j]   where C[j] > 0,   S[j] = sum_i c_ij * d_ij,   C[j] = sum_i c_ij

On dense updates this is exactly FedAvg; on width slices whose clients send weights it is
HeteroFL's / FedRolex's ``combine`` (the mean of the held coordinates over their holders).

The computation has two sides so that secure aggregators reuse the second:

* :func:`accumulate` / :func:`accumulate_elements` — the plaintext sums ``S`` and counts ``C``;
  a secure aggregator instead *reconstructs* ``S`` and ``C`` (SSA: the last value column of the
  DPF-shared table; SESA: the decoded field sums), never seeing a single client's values.
* :func:`apply_count_weighted` — ``w' = w + S / C`` on the touched elements, cast back to each
  tensor's dtype (floats keep their dtype; integer buffers are rounded to nearest).
  :func:`count_weighted_mean` is the same division as a dense ``(size, width)`` array.

:func:`count_weighted_average` (plaintext FedSubAvg) is accumulate + apply over the model's
flat layout, integer buffers included.

**Noisy counts.** Under differential privacy (SSA's servers, SFSL's clients) the reconstructed
``S`` and ``C`` carry noise, and an element nobody touched reconstructs to ``(noise, noise)``:
:func:`suppress_small_counts` post-processes them (elements whose noisy count is below
:func:`count_threshold_stds` noise stds count as untouched) before the apply.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.submodel.layout import ElementUpdate, FlatLayout, Layout
from flwr_fsl.submodel.update import SubmodelUpdate

__all__ = [
    "FALSE_POSITIVES",
    "AggregationStats",
    "accumulate",
    "accumulate_elements",
    "apply_count_weighted",
    "check_clipping_range",
    "check_contribution",
    "clip_update",
    "count_threshold_stds",
    "count_weighted_average",
    "count_weighted_mean",
    "suppress_small_counts",
]

FALSE_POSITIVES = 1e-4
"""Expected number of untouched elements per round whose noisy count passes the threshold."""


@dataclass(frozen=True)
class AggregationStats:
    """What an aggregation touched.

    Attributes
    ----------
    num_updates : int
        Number of client updates averaged.
    touched : dict[str, int]
        Parameter name -> number of coordinates at least one client updated.
    """

    num_updates: int
    touched: dict[str, int]


def accumulate_elements(
    size: int, width: int, parts: Iterable[ElementUpdate]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Sum element updates into ``S = sum c * values`` and ``C = sum c`` (float64).

    Parameters
    ----------
    size, width : int
        The element space (``layout.size``, ``layout.width``).
    parts : Iterable[ElementUpdate]
        One per client, possibly from different layouts over the same element space (width
        slices of different clients).

    Returns
    -------
    tuple[numpy.ndarray, numpy.ndarray]
        ``(size, width)`` sums and ``(size,)`` counts; untouched elements are 0 in both.

    Raises
    ------
    ConfigurationError
        If ``size``/``width`` are negative / < 1, or a part does not fit the element space.
    """
    if size < 0 or width < 1:
        raise ConfigurationError(
            f"element space needs size >= 0 and width >= 1, got {size}, {width}"
        )
    sums = np.zeros((size, width))
    counts = np.zeros(size)
    for part in parts:
        if part.width != width:
            raise ConfigurationError(f"an update has width {part.width}, the layout {width}")
        if part.last >= size:
            raise ConfigurationError(f"an update's element {part.last} is outside [0, {size})")
        # Elements are unique within one part, so fancy-index += is exact; a run (a dense part)
        # is added through a slice. An overflow to inf is reported by the apply
        # (RoundFailedError), not as a warning.
        where = part.where
        with np.errstate(over="ignore", invalid="ignore"):
            sums[where] += part.counts[:, None] * part.values
            counts[where] += part.counts
    return sums, counts


def accumulate(
    layout: Layout, updates: Iterable[SubmodelUpdate]
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Plaintext sums and counts of client updates in one layout's element space.

    Parameters
    ----------
    layout : Layout
        The element space every update is mapped through.
    updates : Iterable[SubmodelUpdate]
        Validated client updates (deltas).

    Returns
    -------
    tuple[numpy.ndarray, numpy.ndarray]
        ``(size, width)`` sums and ``(size,)`` counts (see :func:`accumulate_elements`).

    Raises
    ------
    ValueError
        If an update touches a tensor the layout does not cover.
    ClientInputError
        If an update does not fit its tensors (see ``layout.elements``).
    """
    return accumulate_elements(layout.size, layout.width, (layout.elements(u) for u in updates))


def _touched_means(
    sums: ArrayLike, counts: ArrayLike, size: int | None = None, width: int | None = None
) -> tuple[NDArray[np.int64], NDArray[np.float64], tuple[int, int]]:
    """Apply the one count-weighted formula: touched elements (C > 0) and their S / C.

    Raises
    ------
    ValueError
        If the shapes disagree (with each other or with ``size``/``width``).
    RoundFailedError
        If ``sums`` or ``counts`` is not finite (an overflowed or corrupt aggregate).
    """
    s = np.asarray(sums, np.float64)
    c = np.asarray(counts, np.float64)
    if s.ndim != 2 or c.shape != (s.shape[0],):
        raise ConfigurationError(
            f"sums must be (size, width) and counts (size,): {s.shape}, {c.shape}"
        )
    if size is not None and s.shape != (size, width):
        raise ConfigurationError(
            f"sums have shape {s.shape}, the layout's space is {(size, width)}"
        )
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(c))):
        raise RoundFailedError("the aggregated sums or counts are not finite")
    # C <= 0 means no (honest) client chose the element: secure aggregation reconstructs
    # exactly 0 there, so such an element is left unchanged rather than divided.
    touched = np.flatnonzero(c > 0)
    return touched, s[touched] / c[touched, None], (s.shape[0], s.shape[1])


def count_weighted_mean(sums: ArrayLike, counts: ArrayLike) -> NDArray[np.float64]:
    """Per-element ``S / C`` where ``C > 0``, and 0 elsewhere.

    Parameters
    ----------
    sums : array_like
        ``(size, width)`` sums ``sum_i c_i * d_i``.
    counts : array_like
        ``(size,)`` counts ``sum_i c_i``.

    Returns
    -------
    numpy.ndarray
        ``(size, width)`` float64 averages (the step to add to the model).

    Raises
    ------
    ValueError
        If the shapes disagree.
    RoundFailedError
        If ``sums`` or ``counts`` is not finite.
    """
    touched, means, shape = _touched_means(sums, counts)
    out = np.zeros(shape)
    out[touched] = means
    return out


def apply_count_weighted(
    global_arrays: Mapping[str, NDArray[np.generic]],
    layout: Layout,
    sums: ArrayLike,
    counts: ArrayLike,
    *,
    finite: bool = False,
) -> dict[str, NDArray[np.generic]]:
    """Apply ``w[j] += S[j] / C[j]`` to every touched element of ``layout``.

    Elements with ``C[j] <= 0`` and tensors outside the layout are returned unchanged
    (copied). Arithmetic is float64; each result is cast back to its tensor's dtype, integer
    tensors rounded to nearest.

    Parameters
    ----------
    global_arrays : Mapping[str, numpy.ndarray]
        The model the sums' deltas are relative to (not modified).
    layout : Layout
        The element space of ``sums`` and ``counts``.
    sums : array_like
        ``(layout.size, layout.width)`` sums (plaintext or reconstructed).
    counts : array_like
        ``(layout.size,)`` counts.
    finite : bool, optional
        Also require every updated element (``w[j] + S[j] / C[j]`` in float64, before the
        cast) to be finite, so a non-finite model or an overflow fails the round.

    Returns
    -------
    dict[str, numpy.ndarray]
        The new model (new arrays, model order).

    Raises
    ------
    ValueError
        If the shapes do not match the layout or the model.
    RoundFailedError
        If ``sums`` or ``counts`` is not finite, or (``finite``) an updated element is not.
    """
    touched, means, _ = _touched_means(sums, counts, layout.size, layout.width)
    updated = layout.gather(global_arrays, touched) + means
    if finite and not np.all(np.isfinite(updated)):
        raise RoundFailedError("an updated element of the model is not finite")
    return layout.write(global_arrays, touched, updated)


def apply_count_weighted_parts(
    global_arrays: Mapping[str, NDArray[np.generic]],
    parts: Sequence[tuple[Layout, ArrayLike, ArrayLike]],
    *,
    finite: bool = False,
) -> dict[str, NDArray[np.generic]]:
    """Apply :func:`apply_count_weighted` for several parts of one model at once.

    A mixed model's round aggregates each part (a row table, the dense tensors) in its own
    element space; every part's touched elements move by ``S[j] / C[j]`` of that part, and
    elements no part touched keep their value. The parts' layouts must cover disjoint tensors
    (each part is applied to the original values of its own tensors).

    Parameters
    ----------
    global_arrays : Mapping[str, numpy.ndarray]
        The model the deltas are relative to (not modified).
    parts : Sequence[tuple[Layout, array_like, array_like]]
        Per part its layout, ``(size, width)`` sums and ``(size,)`` counts.
    finite : bool, optional
        As in :func:`apply_count_weighted`.

    Returns
    -------
    dict[str, numpy.ndarray]
        The new model (new arrays, model order).

    Raises
    ------
    ValueError
        As :func:`apply_count_weighted` (shapes that do not fit a part's layout).
    RoundFailedError
        As :func:`apply_count_weighted`.
    """
    out = {k: np.array(v, copy=True) for k, v in global_arrays.items()}
    for layout, sums, counts in parts:
        new = apply_count_weighted(global_arrays, layout, sums, counts, finite=finite)
        for name, array in new.items():
            if not np.array_equal(array, global_arrays[name], equal_nan=True):
                out[name] = array
    return out


def count_weighted_average(
    global_arrays: Mapping[str, NDArray[np.generic]], updates: Sequence[SubmodelUpdate]
) -> tuple[dict[str, NDArray[np.generic]], AggregationStats]:
    """Apply the count-weighted average of submodel deltas to the global model.

    For every coordinate ``j`` of every tensor,
    ``w'[j] = w[j] + sum_i c_ij * d_ij / sum_i c_ij`` over the clients ``i`` whose update
    contains ``j``; ``c_ij`` is the per-index count if the client sent one, else its weight.
    Sums run in float64; results are cast back to each tensor's dtype (integer tensors are
    rounded to nearest). This is :func:`accumulate` + :func:`apply_count_weighted` over
    ``FlatLayout.of(global_arrays, include_integer=True)``.

    Parameters
    ----------
    global_arrays : Mapping[str, numpy.ndarray]
        The model the updates' deltas are relative to.
    updates : Sequence[SubmodelUpdate]
        Validated updates (see :func:`flwr_fsl.submodel.codec.decode_update`).

    Returns
    -------
    tuple[dict[str, numpy.ndarray], AggregationStats]
        The new global arrays (new objects; inputs are not modified) and statistics.

    Raises
    ------
    KeyError
        If an update names a tensor that is not in ``global_arrays``.
    ClientInputError
        If an update does not fit its tensors.
    RoundFailedError
        If the sums overflow to a non-finite value.
    """
    for update in updates:
        for name in update.tensors:
            if name not in global_arrays:
                raise KeyError(name)
    layout = FlatLayout.of(global_arrays, include_integer=True)
    sums, counts = accumulate(layout, updates)
    new_arrays = apply_count_weighted(global_arrays, layout, sums, counts)
    touched = dict.fromkeys(global_arrays, 0)
    for i, name in enumerate(layout.names):
        lo, hi = layout.offsets[i], layout.offsets[i + 1]
        touched[name] = int(np.count_nonzero(counts[lo:hi] > 0))
    return new_arrays, AggregationStats(num_updates=len(updates), touched=touched)


# Half of float64's range: n terms, each below this / n, sum to a finite number.
_FLOAT_BUDGET = 1e307


def check_contribution(update: SubmodelUpdate, max_weight: float, num_clients: int) -> None:
    """Reject an update that could overflow the weighted sums of a round of ``num_clients``.

    Parameters
    ----------
    update : SubmodelUpdate
        A decoded client update (finite values, positive weight).
    max_weight : float
        The largest per-index count a client may send.
    num_clients : int
        How many clients the round's sums add up (the bound is shared among them).

    Raises
    ------
    ClientInputError
        If a per-index count exceeds ``max_weight``, or ``|weight * value|`` could exceed the
        client's share of float64's range (finite values can still be ``1e300``).
    """
    bound = _FLOAT_BUDGET / max(1, num_clients)
    for name, part in update.tensors.items():
        weight = update.weight
        if part.counts is not None and part.counts.size:
            if float(part.counts.max()) > max_weight:
                raise ClientInputError(f"{name}: a per-index count exceeds max_weight")
            weight = float(part.counts.max())
        values = part.values
        if values.size and np.issubdtype(values.dtype, np.number):
            peak = float(np.max(np.abs(values.astype(np.float64, copy=False))))
            if peak * weight > bound:
                raise ClientInputError(f"{name}: weighted values are too large to aggregate")


def check_clipping_range(clipping_range: float | None) -> float | None:
    """Validate a plaintext strategy's ``clipping_range`` (the secure strategies' name and rule).

    Parameters
    ----------
    clipping_range : float or None
        Largest change of one coordinate a client's update may make; None: no bound.

    Returns
    -------
    float or None
        The bound as a float.

    Raises
    ------
    ConfigurationError
        If it is not None and not a finite number > 0.
    """
    if clipping_range is None:
        return None
    number = isinstance(clipping_range, int | float) and not isinstance(clipping_range, bool)
    if not (number and math.isfinite(clipping_range) and clipping_range > 0):
        raise ConfigurationError(f"clipping_range must be finite and > 0, got {clipping_range!r}")
    return float(clipping_range)


def clip_update(
    update: SubmodelUpdate,
    clip: float | None,
    model: Mapping[str, NDArray[np.generic]] | None = None,
) -> int:
    """Clip each coordinate of a client's delta update to ``[-clip, clip]``, in place.

    What the secure strategies' client mods do before masking (``clipping_range``), done by a
    plaintext server on what it received. Only floating tensors are clipped (integer buffers
    such as batch-norm counters are not deltas of a bounded step); a tensor counts as integer
    when ``model``'s tensor of that name is.

    Parameters
    ----------
    update : SubmodelUpdate
        A decoded client update (deltas).
    clip : float or None
        The bound; None clips nothing (non-finite values still raise).
    model : Mapping[str, numpy.ndarray], optional
        The global model, for the tensors' dtypes.

    Returns
    -------
    int
        How many coordinates were clipped.

    Raises
    ------
    ClientInputError
        If a value is not finite: a non-finite update drops the client, it is never clipped.
    """
    clipped = 0
    for name, part in list(update.tensors.items()):
        values = part.values
        if not np.issubdtype(values.dtype, np.number):
            continue
        if np.issubdtype(values.dtype, np.inexact) and not np.all(np.isfinite(values)):
            raise ClientInputError(f"{name}: the update is not finite")
        ref = None if model is None else model.get(name)
        integer = ref is not None and not np.issubdtype(np.asarray(ref).dtype, np.floating)
        if clip is None or integer or not np.issubdtype(values.dtype, np.floating):
            continue
        over = np.abs(values) > clip
        count = int(np.count_nonzero(over))
        if count:
            clipped_values = np.clip(values, -clip, clip).astype(values.dtype, copy=False)
            update.tensors[name] = replace(part, values=clipped_values)
            clipped += count
    return clipped


def count_threshold_stds(num_elements: int, false_positives: float = FALSE_POSITIVES) -> float:
    """Return the count threshold ``t``, in noise stds, for ``num_elements`` elements.

    ``num_elements`` pure-noise counts pass it ``false_positives`` times on average:
    ``t = Φ^-1(1 - false_positives / num_elements)``, at least 3.

    Raises
    ------
    ConfigurationError
        If ``false_positives`` is not in ``(0, 1)``.
    """
    if not 0 < false_positives < 1:
        raise ConfigurationError(f"false_positives must be in (0, 1), got {false_positives!r}")
    tail = false_positives / max(1, num_elements)
    return max(3.0, NormalDist().inv_cdf(1.0 - tail))


def suppress_small_counts(
    sums: NDArray[np.float64],
    counts: NDArray[np.float64],
    sigma_total: float | NDArray[np.float64],
    stds: float | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64], float | NDArray[np.float64]]:
    """Post-process a noisy aggregate: elements with a small noisy count count as untouched.

    Without this, an element no client chose reconstructs to ``(noise, noise)`` and
    ``sums / counts`` is noise over noise. Post-processing of a DP release costs no privacy.

    Parameters
    ----------
    sums : numpy.ndarray
        ``(m, w)`` noisy sums.
    counts : numpy.ndarray
        ``(m,)`` noisy counts.
    sigma_total : float or numpy.ndarray
        Std of the noise on one count word: one number for every element (SSA:
        ``sqrt(σ_0² + σ_1²)``), or ``(m,)`` per element (SFSL: each row's sum has its own
        contributors).
    stds : float, optional
        Threshold in units of ``sigma_total``; :func:`count_threshold_stds` of ``m`` by
        default.

    Returns
    -------
    tuple
        Sums and counts with both zeroed where ``counts <= stds · sigma_total``, and that
        threshold (a float for a scalar ``sigma_total``, else ``(m,)``).
    """
    if stds is None:
        stds = count_threshold_stds(counts.size)
    if np.ndim(sigma_total) == 0:
        threshold: float | NDArray[np.float64] = max(0.0, stds * float(sigma_total))
    else:
        threshold = np.maximum(0.0, stds * np.asarray(sigma_total, dtype=np.float64))
    keep = counts > threshold
    return np.where(keep[:, None], sums, 0.0), np.where(keep, counts, 0.0), threshold
