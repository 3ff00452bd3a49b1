"""Cui's basic protocol in mixed rounds: one PSU per primary table, derived unions by the map.

``SecureRowFedSubAvg(ModelTables(...), union="psu")`` runs a mixed round
(:mod:`flwr_fsl.families.ssa.mixed`) over the union of the clients' rows of each table instead
of each table's full row space. The dense part is unchanged (every coordinate, no union).

**Which unions are opened.** One private set union per *primary* table (the tables whose rows
the client's data chooses), each exactly as in the one-table round
(:mod:`flwr_fsl.families.ssa.union`): its own PSU parameters over that table's ``m`` rows, its
own seeds sealed to S1 under S1 round id of that table's part (distinct per table and round, so
``PsuSum``'s replay check holds). A *derived* table's union is **not** computed by a PSU: it is
``row_map.derive(U_parent)``, a public function of the parent's union that both servers and
every client compute alike. That opens nothing beyond the primary unions (a PSU of the derived
rows would open a set that is itself a function of the clients' primary rows — after each
client's clamp to ``max_rows``, which a separate union would expose — and would cost one more
PSU per derived table). It may hold rows nobody updates this round (children of a parent that
only clients whose clamp dropped them hold); those rows get count 0 and keep their value, as
rows of the union a client claimed but did not send.

**Wire fields** (config of the mixed ``query.psu`` message): :data:`PSU_TABLES_FIELD` (the
primary tables' names), :data:`PSU_PARAMS_LIST_FIELD` (each one's PSU parameters,
:func:`~flwr_fsl.families.ssa.union.psu_params_to_bytes`), :data:`PSU_ROUNDS_FIELD` (each one's
PSU round id, what its sealed seeds are bound to), with S1's key and the session as in the
one-table round. The reply holds one record per primary table under
``part_key(PSU_UPLOAD_KEY, j)`` (``lead``, ``sealed``). The ``query.psr`` and train messages
then carry :data:`UNION_DOMAINS_FIELD` (each table's ``m``) and :data:`UNIONS_FIELD` (each
table's union, sorted int64 LE), and each table part's ``SSAParams`` run over ``[0, |U|)``.

**Empty unions.** A table whose union is empty (no client has a row of it, or a derived map
gives no row) runs over its full row space, as in the default round: an SSA part needs at
least one element.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.ssa.union import UnionInputError, UnionRound
from flwr_fsl.submodel.tables import ModelTables

__all__ = [
    "PSU_PARAMS_LIST_FIELD",
    "PSU_ROUNDS_FIELD",
    "PSU_TABLES_FIELD",
    "UNIONS_FIELD",
    "UNION_DOMAINS_FIELD",
    "derive_unions",
    "local_rows",
    "read_psu_query",
    "read_unions",
    "union_fields",
]

PSU_TABLES_FIELD = "fsl.mixed.psu-tables"
"""Config field of a mixed ``query.psu``: the primary tables with a PSU, in table order."""
PSU_PARAMS_LIST_FIELD = "fsl.mixed.psu-params"
"""Config field of a mixed ``query.psu``: each primary table's PSU parameters (bytes)."""
PSU_ROUNDS_FIELD = "fsl.mixed.psu-rounds"
"""Config field of a mixed ``query.psu``: each primary table's PSU round id (seed binding)."""
UNION_DOMAINS_FIELD = "fsl.mixed.union-domains"
"""Config field of the PSR and train messages: each table's row count ``m`` (table order)."""
UNIONS_FIELD = "fsl.mixed.unions"
"""Config field of the PSR and train messages: each table's union (sorted int64 LE bytes)."""


