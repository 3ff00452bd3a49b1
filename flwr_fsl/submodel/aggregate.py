"""Count-weighted submodel averaging (Niu et al., Alg. 1 and App. C), Flower-free.

Each coordinate is averaged only over the clients that actually updated it, weighted by their
sample counts (or by per-index counts when sent); a coordinate no client touched keeps its
value. On dense updates this is exactly FedAvg.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.submodel.update import Encoding, SubmodelUpdate


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


def count_weighted_average(
    global_arrays: Mapping[str, NDArray[np.generic]], updates: Sequence[SubmodelUpdate]
) -> tuple[dict[str, NDArray[np.generic]], AggregationStats]:
    """Apply the count-weighted average of submodel deltas to the global model.

    For every coordinate ``j`` of every tensor,
    ``w'[j] = w[j] + sum_i c_ij * d_ij / sum_i c_ij`` over the clients ``i`` whose update
    contains ``j``; ``c_ij`` is the per-index count if the client sent one, else its weight.
    Sums run in float64; results are cast back to each tensor's dtype (integer tensors are
    rounded to nearest).

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
    """
    numerators = {k: np.zeros(np.shape(v), np.float64) for k, v in global_arrays.items()}
    denominators = {k: np.zeros(np.shape(v), np.float64) for k, v in global_arrays.items()}
    for update in updates:
        for name, part in update.tensors.items():
            num, den = numerators[name], denominators[name]
            values = part.values.astype(np.float64, copy=False)
            if part.encoding is Encoding.DENSE:
                num += update.weight * values
                den += update.weight
                continue
            assert part.indices is not None
            weights = (
                np.full(part.indices.shape, update.weight, np.float64)
                if part.counts is None
                else part.counts
            )
            if part.encoding is Encoding.COORDINATES:
                # Indices are unique within one update, so fancy-index += is exact.
                num.reshape(-1)[part.indices] += weights * values
                den.reshape(-1)[part.indices] += weights
            else:
                row_weights = weights.reshape((-1,) + (1,) * (num.ndim - 1))
                num[part.indices] += row_weights * values
                den[part.indices] += row_weights
    new_arrays: dict[str, NDArray[np.generic]] = {}
    touched: dict[str, int] = {}
    for name, current in global_arrays.items():
        den = denominators[name]
        mask = den > 0
        touched[name] = int(np.count_nonzero(mask))
        step = np.divide(numerators[name], den, out=np.zeros_like(den), where=mask)
        new = np.asarray(current, np.float64) + step
        if np.issubdtype(current.dtype, np.integer):
            new = np.rint(new)
        new_arrays[name] = np.where(mask, new, current).astype(current.dtype)
    return new_arrays, AggregationStats(num_updates=len(updates), touched=touched)
