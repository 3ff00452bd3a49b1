"""Mixed index-mode rounds: several row tables plus the dense tensors in one two-server round.

A *mixed* round of :class:`~flwr_fsl.families.ssa.index_strategy.SecureRowFedSubAvg` federates a
model described by a :class:`~flwr_fsl.submodel.tables.ModelTables`: every row table is one
*part* (its own PSR retrieval and row SSA, padded to its own ``max_rows``), and the dense
tensors (every floating tensor that is no table) are one more part, aggregated through the same
two-server session as dense SSA: every coordinate, each client's count word its weight. Each
part is its own SSA round on S1 (its own :class:`~flwr_fsl.families.ssa.protocol.SSAParams`
and round id, open at the same time in the run's session), so what each server sees per part
is exactly what it sees in a single-table round of that part's public sizes.

**Dense part as mega-elements.** The dense coordinates (in the model's order,
:class:`~flwr_fsl.submodel.layout.FlatLayout`) are cut into chunks of ``width`` coordinates
(:class:`DenseChunks`); a chunk is one element of the dense part's round, and the client sends
all of them with its weight as every chunk's count word. ``width = 1`` is the coordinate layout
of top-k SSA; a wider chunk only saves count words, which matters under DP (each count word
adds to the sensitivity ``W sqrt(C² + k)``, :mod:`flwr_fsl.families.ssa.dp`).

**Wire fields** (server -> client, in the train and ``query.psr`` messages' ``ConfigRecord``,
beside the first part's ``fsl.ssa.params`` that :func:`~flwr_fsl.families.ssa.records.find_round`
reads): :data:`MIXED_FIELD` (the mixed-round version, 1), :data:`PARTS_FIELD` (the parts'
names: table names, then :data:`DENSE_PART`), :data:`PART_PARAMS_FIELD` (each part's
``SSAParams`` bytes), and in a train message :data:`ANSWERS0_FIELD` / :data:`ANSWERS1_FIELD`
(S0's raw and S1's sealed PSR answer per table). Client -> server: one upload record per part,
under :func:`part_key` of the single-part key (``fsl.psr.query#<i>``, ``fsl.ssa.upload#<i>``).
A client without the mixed mod passes a mixed round through untrained (no upload: S0 drops it).

**U-DPF per table** (optional fields of the same version 1, so a client that does not know them
just sends fresh keys): :data:`UDPF_FIELD` (``True``: the strategy accepts hints) and, in each
client's own train message, :data:`HELD_FIELD` (per table part, the digest of the U-DPF keys S0
holds for that client and table, ``b""``: none; :func:`read_held` decodes it strictly). Each
table part has its own hash key (:func:`part_hash_key`), so its keys are stored under their own
layout on both servers (:func:`~flwr_fsl.families.ssa.protocol.layout_key`); a client whose rows
of a table are the same as in its last accepted round sends that table's hint
(:func:`~flwr_fsl.families.ssa.protocol.encode_round`), its upload record then holds ``hint``
and ``sealed``. The dense part always carries fresh one-shot keys (epoch 0).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.submodel.layout import ElementUpdate, FlatLayout
from flwr_fsl.submodel.update import SubmodelUpdate

__all__ = [
    "ANSWERS0_FIELD",
    "ANSWERS1_FIELD",
    "DENSE_PART",
    "HELD_FIELD",
    "MIXED_FIELD",
    "MIXED_VERSION",
    "PARTS_FIELD",
    "PART_PARAMS_FIELD",
    "UDPF_FIELD",
    "DenseChunks",
    "clamp_rows",
    "part_hash_key",
    "part_key",
    "read_held",
]

MIXED_FIELD = "fsl.mixed.version"
MIXED_VERSION = 1
PARTS_FIELD = "fsl.mixed.parts"
PART_PARAMS_FIELD = "fsl.mixed.params"
ANSWERS0_FIELD = "fsl.mixed.answer0"
ANSWERS1_FIELD = "fsl.mixed.answer1"
UDPF_FIELD = "fsl.mixed.udpf"
HELD_FIELD = "fsl.mixed.held"
HELD_DIGEST_BYTES = 32
DENSE_PART = "*dense*"
"""The dense part's name in :data:`PARTS_FIELD` (no tensor name contains ``*``)."""


def part_hash_key(run_key: bytes, name: str) -> bytes:
    """Return table ``name``'s cuckoo hash key: the run's key, separated per table.

    Distinct per table, so two tables of the same shape never share a U-DPF key store.
    """
    return hashlib.sha256(b"fsl.mixed.hash-key\0" + run_key + name.encode()).digest()[:16]


def read_held(value: object, tables: int) -> list[bytes | None]:
    """Decode :data:`HELD_FIELD`: per table part, S0's held-keys digest (None: none).

    Parameters
    ----------
    value : object
        The field's value (absent: pass None, no table holds keys).
    tables : int
        The round's number of table parts.

    Returns
    -------
    list[bytes or None]
        One digest (32 bytes) or None per table part.

    Raises
    ------
    ClientInputError
        If the field is not a list of ``tables`` byte strings, each empty or 32 bytes.
    """
    if value is None:
        return [None] * tables
    if not (
        isinstance(value, list)
        and len(value) == tables
        and all(isinstance(v, bytes) and len(v) in (0, HELD_DIGEST_BYTES) for v in value)
    ):
        raise ClientInputError(f"{HELD_FIELD!r}: one empty or 32-byte digest per table")
    return [v if v else None for v in value]


