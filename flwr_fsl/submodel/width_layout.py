"""Width slices of a heterogeneous model: :class:`TensorSlice` and :class:`WidthLayout`.

Split out of :mod:`flwr_fsl.submodel.layout` (which re-exports both names and defines the
:class:`~flwr_fsl.submodel.layout.Layout` interface they implement): a :class:`WidthLayout` is
one client's *width slice* (HeteroFL, FedRolex, SESA shards) — per tensor, the kept
output-channel indices (axis 0) and input-channel indices (axis 1). Its element space is the
global model's flat space (a :class:`~flwr_fsl.submodel.layout.FlatLayout`), so narrower
clients' coordinates land exactly on the global coordinates they hold. It is separate because
slicing, extracting and scattering sub-tensors is a concern of its own, used by the width and
SESA families only. Errors follow :mod:`flwr_fsl.submodel.layout`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.submodel.layout import (
    ElementUpdate,
    FlatLayout,
    _check_covered,
    _check_index_set,
    _check_weight,
    _finish,
    _Part,
    _part_coordinates,
)
from flwr_fsl.submodel.update import Encoding, SubmodelUpdate, TensorUpdate

__all__ = ["TensorSlice", "WidthLayout"]


@dataclass(frozen=True, eq=False)
class TensorSlice:
    """Which channels of one tensor a narrower client keeps.

    The sub-tensor is ``W[out_idx][:, in_idx]`` (linear ``(out, in)`` and conv
    ``(out, in, kh, kw)`` weights alike: the first two axes are sliced, the rest kept);
    a 1-D tensor (bias, batch-norm scale) uses ``out_idx`` only. ``None`` keeps the whole axis.

    Attributes
    ----------
    out_idx : numpy.ndarray or None
        Kept indices along axis 0, in the sub-tensor's order.
    in_idx : numpy.ndarray or None
        Kept indices along axis 1, in the sub-tensor's order.
    """

    out_idx: ArrayLike | None = None
    in_idx: ArrayLike | None = None


@dataclass(frozen=True, eq=False)
class WidthLayout:
    """One client's width slice of a heterogeneous model (HeteroFL / FedRolex / SESA).

    The element space is the global model's flat space (``base``), so the count-weighted
    apply averages each global coordinate over exactly the clients whose slice holds it.
    Build it with :meth:`of`.

    Attributes
    ----------
    base : FlatLayout
        The global model's flat layout (the element space).
    shapes : dict[str, tuple[int, ...]]
        Every global tensor's shape, in model order.
    slices : dict[str, tuple[numpy.ndarray | None, numpy.ndarray | None]]
        Validated ``(out_idx, in_idx)`` per sliced tensor (read-only int64); tensors not
        listed are kept whole.
    """

    base: FlatLayout
    shapes: dict[str, tuple[int, ...]]
    slices: dict[str, tuple[NDArray[np.int64] | None, NDArray[np.int64] | None]]

    @classmethod
    def of(
        cls,
        global_arrays: Mapping[str, NDArray[np.generic]],
        slices: Mapping[str, TensorSlice],
        *,
        include_integer: bool = False,
        from_client: bool = False,
    ) -> WidthLayout:
        """Validate a client's index sets against the global model.

        Parameters
        ----------
        global_arrays : Mapping[str, numpy.ndarray]
            The global (full-width) model.
        slices : Mapping[str, TensorSlice]
            Per sliced tensor, its kept output / input channels; other tensors stay whole.
        include_integer : bool
            Put integer buffers in the element space too (see :meth:`FlatLayout.of`).
        from_client : bool
            The index sets came from a client (e.g. SESA's secret shard choice): raise
            :class:`~flwr_fsl.core.errors.ClientInputError` on a bad one instead of ValueError.

        Raises
        ------
        ValueError or ClientInputError
            If a slice names an unknown tensor, slices an axis the tensor does not have, or an
            index set is empty, not 1-D integers, out of range or repeats an index.
        """
        error: type[ValueError] = ClientInputError if from_client else ValueError
        shapes = {name: tuple(int(d) for d in np.shape(a)) for name, a in global_arrays.items()}
        checked: dict[str, tuple[NDArray[np.int64] | None, NDArray[np.int64] | None]] = {}
        for name, spec in slices.items():
            if not isinstance(spec, TensorSlice):
                raise error(f"{name}: expected a TensorSlice, got {type(spec).__name__}")
            if name not in shapes:
                raise error(f"{name!r} is not a tensor of the global model")
            shape = shapes[name]
            out_idx = in_idx = None
            if spec.out_idx is not None:
                if len(shape) < 1:
                    raise error(f"{name}: a scalar tensor has no output axis to slice")
                out_idx = _check_index_set(spec.out_idx, shape[0], f"{name} out_idx", error)
            if spec.in_idx is not None:
                if len(shape) < 2:
                    raise error(f"{name}: a {len(shape)}-D tensor has no input axis to slice")
                in_idx = _check_index_set(spec.in_idx, shape[1], f"{name} in_idx", error)
            if out_idx is not None or in_idx is not None:
                checked[name] = (out_idx, in_idx)
        base = FlatLayout.of(global_arrays, include_integer=include_integer)
        return cls(base, shapes, checked)

    @property
    def size(self) -> int:
        """Coordinates of the global model's flat space."""
        return self.base.size

    @property
    def width(self) -> int:
        """Always 1: an element is one global coordinate."""
        return 1

    def sub_shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name`` in this client's submodel."""
        shape = self.shapes[name]
        out_idx, in_idx = self.slices.get(name, (None, None))
        dims = list(shape)
        if out_idx is not None:
            dims[0] = out_idx.size
        if in_idx is not None:
            dims[1] = in_idx.size
        return tuple(dims)

    @property
    def sub_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape in this client's submodel, in model order."""
        return {name: self.sub_shape(name) for name in self.shapes}

    @property
    def sub_size(self) -> int:
        """Coordinates of the submodel inside the element space."""
        return sum(math.prod(self.sub_shape(n)) for n in self.base.names)

    def _check_global(self, arrays: Mapping[str, NDArray[np.generic]]) -> None:
        for name, shape in self.shapes.items():
            if name not in arrays or tuple(np.shape(arrays[name])) != shape:
                raise ConfigurationError(
                    f"{name!r}: the arrays do not match the global model's shape"
                )

    def _check_sub(self, sub_arrays: Mapping[str, NDArray[np.generic]], finite: bool) -> None:
        extra = sorted(set(sub_arrays) - set(self.shapes))
        if extra:
            raise ClientInputError(f"submodel has unknown tensors {extra}")
        for name in self.base.names:
            if name not in sub_arrays:
                raise ClientInputError(f"submodel lacks tensor {name!r}")
            sub = np.asarray(sub_arrays[name])
            if sub.shape != self.sub_shape(name):
                raise ClientInputError(
                    f"{name}: submodel shape {sub.shape} != expected {self.sub_shape(name)}"
                )
            if finite and not np.all(np.isfinite(sub)):
                raise ClientInputError(f"{name}: values contain NaN or inf")

    def extract(self, global_arrays: Mapping[str, NDArray[np.generic]]) -> dict[str, NDArray]:
        """Return the client's submodel: every tensor sliced to its kept channels (new arrays).

        Raises
        ------
        ValueError
            If ``global_arrays`` does not have the global model's tensors and shapes.
        """
        self._check_global(global_arrays)
        out: dict[str, NDArray] = {}
        for name in self.shapes:
            sub = np.asarray(global_arrays[name])
            out_idx, in_idx = self.slices.get(name, (None, None))
            if out_idx is not None:
                sub = np.take(sub, out_idx, axis=0)
            if in_idx is not None:
                sub = np.take(sub, in_idx, axis=1)
            out[name] = np.array(sub, copy=True)
        return out

    def positions(self, name: str) -> NDArray[np.int64]:
        """Flat row-major positions in the *global* tensor of the sub-tensor's coordinates.

        ``positions(name)[j]`` is where coordinate ``j`` (row-major) of the client's
        sub-tensor lives in the global tensor (not offset into the flat space).
        """
        shape = self.shapes[name]
        if not shape:
            return np.zeros(1, np.int64)
        out_idx, in_idx = self.slices.get(name, (None, None))
        axes = [np.arange(d, dtype=np.int64) for d in shape]
        if out_idx is not None:
            axes[0] = out_idx
        if in_idx is not None:
            axes[1] = in_idx
        grid = np.ravel_multi_index(np.ix_(*axes), shape)
        return np.asarray(grid, np.int64).reshape(-1)

    def scatter(
        self, sub_arrays: Mapping[str, NDArray[np.generic]]
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Map a client's (narrow) arrays onto the global flat coordinates it holds.

        Parameters
        ----------
        sub_arrays : Mapping[str, numpy.ndarray]
            Arrays of the client's submodel (weights or deltas), shaped as :attr:`sub_shapes`.
            Tensors outside the element space are ignored.

        Returns
        -------
        tuple[numpy.ndarray, numpy.ndarray]
            Strictly ascending flat indices into the global space and their float64 values.

        Raises
        ------
        ClientInputError
            If a tensor is missing, unknown, misshapen or not finite.
        """
        self._check_sub(sub_arrays, finite=True)
        parts: list[_Part] = []
        for i, name in enumerate(self.base.names):
            vals = np.asarray(sub_arrays[name]).reshape(-1)
            parts.append((self._place(i, name, None), vals, 1.0))
        elements = _finish("width layout", parts, 1)
        return elements.indices, elements.values[:, 0]

    def _place(self, i: int, name: str, local: NDArray[np.int64] | None) -> int | NDArray[np.int64]:
        """Flat-space positions of sub-tensor coordinates ``local`` (None: all, in order)."""
        offset = self.base.offsets[i]
        if name not in self.slices:  # kept whole: sub coordinates are global coordinates
            return offset if local is None else local + offset
        pos = self.positions(name)
        return (pos if local is None else pos[local]) + offset

    def elements(self, update: SubmodelUpdate) -> ElementUpdate:
        """Map an update expressed in the submodel's coordinates onto global coordinates.

        Each part is dense (sub-tensor shape), coordinates (flat indices into the
        sub-tensor) or rows (indices along the sub-tensor's axis 0). Non-floating tensors
        outside the element space are skipped.

        Raises
        ------
        ValueError
            If the update touches a floating tensor outside the element space.
        ClientInputError
            If a part does not fit its sub-tensor or the weight is not finite and > 0.
        """
        weight = _check_weight(update)
        _check_covered(update, self.base.names)
        parts: list[_Part] = []
        for i, name in enumerate(self.base.names):
            part = update.tensors.get(name)
            if part is None:
                continue
            local, vals, cnts = _part_coordinates(name, part, self.sub_shape(name), weight)
            parts.append((self._place(i, name, local), vals, cnts))
        return _finish("width layout", parts, 1)

    def delta(
        self,
        global_arrays: Mapping[str, NDArray[np.generic]],
        sub_arrays: Mapping[str, NDArray[np.generic]],
        weight: float = 1.0,
    ) -> SubmodelUpdate:
        """Turn a client's trained *weights* into a dense delta update against the global.

        HeteroFL and FedRolex clients return their slice's weights; averaging those over the
        clients holding each coordinate equals applying the count-weighted average of
        ``weights - extract(global)`` to the global model.

        Parameters
        ----------
        global_arrays : Mapping[str, numpy.ndarray]
            The global model the slice was extracted from this round.
        sub_arrays : Mapping[str, numpy.ndarray]
            The client's trained submodel (:attr:`sub_shapes`).
        weight : float
            The client's averaging weight (1 for FedRolex's unweighted mean).

        Returns
        -------
        SubmodelUpdate
            Dense float64 deltas per tensor of the element space, in sub-tensor shapes.

        Raises
        ------
        ClientInputError
            If the submodel's tensors are missing, unknown, misshapen or not finite.
        ValueError
            If ``global_arrays`` does not match the global model.
        """
        self._check_sub(sub_arrays, finite=True)
        start = self.extract(global_arrays)
        tensors = {
            name: TensorUpdate(
                Encoding.DENSE,
                np.asarray(sub_arrays[name], np.float64) - start[name].astype(np.float64),
            )
            for name in self.base.names
        }
        return SubmodelUpdate(tensors, weight)

    def gather(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: NDArray[np.int64] | None = None,
    ) -> NDArray[np.float64]:
        """Read global coordinates (see :meth:`FlatLayout.gather`)."""
        return self.base.gather(arrays, indices)

    def write(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: NDArray[np.int64],
        values: NDArray[np.floating],
    ) -> dict[str, NDArray[np.generic]]:
        """Write global coordinates (see :meth:`FlatLayout.write`)."""
        return self.base.write(arrays, indices, values)
