"""S0's PSU phase of ``SecureRowFedSubAvg(union="psu")`` (Cui's basic protocol, index mode).

Before ``query.psr``, S0 sends every sampled client a ``query.psu`` message carrying the round's
PSU parameters (exact mode over the table's ``m`` rows), S1's key and the session. Each client
answers with its PSU share for S0 (``8 (m + 1)`` bytes) and its 16-byte seed sealed to S1
(:func:`~flwr_fsl.families.ssa.union.seal_psu_seed`). S0 checks each share's length, relays
the sealed seeds to S1 (``PsuSum``, :mod:`flwr_fsl.helper.services.psu`), adds S1's total to the
sum of the shares of the clients S1 accepted and reads the union. PSR and SSA then run over
``[0, |U|)``: the strategy sends the union with the round, S1 gets the table's rows ``U``
only, and the one count-weighted apply writes the union's rows back into the table
(:func:`apply_over_union`).

A client whose share is malformed, or whose sealed seed S1 refuses, is dropped with a reason
before the PSR phase; the others stay exact. A union larger than the accepted clients can make
(``clients · max_rows``) falls back to the full domain (:attr:`UnionRound.fallback`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp import Grid
from numpy.typing import NDArray

from flwr_fsl.core.engine import RoundState
from flwr_fsl.crypto.psu import PSUParams
from flwr_fsl.families.ssa.records import HELPER_KEY_FIELD, SESSION_FIELD, TABLE_FIELD
from flwr_fsl.families.ssa.union import (
    PSU_PARAMS_FIELD,
    PSU_QUERY_TYPE,
    PSU_UPLOAD_KEY,
    SEALED_SEED_BYTES,
    UNION_FIELD,
    UnionInputError,
    UnionRound,
    lead_share_from_bytes,
    open_union,
    psu_params_to_bytes,
)
from flwr_fsl.helper.services.psu import request_psu_total

if TYPE_CHECKING:
    from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg

__all__ = ["apply_over_union", "psu_phase", "union_fields"]


def _parser(psu: PSUParams) -> Callable[[int, RecordDict], tuple[NDArray[np.uint64], bytes]]:
    def parse(_node: int, content: RecordDict) -> tuple[NDArray[np.uint64], bytes]:
        record = content.config_records.get(PSU_UPLOAD_KEY)
        if record is None:
            raise UnionInputError(f"the reply has no {PSU_UPLOAD_KEY!r} record")
        sealed = record.get("sealed")
        if not isinstance(sealed, bytes) or len(sealed) != SEALED_SEED_BYTES:
            raise UnionInputError(f"the sealed PSU seed must be {SEALED_SEED_BYTES} bytes")
        return lead_share_from_bytes(psu, record.get("lead")), sealed

    return parse


def psu_phase(
    strategy: SecureRowFedSubAvg,
    grid: Grid,
    state: RoundState,
    nodes: list[int],
    base: ConfigRecord,
) -> tuple[UnionRound, list[int]]:
    """Run the round's PSU: return the opened union and the clients still in the round.

    Parameters
    ----------
    strategy : SecureRowFedSubAvg
        The strategy (its table, ``max_rows``, connection to S1).
    grid : Grid
        The Flower grid.
    state : RoundState
        The round (dropped clients are recorded on it).
    nodes : list[int]
        The sampled clients.
    base : ConfigRecord
        The round's base config (server round and the like).

    Returns
    -------
    tuple[UnionRound, list[int]]
        The union (possibly empty) and the clients whose PSU share both servers accepted.

    Raises
    ------
    HelperError
        If S1 cannot be reached or refuses the call (the round fails).
    """
    m = int(state.model[strategy.table].shape[0])
    psu = PSUParams.exact(m)
    psu_bytes = psu_params_to_bytes(psu)
    lead = strategy.aggregation.lead
    config = ConfigRecord(dict(base))
    config[PSU_PARAMS_FIELD] = psu_bytes
    config[HELPER_KEY_FIELD] = lead.helper_key()
    config[SESSION_FIELD] = lead.session_id
    config[TABLE_FIELD] = strategy.table
    query = RecordDict({strategy.configrecord_key: config})
    replies = strategy.send(
        grid,
        state,
        "psu",
        dict.fromkeys(nodes, query),
        PSU_QUERY_TYPE,
        parse=_parser(psu),
        timeout=strategy.psr_timeout,
    )
    total1, refused = request_psu_total(
        lead.helper, state.server_round, psu_bytes, ((n, s) for n, (_, s) in replies.items())
    )
    total0 = np.zeros(psu.vector_length, np.uint64)
    kept = []
    for node, (share, _) in replies.items():
        if node in refused:
            state.drop(node, f"PSU: S1 refused the seed: {refused[node]}")
            continue
        total0 += share
        kept.append(node)
    union = UnionRound.of(m, open_union(psu, total0, total1), len(kept) * strategy.max_rows)
    return union, kept


def union_fields(union: UnionRound) -> dict[str, bytes]:
    """Config fields of the PSR and train messages: the PSU parameters and the opened union."""
    return {
        PSU_PARAMS_FIELD: psu_params_to_bytes(PSUParams.exact(union.domain_size)),
        UNION_FIELD: union.union.astype("<i8").tobytes(),
    }


def apply_over_union(
    table: str,
    full: NDArray[np.generic],
    union: UnionRound,
    result: tuple[ArrayRecord | None, MetricRecord | None],
) -> tuple[ArrayRecord | None, MetricRecord | None]:
    """Write the aggregate over the union's rows (``(|U|, width)``) back into the full table."""
    arrays, metrics = result
    if arrays is None:
        return arrays, metrics
    rows = arrays[table].numpy()
    out = np.array(full, copy=True)
    out[union.union] = rows
    arrays[table] = Array(out)
    return arrays, metrics
