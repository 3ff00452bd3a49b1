"""Layouts: the element space a submodel lives in, and how it maps onto a model's tensors.

A *layout* numbers the parts of a model that an aggregator treats as one unit — ``size``
elements of ``width`` values each — and converts between that element space and the model's
named arrays:

* :class:`FlatLayout` — every coordinate of the model's floating tensors (optionally integer
  buffers too) is one element of width 1. Coordinates are numbered tensor by tensor, in the
  order the model's ``ArrayRecord`` lists them, row-major within a tensor. This is SSA's
  flat domain ``[0, m)`` (top-k sparsification).
* :class:`RowLayout` — the rows of one 2-D table are the elements (width = row length). This
  is SSA/PSR's index mode (embedding rows, Cui et al.'s mega-elements).
* :class:`WidthLayout` — one client's *width slice* of a heterogeneous model (HeteroFL,
  FedRolex, SESA shards): per tensor, the kept output-channel indices (axis 0) and input-channel
  indices (axis 1). Its element space is the global model's flat space, so narrower clients'
  coordinates land exactly on the global coordinates they hold. It lives in
  :mod:`flwr_fsl.submodel.width_layout` (re-exported here).

Every layout turns a client's :class:`~flwr_fsl.submodel.update.SubmodelUpdate` into an
:class:`ElementUpdate` (ascending element indices, their values and averaging weights), and
gathers / writes element values from / onto a model's arrays. The one count-weighted apply
in :mod:`flwr_fsl.submodel.aggregate` is written against this interface only, so plaintext
FedSubAvg, SSA and every later secure aggregator update the model through the same code.

Errors: contents of a client's update or a client-chosen index set that are out of range,
duplicated, misshapen or not finite raise :class:`~flwr_fsl.core.errors.ClientInputError` (drop
that client). A layout that does not match the model it is used with, or index sets a server
built wrongly, raise :class:`ValueError` (a bug or a bad setting, not a client's fault).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.submodel.update import Encoding, SubmodelUpdate, TensorUpdate

__all__ = [
    "ElementUpdate",
    "FlatLayout",
    "Layout",
    "RowLayout",
    "TensorSlice",
    "WidthLayout",
]


@dataclass(frozen=True, eq=False)
class ElementUpdate:
    """One client's update in a layout's element space.

    The elements are either listed (``index_array``) or, for dense parts, a *run* of
    consecutive elements from ``start`` (no index array is built; the accumulation adds a
    slice).

    Attributes
    ----------
    values : numpy.ndarray
        ``(k, width)`` float64 values (deltas) of the elements.
    counts : numpy.ndarray
        ``(k,)`` float64 averaging weight of each element (the client's per-index count, or its
        sample count where it sent none), finite and > 0.
    index_array : numpy.ndarray or None
        ``(k,)`` int64 element indices, strictly ascending (hence unique), non-negative; None
        for a run.
    start : int
        First element of a run (unused when ``index_array`` is given).

    Raises
    ------
    ConfigurationError
        If the arrays' shapes disagree, a run starts below 0, or the indices are not strictly
        ascending and non-negative (layouts build these from validated updates; this guards
        against bugs).
    """

    values: NDArray[np.float64]
    counts: NDArray[np.float64]
    index_array: NDArray[np.int64] | None = None
    start: int = 0

    def __post_init__(self) -> None:
        if self.values.ndim != 2:
            raise ConfigurationError(f"values must be (k, width), got {self.values.shape}")
        k = self.values.shape[0]
        if self.counts.shape != (k,):
            raise ConfigurationError(f"counts must have shape ({k},), got {self.counts.shape}")
        idx = self.index_array
        if idx is None:
            if self.start < 0:
                raise ConfigurationError(f"a run cannot start at {self.start}")
            return
        if idx.shape != (k,):
            raise ConfigurationError(f"indices must have shape ({k},), got {idx.shape}")
        if k and (idx[0] < 0 or np.any(idx[1:] <= idx[:-1])):
            raise ConfigurationError("element indices must be non-negative and strictly ascending")

    @property
    def width(self) -> int:
        """Values per element."""
        return int(self.values.shape[1])

    @property
    def indices(self) -> NDArray[np.int64]:
        """``(k,)`` strictly ascending element indices (built for a run)."""
        if self.index_array is None:
            return np.arange(self.start, self.start + self.values.shape[0], dtype=np.int64)
        return self.index_array

    @property
    def where(self) -> slice | NDArray[np.int64]:
        """An index into the element axis: a slice for a run, else the index array."""
        if self.index_array is None:
            return slice(self.start, self.start + self.values.shape[0])
        return self.index_array

    @property
    def last(self) -> int:
        """The largest element index, or -1 when empty."""
        k = self.values.shape[0]
        if k == 0:
            return -1
        return self.start + k - 1 if self.index_array is None else int(self.index_array[-1])


@runtime_checkable
class Layout(Protocol):
    """The element space a submodel lives in: ``size`` elements of ``width`` values each."""

    @property
    def size(self) -> int:
        """Number of elements."""
        ...

    @property
    def width(self) -> int:
        """Values per element."""
        ...

    def elements(self, update: SubmodelUpdate) -> ElementUpdate:
        """Map a client's update onto element indices, values and averaging weights."""
        ...

    def gather(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: NDArray[np.int64] | None = None,
    ) -> NDArray[np.float64]:
        """Read elements (all, or the given ascending ones) of a model as ``(k, width)``."""
        ...

    def write(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: NDArray[np.int64],
        values: NDArray[np.floating],
    ) -> dict[str, NDArray[np.generic]]:
        """Return a copy of ``arrays`` with the given ascending elements set to ``values``.

        Raises
        ------
        ConfigurationError
            If the indices are not strictly ascending within ``[0, size)`` or ``values`` is
            not ``(len(indices), width)`` (every layout checks them alike).
        """
        ...


