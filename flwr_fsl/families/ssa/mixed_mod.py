"""Client side of mixed index-mode rounds: several row tables plus the dense tensors.

:class:`PrivateTables` is :class:`~flwr_fsl.families.ssa.index_mod.PrivateRows` for a model
described by a :class:`~flwr_fsl.submodel.tables.ModelTables` (the round's shape is in
:mod:`flwr_fsl.families.ssa.mixed`)::

    tables = ModelTables((TableSpec("item", 32), TableSpec("genre", 8, "item", GENRES)))
    private = PrivateTables(tables, rows=lambda context: {"item": my_item_ids(context)})
    app = ClientApp(mods=[private.mod])
    app.query("psr")(private.query)

1. **Retrieval** (``query.psr``): ``rows(context)`` gives the client's rows of each *primary*
   table (a bare array or ``(indices, counts)`` means the one primary table); the rows of each
   derived table follow from them by the public row map
   (:meth:`~flwr_fsl.submodel.tables.ModelTables.client_rows`; a derived row's count is the sum
   of its parents' counts). For every table the client sends PSR keys for its rows, padded to
   the table's public ``num_items``. A derived set larger than that keeps its heaviest rows
   (:func:`~flwr_fsl.families.ssa.mixed.clamp_rows`): the servers never see more than the public
   size. A primary set larger than its ``max_rows`` is refused, as in single-table rounds.
2. **Training**: the mod opens every table's answers, places the rows in full-shape tables
   (other rows zero), leaves the dense tensors the server sent (the public global model), calls
   the user's unchanged ``@app.train`` function, and uploads one SSA upload per part: each
   table's changed rows as mega-elements, and every dense coordinate in chunks
   (:class:`~flwr_fsl.families.ssa.mixed.DenseChunks`) with the client's weight as each chunk's
   count word. With DP each part is clipped to the round's ``clip_norm`` separately.
3. **U-DPF per table** (rounds with :data:`~flwr_fsl.families.ssa.mixed.UDPF_FIELD`): the
   client keeps each table's keys in ``Context.state`` and, when its rows of a table are the
   same as in its last accepted round and S0 announces holding exactly those keys
   (:data:`~flwr_fsl.families.ssa.mixed.HELD_FIELD`), sends that table's hint instead of
   fresh keys (:func:`~flwr_fsl.families.ssa.protocol.encode_round`). The dense part is fresh.

Like ``PrivateRows``, the client refuses a round (every part is checked) whose noise multiplier
is below its floor ``fsl-min-noise-multiplier`` (default 1.0) or that names another run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.phases import Phase
from flwr_fsl.core.state import StateSlot
from flwr_fsl.crypto.sealing import RoundBinding
from flwr_fsl.families.ssa.dp import INDEX_MODE_NOISE_FLOOR
from flwr_fsl.families.ssa.mixed import (
    ANSWERS0_FIELD,
    ANSWERS1_FIELD,
    DENSE_PART,
    HELD_FIELD,
    MIXED_FIELD,
    MIXED_VERSION,
    PART_PARAMS_FIELD,
    PARTS_FIELD,
    UDPF_FIELD,
    DenseChunks,
    clamp_rows,
    part_key,
    read_held,
)
from flwr_fsl.families.ssa.mixed_union import local_rows, read_unions
from flwr_fsl.families.ssa.mixed_union_mod import psu_reply
from flwr_fsl.families.ssa.mod_base import ProtocolMod, SSARound
from flwr_fsl.families.ssa.protocol import SSAClientState, SSAParams, encode_round, encode_update
from flwr_fsl.families.ssa.psr import PSRClientState, decode_table, make_query
from flwr_fsl.families.ssa.records import (
    PSR_QUERY,
    PSR_UPLOAD_KEY,
    SESSION_FIELD,
    SSA_TRAIN,
    SSA_UPLOAD_KEY,
    RoundRequest,
    hint_upload_record,
    ssa_upload_record,
)
from flwr_fsl.families.ssa.sealing import open_psr_answer, seal_psr_query, seal_udpf_hint
from flwr_fsl.submodel.codec import SubmodelFormatError
from flwr_fsl.submodel.tables import ModelTables

Rows = NDArray[np.int64] | tuple[NDArray[np.int64], NDArray[np.float64]]
TablesRowsFn = Callable[[Context], "Mapping[str, Rows] | Rows"]

__all__ = ["PrivateTables"]


def _slot(index: int) -> StateSlot[PSRClientState]:
    return StateSlot(
        f"fsl.mixed.psr-state.{index}", PSRClientState.to_bytes, PSRClientState.from_bytes
    )


def _keys_slot(index: int) -> StateSlot[SSAClientState]:
    return StateSlot(
        f"fsl.mixed.ssa-keys.{index}", SSAClientState.to_bytes, SSAClientState.from_bytes
    )


@dataclass(frozen=True, eq=False)
class PartsReply:
    """A reply of several part records (one upload or PSR query per part), nothing else."""

    records: dict[str, ConfigRecord] = field(default_factory=dict)

    def to_record(self) -> RecordDict:
        """Return the reply content: the part records, no metrics in the clear."""
        return RecordDict(dict(self.records))


@dataclass
class PrivateTables(ProtocolMod):
    """Client side of mixed index-mode rounds (see the module docstring).

    Parameters
    ----------
    tables : ModelTables
        The model's row tables (the same names, order and row maps as the server's; each
        table's bound comes with the round's parameters, so the client's ``max_rows`` values
        are not read). Single-table rounds (a table name on the server) are
        :class:`~flwr_fsl.families.ssa.index_mod.PrivateRows`'s: this mod passes them through.
    rows : Callable[[Context], ...]
        This round's rows of each primary table: ``{name: indices}`` or
        ``{name: (indices, counts)}``; a bare array or tuple for the one primary table.
    """

    tables: ModelTables
    rows: TablesRowsFn
    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = {
        SSA_TRAIN.name: SSA_TRAIN,
        PSR_QUERY.name: PSR_QUERY,
    }
    noise_floor: ClassVar[float] = INDEX_MODE_NOISE_FLOOR

    def __post_init__(self) -> None:
        if not isinstance(self.tables, ModelTables):
            raise ConfigurationError("tables must be a ModelTables")
        if not callable(self.rows):
            raise ConfigurationError("rows must be a callable(context)")

    def handles(self, found: SSARound) -> bool:
        """Mixed rounds only (they carry :data:`~flwr_fsl.families.ssa.mixed.MIXED_FIELD`)."""
        return MIXED_FIELD in found.config

    def query(self, msg: Message, context: Context) -> Message:
        """Flower handler of ``query.psr``: PSR keys for this client's rows of every table."""
        return self.answer_query(msg, context)

    def query_psu(self, msg: Message, context: Context) -> Message:
        """Flower handler of ``query.psu`` (``union="psu"``): one PSU share per primary table.

        Needs node config ``fsl-allow-union = true``
        (:func:`~flwr_fsl.families.ssa.mixed_union_mod.psu_reply`).
        """
        primary = {k: v for k, v in self._client_rows(context).items() if k in self.tables.primary}
        return psu_reply(msg, context, {k: v[0] for k, v in primary.items()})

    # -- the round's parts ------------------------------------------------------------------
    def _parts(self, found: SSARound, context: Context) -> list[tuple[str, SSARound]]:
        config = found.config
        if config.get(MIXED_FIELD) != MIXED_VERSION:
            raise ClientInputError(f"{MIXED_FIELD!r}: this client speaks mixed rounds v1 only")
        names, blobs = config.get(PARTS_FIELD), config.get(PART_PARAMS_FIELD)
        session = config.get(SESSION_FIELD)
        if not (
            isinstance(names, list)
            and isinstance(blobs, list)
            and len(names) == len(blobs) >= 1
            and all(isinstance(n, str) for n in names)
            and all(isinstance(b, bytes) for b in blobs)
            and isinstance(session, bytes)
        ):
            raise SubmodelFormatError("malformed mixed-round part fields")
        part_names = [str(n) for n in names]
        part_blobs = [b for b in blobs if isinstance(b, bytes)]
        tables = [n for n in part_names if n != DENSE_PART]
        if tables != list(self.tables.names) or part_names.count(DENSE_PART) > 1:
            raise ClientInputError(
                f"the round's tables {tables} are not this client's {list(self.tables.names)}"
            )
        out = []
        for name, blob in zip(part_names, part_blobs, strict=True):
            try:
                params = SSAParams.from_bytes(blob)
                binding = RoundBinding.of(session, params.round_id, blob)
            except ValueError as err:
                raise SubmodelFormatError(f"bad parameters of part {name!r}: {err}") from None
            part = SSARound(params, found.helper_key, binding, config)
            self.check_privacy(part, context)  # every part, not only the first
            out.append((str(name), part))
        return out

    def _client_rows(self, context: Context) -> dict[str, tuple[NDArray[np.int64], Any]]:
        out = self.rows(context)
        primary = self.tables.primary
        if not isinstance(out, Mapping):
            if len(primary) != 1:
                raise ConfigurationError(f"rows() must return a mapping over tables {primary}")
            out = {primary[0]: out}
        idx = {k: (v[0] if isinstance(v, tuple) else v) for k, v in out.items()}
        weighted = [isinstance(v, tuple) for v in out.values()]
        if weighted and all(weighted):
            counts = {k: v[1] for k, v in out.items() if isinstance(v, tuple)}
            return dict(self.tables.client_counts(idx, counts))
        if any(weighted):
            raise ConfigurationError("rows(): give counts for every primary table or for none")
        return {k: (v, None) for k, v in self.tables.client_rows(idx).items()}

    # -- phases -----------------------------------------------------------------------------
    def on_psr(self, request: RoundRequest, context: Context) -> PartsReply:
        """Make one PSR query per table; keep what reading the answers needs."""
        parts = self._parts(request.round, context)
        rows = self._client_rows(context)
        unions = read_unions(request.round.config, self.tables.names)
        records: dict[str, ConfigRecord] = {}
        for i, (name, part) in enumerate(parts):
            if name == DENSE_PART:
                continue
            indices, counts = rows[name]
            if self.tables[name].derived:
                indices, counts = clamp_rows(indices, counts, part.params.num_items)
            if unions is not None:  # union="psu": the rows' positions in the table's union
                indices, counts = local_rows(unions[name], indices, counts)
            psr = make_query(part.params, indices)
            sealed, answer_key = seal_psr_query(
                part.helper_key,
                binding=part.binding,
                client_id=int(context.node_id),
                public_part=psr.upload.public_part,
                master_seed=psr.upload.master_seeds[1],
            )
            state = PSRClientState(
                part.params.round_id, psr.indices, psr.placement.slots, answer_key, counts
            )
            _slot(i).store(context, state)
            records[part_key(PSR_UPLOAD_KEY, i)] = ssa_upload_record(
                psr.upload.public_part, psr.upload.master_seeds[0], sealed
            )
        return PartsReply(records)

    def on_train(
        self, request: RoundRequest, context: Context, train: Callable[[], Message]
    ) -> PartsReply | Message:
        """Fill every table's rows in, train, upload one SSA upload per part.

        Raises
        ------
        ClientInputError
            If the retrieval state is missing or stale or an answer is malformed.
        ConfigurationError
            If the train reply changes a tensor's shape.
        """
        parts = self._parts(request.round, context)
        ((record_key, record),) = request.content.array_records.items()
        received = {k: v.numpy() for k, v in record.items()}
        submodel = ArrayRecord(dict(record.items()))
        retrieved = self._retrieved(request.round, parts, context)
        unions = read_unions(request.round.config, self.tables.names)
        where: dict[str, NDArray[np.int64]] = {}  # each table's retrieved rows in the full table
        for name, (state, rows) in retrieved.items():
            params = next(p.params for n, p in parts if n == name)
            m, where[name] = params.domain_size, state.indices
            if unions is not None:
                m, where[name] = unions[name].domain_size, unions[name].union[state.indices]
            table = np.zeros((m, params.value_width), np.float32)
            table[where[name]] = rows
            submodel[name] = Array(table)
        request.content[record_key] = submodel  # the user's train sees full-shape tables
        self.check_weight_key(request, context)  # refuse before training
        reply = train()
        if reply.has_error():
            return reply
        weight = self.round_weight(request, reply, context)
        ((_, trained_record),) = reply.content.array_records.items()
        trained = {k: v.numpy() for k, v in trained_record.items()}
        records: dict[str, ConfigRecord] = {}
        udpf = request.round.config.get(UDPF_FIELD) is True
        tables = sum(n != DENSE_PART for n, _ in parts)
        held = iter(read_held(request.round.config.get(HELD_FIELD) if udpf else None, tables))
        for i, (name, part) in enumerate(parts):
            params = part.params
            if name == DENSE_PART:
                names = self.tables.dense_names(received)
                layout = DenseChunks.of(received, names, params.value_width)
                if (layout.size, layout.width) != (params.domain_size, params.value_width):
                    raise ClientInputError("the dense part does not fit this client's model")
                _same_shapes(names, received, trained)
                delta = layout.vector(trained) - layout.vector(received)
                indices = np.arange(layout.size, dtype=np.int64)
                upload, _ = encode_update(params, indices, delta, weight)
            else:
                state, rows = retrieved[name]
                _same_shapes((name,), {name: np.asarray(submodel[name].numpy())}, trained)
                delta = trained[name][where[name]].astype(np.float64) - rows.astype(np.float64)
                counts = weight if state.counts is None else state.counts
                records[part_key(SSA_UPLOAD_KEY, i)] = self._table_upload(
                    i, part, context, (state.indices, delta, counts), udpf, next(held)
                )
                continue
            records[part_key(SSA_UPLOAD_KEY, i)] = self.sealed_upload(upload, part, context)
        # No metrics in the clear: the weight rides in the payload's count words only.
        return PartsReply(records)

    def _table_upload(
        self,
        index: int,
        part: SSARound,
        context: Context,
        update: tuple[NDArray[np.int64], NDArray[np.float64], Any],
        udpf: bool,
        held: bytes | None,
    ) -> ConfigRecord:
        """Encode one table's update: fresh keys, or its U-DPF hint against ``held`` keys."""
        slot = _keys_slot(index)
        out, keys = encode_round(
            part.params, *update, slot.load(context) if udpf else None, udpf=udpf, held=held
        )
        slot.store(context, keys)
        if not isinstance(out, bytes):
            return self.sealed_upload(out, part, context)
        assert held is not None  # a hint is only made against announced keys
        sealed = seal_udpf_hint(
            part.helper_key,
            binding=part.binding,
            client_id=int(context.node_id),
            hint=out,
            held=held,
            signer=self.signer(context),
        )
        return hint_upload_record(out, sealed)

    def _retrieved(
        self, found: SSARound, parts: list[tuple[str, SSARound]], context: Context
    ) -> dict[str, tuple[PSRClientState, NDArray[np.floating]]]:
        answers0, answers1 = found.config.get(ANSWERS0_FIELD), found.config.get(ANSWERS1_FIELD)
        tables = [(i, n, p) for i, (n, p) in enumerate(parts) if n != DENSE_PART]
        if not (
            isinstance(answers0, list)
            and isinstance(answers1, list)
            and len(answers0) == len(answers1) == len(tables)
        ):
            raise SubmodelFormatError("malformed mixed-round answers")
        out = {}
        for j, (i, name, part) in enumerate(tables):
            state = _slot(i).load(context)
            if state is None or state.round_id != part.params.round_id:
                raise ClientInputError(f"no retrieval state of {name!r} for this round")
            a0, a1 = answers0[j], answers1[j]
            if not isinstance(a0, bytes) or not isinstance(a1, bytes):
                raise SubmodelFormatError("mixed-round answers must be bytes")
            answer1 = open_psr_answer(
                state.answer_key, a1, binding=part.binding, client_id=int(context.node_id)
            )
            out[name] = (state, decode_table(state.rows(part.params, a0, answer1)))
        return out


def _same_shapes(
    names: tuple[str, ...], before: Mapping[str, NDArray[Any]], after: Mapping[str, NDArray[Any]]
) -> None:
    for name in names:
        if name not in after or np.shape(after[name]) != np.shape(before[name]):
            raise ConfigurationError(f"the train reply changed or dropped {name!r}")
