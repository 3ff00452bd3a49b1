r"""``PerturbedRows``: the client side of :class:`~flwr_fsl.strategies.SFSLFedSubAvg`.

Usage, around an unchanged ``@app.train`` that trains the model it receives::

    rows = PerturbedRows("item_emb.weight", rows=my_rows, rr=RRParams.symmetric(15/16, 1/16))
    app = ClientApp(mods=[rows.mod])

``rows(context)`` returns the client's real row set ``S`` and a count per row (how many of its
samples touch it). The mod answers the SecAgg control phases of both aggregations
(:func:`~flwr_fsl.mods.secagg.secagg_control`) and:

* ``union`` train phase: its randomized Bloom filter of ``S`` (:func:`~flwr_fsl.protocols.psu.
  client_vector`), masked;
* ``perturb``: ``S''`` over the union by randomized response, with the permanent answers kept
  in ``Context.state`` (and in ``memo_dir`` on disk when given, so a restarted client keeps
  them; a corrupted memo file is an error, never a fresh start);
* ``rows`` train phase: runs your train function on the model with only the rows of ``S''``
  (others zero), then uploads, masked, ``(v_j Δ_j, v_j)`` for ``j in S'' ∩ S``, zero for
  ``S'' \ S``, and ``(w Δ, w)`` for the dense tensors.

Error texts name checks, never rows, counts or values.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from numpy.typing import NDArray

from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.errors import ClientInputError
from flwr_fsl.mods.base import StateSlot
from flwr_fsl.mods.secagg import round_client, secagg_control, store_client
from flwr_fsl.protocols.niu import GammaQuantizer, RowVector
from flwr_fsl.protocols.psu import PSUParams, client_vector
from flwr_fsl.protocols.secagg import decode_ids, decode_rows
from flwr_fsl.records import SECAGG_KEY, masked_input_record, read_secagg_bytes
from flwr_fsl.submodel.perturb import MemoStore, PermanentMemo, RRParams, perturb_index_set

__all__ = ["PerturbedRows"]

RowsFn = Callable[[Context], tuple[NDArray[np.int64], NDArray[np.float64]]]
_MEMO = StateSlot("fsl.sfsl.memo", PermanentMemo.to_bytes, PermanentMemo.from_bytes)


def _indices(raw: bytes, what: str) -> NDArray[np.int64]:
    if len(raw) % 8:
        raise ClientInputError(f"{what} has a bad length")
    return np.frombuffer(raw, dtype="<i8").astype(np.int64)


@dataclass
class PerturbedRows:
    """Client mod of Niu et al.'s secure federated submodel learning for one row table.

    Parameters
    ----------
    table : str
        The row table's name in the model.
    rows : Callable[[Context], tuple]
        The real row set ``S`` and a positive count per row.
    rr : RRParams
        This client's randomized-response probabilities ``p1..p4``.
    memo_dir : str or Path, optional
        Where to keep the permanent answers across restarts (one file per node).
    """

    table: str
    rows: RowsFn
    rr: RRParams
    memo_dir: str | Path | None = None

    def _real(self, context: Context) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
        rows, counts = self.rows(context)
        r = np.asarray(rows, dtype=np.int64)
        c = np.asarray(counts, dtype=np.float64)
        if r.shape != c.shape or r.ndim != 1 or np.unique(r).size != r.size:
            raise ValueError("rows(context) must return distinct rows and one count per row")
        order = np.argsort(r)
        return r[order], c[order]

    def _store(self, context: Context) -> MemoStore | None:
        if self.memo_dir is None:
            return None
        return MemoStore(Path(self.memo_dir) / f"node-{int(context.node_id)}.rr")

    def mod(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Run the mod (see the module docstring)."""
        record = msg.content.config_records.get(SECAGG_KEY)
        if not msg.metadata.message_type.startswith(MessageType.TRAIN) or record is None:
            return call_next(msg, context)
        answer = secagg_control(msg, context)
        if answer is not None:
            return answer
        phase, instance = record.get("phase"), record.get("instance")
        if phase == "train" and instance == "union":
            return self._union(msg, context, record)
        if phase == "perturb":
            return self._perturb(msg, context)
        if phase == "train" and instance == "rows":
            return self._train(msg, context, call_next, record)
        raise ClientInputError("unknown SFSL phase")

    def _union(self, msg: Message, context: Context, record: ConfigRecord) -> Message:
        client, params = round_client(msg, context)
        try:
            psu = PSUParams(
                int(record["psu-domain"]),  # type: ignore[arg-type]
                int(record["psu-length"]),  # type: ignore[arg-type]
                int(record["psu-hashes"]),  # type: ignore[arg-type]
                int(record["psu-partitions"]),  # type: ignore[arg-type]
                bytes(record["psu-key"]),  # type: ignore[arg-type]
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ClientInputError("the PSU parameters are missing or invalid") from err
        if psu.vector_length != params.vector_length:
            raise ClientInputError("the PSU vector does not match the round's length")
        real, _ = self._real(context)
        sharers, _ = decode_ids(read_secagg_bytes(msg.content, "sharers"))
        masked = client.masked_input(sharers, client_vector(psu, real))
        store_client(msg, context, client)
        return Message(masked_input_record(masked), reply_to=msg)

    def _perturb(self, msg: Message, context: Context) -> Message:
        union = _indices(read_secagg_bytes(msg.content, "union"), "the union")
        real, _ = self._real(context)
        store = self._store(context)
        memo = store.load() if store is not None else (_MEMO.load(context) or PermanentMemo())
        perturbed, memo = perturb_index_set(real, union, memo, self.rr)
        _MEMO.store(context, memo)
        if store is not None:
            store.save(memo)
        content = RecordDict(
            {SECAGG_KEY: ConfigRecord({"perturbed": perturbed.astype("<i8").tobytes()})}
        )
        return Message(content, reply_to=msg)

    def _train(
        self, msg: Message, context: Context, call_next: ClientAppCallable, record: ConfigRecord
    ) -> Message:
        client, params = round_client(msg, context)
        perturbed = _indices(read_secagg_bytes(msg.content, "rows"), "the rows")
        union = _indices(read_secagg_bytes(msg.content, "union"), "the union")
        shared = decode_rows(read_secagg_bytes(msg.content, "shared"), params.vector_length)
        sharers, _ = decode_ids(read_secagg_bytes(msg.content, "sharers"))
        try:
            codec = FixedPoint(
                int(record["frac-bits"]),  # type: ignore[arg-type]
                float(record["max-abs"]),  # type: ignore[arg-type]
                int(record["max-clients"]),  # type: ignore[arg-type]
            )
            clip = float(record["clip"])  # type: ignore[arg-type]
            levels = int(record["levels"])  # type: ignore[arg-type]
            quantizer = None if levels == 0 else GammaQuantizer(levels, -clip, clip)
            weight_key = str(record["weight-key"])
        except (KeyError, TypeError, ValueError) as err:
            raise ClientInputError("the SFSL record's settings are missing or invalid") from err
        arrays = list(msg.content.array_records.values())
        if len(arrays) != 1 or self.table not in arrays[0]:
            raise ClientInputError("the SFSL train message must carry the model with its table")
        model = {k: a.numpy() for k, a in arrays[0].items()}
        table = model[self.table]
        layout = RowVector(union, int(table.shape[1]), codec, quantizer)
        dense = [k for k in model if k != self.table]
        dense_size = sum(model[k].size for k in dense)
        if layout.length + dense_size + 1 != params.vector_length:
            raise ClientInputError("the SFSL layout does not match the round's length")
        reply = call_next(msg, context)
        if reply.has_error():
            return reply  # masks of a client that drops are removed in Unmask
        trained_records = list(reply.content.array_records.values())
        metric_records = list(reply.content.metric_records.values())
        if len(trained_records) != 1 or len(metric_records) != 1:
            raise ClientInputError("the train reply must hold one ArrayRecord and one MetricRecord")
        trained = {k: a.numpy() for k, a in trained_records[0].items()}
        weight = metric_records[0].get(weight_key)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise ClientInputError(f"the train reply lacks a positive {weight_key!r}")
        if set(trained) != set(model) or any(trained[k].shape != model[k].shape for k in model):
            raise ClientInputError("the train reply's arrays do not match the model")
        real, counts = self._real(context)
        kept = np.isin(real, perturbed)
        deltas = {
            int(r): np.clip(
                trained[self.table][r].astype(np.float64) - table[r].astype(np.float64), -clip, clip
            )
            for r in real[kept]
        }
        row_words = layout.encode(
            perturbed, deltas, dict(zip(real[kept].tolist(), counts[kept], strict=True))
        )
        dense_delta = [
            np.clip(
                trained[k].astype(np.float64) - model[k].astype(np.float64), -clip, clip
            ).reshape(-1)
            * float(weight)
            for k in dense
        ]
        dense_words = codec.encode(np.concatenate([*dense_delta, np.array([float(weight)])]))
        positions = np.concatenate(
            [
                layout.positions(perturbed),
                np.arange(layout.length, params.vector_length, dtype=np.int64),
            ]
        )
        vector = np.concatenate([row_words, dense_words])
        masked = client.masked_input(sharers, vector, rows=positions, shared_rows=shared)
        store_client(msg, context, client)
        return Message(masked_input_record(masked), reply_to=msg)
