"""S0's PSU phase of a mixed round with ``union="psu"`` (one PSU per primary table).

:mod:`flwr_fsl.families.ssa.mixed_union` says what is opened and why derived tables get no PSU
of their own. Here S0 sends one ``query.psu`` message per sampled client carrying every primary
table's PSU parameters and round id; each client answers one share record per primary table.
S0 checks every share's length (a malformed one drops that client only, with a reason), then
for each primary table relays the still-accepted clients' sealed seeds to S1 (``PsuSum`` under
that table's part round id), drops the clients S1 refuses, adds S1's total to its own over the
clients S1 accepted and reads the table's union. A client S1 refuses at a later table may have
claimed rows in an earlier table's union: they are then rows nobody updates (count 0, kept).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.serverapp import Grid
from numpy.typing import NDArray

from flwr_fsl.core.engine import RoundState
from flwr_fsl.crypto.psu import PSUParams
from flwr_fsl.families.ssa.mixed import part_key
from flwr_fsl.families.ssa.mixed_union import (
    PSU_PARAMS_LIST_FIELD,
    PSU_ROUNDS_FIELD,
    PSU_TABLES_FIELD,
    derive_unions,
)
from flwr_fsl.families.ssa.records import HELPER_KEY_FIELD, SESSION_FIELD
from flwr_fsl.families.ssa.union import (
    PSU_QUERY_TYPE,
    PSU_UPLOAD_KEY,
    SEALED_SEED_BYTES,
    UnionInputError,
    UnionRound,
    lead_share_from_bytes,
    open_union,
    psu_params_to_bytes,
)
from flwr_fsl.helper.services.psu import request_psu_total
from flwr_fsl.submodel.tables import ModelTables

if TYPE_CHECKING:
    from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg

__all__ = ["expand_tables", "mixed_psu_phase", "restrict_tables"]

Shares = list[tuple[NDArray[np.uint64], bytes]]


def _parser(psus: list[PSUParams]) -> Callable[[int, RecordDict], Shares]:
    def parse(_node: int, content: RecordDict) -> Shares:
        out = []
        for j, psu in enumerate(psus):
            record = content.config_records.get(part_key(PSU_UPLOAD_KEY, j))
            if record is None:
                raise UnionInputError(f"the reply has no PSU share of primary table {j}")
            sealed = record.get("sealed")
            if not isinstance(sealed, bytes) or len(sealed) != SEALED_SEED_BYTES:
                raise UnionInputError(f"the sealed PSU seed must be {SEALED_SEED_BYTES} bytes")
            out.append((lead_share_from_bytes(psu, record.get("lead")), sealed))
        return out

    return parse


def mixed_psu_phase(
    strategy: SecureRowFedSubAvg,
    tables: ModelTables,
    grid: Grid,
    state: RoundState,
    nodes: list[int],
    base: ConfigRecord,
    round_ids: list[int],
) -> tuple[dict[str, UnionRound], list[int]]:
    """Run one PSU per primary table; return every table's union and the clients kept.

    Parameters
    ----------
    strategy : SecureRowFedSubAvg
        The strategy (its connection to S1, its timeouts).
    tables : ModelTables
        The model's tables.
    grid : Grid
        The Flower grid.
    state : RoundState
        The round; its ``model`` holds the full tables.
    nodes : list[int]
        The sampled clients.
    base : ConfigRecord
        The round's base config.
    round_ids : list[int]
        S1's round ids of the round's parts (table ``i`` is part ``i``).

    Returns
    -------
    tuple[dict[str, UnionRound], list[int]]
        Every table's union (table order; derived ones by :func:`derive_unions`) and the
        clients whose every PSU share both servers accepted (none: no union, no S1 call).

    Raises
    ------
    HelperError
        If S1 cannot be reached or refuses a call (the round fails).
    """
    primary = [
        (i, spec) for i, spec in enumerate(tables.tables) if spec.row_map is None
    ]  # table i is part i
    psus = [PSUParams.exact(int(state.model[spec.name].shape[0])) for _, spec in primary]
    blobs = [psu_params_to_bytes(psu) for psu in psus]
    rids = [round_ids[i] for i, _ in primary]
    lead = strategy.aggregation.lead
    config = ConfigRecord(dict(base))
    config[PSU_TABLES_FIELD] = [spec.name for _, spec in primary]
    config[PSU_PARAMS_LIST_FIELD] = blobs
    config[PSU_ROUNDS_FIELD] = rids
    config[HELPER_KEY_FIELD] = lead.helper_key()
    config[SESSION_FIELD] = lead.session_id
    replies = strategy.send(
        grid,
        state,
        "psu",
        dict.fromkeys(nodes, RecordDict({strategy.configrecord_key: config})),
        PSU_QUERY_TYPE,
        parse=_parser(psus),
        timeout=strategy.psr_timeout,
    )
    kept = list(replies)
    if not kept:
        return {}, []
    opened: dict[str, UnionRound] = {}
    for j, (_, spec) in enumerate(primary):
        seeds = ((n, replies[n][j][1]) for n in kept)
        total1, refused = request_psu_total(lead.helper, rids[j], blobs[j], seeds)
        total0 = np.zeros(psus[j].vector_length, np.uint64)
        for node in list(kept):
            if node in refused:
                state.drop(node, f"PSU of {spec.name!r}: S1 refused the seed: {refused[node]}")
                kept.remove(node)
            else:
                total0 += replies[node][j][0]
        union = open_union(psus[j], total0, total1)
        opened[spec.name] = UnionRound.of(psus[j].domain_size, union, len(kept) * spec.max_rows)
    sizes = {spec.name: int(state.model[spec.name].shape[0]) for spec in tables.tables}
    return derive_unions(tables, opened, sizes), kept


def restrict_tables(
    model: Mapping[str, Any], unions: Mapping[str, UnionRound] | None
) -> dict[str, Any]:
    """Return ``model`` with each table cut to its union's rows (None: ``model`` as it is)."""
    if unions is None:
        return dict(model)
    return {k: (v[unions[k].union] if k in unions else v) for k, v in model.items()}


def expand_tables(
    full: Mapping[str, Any], unions: Mapping[str, UnionRound] | None, arrays: ArrayRecord | None
) -> None:
    """Write each table's aggregate over its union back into the full table, in ``arrays``.

    Does nothing without unions (a default round) or without a new model.
    """
    if unions is None or arrays is None:
        return
    for name, union in unions.items():
        rows = arrays[name].numpy()
        out = np.array(full[name], copy=True)
        out[union.union] = rows
        arrays[name] = Array(out)
