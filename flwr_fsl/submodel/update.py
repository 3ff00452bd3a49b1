"""The in-memory form of a submodel update: which coordinates of which tensors, and by how much.

Flower-free. :mod:`flwr_fsl.submodel.codec` maps it to and from a Flower message, and
:mod:`flwr_fsl.submodel.aggregate` averages many of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np
from numpy.typing import NDArray


class Encoding(str, Enum):
    """How one tensor's part of an update is represented.

    ``DENSE``: ``values`` is the full-shape delta. ``COORDINATES``: ``indices`` are flat
    (row-major) indices into the tensor and ``values`` their deltas. ``ROWS``: ``indices`` are
    indices along axis 0 (mega-elements, e.g. embedding rows) and ``values`` the whole rows.
    """

    DENSE = "dense"
    COORDINATES = "coordinates"
    ROWS = "rows"


@dataclass(frozen=True)
class TensorUpdate:
    """One tensor's part of a submodel update (a delta against the model the client received).

    Attributes
    ----------
    encoding : Encoding
        Representation (see :class:`Encoding`).
    values : numpy.ndarray
        The deltas: full shape (dense), ``(k,)`` (coordinates) or ``(r, *shape[1:])`` (rows).
    indices : numpy.ndarray or None
        ``int64`` flat indices (coordinates) or row indices (rows), unique; None for dense.
    counts : numpy.ndarray or None
        Optional positive ``float64`` weight per index (coordinates/rows), e.g. how many local
        samples touched an embedding row (Niu et al., Alg. 1); when present it replaces the
        client's sample count as that index's averaging weight.
    """

    encoding: Encoding
    values: NDArray[np.generic]
    indices: NDArray[np.int64] | None = None
    counts: NDArray[np.float64] | None = None

    @property
    def num_indices(self) -> int:
        """Number of coordinates (or rows) this update touches; ``values.size`` if dense."""
        return int(self.values.size if self.indices is None else self.indices.size)


@dataclass
class SubmodelUpdate:
    """A client's update: per-tensor parts plus the client's averaging weight.

    Tensors absent from ``tensors`` were not touched by the client.

    Attributes
    ----------
    tensors : dict[str, TensorUpdate]
        Parameter name -> that tensor's update.
    weight : float
        The client's averaging weight (its sample count), used where no per-index ``counts``
        are given.
    """

    tensors: dict[str, TensorUpdate] = field(default_factory=dict)
    weight: float = 1.0
