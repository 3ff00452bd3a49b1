"""Several row tables in one SFSL round: the tables packed into one public *row domain*.

Niu et al.'s DIN (§VI) has a goods table and a category table (plus dense layers), and a
client's category IDs follow from its goods IDs. :class:`TablePacking` runs such a model
(a :class:`~flwr_fsl.submodel.tables.ModelTables`) through the one-table SFSL round of
:mod:`flwr_fsl.families.sfsl.server` unchanged:

* **Packing.** The tables are stacked, in the spec's (derivation) order, into one virtual
  table of ``Σ rows`` rows and the largest width (narrower tables padded with zero columns,
  which no client changes); table ``t``'s row ``r`` is virtual row ``offset[t] + r``. Every
  other tensor stays a dense tensor of the round. The virtual table's name
  (:attr:`TablePacking.name`) spells out the tables, their shapes and a digest of the spec
  (``max_rows``, derivations, row maps), and travels as the settings record's ``table``: a
  client whose own spec differs refuses the round (no wire-format change; version-1 settings
  of a one-table model are untouched).
* **Union and perturbation over the primary tables only.** A client's union input holds its
  primary rows (the tables its data chooses) and it perturbs the primary part of the union
  (Alg. 2, one randomized response per primary row); its perturb reply is that set.
* **Derived sets consistent with the perturbation (§VI).** The server extends every union and
  every client's ``S''`` by the public row maps: a derived row (a category) is in
  ``S''_derived`` iff one of the perturbed primary rows (goods) maps to it
  (:meth:`TablePacking.extend`). ``S''_derived`` is therefore a function of ``S''_primary``
  and public data — post-processing of the goods' randomized response — and the client's true
  category set is never sent or used to choose what is sent. It is used only for the values:
  the client contributes ``(v Δ, v)`` at the derived rows of its *real* primary rows that the
  extension holds (zero elsewhere), exactly as for a goods row.
* **One count-weighted apply** over all tables and the dense tensors, unpacked afterwards
  (:meth:`TablePacking.unpack`).

Leakage (ε accounting): the union round releases the primary tables' union only (the derived
part of the PSU vector is never set by a client); the perturb reply is ``S''_primary``; the
derived sets add nothing (post-processing). The per-row aggregates of derived rows are
released as for any row, and with DP (:mod:`flwr_fsl.families.sfsl.dp`) a client's rows of
*all* tables share the one clip norm ``C`` and the one bound ``k`` on rows per client.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.submodel.tables import ModelTables

__all__ = ["PACKED_PREFIX", "TablePacking", "spec_digest"]

PACKED_PREFIX = "fsl.sfsl.tables:"
"""The start of a packed (several-table) model's virtual table name."""


