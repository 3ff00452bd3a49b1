"""Client side of a mixed round's PSU (``union="psu"``): one share per primary table.

:meth:`~flwr_fsl.families.ssa.mixed_mod.PrivateTables.query_psu` answers the mixed
``query.psu`` message (:mod:`flwr_fsl.families.ssa.mixed_union` gives its fields) through
:func:`psu_reply`: for each primary table the client splits its rows' PSU vector into S0's
share and a seed sealed to S1, bound to the session, that table's PSU round id and its PSU
parameters, exactly as a one-table client does. Like the one-table handler it answers only with
node config ``fsl-allow-union = true`` (the round opens every primary table's union).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import verify_fingerprint
from flwr_fsl.families.ssa.mixed import part_key
from flwr_fsl.families.ssa.mixed_union import read_psu_query
from flwr_fsl.families.ssa.records import HELPER_KEY_FIELD, SESSION_FIELD
from flwr_fsl.families.ssa.union import (
    NODE_ALLOW_UNION_KEY,
    PSU_UPLOAD_KEY,
    UnionInputError,
    psu_binding,
    psu_params_from_bytes,
    seal_psu_seed,
    share_set,
)
from flwr_fsl.pinning import pinned_fingerprint

__all__ = ["psu_reply"]


def psu_reply(msg: Message, context: Context, primary: Mapping[str, NDArray[np.int64]]) -> Message:
    """Return the reply to a mixed ``query.psu``: one share record per primary table.

    Parameters
    ----------
    msg : Message
        The ``query.psu`` message.
    context : Context
        The client's context (node config, run config with S1's pinned fingerprint).
    primary : Mapping[str, numpy.ndarray]
        This round's rows of each primary table.

    Returns
    -------
    Message
        The reply: ``part_key(PSU_UPLOAD_KEY, j)`` -> ``{lead, sealed}`` per primary table ``j``.

    Raises
    ------
    ConfigurationError
        If the node config does not set ``fsl-allow-union = true``.
    SealedBoxError
        If S1's key does not match the pinned fingerprint.
    UnionInputError
        If the message's PSU fields are malformed, name other tables than this client's
        primary tables, or a row is out of range.
    """
    if context.node_config.get(NODE_ALLOW_UNION_KEY) is not True:
        raise ConfigurationError(
            f"a union='psu' round opens the union of the clients' rows; this client "
            f"answers it only with node config {NODE_ALLOW_UNION_KEY} = true"
        )
    config = next(iter(msg.content.config_records.values()), ConfigRecord())
    helper_key, session = config.get(HELPER_KEY_FIELD), config.get(SESSION_FIELD)
    if not isinstance(helper_key, bytes) or not isinstance(session, bytes):
        raise UnionInputError("the query.psu message carries no S1 key or session")
    query = read_psu_query(config)
    if [name for name, _, _ in query] != list(primary):
        raise UnionInputError(
            f"the PSU's tables {[n for n, _, _ in query]} are not this client's {list(primary)}"
        )
    verify_fingerprint(helper_key, pinned_fingerprint(context.run_config))
    records: dict[str, ConfigRecord] = {}
    for j, (name, blob, round_id) in enumerate(query):
        psu = psu_params_from_bytes(blob)
        try:
            share = share_set(psu, primary[name])
        except ConfigurationError as err:
            raise UnionInputError(f"table {name!r}: {err}") from None
        sealed = seal_psu_seed(
            helper_key,
            binding=psu_binding(session, round_id, psu),
            client_id=int(context.node_id),
            seed=share.helper_seed,
        )
        lead = share.lead_vector.astype("<u8").tobytes()
        records[part_key(PSU_UPLOAD_KEY, j)] = ConfigRecord({"lead": lead, "sealed": sealed})
    return Message(RecordDict(dict(records)), reply_to=msg)
