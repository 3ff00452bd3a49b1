"""Index-mode submodels on the client: private retrieval and secure upload of table rows.

A client's submodel is the set of rows of one table (e.g. item embeddings) its own data
touches — a private set. :class:`PrivateRows` keeps it private from both servers:

1. **Retrieval** (``query.psr`` message): the client cuckoo-hashes its row indices and sends
   PSR keys (:mod:`flwr_fsl.families.ssa.psr`); S0 answers in the clear, S1's answer comes
   sealed to a per-query key of the client.
2. **Training** (``train`` message): the mod adds the two answers to get its rows exactly,
   places them in a full-shape table (other rows zero: the client never sees them), calls the
   user's unchanged ``@app.train`` function, and uploads the changed rows with two-server SSA
   as mega-elements (row width + a count word): the count word is 1 per row by default (unit
   weights), the per-row count in a weighted round.
3. **U-DPF** (Cui §5): when the row set is the same as in the client's previous round, it sends
   only a hint that moves both servers' stored keys to the new values
   (:func:`flwr_fsl.families.ssa.protocol.encode_round` decides). In a round with distributed DP the
   row deltas are clipped to the round's ``clip_norm`` (L2 over all the client's rows) and the
   per-row counts to ``max_weight`` before encoding, for fresh keys and hints alike
   (:func:`~flwr_fsl.families.ssa.protocol.payload_words`).

Usage (the one line beside the mod registers the retrieval phase)::

    rows = PrivateRows("item_emb.weight", rows=lambda context: my_item_ids(context))
    app = ClientApp(mods=[rows.mod])
    app.query("psr")(rows.query)
    app.query("psu")(rows.query_psu)  # only for a strategy with union="psu"

**Union first** (``SecureRowFedSubAvg(union="psu")``, Cui's basic protocol): a ``query.psu``
message before ``query.psr`` asks for the client's PSU share (:meth:`query_psu`): S0's part in
full, S1's as a seed sealed to S1. The client answers only if its node config sets
``fsl-allow-union = true`` (the union is opened exactly, even with DP on). The PSR and train
messages then carry the union: the client queries and uploads its rows' positions in it.

**Promised noise.** The client refuses a round (retrieval and training alike) whose DP noise
multiplier is below its floor: node config ``fsl-min-noise-multiplier``, default
:data:`~flwr_fsl.families.ssa.dp.INDEX_MODE_NOISE_FLOOR` (1.0, the index-mode strategy's
default), so a server that turns DP off or lowers it gets no answer unless the client's
operator lowers the floor too (:meth:`~flwr_fsl.families.ssa.mod_base.ProtocolMod.check_privacy`).

``rows(context)`` returns the row indices, or ``(indices, counts)`` with a positive weight per
row (e.g. how many local samples touch it; default: the reply's weight metric), used only in
rounds of a ``weighted=True`` strategy (unit weights otherwise: every row's count word is 1).
At most the server's ``max_rows`` indices; the set size is public, the indices are not.
Between the phases the client keeps its query
(:class:`~flwr_fsl.families.ssa.psr.PSRClientState`) and its keys
(:class:`~flwr_fsl.families.ssa.protocol.SSAClientState`) in ``Context.state``; the Flower
plumbing is :class:`~flwr_fsl.families.ssa.mod_base.ProtocolMod`'s (a
:class:`~flwr_fsl.core.phases.PhaseMod` over :data:`~flwr_fsl.families.ssa.records.PSR_QUERY`
and :data:`~flwr_fsl.families.ssa.records.SSA_TRAIN`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.phases import Phase
from flwr_fsl.core.state import StateSlot
from flwr_fsl.crypto.channel import verify_fingerprint
from flwr_fsl.crypto.psu import PSUParams
from flwr_fsl.families.ssa.dp import INDEX_MODE_NOISE_FLOOR
from flwr_fsl.families.ssa.mod_base import ProtocolMod, SSARound
from flwr_fsl.families.ssa.protocol import SSAClientState, encode_round
from flwr_fsl.families.ssa.psr import PSRClientState, decode_table, make_query
from flwr_fsl.families.ssa.records import (
    ANSWER0_FIELD,
    ANSWER1_FIELD,
    HELPER_KEY_FIELD,
    PSR_QUERY,
    SESSION_FIELD,
    SSA_TRAIN,
    TABLE_FIELD,
    UDPF_FIELD,
    UDPF_HELD_FIELD,
    PSRQueryReply,
    RoundRequest,
    UploadReply,
    hint_upload_record,
    ssa_upload_record,
)
from flwr_fsl.families.ssa.sealing import open_psr_answer, seal_psr_query, seal_udpf_hint
from flwr_fsl.families.ssa.union import (
    NODE_ALLOW_UNION_KEY,
    PSU_PARAMS_FIELD,
    PSU_UPLOAD_KEY,
    UNION_FIELD,
    UnionInputError,
    UnionRound,
    psu_binding,
    psu_params_from_bytes,
    read_union,
    seal_psu_seed,
    share_set,
)
from flwr_fsl.pinning import pinned_fingerprint
from flwr_fsl.submodel.tables import row_counts

RowsFn = Callable[[Context], "NDArray[np.int64] | tuple[NDArray[np.int64], NDArray[np.float64]]"]
_QUERY = StateSlot("fsl.psr.client-state", PSRClientState.to_bytes, PSRClientState.from_bytes)
_KEYS = StateSlot("fsl.ssa.client-state", SSAClientState.to_bytes, SSAClientState.from_bytes)


@dataclass
class PrivateRows(ProtocolMod):
    """Client side of index mode for one row table.

    Parameters
    ----------
    table : str
        Name of the row table in the model's ``ArrayRecord`` (e.g. an embedding weight).
    rows : Callable[[Context], ...]
        The client's row indices (or ``(indices, counts)``) for this round.
    """

    table: str
    rows: RowsFn
    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = {
        SSA_TRAIN.name: SSA_TRAIN,
        PSR_QUERY.name: PSR_QUERY,
    }
    noise_floor: ClassVar[float] = INDEX_MODE_NOISE_FLOOR

    def handles(self, found: SSARound) -> bool:
        """Index-mode rounds only (they name the row table)."""
        return TABLE_FIELD in found.config

    def query(self, msg: Message, context: Context) -> Message:
        """Flower handler of ``query.psr``: PSR keys for this client's rows.

        Raises
        ------
        ValueError
            If the message carries no round, S1's key does not match the pinned fingerprint
            or the row set does not fit the round.
        """
        return self.answer_query(msg, context)

    def query_psu(self, msg: Message, context: Context) -> Message:
        """Flower handler of ``query.psu``: this client's PSU share (``union="psu"`` rounds).

        Raises
        ------
        ConfigurationError
            If the node config does not set ``fsl-allow-union = true``.
        SealedBoxError
            If S1's key does not match the pinned fingerprint.
        UnionInputError
            If the message's PSU fields are malformed or the rows are out of range.
        """
        if context.node_config.get(NODE_ALLOW_UNION_KEY) is not True:
            raise ConfigurationError(
                f"a union='psu' round opens the union of the clients' rows; this client "
                f"answers it only with node config {NODE_ALLOW_UNION_KEY} = true"
            )
        config = next(iter(msg.content.config_records.values()), ConfigRecord())
        helper_key, session = config.get(HELPER_KEY_FIELD), config.get(SESSION_FIELD)
        psu_bytes, rnd = config.get(PSU_PARAMS_FIELD), config.get("server-round")
        if not isinstance(psu_bytes, bytes) or not isinstance(helper_key, bytes):
            raise UnionInputError("the query.psu message carries no PSU round")
        if not isinstance(session, bytes) or not isinstance(rnd, int) or isinstance(rnd, bool):
            raise UnionInputError("the query.psu message carries no session or round")
        verify_fingerprint(helper_key, pinned_fingerprint(context.run_config))
        psu: PSUParams = psu_params_from_bytes(psu_bytes)
        share = share_set(psu, self._rows(context)[0])
        binding = psu_binding(session, rnd, psu)
        sealed = seal_psu_seed(
            helper_key, binding=binding, client_id=int(context.node_id), seed=share.helper_seed
        )
        lead = share.lead_vector.astype("<u8").tobytes()
        reply = ConfigRecord({"lead": lead, "sealed": sealed})
        return Message(RecordDict({PSU_UPLOAD_KEY: reply}), reply_to=msg)

    def on_psr(self, request: RoundRequest, context: Context) -> PSRQueryReply:
        """Make the PSR query, keep what reading the answers needs, reply with the keys."""
        found = request.round
        indices, counts = self._rows(context)
        union = _union(found.config)
        if union is not None:  # query the rows' positions in the union (those it holds)
            indices, kept = union.local(indices)
            counts = None if counts is None else counts[kept]
        psr = make_query(found.params, indices)
        sealed, answer_key = seal_psr_query(
            found.helper_key,
            binding=found.binding,
            client_id=int(context.node_id),
            public_part=psr.upload.public_part,
            master_seed=psr.upload.master_seeds[1],
        )
        _QUERY.store(
            context,
            PSRClientState(
                found.params.round_id, psr.indices, psr.placement.slots, answer_key, counts
            ),
        )
        upload = ssa_upload_record(psr.upload.public_part, psr.upload.master_seeds[0], sealed)
        return PSRQueryReply(upload)

    def on_train(
        self, request: RoundRequest, context: Context, train: Callable[[], Message]
    ) -> UploadReply | Message:
        """Fill the retrieved rows in, train, upload the row updates (fresh keys or a hint).

        Raises
        ------
        ValueError
            If the round's table is another, the retrieval state is missing or stale, the
            answers are malformed, or the train reply changes the table's shape.
        """
        found = request.round
        params = found.params
        if found.config.get(TABLE_FIELD) != self.table:
            raise ClientInputError(f"the server's row table is {found.config.get(TABLE_FIELD)!r}")
        query = _QUERY.load(context)
        if query is None or query.round_id != params.round_id:
            raise ClientInputError("no retrieval state for this round (query.psr must come first)")
        answer1 = open_psr_answer(
            query.answer_key,
            found.bytes_field(ANSWER1_FIELD),
            binding=found.binding,
            client_id=int(context.node_id),
        )
        rows = decode_table(query.rows(params, found.bytes_field(ANSWER0_FIELD), answer1))
        ((record_key, record),) = request.content.array_records.items()
        union = _union(found.config)
        full = query.indices if union is None else union.union[query.indices]
        m = params.domain_size if union is None else union.domain_size
        table = np.zeros((m, params.value_width), np.float32)
        table[full] = rows
        submodel = ArrayRecord(dict(record.items()))
        submodel[self.table] = Array(table)
        request.content[record_key] = submodel  # the user's train sees its rows in a full table
        self.check_weight_key(request, context)  # refuse before training
        reply = train()
        if reply.has_error():
            return reply
        weight = self.round_weight(request, reply, context)
        ((_, trained_record),) = reply.content.array_records.items()
        trained = trained_record[self.table].numpy()
        if trained.shape != table.shape:
            raise ConfigurationError(f"the train reply changed the shape of {self.table!r}")
        delta = trained[full].astype(np.float64) - rows.astype(np.float64)
        udpf = found.config.get(UDPF_FIELD) is True
        held = _held(found.config.get(UDPF_HELD_FIELD))
        out, keys = encode_round(
            params,
            query.indices,
            delta,
            weight if query.counts is None else query.counts,
            _KEYS.load(context) if udpf else None,
            udpf=udpf,
            held=held,
        )
        _KEYS.store(context, keys)
        if isinstance(out, bytes):
            assert held is not None  # a hint is only made against announced keys
            sealed = seal_udpf_hint(
                found.helper_key,
                binding=found.binding,
                client_id=int(context.node_id),
                hint=out,
                held=held,
                signer=self.signer(context),
            )
            upload = hint_upload_record(out, sealed)
        else:
            upload = self.sealed_upload(out, found, context)
        # No metrics in the clear: the weight rides in the payload's count word only.
        return UploadReply(upload)

    def _rows(self, context: Context) -> tuple[NDArray[np.int64], NDArray[np.float64] | None]:
        out = self.rows(context)
        if not isinstance(out, tuple):
            return np.asarray(out, np.int64).reshape(-1), None
        indices = np.asarray(out[0], np.int64).reshape(-1)
        return indices, row_counts(self.table, indices, out[1])  # as PrivateTables checks them


def _union(config: Any) -> UnionRound | None:
    # The union of a union="psu" round (None in a default round), checked strictly.
    if UNION_FIELD not in config:
        return None
    return read_union(config.get(PSU_PARAMS_FIELD), config.get(UNION_FIELD))


def _held(value: object) -> bytes | None:
    # What S0 says it holds; anything but a 32-byte digest means "nothing": send fresh keys.
    return value if isinstance(value, bytes) and len(value) == 32 else None


__all__ = ["PrivateRows"]
