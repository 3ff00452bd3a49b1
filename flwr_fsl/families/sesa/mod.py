"""``sesa_mod``: the client side of :class:`~flwr_fsl.strategies.SesaFedAvg` (SESA).

Put it in front of your ``@app.train`` (``ClientApp(mods=[sesa_mod])``), written as for
:func:`~flwr_fsl.mods.width_mod`: build the model at ``config["width-rate"]``
(:data:`~flwr_fsl.families.width.mod.RATE_CONFIG_KEY`), load the arrays you receive, train, reply
the trained arrays and ``num-examples``. The node's capacity comes from its node config
``width-rate`` (or the run config's ``width-mix`` by ``partition-id``), read by
:func:`~flwr_fsl.families.width.mod.capacity_of`.

A SESA round is four ``train`` messages carrying a :data:`SESA_KEY` record; the mod answers
three itself (your function never sees them) and wraps your function in the third
(:mod:`flwr_fsl.families.sesa.protocol`):

1. ``advertise`` — the mod picks, *secretly* (operating-system randomness), ``B · S`` of the
   ``S`` shards of every hidden layer (:func:`~flwr_fsl.families.width.rules.select_shards`),
   keeps them in ``Context.state`` with a fresh X25519 key and seed, and replies the public
   key;
2. ``offline`` — with the roster, it computes the selector and mask evaluations for every
   other client and replies them sealed to each;
3. ``train`` — the message holds the *whole* global model (downloading only the chosen shards
   would tell the server which they are). The mod cuts out the narrow model its shards span
   (:meth:`~flwr_fsl.families.sesa.layout.SesaLayout.width_layout`), puts it in the message
   in place of the global one, sets ``width-rate``, runs your function, checks the reply's
   shapes, and turns ``trained - global`` of each chosen shard into a fixed-point shard
   vector ``(c·Δ, c)`` (``c = num-examples / max-weight``, or 1 unweighted; each ``Δ``
   clipped to the strategy's clipping range) in ``F_p``, masked: the reply is the masked
   update only — no arrays, no weight, no metric in the clear;
4. ``decode`` — from every survivor's masked update and the evaluations sealed to it, it
   computes ``ψ(α_i)`` and replies it.

All other messages (evaluation, queries, train messages without the record) pass through.
A malformed or inconsistent SESA message raises :class:`~flwr_fsl.core.errors.ClientInputError`
(Flower turns it into an error reply; the server drops the node). Error texts name checks,
never a shard, value or weight.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.state import StateSlot
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.families.sesa.layout import SesaLayout, check_selection, group_slots
from flwr_fsl.families.sesa.protocol import (
    SesaClient,
    SesaError,
    SesaParams,
    ShardVector,
    decode_ids,
)
from flwr_fsl.families.sesa.records import SESA_KEY, SESA_PHASES
from flwr_fsl.families.width.mod import capacity_of
from flwr_fsl.families.width.records import RATE_CONFIG_KEY
from flwr_fsl.families.width.rules import select_shards

__all__ = [
    "SESA_KEY",
    "SESA_PHASES",
    "SesaNodeState",
    "sesa_codec",
    "sesa_mod",
]

log = logging.getLogger(__name__)

_MAGIC = register_magic(b"FSEN", "SESA node state (flwr_fsl.families.sesa.mod)")
_VERSION = 1
_MAX_LAYERS = 256


@dataclass
class SesaNodeState:
    """What a node keeps between the messages of one SESA round (``Context.state``).

    Attributes
    ----------
    client : SesaClient
        The protocol state (key, seed, shard slots, roster, ``U2``).
    rate : float
        The node's capacity this round.
    layers : tuple[str, ...]
        The hidden layers.
    selection : tuple[tuple[int, ...], ...]
        The chosen shards of each hidden layer (secret).
    """

    client: SesaClient
    rate: float
    layers: tuple[str, ...]
    selection: tuple[tuple[int, ...], ...]

    @property
    def choice(self) -> dict[str, tuple[int, ...]]:
        """Hidden layer -> its chosen shards."""
        return dict(zip(self.layers, self.selection, strict=True))

    def to_bytes(self) -> bytes:
        """``FSEN`` v1: client state, rate (f64 array), layers, selection per layer."""
        w = Writer()
        w.fixed(_MAGIC, 4)
        w.u8(_VERSION)
        w.raw(self.client.to_bytes())
        w.array(np.asarray(self.rate, dtype=np.float64))
        w.count(len(self.layers))
        for name, ids in zip(self.layers, self.selection, strict=True):
            w.raw(name.encode())
            w.ids(list(ids))
        return w.payload()

    @classmethod
    def from_bytes(cls, data: bytes) -> SesaNodeState:
        """Strict decoder of :meth:`to_bytes` (raises :class:`SesaError`)."""
        try:
            r = Reader.versioned(data, _MAGIC, _VERSION, "a SESA node state")
            client = SesaClient.from_bytes(r.raw("client"))
            rate = r.array("rate")
            n = r.count("layers", 8)
            if n > _MAX_LAYERS or rate.shape != () or rate.dtype != np.float64:
                raise SesaError("a SESA node state is malformed")
            layers, selection = [], []
            for _ in range(n):
                layers.append(r.raw("layer").decode())
                selection.append(tuple(r.ids("shards")))
            r.done()
        except (WireFormatError, UnicodeDecodeError) as err:
            raise SesaError(f"a SESA node state is malformed: {err}") from err
        if not 0.0 < float(rate) <= 1.0:
            raise SesaError("a SESA node state has a bad rate")
        return cls(client, float(rate), tuple(layers), tuple(selection))


_SLOT: StateSlot[SesaNodeState] = StateSlot(
    "fsl.sesa.client-state", SesaNodeState.to_bytes, SesaNodeState.from_bytes
)


def _field(record: ConfigRecord, name: str, kind: type | tuple[type, ...]) -> object:
    value = record.get(name)
    if isinstance(value, bool) and kind is not bool:
        raise ClientInputError(f"the SESA record lacks a valid {name!r}")
    if not isinstance(value, kind):
        raise ClientInputError(f"the SESA record lacks a valid {name!r}")
    return value


def _strings(record: ConfigRecord, name: str) -> list[str]:
    value = record.get(name)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ClientInputError(f"the SESA record lacks a valid {name!r}")
    return [str(v) for v in value]


def sesa_codec(record: ConfigRecord, params: SesaParams) -> FixedPoint:
    """Rebuild the round's fixed point from the train record (checked overflow bound).

    Raises
    ------
    ClientInputError
        If a setting is missing or the bound does not hold.
    """
    clip = _field(record, "clip", float)
    frac_bits = _field(record, "frac-bits", int)
    max_clients = _field(record, "max-clients", int)
    try:
        return FixedPoint(
            frac_bits=int(frac_bits),  # type: ignore[call-overload]
            max_abs=max(float(clip), 1.0),  # type: ignore[arg-type]
            max_summands=int(max_clients),  # type: ignore[call-overload]
            ring=params.field,
        )
    except ConfigurationError as err:
        raise ClientInputError(f"the SESA fixed point settings are invalid: {err}") from err


def _reply(msg: Message, **fields: bytes) -> Message:
    return Message(RecordDict({SESA_KEY: ConfigRecord(dict(fields))}), reply_to=msg)


def _round_state(record: ConfigRecord, context: Context) -> tuple[SesaNodeState, SesaParams]:
    params = SesaParams.from_bytes(_field(record, "params", bytes))  # type: ignore[arg-type]
    state = _SLOT.load(context)
    if state is None or state.client.params != params or state.client.node != context.node_id:
        raise ClientInputError("no SESA state for this round (its advertisement was lost)")
    return state, params


def sesa_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Client mod of SESA for a width-scalable ``@app.train`` (module docstring).

    Parameters
    ----------
    msg : Message
        The incoming message.
    context : Context
        The node's context (node config: capacity; state: the round's secrets).
    call_next : ClientAppCallable
        The rest of the ClientApp.

    Returns
    -------
    Message
        The protocol reply, or the untouched reply of ``call_next`` for other messages.

    Raises
    ------
    ClientInputError
        If a SESA message is malformed, has an unknown phase, or does not fit this node's
        state; if the node has no valid capacity; or if the train reply does not match the
        narrow model it was given.
    """
    record = msg.content.config_records.get(SESA_KEY)
    if record is None or not msg.metadata.message_type.startswith(MessageType.TRAIN):
        return call_next(msg, context)
    phase = record.get("phase")
    if phase == "advertise":
        return _advertise(msg, record, context)
    if phase == "offline":
        state, _ = _round_state(record, context)
        bundle = state.client.offline(_field(record, "roster", bytes))  # type: ignore[arg-type]
        _SLOT.store(context, state)
        return _reply(msg, bundle=bundle)
    if phase == "train":
        return _train(msg, record, context, call_next)
    if phase == "decode":
        state, _ = _round_state(record, context)
        evaluation = state.client.evaluate(_field(record, "request", bytes))  # type: ignore[arg-type]
        _SLOT.store(context, state)
        return _reply(msg, evaluation=evaluation)
    raise ClientInputError("unknown SESA phase")


