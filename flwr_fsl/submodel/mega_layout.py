"""Mega-elements in a flat space: :class:`MegaLayout` (rows of grouped tensors + coordinates).

Cui et al.'s top-k with mega-elements (§6, §7.4) ranks the rows of some tensors (an embedding
table) by L1 norm and sends chosen rows whole, while the rest of the model is sparsified
coordinate by coordinate (:func:`~flwr_fsl.submodel.topk.sparsify` with ``groups``). A
:class:`MegaLayout` is that mixed element space, for secure top-k
(:class:`~flwr_fsl.strategies.SecureFedSubAvg` with ``groups``):

* tensors are numbered in the model's order (floating tensors only, as
  :class:`~flwr_fsl.submodel.layout.FlatLayout`);
* a **grouped** tensor of shape ``(r, ...)`` contributes ``r`` elements, its rows (row length
  ``prod(shape[1:])``); any other floating tensor contributes one element per coordinate;
* every element has the same ``width``: the widest row. Shorter elements (single coordinates,
  rows of a narrower group) are **padded with zero words** at the end. One SSA instance then
  carries the whole round: one cuckoo table over all element ids, ``width + 1`` payload words
  per key (values and the count word).

Why one padded space rather than one SSA instance per width: the padding costs
``(width - w_e) * 8`` bytes per chosen narrow element in every client's keys and the same
words per evaluated point on the servers; separate instances would avoid it but need a
second S1 round (session, seal, check) per Flower round. ``benchmarks/newsgroups_compare.py``
measures both (the padded upload, and the two instances' keys encoded separately).

Element ``e`` of a padded space uses columns ``[0, w_e)`` of its ``width`` words; :meth:`write`
ignores the padding columns (a client that puts values there changes nothing).
Errors follow :mod:`flwr_fsl.submodel.layout`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.submodel.layout import (
    ElementUpdate,
    _cast,
    _check_ascending,
    _check_covered,
    _check_weight,
    _check_write,
    _finish,
    _Part,
    _part_coordinates,
)
from flwr_fsl.submodel.update import Encoding, SubmodelUpdate

__all__ = ["MegaLayout"]


@dataclass(frozen=True)
class MegaLayout:
    """Rows of grouped tensors and coordinates of the others, as one padded element space.

    Attributes
    ----------
    names : tuple[str, ...]
        Floating tensor names, in model order.
    shapes : tuple[tuple[int, ...], ...]
        Their shapes.
    groups : frozenset[str]
        The tensors whose rows are elements.
    offsets : tuple[int, ...]
        First element of each tensor; ``offsets[-1]`` is :attr:`size`.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    groups: frozenset[str]
    offsets: tuple[int, ...]

    @classmethod
    def of(cls, arrays: Mapping[str, NDArray[np.generic]], groups: Iterable[str]) -> MegaLayout:
        """Build the layout of a model with the given grouped tensors.

        Parameters
        ----------
        arrays : Mapping[str, numpy.ndarray]
            The model.
        groups : iterable of str
            Names of tensors sent as whole rows (``topk-groups``).

        Raises
        ------
        ConfigurationError
            If a group is not a floating tensor of the model with a row axis.
        """
        group_set = frozenset(groups)
        names = tuple(
            n for n, a in arrays.items() if np.issubdtype(np.asarray(a).dtype, np.floating)
        )
        for g in sorted(group_set):
            if g not in names:
                raise ConfigurationError(f"group {g!r} is not a floating tensor of the model")
            if np.ndim(arrays[g]) < 1 or np.shape(arrays[g])[0] < 1:
                raise ConfigurationError(f"group {g!r} has no rows")
        shapes = tuple(tuple(int(x) for x in np.shape(arrays[n])) for n in names)
        sizes = [
            s[0] if n in group_set else math.prod(s) for n, s in zip(names, shapes, strict=True)
        ]
        offsets = tuple(int(x) for x in np.cumsum([0, *sizes]))
        return cls(names, shapes, group_set, offsets)

    def row_width(self, name: str) -> int:
        """Words of one element of tensor ``name`` (its row length if grouped, else 1)."""
        shape = self.shapes[self.names.index(name)]
        return math.prod(shape[1:]) if name in self.groups else 1

    @property
    def size(self) -> int:
        """Number of elements (rows of the groups plus coordinates of the rest)."""
        return self.offsets[-1]

    @property
    def width(self) -> int:
        """Words per element: the widest group row (1 without groups)."""
        return max([1, *(self.row_width(n) for n in self.names if n in self.groups)])

    def group_sizes(self) -> dict[str, int]:
        """Elements per group: each grouped tensor's rows, and ``""`` for all coordinates."""
        out = {n: self.shapes[i][0] for i, n in enumerate(self.names) if n in self.groups}
        out[""] = sum(
            math.prod(self.shapes[i]) for i, n in enumerate(self.names) if n not in self.groups
        )
        return out

    def elements(self, update: SubmodelUpdate) -> ElementUpdate:
        """Map a top-k update (rows of the groups, coordinates elsewhere) onto padded elements.

        Raises
        ------
        ConfigurationError
            If a grouped tensor is sent as coordinates or another tensor as rows, or a floating
            tensor outside the model is named.
        ClientInputError
            If a part does not fit its tensor or the weight is not finite and > 0.
        """
        weight = _check_weight(update)
        _check_covered(update, self.names)
        width = self.width
        parts: list[_Part] = []
        for i, name in enumerate(self.names):
            part = update.tensors.get(name)
            if part is None:
                continue
            grouped = name in self.groups
            if grouped and part.encoding is Encoding.COORDINATES:
                raise ConfigurationError(f"{name!r} is a group: send its rows, not coordinates")
            if not grouped and part.encoding is Encoding.ROWS:
                raise ConfigurationError(f"{name!r} is not a group: rows need topk-groups")
            pos, vals, cnts = _part_coordinates(name, part, self.shapes[i], weight)
            w = self.row_width(name)
            rows: int | NDArray[np.int64]
            if pos is None:
                rows = self.offsets[i]
            else:
                rows = pos[::w] // w + self.offsets[i]
                cnts = cnts if isinstance(cnts, float) else cnts[::w]
            padded = np.zeros((vals.size // w, width))
            padded[:, :w] = np.asarray(vals, np.float64).reshape(-1, w)
            parts.append((rows, padded.reshape(-1), cnts))
        return _finish("mega layout", parts, width)

    def _segments(self, idx: NDArray[np.int64]) -> list[tuple[int, int, int]]:
        """For ascending ``idx``: (tensor number, start, stop) of each tensor's slice of it."""
        cuts = np.searchsorted(idx, np.asarray(self.offsets), side="left")
        return [
            (i, int(cuts[i]), int(cuts[i + 1]))
            for i in range(len(self.names))
            if cuts[i + 1] > cuts[i]
        ]

    def _view(self, array: NDArray[np.generic], i: int) -> NDArray[np.generic]:
        """Return the tensor as ``(elements, element width)`` (a view for C-ordered arrays)."""
        name = self.names[i]
        if tuple(np.shape(array)) != self.shapes[i]:
            raise ConfigurationError(
                f"{name!r} has shape {np.shape(array)}, the layout {self.shapes[i]}"
            )
        return np.asarray(array).reshape(-1, self.row_width(name))

    def gather(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: NDArray[np.int64] | None = None,
    ) -> NDArray[np.float64]:
        """Read elements (all, or the given strictly ascending ones) as ``(k, width)``, zero-padded.

        Raises
        ------
        ConfigurationError
            If a tensor's shape differs from the layout or the indices are not strictly
            ascending within ``[0, size)``.
        """
        idx = (
            np.arange(self.size, dtype=np.int64)
            if indices is None
            else _check_ascending(indices, self.size)
        )
        out = np.zeros((idx.size, self.width))
        for i, lo, hi in self._segments(idx):
            view = self._view(arrays[self.names[i]], i)
            out[lo:hi, : view.shape[1]] = view[idx[lo:hi] - self.offsets[i]]
        return out

    def write(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: NDArray[np.int64],
        values: NDArray[np.floating],
    ) -> dict[str, NDArray[np.generic]]:
        """Return a copy of ``arrays`` with the given elements set (padding columns ignored).

        Raises
        ------
        ConfigurationError
            As :meth:`Layout.write <flwr_fsl.submodel.layout.Layout.write>`, or if a tensor's
            shape differs from the layout.
        """
        idx, vals = _check_write(indices, values, self.size, self.width)
        out = {name: np.array(value, copy=True, order="C") for name, value in arrays.items()}
        for i, lo, hi in self._segments(idx):
            view = self._view(out[self.names[i]], i)  # C order: a view of the copy
            w = view.shape[1]
            view[idx[lo:hi] - self.offsets[i]] = _cast(vals[lo:hi, :w], view.dtype)
        return out