def spec_digest(tables: ModelTables) -> str:
    """Return a short digest of a table spec (names, ``max_rows``, derivations, row maps)."""
    h = hashlib.sha256(b"flwr_fsl.sfsl.tables\x00")
    for t in tables.tables:
        h.update(json.dumps([t.name, t.max_rows, t.derived_from]).encode() + b"\x00")
        if t.row_map is not None:
            h.update(t.row_map.indptr.astype("<i8").tobytes())
            h.update(t.row_map.indices.astype("<i8").tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class TablePacking:
    """How a several-table model is one virtual table for the SFSL round (module docstring).

    Build it with :meth:`of` (the server, from the model) or :meth:`from_name` (the client,
    from the round's settings).

    Attributes
    ----------
    tables : ModelTables
        The spec.
    shapes : tuple[tuple[int, int], ...]
        ``(rows, width)`` of every table, in the spec's order.
    """

    tables: ModelTables
    shapes: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.tables.tables):
            raise ConfigurationError("TablePacking: one shape per table")
        for (rows, width), table in zip(self.shapes, self.tables.tables, strict=True):
            if rows < 1 or width < 1:
                raise ConfigurationError(f"table {table.name!r} must have rows and columns")
            if table.row_map is not None:
                parent = self.shapes[self.tables.names.index(str(table.derived_from))][0]
                if table.row_map.num_parents != parent or table.row_map.max_child >= rows:
                    raise ConfigurationError(
                        f"table {table.name!r}: the row map does not fit the tables' shapes"
                    )

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def of(cls, tables: ModelTables, model: Mapping[str, ArrayLike]) -> TablePacking:
        """Return the packing of ``model``'s tables.

        Raises
        ------
        ConfigurationError
            If the spec does not fit the model (:meth:`ModelTables.check`) or the tables do
            not share one dtype.
        """
        tables.check(model)
        dtypes = {np.asarray(model[n]).dtype for n in tables.names}
        if len(dtypes) != 1:
            raise ConfigurationError(f"the tables {tables.names} must share one dtype")
        shapes = tuple(
            (int(np.shape(model[n])[0]), int(np.shape(model[n])[1])) for n in tables.names
        )
        return cls(tables, shapes)

    @classmethod
    def from_name(cls, name: str, tables: ModelTables) -> TablePacking:
        """Return the packing a round's virtual table name describes, checked against a spec.

        Raises
        ------
        ClientInputError
            If the name is not a packed name of exactly these tables (names, order, digest).
        """
        if not name.startswith(PACKED_PREFIX):
            raise ClientInputError("the SFSL round does not carry several tables")
        try:
            body = json.loads(name[len(PACKED_PREFIX) :])
            entries, digest = body["tables"], body["spec"]
            names = tuple(str(e[0]) for e in entries)
            shapes = tuple((int(e[1]), int(e[2])) for e in entries)
        except (ValueError, KeyError, TypeError, IndexError) as err:
            raise ClientInputError(f"the SFSL round's table name is malformed: {err}") from err
        if names != tables.names or digest != spec_digest(tables):
            raise ClientInputError("the SFSL round's tables are not this client's table spec")
        try:
            return cls(tables, shapes)
        except ConfigurationError as err:
            raise ClientInputError(str(err)) from err

    # -- the virtual table ------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The virtual table's name (the settings record's ``table``)."""
        entries = [
            [t.name, r, w] for t, (r, w) in zip(self.tables.tables, self.shapes, strict=True)
        ]
        body = json.dumps(
            {"tables": entries, "spec": spec_digest(self.tables)}, separators=(",", ":")
        )
        return PACKED_PREFIX + body

    @property
    def offsets(self) -> tuple[int, ...]:
        """First virtual row of every table, then the total."""
        return tuple(int(x) for x in np.cumsum([0, *[r for r, _ in self.shapes]]))

    @property
    def rows(self) -> int:
        """Rows of the virtual table."""
        return self.offsets[-1]

    @property
    def width(self) -> int:
        """Width of the virtual table (the widest table's)."""
        return max(w for _, w in self.shapes)

    def _index(self, name: str) -> int:
        return self.tables.names.index(name)

    def primary_mask(self, virtual: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Which virtual rows belong to a primary (not derived) table."""
        out = np.zeros(np.shape(virtual), dtype=bool)
        offsets = self.offsets
        for i, table in enumerate(self.tables.tables):
            if not table.derived:
                out |= (virtual >= offsets[i]) & (virtual < offsets[i + 1])
        return out

    def to_virtual(self, rows: Mapping[str, ArrayLike]) -> NDArray[np.int64]:
        """Return the virtual rows of ``{table: local rows}`` (sorted)."""
        offsets = self.offsets
        parts = [np.asarray(r, dtype=np.int64) + offsets[self._index(n)] for n, r in rows.items()]
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    def split(self, virtual: ArrayLike) -> dict[str, NDArray[np.int64]]:
        """Return ``{table: local rows}`` of virtual rows (every table, in order)."""
        v = np.asarray(virtual, dtype=np.int64)
        offsets = self.offsets
        return {
            t.name: v[(v >= offsets[i]) & (v < offsets[i + 1])] - offsets[i]
            for i, t in enumerate(self.tables.tables)
        }

    def extend(self, primary: ArrayLike) -> NDArray[np.int64]:
        """Return virtual rows whose derived part is the derivation of their primary part.

        The derived rows of the input are dropped and replaced by the rows the public maps give
        for its primary rows: the result is a function of the primary rows only.
        """
        v = np.asarray(primary, dtype=np.int64)
        local = self.split(v[self.primary_mask(v)])
        for t in self.tables.tables:
            if t.row_map is not None:
                local[t.name] = t.row_map.derive(local[str(t.derived_from)])
        return self.to_virtual(local)

    # -- the client's rows ------------------------------------------------------------------
    def primary_rows(
        self, real: Mapping[str, object]
    ) -> dict[str, tuple[NDArray[np.int64], NDArray[np.float64]]]:
        """Check a client's primary rows and cut each table to its ``max_rows``.

        Parameters
        ----------
        real : Mapping[str, object]
            ``{primary table: rows}`` or ``{primary table: (rows, counts)}``.

        Returns
        -------
        dict[str, tuple[numpy.ndarray, numpy.ndarray]]
            Sorted distinct rows and positive counts per primary table; a table over its
            ``max_rows`` keeps its ``max_rows`` rows of largest count (then lowest index) — a
            deterministic choice, so every phase of a round sees the same rows.

        Raises
        ------
        ConfigurationError
            If a key is not a primary table, rows repeat or lie outside the table, or counts
            do not match.
        """
        out: dict[str, tuple[NDArray[np.int64], NDArray[np.float64]]] = {}
        for name, value in real.items():
            if name not in self.tables.primary:
                raise ConfigurationError(f"rows: {name!r} is not a primary table")
            if isinstance(value, tuple):
                rows, counts = (np.asarray(v) for v in value)
            else:
                rows = np.asarray(value)
                counts = np.ones(rows.shape)
            r = rows.astype(np.int64).reshape(-1)
            c = counts.astype(np.float64).reshape(-1)
            size = self.shapes[self._index(name)][0]
            if r.shape != c.shape or np.unique(r).size != r.size or not np.all(c > 0):
                raise ConfigurationError(f"rows of {name!r}: distinct, one count > 0 per row")
            if r.size and (int(r.min()) < 0 or int(r.max()) >= size):
                raise ConfigurationError(f"rows of {name!r} must lie in [0, {size})")
            limit = self.tables[name].max_rows
            if r.size > limit:
                keep = np.lexsort((r, -c))[:limit]
                r, c = r[keep], c[keep]
            order = np.argsort(r)
            out[name] = (r[order], c[order])
        return out

    def real_rows(
        self, primary: Mapping[str, tuple[NDArray[np.int64], NDArray[np.float64]]]
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Return a client's virtual real rows of every table and their counts.

        A derived row's count is the sum of its parents' (:meth:`ModelTables.client_counts`).
        """
        rows = {n: r for n, (r, _) in primary.items()}
        counts = {n: c for n, (_, c) in primary.items()}
        every = self.tables.client_counts(rows, counts)
        offsets = self.offsets
        parts = [(r + offsets[self._index(n)], c) for n, (r, c) in every.items()]
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0)
        v = np.concatenate([p[0] for p in parts])
        c = np.concatenate([p[1] for p in parts])
        order = np.argsort(v)
        return v[order], c[order]

    def real_of_virtual(
        self, rows: NDArray[np.int64], counts: NDArray[np.float64]
    ) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        """Return :meth:`real_rows` of virtual primary rows and their counts."""
        v = np.asarray(rows, dtype=np.int64)
        c = np.asarray(counts, dtype=np.float64)
        offsets = self.offsets
        primary: dict[str, tuple[NDArray[np.int64], NDArray[np.float64]]] = {}
        for i, t in enumerate(self.tables.tables):
            inside = (v >= offsets[i]) & (v < offsets[i + 1])
            if not t.derived:
                primary[t.name] = (v[inside] - offsets[i], c[inside])
        return self.real_rows(primary)

    def check_extended(self, rows: NDArray[np.int64]) -> None:
        """Refuse an ``S''`` whose derived rows are not the derivation of its primary rows.

        Raises
        ------
        ClientInputError
            If they differ (a server deviating from :meth:`extend`).
        """
        if not np.array_equal(np.sort(np.asarray(rows, dtype=np.int64)), self.extend(rows)):
            raise ClientInputError("the derived rows of S'' do not follow from its primary rows")

    # -- models -----------------------------------------------------------------------------
    def pack(self, model: Mapping[str, NDArray[np.generic]]) -> dict[str, NDArray[np.generic]]:
        """Return the model with its tables stacked into the virtual table (first)."""
        names = self.tables.names
        dtype = np.asarray(model[names[0]]).dtype
        table = np.zeros((self.rows, self.width), dtype=dtype)
        offsets = self.offsets
        for i, n in enumerate(names):
            part = np.asarray(model[n])
            table[offsets[i] : offsets[i + 1], : part.shape[1]] = part
        out: dict[str, NDArray[np.generic]] = {self.name: table}
        out.update({k: v for k, v in model.items() if k not in names})
        return out

    def unpack(
        self,
        packed: Mapping[str, NDArray[np.generic]],
        order: tuple[str, ...] | None = None,
    ) -> dict[str, NDArray[np.generic]]:
        """Return the model of a packed one (tables first, or in ``order``, a model's keys).

        Raises
        ------
        ClientInputError
            If the virtual table is missing or not of the packing's shape.
        """
        table = packed.get(self.name)
        if table is None or np.shape(table) != (self.rows, self.width):
            raise ClientInputError("the packed model's virtual table has the wrong shape")
        offsets = self.offsets
        out: dict[str, NDArray[np.generic]] = {
            t.name: np.array(table[offsets[i] : offsets[i + 1], : self.shapes[i][1]])
            for i, t in enumerate(self.tables.tables)
        }
        out.update({k: v for k, v in packed.items() if k != self.name})
        if order is not None:
            out = {k: out[k] for k in order}
        return out