def _advertise(msg: Message, record: ConfigRecord, context: Context) -> Message:
    params = SesaParams.from_bytes(_field(record, "params", bytes))  # type: ignore[arg-type]
    layers = _strings(record, "layers")
    descriptors = _strings(record, "groups")
    widths = record.get("widths")
    num_shards = _field(record, "num-shards", int)
    if (
        not isinstance(widths, list)
        or len(widths) != len(layers)
        or not all(isinstance(w, int) and not isinstance(w, bool) for w in widths)
        or len(layers) > _MAX_LAYERS
        or len(set(layers)) != len(layers)
    ):
        raise ClientInputError("the SESA record's layers and widths do not match")
    rate = capacity_of(context)
    s = int(num_shards)  # type: ignore[call-overload]
    try:
        picks = [select_shards(int(w), s, rate).shards for w in widths]
    except ValueError as err:
        raise ClientInputError(f"no SESA shard choice for this node: {err}") from err
    selection = tuple(tuple(int(x) for x in p) for p in picks)
    choice = check_selection(dict(zip(layers, selection, strict=True)), layers, s)
    slots = group_slots(descriptors, s, choice)
    if len(slots) != len(params.groups):
        raise ClientInputError("the SESA record's groups do not match the round's parameters")
    try:
        client = SesaClient(int(context.node_id), params, slots)
    except ConfigurationError as err:
        raise ClientInputError(f"the SESA groups do not fit the round: {err}") from err
    _SLOT.store(context, SesaNodeState(client, rate, tuple(layers), selection))
    return _reply(msg, advertise=client.advertise())


