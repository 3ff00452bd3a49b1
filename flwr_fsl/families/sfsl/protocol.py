"""Count-weighted secure submodel averaging of Niu et al. (Alg. 1, lines 7-9 and 14-19).

A round's questionnaire is the union ``U`` of the chosen clients' real row sets (private set
union, :mod:`flwr_fsl.families.sfsl.psu`); client ``i`` answers with a perturbed set ``S''_i``
(:mod:`flwr_fsl.families.sfsl.perturb`), downloads those rows, trains succinctly on
``S''_i ∩ S_i`` and uploads, for every row ``j`` of ``S''_i``, the row ``v_ij · Δ_ij`` and
the count ``v_ij`` (the number of its samples touching ``j``): zero row and zero count for
``j`` not in ``S_i``. Secure aggregation over each row's participants ``C_j = {i : j in
S''_i}`` (a *subset round* of :mod:`flwr_fsl.families.secagg.protocol`) gives the server
``Σ_i v_ij Δ_ij`` and ``Σ_i v_ij`` per row, and the row moves by their quotient — every
coordinate averaged over the samples that actually touched it (Niu App. C).

:class:`RowVector` lays the rows of ``U`` out as one vector of ``|U| · (d + 1)`` ring words
(row ``r`` of ``U`` at ``r (d+1) .. r (d+1) + d``, the count last) in fixed point, gives each
client its positions ``R_i`` and decodes the sum.

**Leakage** (beyond the union and the perturbed sets, which the server sees by design): per
row, the participant set ``C_j`` and the aggregate over it. A row with one participant is that
client's row in the clear (Theorem 2's Event 1: probability ``p7``, which RR keeps small); a
row whose owners all answered "no" while others answered "yes" aggregates to zero and tells
the server those clients lack it (Event 2, ``p8``). Each client also learns, from the shared
rows of its masked-input request, which other clients answered "yes" to the rows of its own
``S''_i``. ``tests/families/sfsl/test_protocol.py`` shows the Event 1 exposure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.crypto.fixedpoint import FixedPoint

__all__ = ["GammaQuantizer", "RowVector", "check_perturbed", "rows_vector"]


@dataclass(frozen=True)
class GammaQuantizer:
    """γ-level stochastic quantization of Niu et al. App. B (their γ = 2^15).

    ``[low, high]`` is cut into ``γ - 1`` segments of ``unit = (high - low) / (γ - 1)``; a
    value ``x`` (clipped to the interval) maps to the level below or above it with
    probabilities that make ``E[z] = (x - low) / unit``. A count-weighted mean taken on the
    levels and then dequantized, ``(Σ v z / Σ v) · unit + low``, is an unbiased estimate of
    ``Σ v x / Σ v`` (App. B; ``tests/families/sfsl/test_protocol.py`` checks it).

    Raises
    ------
    ConfigurationError
        If ``levels < 2`` or the interval is empty or not finite.
    """

    levels: int
    low: float
    high: float

    def __post_init__(self) -> None:
        if isinstance(self.levels, bool) or not isinstance(self.levels, int) or self.levels < 2:
            raise ConfigurationError("quantization levels must be an int >= 2")
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ConfigurationError("the quantization interval must be finite and non-empty")

    @property
    def unit(self) -> float:
        """The segment length."""
        return (self.high - self.low) / (self.levels - 1)

    def quantize(
        self, values: ArrayLike, rng: np.random.Generator | None = None
    ) -> NDArray[np.int64]:
        """Return the levels in ``0 .. γ - 1`` (stochastic rounding of the clipped values)."""
        rng = rng if rng is not None else np.random.default_rng()
        x = np.clip(np.asarray(values, dtype=np.float64), self.low, self.high)
        scaled = (x - self.low) / self.unit
        below = np.floor(scaled)
        up = rng.random(size=scaled.shape) < (scaled - below)
        return np.minimum(below + up, self.levels - 1).astype(np.int64)

    def dequantize(self, levels: ArrayLike) -> NDArray[np.float64]:
        """Map (mean) levels back to values: ``z · unit + low``."""
        return np.asarray(levels, dtype=np.float64) * self.unit + self.low


@dataclass(frozen=True)
class RowVector:
    """The ring vector of one round's union rows and counts.

    Parameters
    ----------
    union : array_like
        ``U``: the round's rows (table row ids), strictly increasing.
    width : int
        ``d``, the row width.
    codec : FixedPoint
        Fixed point of every word; its ``max_abs`` must cover ``max count × max |Δ|`` and the
        largest count, its ``max_summands`` the clients per round.
    quantizer : GammaQuantizer, optional
        Quantize each ``Δ`` to γ levels first (App. B): the client sends ``v · z`` and the
        server dequantizes the count-weighted mean level (``max_abs`` must then cover
        ``max count × (γ - 1)``).

    Raises
    ------
    ConfigurationError
        If the union is not strictly increasing non-negative rows or the width is not positive.
    """

    union: NDArray[np.int64]
    width: int
    codec: FixedPoint
    quantizer: GammaQuantizer | None = None

    def __post_init__(self) -> None:
        u = np.asarray(self.union, dtype=np.int64)
        if u.ndim != 1 or (u.size and (u[0] < 0 or np.any(u[1:] <= u[:-1]))):
            raise ConfigurationError("the union must be strictly increasing non-negative rows")
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise ConfigurationError("the row width must be a positive int")
        object.__setattr__(self, "union", u)

    @property
    def length(self) -> int:
        """``|U| · (d + 1)`` ring words."""
        return int(self.union.size) * (self.width + 1)

    def _slots(self, rows: ArrayLike) -> NDArray[np.int64]:
        r = np.asarray(rows, dtype=np.int64)
        slots = np.searchsorted(self.union, r)
        if r.size and (
            np.any(slots >= self.union.size) or not np.array_equal(self.union[slots], r)
        ):
            raise ClientInputError("a row is not in the round's union")
        return slots

    def positions(self, rows: ArrayLike) -> NDArray[np.int64]:
        """``R_i``: the vector positions of the rows ``S''_i`` (sorted rows of ``U``)."""
        slots = np.unique(self._slots(rows))
        grid = slots[:, None] * (self.width + 1) + np.arange(self.width + 1)[None, :]
        return grid.reshape(-1).astype(np.int64)

    def encode(
        self,
        perturbed: ArrayLike,
        deltas: Mapping[int, NDArray[np.floating]],
        counts: Mapping[int, int | float],
        rng: np.random.Generator | None = None,
    ) -> NDArray[np.uint64]:
        """Return a client's words at :meth:`positions` of ``S''_i`` (lines 16-19).

        Parameters
        ----------
        perturbed : array_like
            ``S''_i``.
        deltas : Mapping[int, numpy.ndarray]
            Row -> ``Δ_ij`` (width ``d``) for the rows it trained, ``S''_i ∩ S_i``.
        counts : Mapping[int, int or float]
            Row -> ``v_ij > 0`` for the same rows.

        Raises
        ------
        ClientInputError
            If a trained row is outside ``S''_i``, lacks a count, a count is not positive and
            finite, or a row has the wrong width or is not finite.
        """
        rows = np.unique(np.asarray(perturbed, dtype=np.int64))
        self._slots(rows)
        if set(deltas) != set(counts) or not set(deltas) <= set(rows.tolist()):
            raise ClientInputError("trained rows must lie in S'' and each have a count")
        block = np.zeros((rows.size, self.width + 1), dtype=np.float64)
        index = {int(r): k for k, r in enumerate(rows)}
        for row, delta in deltas.items():
            v = float(counts[row])
            d = np.asarray(delta, dtype=np.float64)
            if not (math.isfinite(v) and v > 0) or d.shape != (self.width,):
                raise ClientInputError("a trained row has a bad count or width")
            if not np.all(np.isfinite(d)):
                raise ClientInputError("a trained row is not finite")
            level = d if self.quantizer is None else self.quantizer.quantize(d, rng)
            block[index[int(row)], : self.width] = v * level
            block[index[int(row)], self.width] = v
        return self.codec.encode(block.reshape(-1), rng)

    def sums(self, total: NDArray[np.uint64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Line 9's operands per union row: ``(S, C)`` for the one count-weighted apply.

        ``w += S / C`` where ``C > 0`` (:func:`flwr_fsl.submodel.aggregate.apply_count_weighted`)
        gives every touched row its count-weighted mean update. A row counts as touched when
        its total count is above half a fixed-point unit (elsewhere ``C = 0``). With a
        quantizer the step is an affine map of the count-weighted mean *level*
        (``(Σ v z / Σ v) · unit + low``, App. B), so the mean step goes out with unit counts
        (``S / 1`` is exact): the apply adds exactly what :meth:`decode` returns.

        Returns
        -------
        tuple
            ``(|U|, d)`` sums and ``(|U|,)`` counts, rows in the order of ``union``.
        """
        values = self.codec.decode(total).reshape(self.union.size, self.width + 1)
        count = values[:, self.width]
        touched = count > 0.5 / self.codec.scale
        sums = values[:, : self.width]
        if self.quantizer is None:
            return sums, np.where(touched, count, 0.0)
        steps = np.zeros_like(sums)
        steps[touched] = self.quantizer.dequantize(sums[touched] / count[touched, None])
        return steps, touched.astype(np.float64)

    def decode(
        self, total: NDArray[np.uint64]
    ) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
        """Line 9: the rows whose total count is positive, their mean update and the count.

        Returns
        -------
        tuple
            ``rows`` (table ids), ``Σ v Δ / Σ v`` per row (``len(rows) × d``) and ``Σ v``.
        """
        values = self.codec.decode(total).reshape(self.union.size, self.width + 1)
        count = values[:, self.width]
        touched = count > 0.5 / self.codec.scale
        mean = values[touched, : self.width] / count[touched, None]
        if self.quantizer is not None:
            mean = self.quantizer.dequantize(mean)
        return self.union[touched], mean, count[touched]