# -- shared helpers --------------------------------------------------------------------------


def _cast(values: NDArray[np.floating], dtype: np.dtype[np.generic]) -> NDArray[np.generic]:
    """Cast float64 results to a tensor's dtype: integers rounded to nearest, floats as is."""
    if np.issubdtype(dtype, np.integer):
        values = np.rint(values)
    return np.asarray(values).astype(dtype)


def _check_ascending(indices: NDArray[np.int64], size: int) -> NDArray[np.int64]:
    """Validate element indices handed to ``gather``/``write`` (a caller's, not a client's)."""
    idx = np.asarray(indices)
    if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
        raise ConfigurationError(f"element indices must be a 1-D integer array, got {idx.shape}")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx[0] < 0 or idx[-1] >= size or np.any(idx[1:] <= idx[:-1])):
        raise ConfigurationError(f"element indices must be strictly ascending within [0, {size})")
    return idx


def _check_write(
    indices: NDArray[np.int64], values: NDArray[np.floating], size: int, width: int
) -> tuple[NDArray[np.int64], NDArray[np.floating]]:
    """Validate ``write``'s arguments (every layout's): ascending indices, ``(k, width)`` values."""
    idx = _check_ascending(indices, size)
    vals = np.asarray(values)
    if vals.shape != (idx.size, width):
        raise ConfigurationError(f"values must have shape {(idx.size, width)}, got {vals.shape}")
    return idx, vals


def _check_index_set(
    indices: ArrayLike, bound: int, what: str, error: type[ValueError]
) -> NDArray[np.int64]:
    """Validate an index set along one axis: 1-D integers, non-empty, unique, within ``[0, bound)``.

    Any order is accepted: the order is the sub-tensor's channel order (FedRolex's rolling
    window wraps around, e.g. ``[3, 0]`` for 4 channels, width 2, shift 1).
    """
    idx = np.asarray(indices)
    if idx.shape == (0,):
        raise error(f"{what}: must keep at least one index")
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise error(f"{what}: indices must be a 1-D integer array, got {idx.dtype} {idx.shape}")
    if np.any(idx < 0) or np.any(idx >= bound):
        raise error(f"{what}: index out of range [0, {bound})")
    if np.unique(idx).size != idx.size:
        raise error(f"{what}: duplicate indices")
    out: NDArray[np.int64] = idx.astype(np.int64)
    out.flags.writeable = False
    return out


def _check_weight(update: SubmodelUpdate) -> float:
    weight = update.weight
    real = isinstance(weight, numbers.Real) and not isinstance(weight, bool | np.bool_)
    if not (real and math.isfinite(weight) and weight > 0):
        raise ClientInputError(f"update weight must be a finite number > 0, got {weight!r}")
    return float(weight)


