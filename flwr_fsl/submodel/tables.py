"""Which tensors of a model are row tables, and how one table's rows follow from another's.

A recommendation or text model is several *row tables* (item, category, word embeddings) plus
*dense* tensors (the MLP on top). A client touches a few rows of each table; which ones is
private. This module is the shared, Flower-free description of that structure, used by every
family that federates such a model (SSA/PSR index mode, Niu's SFSL, the recsys example):

* :class:`TableSpec` — one 2-D table of the model's ``ArrayRecord``: its name, the public bound
  ``max_rows`` on one client's rows of it per round, and, for a *derived* table, the table its
  rows follow from and the public :class:`RowMap` between them.
* :class:`RowMap` — a public many-to-many map from a parent table's rows to a derived table's
  rows in CSR form (e.g. MovieLens item -> its genres): parent row ``p`` maps to
  ``indices[indptr[p]:indptr[p + 1]]``. It is task data built by the app's code on both sides
  (server and client), never sent by a client.
* :class:`ModelTables` — the tables of one model. Every floating tensor it does not name is
  *dense* (:meth:`ModelTables.dense_names`, in the model's order, as
  :class:`~flwr_fsl.submodel.layout.FlatLayout` numbers them). :meth:`ModelTables.client_rows`
  completes a client's *primary* rows (the tables its data chooses) with the rows of every
  derived table.

Errors: a setting that does not fit (a name missing from the model, a table that is not 2-D,
a derivation cycle, a map out of range, row indices a client's own callback produced wrongly)
raises :class:`~flwr_fsl.core.errors.ConfigurationError` naming the table. Nothing here reads
bytes from another party, so nothing raises :class:`~flwr_fsl.core.errors.ClientInputError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.checks import check_int, check_str
from flwr_fsl.core.errors import ConfigurationError

__all__ = ["ModelTables", "RowMap", "TableSpec", "row_counts"]


def _readonly(array: NDArray[np.int64]) -> NDArray[np.int64]:
    out = np.array(array, np.int64, copy=True)
    out.setflags(write=False)
    return out


def _int_vector(what: str, values: ArrayLike) -> NDArray[np.int64]:
    """``values`` as a 1-D int64 vector; floats, bools and other shapes are refused."""
    array = np.asarray(values)
    if array.size == 0:
        return np.zeros(0, np.int64)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ConfigurationError(
            f"{what} must be a 1-D vector of integers, got dtype {array.dtype} shape {array.shape}"
        )
    return array.astype(np.int64)


@dataclass(frozen=True, eq=False)
class RowMap:
    """A public many-to-many map from parent rows to child rows, in CSR form.

    Parent row ``p`` maps to the child rows ``indices[indptr[p]:indptr[p + 1]]`` (a parent may
    map to no row, and repeats within a parent's list are harmless). The arrays are copied and
    made read-only.

    Attributes
    ----------
    indptr : numpy.ndarray
        ``(num_parents + 1,)`` int64, ``indptr[0] == 0``, non-decreasing,
        ``indptr[-1] == len(indices)``.
    indices : numpy.ndarray
        ``(nnz,)`` int64 child rows, non-negative.

    Raises
    ------
    ConfigurationError
        If the arrays are not integer vectors of that form.
    """

    indptr: NDArray[np.int64]
    indices: NDArray[np.int64]

    def __post_init__(self) -> None:
        indptr = _int_vector("row_map.indptr", self.indptr)
        indices = _int_vector("row_map.indices", self.indices)
        if indptr.size < 1 or indptr[0] != 0:
            raise ConfigurationError("row_map.indptr must start with 0 (one entry per parent + 1)")
        if np.any(np.diff(indptr) < 0):
            raise ConfigurationError("row_map.indptr must be non-decreasing")
        if indptr[-1] != indices.size:
            raise ConfigurationError(
                f"row_map.indptr ends at {int(indptr[-1])}, but there are {indices.size} indices"
            )
        if indices.size and int(indices.min()) < 0:
            raise ConfigurationError("row_map.indices must be non-negative")
        object.__setattr__(self, "indptr", _readonly(indptr))
        object.__setattr__(self, "indices", _readonly(indices))

    @classmethod
    def from_lists(cls, children: Sequence[Iterable[int]]) -> RowMap:
        """Build the map from one list of child rows per parent row.

        Parameters
        ----------
        children : Sequence[Iterable[int]]
            ``children[p]``: the child rows of parent ``p``.

        Returns
        -------
        RowMap
            The CSR form.
        """
        lists = [np.asarray(list(c), np.int64).reshape(-1) for c in children]
        indptr = np.cumsum([0, *[len(c) for c in lists]], dtype=np.int64)
        indices = np.concatenate(lists) if lists else np.zeros(0, np.int64)
        return cls(indptr, indices.astype(np.int64))

    @property
    def num_parents(self) -> int:
        """Number of parent rows the map is defined on (``len(indptr) - 1``)."""
        return int(self.indptr.size - 1)

    @property
    def max_child(self) -> int:
        """The largest child row (-1 for an empty map)."""
        return int(self.indices.max()) if self.indices.size else -1

    def bound(self, parents: int) -> int:
        """Upper bound on the child rows of any ``parents`` parent rows.

        The sum of the ``parents`` largest fan-outs (a set-cover bound; the true worst case can be
        smaller when lists overlap).

        Parameters
        ----------
        parents : int
            How many parent rows (e.g. the parent table's ``max_rows``).

        Returns
        -------
        int
            The bound.
        """
        check_int("parents", parents, 0)
        fanout = np.sort(np.diff(self.indptr))[::-1]
        return int(fanout[:parents].sum())

    def _parents(self, parent_rows: ArrayLike) -> NDArray[np.int64]:
        parents = _int_vector("parent rows", parent_rows)
        if parents.size and (int(parents.min()) < 0 or int(parents.max()) >= self.num_parents):
            raise ConfigurationError(
                f"parent rows must lie in [0, {self.num_parents}), the map's domain"
            )
        return parents

    def _expand(self, parents: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        # Every (position in parents, child row) pair, vectorized: no Python loop over parents.
        starts = self.indptr[parents]
        lengths = self.indptr[parents + 1] - starts
        total = int(lengths.sum())
        owner = np.repeat(np.arange(parents.size, dtype=np.int64), lengths)
        first = np.cumsum(lengths) - lengths
        offsets = np.arange(total, dtype=np.int64) - np.repeat(first, lengths)
        return owner, self.indices[np.repeat(starts, lengths) + offsets]

    def derive(self, parent_rows: ArrayLike) -> NDArray[np.int64]:
        """Return the child rows of a set of parent rows: sorted, unique.

        Parameters
        ----------
        parent_rows : array_like of int
            Parent row indices (repeats allowed).

        Returns
        -------
        numpy.ndarray
            ``(n,)`` int64, strictly ascending.

        Raises
        ------
        ConfigurationError
            If a parent row is outside ``[0, num_parents)`` or the input is not integers.
        """
        _, children = self._expand(self._parents(parent_rows))
        return np.unique(children)

    def derive_counts(
        self, parent_rows: ArrayLike, counts: ArrayLike
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Return the child rows of weighted parent rows, each weighted by its parents' sum.

        A child row's count is the total count of the parent rows (listed once each) that map to
        it: e.g. a genre embedding is touched by the samples of every item of that genre.

        Parameters
        ----------
        parent_rows : array_like of int
            Parent row indices, unique.
        counts : array_like of float
            One finite weight > 0 per parent row.

        Returns
        -------
        tuple[numpy.ndarray, numpy.ndarray]
            Strictly ascending child rows and their float64 counts.

        Raises
        ------
        ConfigurationError
            If the parent rows are out of range or repeated, or the counts do not match them.
        """
        parents = self._parents(parent_rows)
        weights = np.asarray(counts, np.float64).reshape(-1)
        if weights.shape != parents.shape:
            raise ConfigurationError("counts must have one entry per parent row")
        if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
            raise ConfigurationError("counts must be finite and > 0")
        if np.unique(parents).size != parents.size:
            raise ConfigurationError("weighted parent rows must be unique")
        owner, children = self._expand(parents)
        # A parent listing a child twice still counts once towards it.
        pairs = np.unique(np.stack([owner, children]), axis=1)
        rows, inverse = np.unique(pairs[1], return_inverse=True)
        totals = np.zeros(rows.size, np.float64)
        np.add.at(totals, inverse, weights[pairs[0]])
        return rows, totals


@dataclass(frozen=True)
class TableSpec:
    """One row table of a model.

    Attributes
    ----------
    name : str
        The 2-D tensor's name in the model's ``ArrayRecord``.
    max_rows : int
        Public bound on one client's rows of this table per round (>= 1).
    derived_from : str or None
        The table whose rows determine this one's; None: the client's data chooses them.
    row_map : RowMap or None
        The public map from ``derived_from``'s rows to this table's rows; given exactly when
        ``derived_from`` is.

    Raises
    ------
    ConfigurationError
        If the name is empty, ``max_rows`` < 1, only one of ``derived_from`` / ``row_map`` is
        given, or the table is derived from itself.
    """

    name: str
    max_rows: int
    derived_from: str | None = None
    row_map: RowMap | None = None

    def __post_init__(self) -> None:
        check_str("TableSpec.name", self.name)
        object.__setattr__(
            self, "max_rows", check_int(f"max_rows of table {self.name!r}", self.max_rows, 1)
        )
        if (self.derived_from is None) != (self.row_map is None):
            raise ConfigurationError(
                f"table {self.name!r}: derived_from and row_map go together (both or neither)"
            )
        if self.derived_from is not None:
            check_str(f"derived_from of table {self.name!r}", self.derived_from)
            if self.derived_from == self.name:
                raise ConfigurationError(f"table {self.name!r} cannot be derived from itself")
        if self.row_map is not None and not isinstance(self.row_map, RowMap):
            raise ConfigurationError(f"row_map of table {self.name!r} must be a RowMap")

    @property
    def derived(self) -> bool:
        """Whether the rows follow from another table's."""
        return self.derived_from is not None


@dataclass(frozen=True)
class ModelTables:
    """The row tables of a model; every other floating tensor is dense.

    Attributes
    ----------
    tables : tuple[TableSpec, ...]
        At least one table; unique names; every ``derived_from`` names another table of the
        tuple and derivations have no cycle. Stored in derivation order (a parent before the
        tables derived from it; otherwise the given order).

    Raises
    ------
    ConfigurationError
        If the tuple is empty, holds something else than ``TableSpec``, repeats a name, derives
        from a table it does not hold, or derivations form a cycle.
    """

    tables: tuple[TableSpec, ...]

    def __post_init__(self) -> None:
        tables = tuple(self.tables)
        if not tables:
            raise ConfigurationError("tables: give at least one TableSpec")
        if not all(isinstance(t, TableSpec) for t in tables):
            raise ConfigurationError("tables: every entry must be a TableSpec")
        names = [t.name for t in tables]
        for name in names:
            if names.count(name) > 1:
                raise ConfigurationError(f"table {name!r} is named twice")
        for table in tables:
            if table.derived_from is not None and table.derived_from not in names:
                raise ConfigurationError(
                    f"table {table.name!r} is derived from {table.derived_from!r}, "
                    "which is not one of the tables"
                )
        object.__setattr__(self, "tables", _derivation_order(tables))

    @classmethod
    def single(cls, name: str, max_rows: int) -> ModelTables:
        """One primary table (the single-table index mode)."""
        return cls((TableSpec(name, max_rows),))

    @property
    def names(self) -> tuple[str, ...]:
        """Table names, in derivation order."""
        return tuple(t.name for t in self.tables)

    @property
    def primary(self) -> tuple[str, ...]:
        """Names of the tables whose rows the client's data chooses."""
        return tuple(t.name for t in self.tables if not t.derived)

    def __getitem__(self, name: str) -> TableSpec:
        """Return the spec of table ``name``.

        Raises
        ------
        ConfigurationError
            If there is no such table.
        """
        for table in self.tables:
            if table.name == name:
                return table
        raise ConfigurationError(f"{name!r} is not one of the tables {self.names}")

    def check(self, arrays: Mapping[str, Any]) -> None:
        """Check the tables against a model.

        Parameters
        ----------
        arrays : Mapping[str, array_like]
            The model's tensors by name (numpy arrays or anything ``numpy.shape`` reads).

        Raises
        ------
        ConfigurationError
            If a table is missing, not a 2-D floating tensor with rows and columns, or a row map
            does not have one entry per parent row or points past the derived table's rows.
        """
        for table in self.tables:
            if table.name not in arrays:
                raise ConfigurationError(f"table {table.name!r}: the model has no such tensor")
            array = np.asarray(arrays[table.name])
            if array.ndim != 2 or min(array.shape) < 1:
                raise ConfigurationError(
                    f"table {table.name!r} must be a non-empty 2-D tensor, got shape {array.shape}"
                )
            if not np.issubdtype(array.dtype, np.floating):
                raise ConfigurationError(
                    f"table {table.name!r} must be floating, not {array.dtype}"
                )
            if table.row_map is None:
                continue
            parent_rows = int(np.shape(arrays[str(table.derived_from)])[0])
            if table.row_map.num_parents != parent_rows:
                raise ConfigurationError(
                    f"table {table.name!r}: the row map covers {table.row_map.num_parents} rows "
                    f"of {table.derived_from!r}, which has {parent_rows}"
                )
            if table.row_map.max_child >= array.shape[0]:
                raise ConfigurationError(
                    f"table {table.name!r}: the row map points to row {table.row_map.max_child}, "
                    f"the table has {array.shape[0]}"
                )

    def dense_names(self, arrays: Mapping[str, Any]) -> tuple[str, ...]:
        """Return the floating tensors that are not tables, in the model's order.

        Integer tensors (batch-norm counters) are neither tables nor dense: secure aggregation
        leaves them out, as :class:`~flwr_fsl.submodel.layout.FlatLayout` does.
        """
        tables = set(self.names)
        return tuple(
            name
            for name, array in arrays.items()
            if name not in tables and np.issubdtype(np.asarray(array).dtype, np.floating)
        )

    def worst_case_rows(self, name: str, rows: Mapping[str, int] | None = None) -> int:
        """Return a bound on one client's rows of table ``name`` when its parents are full.

        ``max_rows`` for a primary table; for a derived one, :meth:`RowMap.bound` of its
        parent's worst case. Compare with ``max_rows`` to see whether a client can exceed it.

        Parameters
        ----------
        name : str
            The table.
        rows : Mapping[str, int], optional
            Each table's row count (its tensor's first dimension): a client never holds more
            rows of a table than the table has, so the bound of every table on the way is
            capped at its count (a table left out is not capped).

        Returns
        -------
        int
            The bound.
        """
        table = self[name]
        if table.row_map is None:
            bound = table.max_rows
        else:
            bound = table.row_map.bound(self.worst_case_rows(str(table.derived_from), rows))
        return bound if rows is None or name not in rows else min(bound, int(rows[name]))

    def client_rows(self, primary: Mapping[str, ArrayLike]) -> dict[str, NDArray[np.int64]]:
        """One client's rows of every table, from its rows of the primary tables.

        Parameters
        ----------
        primary : Mapping[str, array_like of int]
            ``{primary table name: row indices}``; a primary table left out has no rows.

        Returns
        -------
        dict[str, numpy.ndarray]
            Every table's rows, in derivation order: primary rows as given (int64), derived
            rows sorted and unique. ``max_rows`` is not applied here (the caller decides how a
            set over its bound is handled).

        Raises
        ------
        ConfigurationError
            If a key is not a primary table, a row set is not unique non-negative integers, or a
            parent row is outside its row map; the message names the table.
        """
        self._check_keys(primary)
        out: dict[str, NDArray[np.int64]] = {}
        for table in self.tables:
            if table.row_map is None:
                out[table.name] = _primary_rows(table.name, primary.get(table.name, ()))
                continue
            try:
                out[table.name] = table.row_map.derive(out[str(table.derived_from)])
            except ConfigurationError as error:
                raise ConfigurationError(f"table {table.name!r}: {error}") from None
        return out

    def client_counts(
        self,
        primary: Mapping[str, ArrayLike],
        counts: Mapping[str, ArrayLike],
    ) -> dict[str, tuple[NDArray[np.int64], NDArray[np.float64]]]:
        """Like :meth:`client_rows`, with a weight per row (weighted rounds).

        A derived row's weight is the sum of the weights of the parent rows mapping to it
        (:meth:`RowMap.derive_counts`).

        Parameters
        ----------
        primary : Mapping[str, array_like of int]
            Primary rows per table (unique).
        counts : Mapping[str, array_like of float]
            One finite weight > 0 per primary row, same keys as ``primary``.

        Returns
        -------
        dict[str, tuple[numpy.ndarray, numpy.ndarray]]
            Every table's ``(rows, counts)`` in derivation order (derived rows ascending).

        Raises
        ------
        ConfigurationError
            As :meth:`client_rows`, or if the counts do not match the rows; names the table.
        """
        self._check_keys(primary)
        if set(counts) != set(primary):
            raise ConfigurationError("counts must name exactly the tables of the primary rows")
        out: dict[str, tuple[NDArray[np.int64], NDArray[np.float64]]] = {}
        for table in self.tables:
            if table.row_map is None:
                rows = _primary_rows(table.name, primary.get(table.name, ()))
                out[table.name] = (rows, row_counts(table.name, rows, counts.get(table.name, ())))
                continue
            parent_rows, parent_counts = out[str(table.derived_from)]
            try:
                out[table.name] = table.row_map.derive_counts(parent_rows, parent_counts)
            except ConfigurationError as error:
                raise ConfigurationError(f"table {table.name!r}: {error}") from None
        return out

    def _check_keys(self, primary: Mapping[str, ArrayLike]) -> None:
        allowed = set(self.primary)
        for name in primary:
            if name not in allowed:
                raise ConfigurationError(
                    f"table {name!r} is not a primary table (primary: {self.primary})"
                )


def row_counts(table: str, rows: NDArray[np.int64], counts: ArrayLike) -> NDArray[np.float64]:
    """Check a client's weights of its ``rows`` of ``table`` (what an app's ``rows()`` returns).

    Parameters
    ----------
    table : str
        The table (named in the messages).
    rows : numpy.ndarray
        The client's rows of the table, 1-D.
    counts : array_like of float
        One weight per row.

    Returns
    -------
    numpy.ndarray
        The weights as a 1-D float64 array.

    Raises
    ------
    ConfigurationError
        If there is not one count per row or a count is not finite and > 0.
    """
    weights = np.asarray(counts, np.float64).reshape(-1)
    if weights.shape != np.shape(rows):
        raise ConfigurationError(f"table {table!r}: one count per row")
    if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
        raise ConfigurationError(f"table {table!r}: counts must be finite, > 0")
    return weights


def _primary_rows(name: str, rows: ArrayLike) -> NDArray[np.int64]:
    out = _int_vector(f"rows of table {name!r}", rows)
    if out.size and int(out.min()) < 0:
        raise ConfigurationError(f"rows of table {name!r} must be non-negative")
    if np.unique(out).size != out.size:
        raise ConfigurationError(f"rows of table {name!r} must be unique")
    return out


def _derivation_order(tables: tuple[TableSpec, ...]) -> tuple[TableSpec, ...]:
    """Parents before children, stable otherwise; a cycle is a ConfigurationError."""
    placed: list[TableSpec] = []
    done: set[str] = set()
    pending = list(tables)
    while pending:
        ready = [t for t in pending if t.derived_from is None or t.derived_from in done]
        if not ready:
            cycle = sorted(t.name for t in pending)
            raise ConfigurationError(f"tables {cycle} are derived from each other in a cycle")
        for table in ready:
            placed.append(table)
            done.add(table.name)
        pending = [t for t in pending if t.name not in done]
    return tuple(placed)