def _clip(deltas: Sequence[np.ndarray], clip: float) -> tuple[list[np.ndarray], int]:
    out, clipped = [], 0
    for d in deltas:
        clipped += int(np.count_nonzero(np.abs(d) > clip))
        out.append(np.clip(d, -clip, clip))
    return out, clipped


def _train(
    msg: Message, record: ConfigRecord, context: Context, call_next: ClientAppCallable
) -> Message:
    state, params = _round_state(record, context)
    sharers = decode_ids(_field(record, "sharers", bytes))  # type: ignore[arg-type]
    config_key = _field(record, "config-key", str)
    weight_key = _field(record, "weight-key", str)
    weighted = _field(record, "weighted", bool)
    max_weight = float(_field(record, "max-weight", float))  # type: ignore[arg-type]
    clip = float(_field(record, "clip", float))  # type: ignore[arg-type]
    num_shards = int(_field(record, "num-shards", int))  # type: ignore[call-overload]
    if config_key not in msg.content.config_records:
        raise ClientInputError("the SESA record names no config record of the message")
    if not (np.isfinite(clip) and clip > 0 and np.isfinite(max_weight) and max_weight > 0):
        raise ClientInputError("the SESA clipping range and max weight must be positive")
    codec = sesa_codec(record, params)
    records = list(msg.content.array_records.items())
    if len(records) != 1:
        raise ClientInputError("a SESA train message must carry one ArrayRecord")
    array_key, global_record = records[0]
    model = {k: a.numpy() for k, a in global_record.items()}
    try:
        layout = SesaLayout.of(model, num_shards)
    except ConfigurationError as err:
        raise ClientInputError(f"the global model does not split into SESA shards: {err}") from err
    if layout.descriptors != tuple(_strings(record, "groups")) or layout.sesa_groups() != tuple(
        params.groups
    ):
        raise ClientInputError("the global model's shard groups differ from the round's")
    if tuple(layout.widths) != state.layers:
        raise ClientInputError("the global model's hidden layers differ from the advertised ones")
    narrow = layout.width_layout(model, state.choice)
    sub = narrow.extract(model)
    msg.content[array_key] = ArrayRecord({k: Array(np.asarray(v)) for k, v in sub.items()})
    msg.content.config_records[str(config_key)][RATE_CONFIG_KEY] = state.rate
    reply = call_next(msg, context)
    if reply.has_error():
        return reply  # this client drops out; nobody uses its offline evaluations
    trained_records = list(reply.content.array_records.values())
    metric_records = list(reply.content.metric_records.values())
    if len(trained_records) != 1 or len(metric_records) != 1:
        raise ClientInputError("the train reply must hold one ArrayRecord and one MetricRecord")
    trained = {k: a.numpy() for k, a in trained_records[0].items()}
    if {k: v.shape for k, v in trained.items()} != {k: v.shape for k, v in sub.items()}:
        raise ClientInputError(
            f"the train reply does not match the narrow model at rate {state.rate} "
            f"(build the model from config[{RATE_CONFIG_KEY!r}])"
        )
    weight = 1.0
    if weighted:
        value = metric_records[0].get(str(weight_key))
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ClientInputError(f"the train reply lacks a numeric {weight_key!r}")
        if not (np.isfinite(value) and 0 < value <= max_weight):
            raise ClientInputError(f"{weight_key!r} must be in (0, max-weight]")
        weight = float(value) / max_weight
    deltas, clipped = _clip(layout.shard_deltas(model, trained, state.choice), clip)
    if clipped:
        log.warning("sesa_mod: %d update coordinates clipped to the clipping range", clipped)
    updates = [
        ShardVector(g.length, codec).encode(d, weight)
        for g, d in zip(layout.groups, deltas, strict=True)
    ]
    masked = state.client.masked_update(sharers, updates)
    _SLOT.store(context, state)
    return _reply(msg, masked=masked)