def part_key(key: str, index: int) -> str:
    """Return the record key of part ``index`` of a single-part record key."""
    return f"{key}#{index}"


def clamp_rows(
    rows: NDArray[np.int64], counts: NDArray[np.float64] | None, limit: int
) -> tuple[NDArray[np.int64], NDArray[np.float64] | None]:
    """Keep at most ``limit`` of a derived table's rows: the heaviest, ties by lower index.

    A client's derived rows can outnumber the table's public ``max_rows`` (many parents mapping
    to many rows). Its row set size is public, so the client cannot send more; it keeps the
    rows with the largest counts (unit counts: the lowest indices) and neither retrieves nor
    updates the others this round. Nothing about the excess reaches a server.

    Parameters
    ----------
    rows : numpy.ndarray
        Ascending derived rows.
    counts : numpy.ndarray or None
        Their weights (None: unit).
    limit : int
        The table's ``num_items`` this round.

    Returns
    -------
    tuple[numpy.ndarray, numpy.ndarray or None]
        The kept rows (ascending) and their counts.
    """
    if rows.size <= limit:
        return rows, counts
    weight = np.ones(rows.size) if counts is None else counts
    order = np.lexsort((rows, -weight))[:limit]
    keep = np.sort(order)
    return rows[keep], None if counts is None else counts[keep]


@dataclass(frozen=True)
class DenseChunks:
    """The dense tensors of a model as elements of ``width`` consecutive coordinates.

    Element ``j`` holds flat coordinates ``[j w, (j + 1) w)`` of
    :attr:`flat` (the dense tensors in model order); the last one is zero-padded.

    Attributes
    ----------
    flat : FlatLayout
        The dense tensors' flat layout.
    chunk : int
        Coordinates per element (>= 1).
    """

    flat: FlatLayout
    chunk: int

    def __post_init__(self) -> None:
        if self.flat.size < 1:
            raise ConfigurationError("the model has no dense coordinates to federate")
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise ConfigurationError(f"dense_width must be an integer >= 1, got {self.chunk!r}")

    @classmethod
    def of(
        cls, arrays: Mapping[str, NDArray[np.generic]], names: tuple[str, ...], chunk: int
    ) -> DenseChunks:
        """Build the chunks of tensors ``names`` of ``arrays`` (in that order)."""
        return cls(FlatLayout.of({n: arrays[n] for n in names}), min(chunk, _size(arrays, names)))

    @property
    def size(self) -> int:
        """Number of chunks."""
        return math.ceil(self.flat.size / self.chunk)

    @property
    def width(self) -> int:
        """Coordinates per chunk."""
        return self.chunk

    @property
    def names(self) -> tuple[str, ...]:
        """The dense tensors."""
        return self.flat.names

    def vector(self, arrays: Mapping[str, NDArray[np.generic]]) -> NDArray[np.float64]:
        """Return the dense coordinates of ``arrays`` as ``(size, width)`` float64 (padded)."""
        out = np.zeros(self.size * self.chunk, np.float64)
        for name, start, end in zip(
            self.flat.names, self.flat.offsets[:-1], self.flat.offsets[1:], strict=True
        ):
            array = np.asarray(arrays[name])
            if array.size != end - start:
                raise ConfigurationError(
                    f"{name!r} has {array.size} values, the layout {end - start}"
                )
            out[start:end] = array.reshape(-1)
        return out.reshape(self.size, self.chunk)

    def elements(self, update: SubmodelUpdate) -> ElementUpdate:
        """Not used: dense parts are encoded from :meth:`vector` (no sparse update)."""
        raise ConfigurationError("DenseChunks maps model arrays, not submodel updates")

    def gather(
        self, arrays: Mapping[str, NDArray[np.generic]], indices: ArrayLike | None = None
    ) -> NDArray[np.float64]:
        """Return the values of chunks ``indices`` (all: None) as ``(k, width)`` float64."""
        vector = self.vector(arrays)
        return vector if indices is None else vector[np.asarray(indices, np.int64)]

    def write(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: ArrayLike,
        values: ArrayLike,
    ) -> dict[str, NDArray[np.generic]]:
        """Return a copy of ``arrays`` with chunks ``indices`` set to ``values``.

        Raises
        ------
        ClientInputError
            If ``values`` does not have one row of ``width`` per index.
        """
        idx = np.asarray(indices, np.int64)
        vals = np.asarray(values, np.float64)
        if vals.shape != (idx.size, self.chunk):
            raise ClientInputError(
                f"chunk values of shape {vals.shape}, expected {(idx.size, self.chunk)}"
            )
        flat = self.vector(arrays).copy()
        flat[idx] = vals
        coords = flat.reshape(-1)
        out = {k: np.array(v, copy=True) for k, v in arrays.items()}
        for name, start, end in zip(
            self.flat.names, self.flat.offsets[:-1], self.flat.offsets[1:], strict=True
        ):
            old = np.asarray(arrays[name])
            out[name] = coords[start:end].reshape(old.shape).astype(old.dtype)
        return out


def _size(arrays: Mapping[str, NDArray[np.generic]], names: tuple[str, ...]) -> int:
    return max(1, sum(int(np.asarray(arrays[n]).size) for n in names))
