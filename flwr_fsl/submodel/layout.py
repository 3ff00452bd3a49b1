"""One flat index space over a model's floating tensors (what SSA's ``[0, m)`` refers to).

Coordinates are numbered tensor by tensor, in the order the model's ``ArrayRecord`` lists
them, row-major within a tensor. Integer tensors (e.g. batch-norm counters) are not part of
the space: secure aggregation leaves them unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.submodel.update import Encoding, SubmodelUpdate


@dataclass(frozen=True)
class FlatLayout:
    """Offsets of the floating tensors of a model in the flat index space.

    Attributes
    ----------
    names : tuple[str, ...]
        Floating tensor names, in order.
    shapes : tuple[tuple[int, ...], ...]
        Their shapes.
    offsets : tuple[int, ...]
        Start of each tensor; ``offsets[-1]`` is the total size ``m``.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]

    @classmethod
    def of(cls, arrays: Mapping[str, NDArray[np.generic]]) -> FlatLayout:
        """Build the layout of a model (floating tensors, in mapping order)."""
        names = tuple(n for n, a in arrays.items() if np.issubdtype(a.dtype, np.floating))
        shapes = tuple(tuple(np.shape(arrays[n])) for n in names)
        offsets = tuple(int(x) for x in np.cumsum([0, *[int(np.prod(s)) for s in shapes]]))
        return cls(names, shapes, offsets)

    @property
    def size(self) -> int:
        """``m``: total number of floating coordinates."""
        return self.offsets[-1]

    def flatten_update(
        self, update: SubmodelUpdate
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Return the flat indices (ascending) and values of a (coordinate or dense) update.

        Raises
        ------
        ValueError
            If the update touches a tensor outside the layout or uses row encoding.
        """
        idx_parts, val_parts = [], []
        for name, part in update.tensors.items():
            if name not in self.names:
                if np.issubdtype(part.values.dtype, np.floating):
                    raise ValueError(f"{name!r} is not a floating tensor of the model")
                continue  # integer buffers are not aggregated securely
            base = self.offsets[self.names.index(name)]
            if part.encoding is Encoding.ROWS:
                raise ValueError("row (mega-element) updates need the row layout, not flat")
            if part.encoding is Encoding.DENSE:
                idx = np.arange(part.values.size, dtype=np.int64)
            else:
                assert part.indices is not None
                idx = part.indices
            idx_parts.append(idx + base)
            val_parts.append(np.asarray(part.values, np.float64).reshape(-1))
        if not idx_parts:
            return np.zeros(0, np.int64), np.zeros(0)
        idx, vals = np.concatenate(idx_parts), np.concatenate(val_parts)
        order = np.argsort(idx, kind="stable")
        return idx[order], vals[order]

    def flatten(self, arrays: Mapping[str, NDArray[np.generic]]) -> NDArray[np.float64]:
        """Concatenate the floating tensors of ``arrays`` into one float64 vector."""
        if not self.names:
            return np.zeros(0)
        return np.concatenate([np.asarray(arrays[n], np.float64).reshape(-1) for n in self.names])

    def unflatten(
        self, flat: NDArray[np.floating], like: Mapping[str, NDArray[np.generic]]
    ) -> dict[str, NDArray[np.generic]]:
        """Split a flat vector back into tensors (dtypes of ``like``; other tensors copied)."""
        out = {name: np.array(value, copy=True) for name, value in like.items()}
        for i, name in enumerate(self.names):
            lo, hi = self.offsets[i], self.offsets[i + 1]
            out[name] = flat[lo:hi].reshape(self.shapes[i]).astype(like[name].dtype)
        return out