def derive_unions(
    tables: ModelTables, primary: Mapping[str, UnionRound], rows: Mapping[str, int]
) -> dict[str, UnionRound]:
    """Return every table's union: the primary ones as opened, derived ones by their row maps.

    Parameters
    ----------
    tables : ModelTables
        The model's tables (derivation order: a parent before its children).
    primary : Mapping[str, UnionRound]
        The opened union of each primary table.
    rows : Mapping[str, int]
        Each table's row count ``m``.

    Returns
    -------
    dict[str, UnionRound]
        Each table's union, in table order; an empty union is replaced by the full row space
        (``fallback``).

    Raises
    ------
    ConfigurationError
        If a primary table has no union.
    """
    out: dict[str, UnionRound] = {}
    for spec in tables.tables:
        m = int(rows[spec.name])
        if spec.row_map is None:
            if spec.name not in primary:
                raise ConfigurationError(f"no union of primary table {spec.name!r}")
            union = primary[spec.name]
        else:
            parent = out[str(spec.derived_from)].union
            union = UnionRound.of(m, spec.row_map.derive(parent), m)
        if union.size == 0:
            union = UnionRound(m, np.arange(m, dtype=np.int64), True)
        out[spec.name] = union
    return out


def union_fields(unions: Mapping[str, UnionRound]) -> dict[str, Any]:
    """Config fields of the PSR and train messages: each table's ``m`` and union."""
    return {
        UNION_DOMAINS_FIELD: [int(u.domain_size) for u in unions.values()],
        UNIONS_FIELD: [u.union.astype("<i8").tobytes() for u in unions.values()],
    }


def _union_from_bytes(name: str, m: int, data: object) -> UnionRound:
    if not isinstance(data, bytes) or not data or len(data) % 8 or len(data) // 8 > m:
        raise UnionInputError(f"the union of {name!r} must hold 1 to {m} int64 words")
    u = np.frombuffer(data, "<i8").astype(np.int64)
    if u[0] < 0 or u[-1] >= m or np.any(np.diff(u) <= 0):
        raise UnionInputError(f"the union of {name!r} must be strictly ascending in [0, {m})")
    return UnionRound(m, u)


def read_unions(config: Mapping[str, Any], names: Sequence[str]) -> dict[str, UnionRound] | None:
    """Client side: each table's union from a mixed round's config (None: no union round).

    Raises
    ------
    UnionInputError
        If the fields are malformed: not one ``m`` >= 1 and one strictly ascending union in
        ``[0, m)`` per table.
    """
    if UNIONS_FIELD not in config and UNION_DOMAINS_FIELD not in config:
        return None
    domains, blobs = config.get(UNION_DOMAINS_FIELD), config.get(UNIONS_FIELD)
    if not (
        isinstance(domains, list)
        and isinstance(blobs, list)
        and len(domains) == len(blobs) == len(names)
        and all(isinstance(m, int) and not isinstance(m, bool) and m >= 1 for m in domains)
    ):
        raise UnionInputError("malformed mixed-round union fields (one m and union per table)")
    return {
        name: _union_from_bytes(name, int(m), blob)
        for name, m, blob in zip(names, domains, blobs, strict=True)
    }


def read_psu_query(config: Mapping[str, Any]) -> list[tuple[str, bytes, int]]:
    """Client side: ``(table, PSU parameter bytes, PSU round id)`` per primary table.

    Raises
    ------
    UnionInputError
        If the three list fields are missing, of different lengths or of the wrong types.
    """
    names = config.get(PSU_TABLES_FIELD)
    blobs = config.get(PSU_PARAMS_LIST_FIELD)
    rounds = config.get(PSU_ROUNDS_FIELD)
    if not (
        isinstance(names, list)
        and isinstance(blobs, list)
        and isinstance(rounds, list)
        and len(names) == len(blobs) == len(rounds) >= 1
        and all(isinstance(n, str) for n in names)
        and all(isinstance(b, bytes) for b in blobs)
        and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in rounds)
    ):
        raise UnionInputError("the mixed query.psu message carries no PSU per primary table")
    return [(str(n), bytes(b), int(r)) for n, b, r in zip(names, blobs, rounds, strict=True)]


def local_rows(
    union: UnionRound, rows: NDArray[np.int64], counts: NDArray[np.float64] | None
) -> tuple[NDArray[np.int64], NDArray[np.float64] | None]:
    """Client side: positions in ``union`` of the rows it holds (their counts kept alike)."""
    local, kept = union.local(rows)
    return local, None if counts is None else counts[kept]