def _check_covered(update: SubmodelUpdate, names: tuple[str, ...]) -> None:
    """Reject floating tensors outside a flat space (integer buffers may lie outside it)."""
    for name, part in update.tensors.items():
        if name not in names and np.issubdtype(np.asarray(part.values).dtype, np.floating):
            raise ConfigurationError(f"{name!r} is not a floating tensor of the model")


def _part_coordinates(  # noqa: C901
    name: str, part: TensorUpdate, shape: tuple[int, ...], weight: float
) -> tuple[NDArray[np.int64] | None, NDArray[np.generic], NDArray[np.float64] | float]:
    """One tensor part as (flat row-major positions within ``shape``, raw values, weights).

    The positions are None for a dense part: every coordinate, in order. The weights are one
    float (the client's ``weight``) when the part carries no per-index counts.

    Raises
    ------
    ClientInputError
        If the part does not fit ``shape`` (wrong shape, index out of range or repeated,
        counts not finite and > 0).
    """
    size = math.prod(shape)
    values = np.asarray(part.values)
    if part.encoding is Encoding.DENSE:
        if values.shape != shape:
            raise ClientInputError(f"{name}: dense values have shape {values.shape}, not {shape}")
        if part.indices is not None or part.counts is not None:
            raise ClientInputError(f"{name}: a dense part carries no indices or counts")
        return None, values.reshape(-1), weight
    if part.indices is None:
        raise ClientInputError(f"{name}: {part.encoding.value} part without indices")
    idx = np.asarray(part.indices)
    if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
        raise ClientInputError(f"{name}: indices must be a 1-D integer array")
    idx = idx.astype(np.int64, copy=False)
    counts: NDArray[np.float64] | float = weight
    if part.counts is not None:
        counts = np.asarray(part.counts, np.float64)
        if counts.shape != idx.shape:
            raise ClientInputError(f"{name}: {counts.size} counts for {idx.size} indices")
        if not np.all(np.isfinite(counts)) or np.any(counts <= 0):
            raise ClientInputError(f"{name}: counts must be finite and > 0")
    if part.encoding is Encoding.COORDINATES:
        bound, row = size, 1
        if values.shape != idx.shape:
            raise ClientInputError(f"{name}: {values.size} values for {idx.size} indices")
    else:  # Encoding.ROWS
        if not shape:
            raise ClientInputError(f"{name}: rows encoding needs a tensor with a row axis")
        bound, row = shape[0], math.prod(shape[1:])
        if values.shape != (idx.size, *shape[1:]):
            raise ClientInputError(
                f"{name}: rows values have shape {values.shape}, not {(idx.size, *shape[1:])}"
            )
    if idx.size and (idx.min() < 0 or idx.max() >= bound):
        raise ClientInputError(f"{name}: index out of range [0, {bound})")
    if row != 1:  # a row is `row` consecutive coordinates, all with the row's weight
        idx = (idx[:, None] * row + np.arange(row, dtype=np.int64)).reshape(-1)
        if not isinstance(counts, float):
            counts = np.repeat(counts, row)
    return idx, values.reshape(-1), counts


_Part = tuple[int | NDArray[np.int64], NDArray[np.generic], NDArray[np.float64] | float]
"""One tensor's share of an element update: (run start or element indices, values, counts or
one count for all its elements)."""


