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
   vector ``(c·Δ, c)`` (``c = 1`` by default; ``weight / max-weight`` when the strategy
   asks for weights; each ``Δ`` clipped to the strategy's clipping range) in ``F_p``,
   masked: the reply is the masked update only — no arrays, no weight, no metric in the
   clear;
4. ``decode`` — from every survivor's masked update and the evaluations sealed to it, it
   computes ``ψ(α_i)`` and replies it.

The four phases are the typed :class:`~flwr_fsl.core.phases.Phase` objects of
:mod:`flwr_fsl.families.sesa.records`, answered by :class:`SesaMod`
(a :class:`~flwr_fsl.core.phases.PhaseMod`); the round's settings arrive as one
:class:`~flwr_fsl.families.sesa.messages.SesaSettings` record, and the client steps are the
Flower-free ones of :mod:`flwr_fsl.families.sesa.server` (which :func:`~flwr_fsl.families.sesa.
server.run_round` runs in process).

**Weights.** A round that asks for weights (``weighted``) names the metric to use; the mod
accepts only ``num-examples`` or a metric its own node config lists in ``fsl-weight-keys``
(comma-separated, :func:`~flwr_fsl.core.privacy.check_weight_key`) and otherwise refuses the
round at ``advertise`` and ``train``, naming the key. Weighted rounds leak each client's weight
and, through it, who chose which shard (:class:`~flwr_fsl.families.sesa.strategy.SesaFedAvg`).

All other messages (evaluation, queries, train messages without the record) pass through.
A malformed or inconsistent SESA message raises :class:`~flwr_fsl.core.errors.ClientInputError`
(Flower turns it into an error reply; the server drops the node). Error texts name checks,
never a shard, value or weight.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp.typing import ClientAppCallable

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.phases import Phase, PhaseMod
from flwr_fsl.core.privacy import check_weight_key
from flwr_fsl.core.state import StateSlot
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.families.sesa.protocol import SesaClient, SesaError, SesaParams, ShardVector
from flwr_fsl.families.sesa.records import (
    ADVERTISE,
    DECODE,
    OFFLINE,
    SESA_KEY,
    SESA_PHASES,
    TRAIN,
    AdvertiseReply,
    AdvertiseRequest,
    DecodeReply,
    DecodeRequest,
    MaskedUpdateReply,
    MaskedUpdateRequest,
    OfflineReply,
    OfflineRequest,
)
from flwr_fsl.families.sesa.server import (
    check_mailbox,
    choose_shards,
    masked_shard_update,
    narrow_model,
)
from flwr_fsl.families.sesa.settings import SesaSettings
from flwr_fsl.families.width.mod import capacity_of
from flwr_fsl.families.width.records import RATE_CONFIG_KEY

__all__ = [
    "SESA_KEY",
    "SESA_PHASES",
    "SesaMod",
    "SesaNodeState",
    "ShardVector",
    "sesa_mod",
]

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


def _round_state(context: Context, params: SesaParams) -> SesaNodeState:
    state = _SLOT.load(context)
    if state is None or state.client.params != params or state.client.node != context.node_id:
        raise ClientInputError("no SESA state for this round (its advertisement was lost)")
    return state


def _check_weight(settings: SesaSettings, context: Context) -> None:
    """Refuse a weighted round whose weight key this node's config does not allow."""
    if settings.weighted:
        check_weight_key(settings.weight_key, context.node_config)


class SesaMod(PhaseMod):
    """The client side of ``SesaFedAvg`` (the module docstring) as a phase mod."""

    family: ClassVar[str] = SESA_KEY
    title: ClassVar[str] = "SESA"
    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = {
        p.name: p for p in (ADVERTISE, OFFLINE, TRAIN, DECODE)
    }

    @staticmethod
    def on_advertise(request: AdvertiseRequest, context: Context) -> AdvertiseReply:
        """Pick this node's shards secretly; keep them with a fresh key; reply the public key."""
        rate = capacity_of(context)
        settings = request.settings
        _check_weight(settings, context)
        client, selection = choose_shards(int(context.node_id), request.params, settings, rate)
        _SLOT.store(context, SesaNodeState(client, rate, settings.layers, selection))
        return AdvertiseReply(client.advertise())

    @staticmethod
    def on_offline(request: OfflineRequest, context: Context) -> OfflineReply:
        """Seal the selector and mask evaluations to every other client of the roster."""
        state = _round_state(context, request.params)
        bundle = state.client.offline(request.roster)
        _SLOT.store(context, state)
        return OfflineReply(bundle)

    @staticmethod
    def on_train(
        request: MaskedUpdateRequest, context: Context, train: Callable[..., Message]
    ) -> MaskedUpdateReply | Message:
        """Train the narrow model the chosen shards span; reply its masked shard vectors."""
        state = _round_state(context, request.params)
        settings = request.settings
        _check_weight(settings, context)
        if settings.config_key not in request.beside.config_records:
            raise ClientInputError("the SESA record names no config record of the message")
        records = list(request.beside.array_records.values())
        if len(records) != 1:
            raise ClientInputError("a SESA train message must carry one ArrayRecord")
        model = {k: a.numpy() for k, a in records[0].items()}
        complaint = check_mailbox(state.client, request.sharers, request.mailbox)
        layout, narrow = narrow_model(request.params, settings, state.layers, state.choice, model)
        sub = narrow.extract(model)
        # The train function sees only the narrow model, and its rate in the train config.
        request.beside.config_records[settings.config_key][RATE_CONFIG_KEY] = state.rate
        array_key = next(iter(request.beside.array_records))
        narrow_record = ArrayRecord({k: Array(np.asarray(v)) for k, v in sub.items()})
        reply = train({array_key: narrow_record})
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
        masked = masked_shard_update(
            state.client, request.params, settings, request.sharers, layout, state.choice,
            model, trained, metric_records[0].get(settings.weight_key), complaint,
        )  # fmt: skip
        _SLOT.store(context, state)
        return MaskedUpdateReply(masked)

    @staticmethod
    def on_decode(request: DecodeRequest, context: Context) -> DecodeReply:
        """Compute ``ψ(α_i)`` from the survivors' masked updates and the evaluations."""
        state = _round_state(context, request.params)
        evaluation = state.client.evaluate(request.request)
        _SLOT.store(context, state)
        return DecodeReply(evaluation)


_MOD = SesaMod()


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
    ConfigurationError
        If the round asks for a weight key this node's config does not allow
        (``fsl-weight-keys``; ``num-examples`` is always allowed).
    """
    return _MOD(msg, context, call_next)
