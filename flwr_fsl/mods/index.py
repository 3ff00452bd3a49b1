"""Index-mode submodels on the client: private retrieval and secure upload of table rows.

A client's submodel is the set of rows of one table (e.g. item embeddings) its own data
touches — a private set. :class:`PrivateRows` keeps it private from both servers:

1. **Retrieval** (``query.psr`` message): the client cuckoo-hashes its row indices and sends
   PSR keys (:mod:`flwr_fsl.protocols.psr`); S0 answers in the clear, S1's answer comes
   sealed to a per-query key of the client.
2. **Training** (``train`` message): the mod adds the two answers to get its rows exactly,
   places them in a full-shape table (other rows zero: the client never sees them), calls the
   user's unchanged ``@app.train`` function, and uploads the changed rows with two-server SSA
   as mega-elements (row width + a count word), weighted by per-row counts.
3. **U-DPF** (Cui §5): when the row set is the same as in the client's previous round, it sends
   only a hint that moves both servers' stored keys to the new values.

Usage (the one line beside the mod registers the retrieval phase)::

    rows = PrivateRows("item_emb.weight", rows=lambda context: my_item_ids(context))
    app = ClientApp(mods=[rows.mod])
    app.query("psr")(rows.query)

``rows(context)`` returns the row indices, or ``(indices, counts)`` with a positive weight per
row (e.g. how many local samples touch it; default: the reply's ``num-examples``). At most the
server's ``max_rows`` indices; the set size is public, the indices are not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import serialization
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from numpy.typing import NDArray

from flwr_fsl.crypto.channel import SealingKeyPair, verify_fingerprint
from flwr_fsl.crypto.dpf import DPFKeyBatch
from flwr_fsl.mods.ssa import WEIGHT_KEY
from flwr_fsl.pinning import pinned_fingerprint
from flwr_fsl.protocols.psr import decode_rows, decode_table, make_query
from flwr_fsl.protocols.sealing import (
    RoundBinding,
    open_psr_answer,
    seal_psr_query,
    seal_ssa_upload,
)
from flwr_fsl.protocols.ssa import (
    Placement,
    SSAClientState,
    SSAParams,
    encode_update,
    same_layout,
)
from flwr_fsl.records import (
    ANSWER0_FIELD,
    ANSWER1_FIELD,
    PSR_UPLOAD_KEY,
    SSA_UPLOAD_KEY,
    TABLE_FIELD,
    UDPF_FIELD,
    find_ssa_round,
    hint_upload_record,
    ssa_upload_record,
)

RowsFn = Callable[[Context], "NDArray[np.int64] | tuple[NDArray[np.int64], NDArray[np.float64]]"]
_QUERY_STATE = "fsl.psr.state"
_QUERY_ARRAYS = "fsl.psr.arrays"
_UDPF_STATE = "fsl.udpf.state"
_UDPF_ARRAYS = "fsl.udpf.arrays"


def _config_with_round(
    msg: Message,
) -> tuple[SSAParams, bytes, RoundBinding, ConfigRecord] | None:
    for record in msg.content.config_records.values():
        found = find_ssa_round(RecordDict({"c": record}))
        if found is not None:
            return (*found, record)
    return None


@dataclass
class PrivateRows:
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

    def _rows(self, context: Context) -> tuple[NDArray[np.int64], NDArray[np.float64] | None]:
        out = self.rows(context)
        if isinstance(out, tuple):
            idx, counts = out
            return np.asarray(idx, np.int64).reshape(-1), np.asarray(counts, np.float64)
        return np.asarray(out, np.int64).reshape(-1), None

    # -- retrieval phase ------------------------------------------------------------------
    def query(self, msg: Message, context: Context) -> Message:
        """Answer a ``query.psr`` message with PSR keys for this client's rows.

        Raises
        ------
        ValueError
            If S1's key does not match the pinned fingerprint or the row set does not fit
            the round.
        """
        found = _config_with_round(msg)
        if found is None:
            raise ValueError("the retrieval message carries no SSA round parameters")
        params, helper_key, binding, _ = found
        verify_fingerprint(helper_key, pinned_fingerprint(context.run_config))
        indices, counts = self._rows(context)
        if counts is not None and counts.shape != indices.shape:
            raise ValueError("rows() returned counts of another length than the indices")
        psr = make_query(params, indices)
        node = int(context.node_id)
        sealed, answer_key = seal_psr_query(
            helper_key,
            binding=binding,
            client_id=node,
            public_part=psr.upload.public_part,
            master_seed=psr.upload.master_seeds[1],
        )
        context.state[_QUERY_STATE] = ConfigRecord(
            {"round": params.round_id, "answer-key": _raw_private(answer_key)}
        )
        arrays: dict[str, NDArray[np.generic]] = {"indices": indices, "slots": psr.placement.slots}
        if counts is not None:
            arrays["counts"] = counts
        context.state[_QUERY_ARRAYS] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
        upload = ssa_upload_record(psr.upload.public_part, psr.upload.master_seeds[0], sealed)
        return Message(RecordDict({PSR_UPLOAD_KEY: upload}), reply_to=msg)

    # -- training phase -------------------------------------------------------------------
    def mod(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Client mod: fill the retrieved rows in, train, upload the row updates via SSA.

        Train messages without index-mode parameters (e.g. a plaintext baseline round) pass
        through unchanged.

        Raises
        ------
        ValueError
            If the retrieval state is missing or stale, the answers are malformed, or the
            train reply changes the table's shape.
        """
        if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return call_next(msg, context)
        found = _config_with_round(msg)
        if found is None or TABLE_FIELD not in found[3]:
            return call_next(msg, context)  # a plaintext round: nothing to retrieve or hide
        params, helper_key, binding, config = found
        verify_fingerprint(helper_key, pinned_fingerprint(context.run_config))
        if config.get(TABLE_FIELD) != self.table:
            raise ValueError(f"the server's row table is {config.get(TABLE_FIELD)!r}")
        state = context.state.config_records.get(_QUERY_STATE)
        if state is None or state.get("round") != params.round_id:
            raise ValueError("no retrieval state for this round (query.psr must come first)")
        stored = {k: v.numpy() for k, v in context.state.array_records[_QUERY_ARRAYS].items()}
        indices, slots = stored["indices"], stored["slots"]
        answer_key = SealingKeyPair.from_private_bytes(bytes(state["answer-key"]))  # type: ignore[arg-type]
        width = params.value_width
        answer0 = np.frombuffer(bytes(config[ANSWER0_FIELD]), np.uint64)  # type: ignore[arg-type]
        if answer0.size != params.num_keys * width:
            raise ValueError("S0's answer has the wrong size")
        answer1 = open_psr_answer(
            answer_key,
            bytes(config[ANSWER1_FIELD]),  # type: ignore[arg-type]
            binding=binding,
            client_id=int(context.node_id),
        )
        rows = decode_table(
            decode_rows(slots, indices.size, answer0.reshape(-1, width), answer1), np.float32
        )
        ((record_key, record),) = msg.content.array_records.items()
        table = np.zeros((params.domain_size, width), np.float32)
        table[indices] = rows
        submodel = ArrayRecord({k: v for k, v in record.items()})
        submodel[self.table] = Array(table)
        msg.content[record_key] = submodel  # the user's train sees its rows in a full table
        reply = call_next(msg, context)
        if reply.has_error():
            return reply
        metrics = list(reply.content.metric_records.items())
        if len(metrics) != 1 or WEIGHT_KEY not in metrics[0][1]:
            raise ValueError(f"the train reply needs one MetricRecord with {WEIGHT_KEY!r}")
        ((_, trained_record),) = reply.content.array_records.items()
        trained = trained_record[self.table].numpy()
        if trained.shape != table.shape:
            raise ValueError(f"the train reply changed the shape of {self.table!r}")
        delta = trained[indices].astype(np.float64) - rows.astype(np.float64)
        weights = stored.get("counts")
        weight: float | NDArray[np.float64] = (
            float(metrics[0][1][WEIGHT_KEY]) if weights is None else weights  # type: ignore[arg-type]
        )
        udpf = config.get(UDPF_FIELD) is True
        upload = self._upload(params, helper_key, binding, indices, delta, weight, context, udpf)
        return Message(
            RecordDict({SSA_UPLOAD_KEY: upload, metrics[0][0]: metrics[0][1]}), reply_to=msg
        )

    def _upload(
        self,
        params: SSAParams,
        helper_key: bytes,
        binding: RoundBinding,
        indices: NDArray[np.int64],
        delta: NDArray[np.float64],
        weight: float | NDArray[np.float64],
        context: Context,
        udpf: bool,
    ) -> ConfigRecord:
        previous = self._load_udpf(context) if udpf else None
        if (
            previous is not None
            and params.epoch > previous.params.epoch
            and np.array_equal(previous.indices, indices)
            and same_layout(previous.params, params)
        ):
            hint = previous.next_round(params, delta, weight)
            self._store_udpf(context, previous)
            return hint_upload_record(hint)
        upload, client_state = encode_update(params, indices, delta, weight)
        self._store_udpf(context, client_state)
        sealed = seal_ssa_upload(
            helper_key,
            binding=binding,
            client_id=int(context.node_id),
            public_part=upload.public_part,
            master_seed=upload.master_seeds[1],
        )
        return ssa_upload_record(upload.public_part, upload.master_seeds[0], sealed)

    @staticmethod
    def _store_udpf(context: Context, state: SSAClientState) -> None:
        context.state[_UDPF_STATE] = ConfigRecord(
            {
                "params": state.params.to_bytes(),
                "k0": state.keys[0].to_bytes(),
                "k1": state.keys[1].to_bytes(),
            }
        )
        context.state[_UDPF_ARRAYS] = ArrayRecord(
            {
                "indices": Array(state.indices),
                "alphas": Array(state.placement.alphas),
                "slots": Array(state.placement.slots),
            }
        )

    @staticmethod
    def _load_udpf(context: Context) -> SSAClientState | None:
        record = context.state.config_records.get(_UDPF_STATE)
        if record is None or _UDPF_ARRAYS not in context.state.array_records:
            return None
        arrays = {k: v.numpy() for k, v in context.state.array_records[_UDPF_ARRAYS].items()}
        return SSAClientState(
            params=SSAParams.from_bytes(bytes(record["params"])),  # type: ignore[arg-type]
            indices=arrays["indices"],
            placement=Placement(arrays["alphas"], arrays["slots"]),
            keys=(
                DPFKeyBatch.from_bytes(bytes(record["k0"])),  # type: ignore[arg-type]
                DPFKeyBatch.from_bytes(bytes(record["k1"])),  # type: ignore[arg-type]
            ),
        )


def _raw_private(keypair: SealingKeyPair) -> bytes:
    # The per-query answer key lives only in this node's Context.state, never on the wire.
    return keypair.private_key.private_bytes(
        serialization.Encoding.Raw,
        serialization.PrivateFormat.Raw,
        serialization.NoEncryption(),
    )


__all__ = ["PrivateRows"]