def _finish(name_of: str, parts: list[_Part], width: int) -> ElementUpdate:
    """Join parts (values as float64) into one run if they are adjacent runs, else sort them.

    Raises
    ------
    ClientInputError
        If two parts name the same element.
    """
    if not parts:
        return ElementUpdate(np.zeros((0, width)), np.zeros(0), np.zeros(0, np.int64))
    vals = np.concatenate([p[1] for p in parts], dtype=np.float64).reshape(-1, width)
    lengths = [p[1].size // width for p in parts]
    uniform = {p[2] for p in parts if isinstance(p[2], float)}
    if len(uniform) == 1 and all(isinstance(p[2], float) for p in parts):
        cnts = np.full(vals.shape[0], uniform.pop())
    else:
        cnts = np.concatenate(
            [
                np.full(n, c) if isinstance(c, float) else c
                for (_, _, c), n in zip(parts, lengths, strict=True)
            ],
            dtype=np.float64,
        )
    starts = [p[0] for p in parts]
    if all(isinstance(x, int | np.integer) for x in starts):
        first = [int(x) for x in starts]
        if all(first[i] + lengths[i] == first[i + 1] for i in range(len(parts) - 1)):
            return ElementUpdate(vals, cnts, None, first[0])
    idx = np.concatenate(
        [
            np.arange(x, x + n, dtype=np.int64) if isinstance(x, int | np.integer) else x
            for x, n in zip(starts, lengths, strict=True)
        ]
    )
    if idx.size > 1 and np.any(idx[1:] <= idx[:-1]):
        order = np.argsort(idx, kind="stable")
        idx, vals, cnts = idx[order], vals[order], cnts[order]
        if np.any(idx[1:] == idx[:-1]):
            raise ClientInputError(f"{name_of}: the update names an element more than once")
    return ElementUpdate(vals, cnts, idx)


# -- flat coordinates -----------------------------------------------------------------------


@dataclass(frozen=True)
class FlatLayout:
    """Offsets of a model's tensors in the flat index space (elements of width 1).

    Attributes
    ----------
    names : tuple[str, ...]
        Tensor names in the space, in order (floating tensors; integer ones too when built
        with ``include_integer=True``).
    shapes : tuple[tuple[int, ...], ...]
        Their shapes.
    offsets : tuple[int, ...]
        Start of each tensor; ``offsets[-1]`` is the total size ``m``.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]

    @classmethod
    def of(
        cls, arrays: Mapping[str, NDArray[np.generic]], *, include_integer: bool = False
    ) -> FlatLayout:
        """Build the layout of a model (its tensors in mapping order).

        Parameters
        ----------
        arrays : Mapping[str, numpy.ndarray]
            The model.
        include_integer : bool
            Also number integer tensors (batch-norm counters). Secure aggregation leaves them
            out (the default); plaintext averaging includes them and rounds their result.
        """

        def kept(a: NDArray[np.generic]) -> bool:
            dtype = np.asarray(a).dtype
            return bool(
                np.issubdtype(dtype, np.floating)
                or (include_integer and np.issubdtype(dtype, np.integer))
            )

        names = tuple(n for n, a in arrays.items() if kept(a))
        shapes = tuple(tuple(np.shape(arrays[n])) for n in names)
        offsets = tuple(int(x) for x in np.cumsum([0, *[math.prod(s) for s in shapes]]))
        return cls(names, shapes, offsets)

    @property
    def size(self) -> int:
        """``m``: total number of coordinates."""
        return self.offsets[-1]

    @property
    def width(self) -> int:
        """Always 1: an element is one coordinate."""
        return 1

    def offset(self, name: str) -> int:
        """Start of tensor ``name`` in the flat space.

        Raises
        ------
        ConfigurationError
            If ``name`` is not in the layout.
        """
        try:
            return self.offsets[self.names.index(name)]
        except ValueError:
            raise ConfigurationError(f"{name!r} is not a tensor of this layout") from None

    def elements(self, update: SubmodelUpdate) -> ElementUpdate:
        """Map a (dense, coordinate or row) update onto flat coordinates.

        A row of a row-encoded tensor becomes its ``prod(shape[1:])`` coordinates, each with
        the row's weight. Tensors outside the layout that are not floating (integer buffers of
        a float-only layout) are skipped.

        Raises
        ------
        ValueError
            If the update touches a floating tensor that is not in the layout.
        ClientInputError
            If a part does not fit its tensor or the weight is not finite and > 0.
        """
        weight = _check_weight(update)
        _check_covered(update, self.names)
        parts: list[_Part] = []
        for i, name in enumerate(self.names):  # layout order: ascending unless a part is not
            part = update.tensors.get(name)
            if part is None:
                continue
            pos, vals, cnts = _part_coordinates(name, part, self.shapes[i], weight)
            parts.append((self.offsets[i] if pos is None else pos + self.offsets[i], vals, cnts))
        return _finish("flat layout", parts, 1)

    def flatten_update(
        self, update: SubmodelUpdate
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Return the flat indices (ascending) and values of a (coordinate or dense) update.

        Raises
        ------
        ConfigurationError
            If the update touches a tensor outside the layout or uses row encoding.
        ClientInputError
            If a part does not fit its tensor.
        """
        for part in update.tensors.values():
            if part.encoding is Encoding.ROWS:
                raise ConfigurationError("row (mega-element) updates need the row layout, not flat")
        elements = self.elements(update)
        return elements.indices, elements.values[:, 0]

    def flatten(self, arrays: Mapping[str, NDArray[np.generic]]) -> NDArray[np.float64]:
        """Concatenate the layout's tensors of ``arrays`` into one float64 vector."""
        if not self.names:
            return np.zeros(0)
        return np.concatenate([np.asarray(arrays[n], np.float64).reshape(-1) for n in self.names])

    def unflatten(
        self, flat: NDArray[np.floating], like: Mapping[str, NDArray[np.generic]]
    ) -> dict[str, NDArray[np.generic]]:
        """Split a flat vector back into tensors (dtypes of ``like``; other tensors copied).

        Integer tensors (only in a layout built with ``include_integer=True``) are rounded
        to nearest.
        """
        out = {name: np.array(value, copy=True) for name, value in like.items()}
        for i, name in enumerate(self.names):
            lo, hi = self.offsets[i], self.offsets[i + 1]
            out[name] = _cast(flat[lo:hi].reshape(self.shapes[i]), like[name].dtype)
        return out

    def _segments(self, idx: NDArray[np.int64]) -> list[tuple[int, int, int]]:
        """For ascending ``idx``: (tensor number, start, stop) of each tensor's slice of it."""
        cuts = np.searchsorted(idx, np.asarray(self.offsets), side="left")
        return [
            (i, int(cuts[i]), int(cuts[i + 1]))
            for i in range(len(self.names))
            if cuts[i + 1] > cuts[i]
        ]

    def gather(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: NDArray[np.int64] | None = None,
    ) -> NDArray[np.float64]:
        """Read coordinates of a model as a ``(k, 1)`` float64 array.

        Parameters
        ----------
        arrays : Mapping[str, numpy.ndarray]
            A model with this layout's tensors.
        indices : numpy.ndarray, optional
            Strictly ascending flat indices; all coordinates when omitted.

        Raises
        ------
        ValueError
            If the indices are not strictly ascending within ``[0, size)``.
        """
        if indices is None:
            return self.flatten(arrays).reshape(-1, 1)
        idx = _check_ascending(indices, self.size)
        out = np.empty(idx.size)
        for i, lo, hi in self._segments(idx):
            flat = np.asarray(arrays[self.names[i]]).reshape(-1)
            out[lo:hi] = flat[idx[lo:hi] - self.offsets[i]]
        return out.reshape(-1, 1)

    def write(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: NDArray[np.int64],
        values: NDArray[np.floating],
    ) -> dict[str, NDArray[np.generic]]:
        """Return a copy of ``arrays`` with the given coordinates set to ``values``.

        Each value is cast to its tensor's dtype (integers rounded to nearest); every other
        coordinate and every tensor outside the layout is copied unchanged.

        Raises
        ------
        ConfigurationError
            If the indices are not strictly ascending within ``[0, size)`` or ``values`` is
            not ``(len(indices), 1)``.
        """
        idx, vals = _check_write(indices, values, self.size, 1)
        out = {name: np.array(value, copy=True, order="C") for name, value in arrays.items()}
        for i, lo, hi in self._segments(idx):  # C order: reshape(-1) below is a view
            target = out[self.names[i]]
            target.reshape(-1)[idx[lo:hi] - self.offsets[i]] = _cast(vals[lo:hi, 0], target.dtype)
        return out


