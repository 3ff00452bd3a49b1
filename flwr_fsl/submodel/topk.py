"""Top-k sparsification with error feedback and mega-element (row) grouping, Flower-free.

A client keeps only the largest-magnitude coordinates of its update (Cui et al. §7.3, after
Aji & Heafield 2017). With error feedback the dropped remainder is carried to the next round
and added to that round's update, so nothing is lost, only delayed: over any number of rounds
``sum(sent) + residual == sum(updates)``. Tensors named as *groups* (e.g. an embedding
weight) are ranked by rows: a row's score is the L1 norm of its update and chosen rows are sent
whole (mega-elements, Cui §6 and §7.4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.submodel.update import Encoding, SubmodelUpdate, TensorUpdate

SCOPES = ("global", "per-tensor")


@dataclass(frozen=True)
class TopKConfig:
    """How many coordinates a client keeps.

    Parameters
    ----------
    ratio : float or None
        Fraction in (0, 1] of coordinates to keep. Exactly one of ``ratio`` and ``count``.
    count : int or None
        Number of coordinates to keep (globally, or per tensor with ``scope="per-tensor"``).
    scope : str
        ``"global"``: rank the coordinates of all non-group tensors together;
        ``"per-tensor"``: keep the budget within each tensor.
    error_feedback : bool
        Carry the dropped remainder to the next round.
    groups : tuple[str, ...]
        Names of tensors sent as whole rows (mega-elements), ranked by row L1 norm. Each
        keeps ``ceil(ratio * rows)`` rows; with ``count`` the ratio is
        ``count / total coordinates`` (global) or ``count / tensor size`` (per tensor).

    Raises
    ------
    ConfigurationError
        If the settings are inconsistent or out of range.
    """

    ratio: float | None = None
    count: int | None = None
    scope: str = "global"
    error_feedback: bool = True
    groups: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if (self.ratio is None) == (self.count is None):
            raise ConfigurationError("set exactly one of ratio and count")
        if self.ratio is not None and not (0.0 < self.ratio <= 1.0):
            raise ConfigurationError(f"ratio must be in (0, 1], got {self.ratio}")
        if self.count is not None and (isinstance(self.count, bool) or self.count < 1):
            raise ConfigurationError(f"count must be a positive integer, got {self.count}")
        if self.scope not in SCOPES:
            raise ConfigurationError(f"scope must be one of {SCOPES}, got {self.scope!r}")

    @property
    def is_dense(self) -> bool:
        """True if the configuration keeps everything (``ratio == 1``)."""
        return self.ratio == 1.0


def _keep(budget: int, size: int) -> int:
    return max(0, min(size, budget))


def _largest(scores: NDArray[np.floating], k: int) -> NDArray[np.int64]:
    """Return the indices of the ``k`` largest scores, ascending (ties: lowest index)."""
    if k >= scores.size:
        return np.arange(scores.size, dtype=np.int64)
    if k == 0:
        return np.zeros(0, np.int64)
    # Stable on ties: sort by (-score, index) among the candidates.
    order = np.argsort(-scores, kind="stable")[:k]
    return np.sort(order).astype(np.int64)


def sparsify(  # noqa: C901, PLR0915
    deltas: Mapping[str, NDArray[np.generic]],
    config: TopKConfig,
    residuals: Mapping[str, NDArray[np.generic]] | None = None,
) -> tuple[SubmodelUpdate, dict[str, NDArray[np.generic]]]:
    """Select the top-k part of an update.

    Parameters
    ----------
    deltas : Mapping[str, numpy.ndarray]
        This round's update per tensor (trained minus received).
    config : TopKConfig
        Selection settings.
    residuals : Mapping[str, numpy.ndarray], optional
        Error-feedback remainder from the previous round (same names and shapes); ignored
        when ``config.error_feedback`` is False.

    Returns
    -------
    tuple[SubmodelUpdate, dict[str, numpy.ndarray]]
        The update to send (weight 1.0; the caller sets it) and the new residuals (empty
        when error feedback is off). Non-floating tensors (e.g. batch-norm counters) are sent
        dense and never leave a residual.

    Raises
    ------
    ConfigurationError
        If a group is not in ``deltas`` or has no row axis, or residual shapes differ.
    """
    for name in config.groups:
        if name not in deltas:
            raise ConfigurationError(f"group {name!r} is not a tensor of the model")
        if np.ndim(deltas[name]) < 1:
            raise ConfigurationError(f"group {name!r} has no row axis")
    accumulated: dict[str, NDArray[np.generic]] = {}
    for name, delta in deltas.items():
        delta = np.asarray(delta)
        if config.error_feedback and residuals and name in residuals:
            residual = np.asarray(residuals[name])
            if residual.shape != delta.shape:
                raise ConfigurationError(f"residual for {name!r} has shape {residual.shape}")
            delta = delta + residual.astype(delta.dtype)
        accumulated[name] = delta

    floating = [n for n, d in accumulated.items() if np.issubdtype(d.dtype, np.floating)]
    pooled = [n for n in floating if n not in config.groups]
    total = sum(accumulated[n].size for n in floating)

    tensors: dict[str, TensorUpdate] = {}
    for name, acc in accumulated.items():
        if name not in floating:
            tensors[name] = TensorUpdate(Encoding.DENSE, acc)

    # Element-wise top-k over the non-group floating tensors.
    if config.scope == "global" and pooled:
        flat = np.concatenate([accumulated[n].reshape(-1) for n in pooled])
        budget = math.ceil(config.ratio * flat.size) if config.ratio is not None else config.count
        chosen = _largest(np.abs(flat), _keep(int(budget or 0), flat.size))
        offsets = np.cumsum([0] + [accumulated[n].size for n in pooled])
        for i, name in enumerate(pooled):
            lo, hi = offsets[i], offsets[i + 1]
            sel = chosen[(chosen >= lo) & (chosen < hi)] - lo
            if sel.size:
                tensors[name] = _coordinates(accumulated[name], sel)
    else:
        for name in pooled:
            acc = accumulated[name]
            budget = (
                math.ceil(config.ratio * acc.size) if config.ratio is not None else config.count
            )
            sel = _largest(np.abs(acc.reshape(-1)), _keep(int(budget or 0), acc.size))
            if sel.size:
                tensors[name] = _coordinates(acc, sel)

    # Mega-elements: whole rows ranked by L1 norm.
    for name in config.groups:
        acc = accumulated[name]
        if name not in floating:
            continue
        rows = acc.shape[0]
        if config.ratio is not None:
            ratio = config.ratio
        else:
            denominator = total if config.scope == "global" else acc.size
            ratio = min(1.0, float(config.count or 0) / max(denominator, 1))
        keep = _keep(math.ceil(ratio * rows), rows)
        scores = np.abs(acc.reshape(rows, -1)).sum(axis=1, dtype=np.float64)
        sel = _largest(scores, keep)
        if sel.size:
            tensors[name] = TensorUpdate(Encoding.ROWS, np.ascontiguousarray(acc[sel]), sel)

    new_residuals: dict[str, NDArray[np.generic]] = {}
    if config.error_feedback:
        for name in floating:
            remainder = accumulated[name].copy()
            part = tensors.get(name)
            if part is not None and part.indices is not None:
                if part.encoding is Encoding.ROWS:
                    remainder[part.indices] = 0
                else:
                    remainder.reshape(-1)[part.indices] = 0
            elif part is not None:
                remainder[...] = 0
            new_residuals[name] = remainder
    return SubmodelUpdate(tensors, 1.0), new_residuals


def _coordinates(acc: NDArray[np.generic], sel: NDArray[np.int64]) -> TensorUpdate:
    return TensorUpdate(Encoding.COORDINATES, np.ascontiguousarray(acc.reshape(-1)[sel]), sel)