def check_perturbed(rows: ArrayLike, union: NDArray[np.int64]) -> NDArray[np.int64]:
    """Check a client's ``S''``: strictly increasing rows of the union ``U``.

    Raises
    ------
    ClientInputError
        If it is longer than the union, not strictly increasing or names a row outside it.
    """
    r = np.asarray(rows)
    if r.ndim != 1 or r.size > union.size:  # before the copy below
        raise ClientInputError("the perturbed set has a bad length")
    r = r.astype(np.int64)
    if r.size and (np.any(r[1:] <= r[:-1]) or not np.isin(r, union).all()):
        raise ClientInputError("the perturbed set must be increasing rows of the union")
    return r


def rows_vector(  # noqa: PLR0913
    layout: RowVector,
    table: str,
    clip: float,
    perturbed: NDArray[np.int64],
    model: Mapping[str, NDArray[np.generic]],
    trained: Mapping[str, NDArray[np.generic]],
    weight: float,
    real: tuple[NDArray[np.int64], NDArray[np.float64]],
    vector_length: int,
) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    r"""Return a client's rows-round input (Alg. 1 lines 16-19) and its positions ``R_i``.

    ``(v_j Δ_j, v_j)`` for the rows ``j`` of ``S'' ∩ S`` (zero for ``S'' \ S``), then
    ``(w Δ, w)`` for the dense tensors, every ``Δ`` clipped to ``[-clip, clip]``.

    Parameters
    ----------
    layout : RowVector
        The round's rows layout (its codec encodes the dense part too).
    table : str
        The row table's name.
    clip : float
        Largest ``|Δ|``.
    perturbed : numpy.ndarray
        ``S''``.
    model, trained : Mapping[str, numpy.ndarray]
        The submodel the client received and the one it trained (same names and shapes).
    weight : float
        The client's weight (``> 0``).
    real : tuple
        ``S`` (sorted) and one positive count per row.
    vector_length : int
        The round's vector length.

    Raises
    ------
    ClientInputError
        If the trained model does not match the received one, a row or count is bad, or a
        delta is not finite (never clipped: the client leaves the round).
    """
    if set(trained) != set(model) or any(trained[k].shape != model[k].shape for k in model):
        raise ClientInputError("the train reply's arrays do not match the model")
    rows, counts = real
    kept = np.isin(rows, perturbed)
    base = model[table]
    raw = {
        int(r): trained[table][r].astype(np.float64) - base[r].astype(np.float64)
        for r in rows[kept]
    }
    dense_raw = [
        trained[k].astype(np.float64) - model[k].astype(np.float64) for k in model if k != table
    ]
    if not all(np.all(np.isfinite(d)) for d in [*raw.values(), *dense_raw]):
        # Clipping would turn ±inf into ±clip: a non-finite update leaves the round instead.
        raise ClientInputError("a trained row or tensor is not finite")
    deltas = {r: np.clip(d, -clip, clip) for r, d in raw.items()}
    row_words = layout.encode(
        perturbed, deltas, dict(zip(rows[kept].tolist(), counts[kept], strict=True))
    )
    dense_delta = [np.clip(d, -clip, clip).reshape(-1) * float(weight) for d in dense_raw]
    dense_words = layout.codec.encode(np.concatenate([*dense_delta, np.array([float(weight)])]))
    positions = np.concatenate(
        [layout.positions(perturbed), np.arange(layout.length, vector_length, dtype=np.int64)]
    )
    return np.concatenate([row_words, dense_words]), positions