# -- table rows -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RowLayout:
    """The rows of one 2-D table as elements (index mode: embedding rows, mega-elements).

    Attributes
    ----------
    table : str
        The table's tensor name.
    shape : tuple[int, int]
        ``(rows, row length)``.
    """

    table: str
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        if len(self.shape) != 2 or min(self.shape) < 1:
            raise ConfigurationError(
                f"a row table needs a 2-D shape with rows and columns: {self.shape}"
            )

    @classmethod
    def of(cls, arrays: Mapping[str, NDArray[np.generic]], table: str) -> RowLayout:
        """Build the row layout of ``arrays[table]``.

        Raises
        ------
        ConfigurationError
            If ``table`` is not in ``arrays`` or is not a non-empty 2-D tensor.
        """
        if table not in arrays:
            raise ConfigurationError(f"the model has no tensor {table!r}")
        shape = tuple(np.shape(arrays[table]))
        if len(shape) != 2:
            raise ConfigurationError(f"{table!r} must be a 2-D table, got shape {shape}")
        return cls(table, (int(shape[0]), int(shape[1])))

    @property
    def size(self) -> int:
        """Number of rows."""
        return self.shape[0]

    @property
    def width(self) -> int:
        """Row length."""
        return self.shape[1]

    def _table(self, arrays: Mapping[str, NDArray[np.generic]]) -> NDArray[np.generic]:
        table = np.asarray(arrays[self.table])
        if table.shape != self.shape:
            raise ConfigurationError(
                f"{self.table!r} has shape {table.shape}, the layout {self.shape}"
            )
        return table

    def elements(self, update: SubmodelUpdate) -> ElementUpdate:
        """Map a row (or dense) update of the table onto rows.

        Raises
        ------
        ConfigurationError
            If the update touches another tensor or sends the table as coordinates.
        ClientInputError
            If the part does not fit the table or the weight is not finite and > 0.
        """
        weight = _check_weight(update)
        others = sorted(set(update.tensors) - {self.table})
        if others:
            raise ConfigurationError(f"the row layout covers only {self.table!r}, not {others}")
        part = update.tensors.get(self.table)
        if part is None:
            return _finish(self.table, [], self.width)
        if part.encoding is Encoding.COORDINATES:
            raise ConfigurationError("coordinate updates need the flat layout, not rows")
        pos, vals, cnts = _part_coordinates(self.table, part, self.shape, weight)
        # Rows come back expanded to `width` coordinates each; keep one entry per row.
        rows: int | NDArray[np.int64] = 0 if pos is None else pos[:: self.width] // self.width
        row_counts = cnts if isinstance(cnts, float) else cnts[:: self.width]
        return _finish(self.table, [(rows, vals, row_counts)], self.width)

    def extract(self, arrays: Mapping[str, NDArray[np.generic]], rows: ArrayLike) -> NDArray:
        """Return a client's submodel: the selected rows of the table, in the given order.

        Raises
        ------
        ClientInputError
            If ``rows`` is not a non-empty set of distinct rows in range (a client's choice).
        """
        idx = _check_index_set(rows, self.size, f"{self.table} rows", ClientInputError)
        return np.take(self._table(arrays), idx, axis=0)

    def scatter(
        self, rows: ArrayLike, values: ArrayLike
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Rows and their values as ascending element indices and ``(k, width)`` float64.

        Raises
        ------
        ClientInputError
            If ``rows`` is not a set of distinct rows in range, or ``values`` is not one
            finite row per index.
        """
        idx = _check_index_set(rows, self.size, f"{self.table} rows", ClientInputError)
        vals = np.asarray(values)
        if vals.shape != (idx.size, self.width):
            raise ClientInputError(
                f"{self.table}: values have shape {vals.shape}, not {(idx.size, self.width)}"
            )
        if not np.all(np.isfinite(vals)):
            raise ClientInputError(f"{self.table}: values contain NaN or inf")
        order = np.argsort(idx, kind="stable")
        return idx[order], vals[order].astype(np.float64)

    def gather(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: NDArray[np.int64] | None = None,
    ) -> NDArray[np.float64]:
        """Read rows (all, or the given strictly ascending ones) as ``(k, width)`` float64.

        Raises
        ------
        ValueError
            If the table's shape differs from the layout or the indices are not strictly
            ascending within ``[0, size)``.
        """
        table = self._table(arrays)
        if indices is None:
            return table.astype(np.float64)
        return table[_check_ascending(indices, self.size)].astype(np.float64)

    def write(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: NDArray[np.int64],
        values: NDArray[np.floating],
    ) -> dict[str, NDArray[np.generic]]:
        """Return a copy of ``arrays`` with the given rows set to ``values`` (table's dtype).

        Raises
        ------
        ConfigurationError
            As :meth:`Layout.write`, or if the table's shape differs from the layout.
        """
        idx, vals = _check_write(indices, values, self.size, self.width)
        self._table(arrays)
        out = {name: np.array(value, copy=True) for name, value in arrays.items()}
        out[self.table][idx] = _cast(vals, out[self.table].dtype)
        return out


# Re-exported from the module that holds them (imported last: it builds on the names above).
from flwr_fsl.submodel.width_layout import TensorSlice, WidthLayout  # noqa: E402
