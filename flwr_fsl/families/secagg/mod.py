"""``secagg_mod``: the client side of :class:`~flwr_fsl.strategies.SecAggFedAvg`.

Put it in front of an unchanged ``@app.train`` (``ClientApp(mods=[secagg_mod])``). It
answers the SecAgg control phases itself (``advertise``, ``share``, ``unmask``: ``train``
messages whose SecAgg record names the phase, so they need no registered function of their
own and never reach your code). On the SecAgg ``train`` phase it runs your train
function on the message (the SecAgg record sits beside its usual records), then replaces the
reply by the masked vector of
:class:`~flwr_fsl.families.secagg.vector.WeightedVector`: the (weighted) update, the weight
and the (weighted) train metrics the strategy asked for. The reply carries nothing else: no
arrays, no weight, no metric in the clear. Train messages without a SecAgg record, evaluation
and other queries pass through.

**What the client accepts.** By default the weight is 1. A key-weighted round
(``weighted=True``) uses ``num-examples`` or a metric the node config lists under
``fsl-weight-keys`` (:func:`flwr_fsl.core.privacy.check_weight_key`); any other key makes the
client refuse the round, naming the key. The client computes the noise the settings promise
itself (0 without ``dp``) and refuses a round below its node-config floor
``fsl-min-noise-multiplier`` (default 0 for SecAgg: DP is opt-in). With ``dp`` it clips its
update and adds its discrete Gaussian noise to every word before masking
(:mod:`flwr_fsl.families.secagg.dp`). Both checks run before your train function.

The mod owns the SecAgg ``instance`` ``"model"`` (SecAggFedAvg's). SecAgg messages of another
instance (e.g. the ``"union"`` and ``"rows"`` aggregations of
:class:`~flwr_fsl.strategies.SFSLFedSubAvg`) pass through to the next mod untouched, so it
stacks with :class:`~flwr_fsl.mods.PerturbedRows` in one ClientApp, in either order
(``ClientApp(mods=[rows.mod, secagg_mod])``). A message of its own instance with an unknown
phase, or a SecAgg record whose ``instance`` is not a valid name, is refused
(:class:`~flwr_fsl.core.errors.ClientInputError`).

The mod is a :class:`~flwr_fsl.core.phases.PhaseMod` over SecAgg's four typed phases
(:mod:`flwr_fsl.families.secagg.records`); :func:`secagg_mod` is its plain-function form.

The round's secrets (two X25519 private keys, the self-mask seed, this client's own share)
live in ``Context.state`` between the messages of one round and are replaced by the next
round's. Error texts name the check that failed, never a value, an index or a weight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.phases import Phase, PhaseMod, phase_name
from flwr_fsl.core.privacy import check_noise_floor, check_weight_key, node_noise_floor
from flwr_fsl.core.state import StateSlot
from flwr_fsl.families.secagg.messages import SecAggSettings
from flwr_fsl.families.secagg.protocol import SecAggClient, SecAggParams
from flwr_fsl.families.secagg.records import (
    ADVERTISE,
    MODEL_INSTANCE,
    SECAGG_KEY,
    SHARE,
    TRAIN,
    UNMASK,
    AdvertiseReply,
    AdvertiseRequest,
    MaskedInputReply,
    MaskedInputRequest,
    ShareReply,
    ShareRequest,
    UnmaskReply,
    UnmaskSharesRequest,
    read_secagg_bytes,
    record_instance,
)
from flwr_fsl.families.secagg.vector import WeightedVector

__all__ = [
    "MODEL_INSTANCE",
    "SecAggMod",
    "keep_client",
    "layout_from_config",
    "load_client",
    "record_instance",
    "round_client",
    "secagg_control",
    "secagg_mod",
    "store_client",
]

log = logging.getLogger(__name__)


def _slot(instance: str) -> StateSlot[SecAggClient]:
    # One slot per aggregation of a round (Niu runs two: the union and the rows).
    name = "fsl.secagg.client-state" if instance == MODEL_INSTANCE else f"fsl.secagg.{instance}"
    return StateSlot(name, SecAggClient.to_bytes, SecAggClient.from_bytes)


def layout_from_config(record: ConfigRecord, shapes: dict[str, tuple[int, ...]]) -> WeightedVector:
    """Rebuild the round's :class:`WeightedVector` from the train message's SecAgg record.

    Parameters
    ----------
    record : ConfigRecord
        The SecAgg record of a ``train`` message (its ``settings`` field is decoded).
    shapes : dict[str, tuple[int, ...]]
        The shapes of the arrays the message carries.

    Returns
    -------
    WeightedVector
        The layout the server decodes the sum with.

    Raises
    ------
    ClientInputError
        If the settings record is missing or malformed, or names an array the message does
        not carry.
    """
    return _layout(
        SecAggSettings.from_bytes(read_secagg_bytes(RecordDict({SECAGG_KEY: record}), "settings")),
        shapes,
    )


def _layout(settings: SecAggSettings, shapes: Mapping[str, tuple[int, ...]]) -> WeightedVector:
    try:
        return settings.layout(shapes)
    except ConfigurationError as err:
        raise ClientInputError(f"the SecAgg layout does not fit the message: {err}") from err


def _load(context: Context, instance: str, params: SecAggParams) -> SecAggClient:
    client = _slot(instance).load(context)
    if client is None or client.params != params or client.node != context.node_id:
        raise ClientInputError("no SecAgg state for this round (its key advertisement was lost)")
    return client


def round_client(msg: Message, context: Context) -> tuple[SecAggClient, SecAggParams]:
    """Return this node's SecAgg state for the round (and instance) ``msg`` belongs to.

    Raises
    ------
    ClientInputError
        If the message's parameters are malformed or the node holds no state for them.
    """
    instance = record_instance(msg.content.config_records[SECAGG_KEY])
    params = SecAggParams.from_bytes(read_secagg_bytes(msg.content, "params"))
    return _load(context, instance, params), params


def load_client(context: Context, instance: str, params: SecAggParams) -> SecAggClient:
    """Return this node's SecAgg state for ``instance`` of the round ``params`` name.

    Raises
    ------
    ClientInputError
        If the node holds no state for them (its key advertisement was lost).
    """
    return _load(context, instance, params)


def keep_client(context: Context, instance: str, client: SecAggClient) -> None:
    """Keep ``client`` as this node's state for ``instance``."""
    _slot(instance).store(context, client)


def store_client(msg: Message, context: Context, client: SecAggClient) -> None:
    """Keep ``client`` as this node's state for the instance of ``msg``."""
    _slot(record_instance(msg.content.config_records[SECAGG_KEY])).store(context, client)


# -- the control phases, for every instance ---------------------------------------------------
def on_advertise(request: AdvertiseRequest, context: Context) -> AdvertiseReply:
    """AdvertiseKeys: a fresh client for the round, its two public keys."""
    client = SecAggClient(int(context.node_id), request.params)
    _slot(request.instance).store(context, client)
    return AdvertiseReply(client.advertise())


def on_share(request: ShareRequest, context: Context) -> ShareReply:
    """ShareKeys: the shares of this client's secrets, sealed to the roster."""
    client = _load(context, request.instance, request.params)
    bundle = client.share_keys(request.roster)
    _slot(request.instance).store(context, client)
    return ShareReply(bundle)


def on_unmask(request: UnmaskSharesRequest, context: Context) -> UnmaskReply:
    """Unmask: this client's shares of the survivors' seeds and the dropped clients' keys."""
    client = _load(context, request.instance, request.params)
    answer = client.unmask(request.request)
    _slot(request.instance).store(context, client)
    return UnmaskReply(answer)


_CONTROL: dict[str, tuple[Phase[Any, Any], Callable[[Any, Context], Any]]] = {
    ADVERTISE.name: (ADVERTISE, on_advertise),
    SHARE.name: (SHARE, on_share),
    UNMASK.name: (UNMASK, on_unmask),
}


def secagg_control(msg: Message, context: Context) -> Message | None:
    """Answer a SecAgg control phase (advertise, share, unmask) of any instance.

    Returns None for other messages (the masked phase is the caller's: it knows the vector).

    Raises
    ------
    ClientInputError
        If the SecAgg message is malformed or inconsistent with this node's state.
    """
    control = _CONTROL.get(phase_name(msg.content, SECAGG_KEY) or "")
    if control is None:
        return None
    phase, handler = control
    return Message(handler(phase.parse_request(msg.content), context).to_record(), reply_to=msg)


class SecAggMod(PhaseMod):
    """The client side of ``SecAggFedAvg`` (the module docstring) as a phase mod."""

    family: ClassVar[str] = SECAGG_KEY
    title: ClassVar[str] = "SecAgg"
    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = {
        p.name: p for p in (ADVERTISE, SHARE, TRAIN, UNMASK)
    }

    def owns(self, content: RecordDict) -> bool:
        """Only instance ``"model"``: other aggregations' messages go to their own mods."""
        return record_instance(content.config_records[SECAGG_KEY]) == MODEL_INSTANCE

    on_advertise = staticmethod(on_advertise)
    on_share = staticmethod(on_share)
    on_unmask = staticmethod(on_unmask)

    @staticmethod
    def on_train(
        request: MaskedInputRequest, context: Context, train: Callable[[], Message]
    ) -> MaskedInputReply | Message:
        """MaskedInput: run the user's train function, mask its weighted update."""
        client = _load(context, request.instance, request.params)
        arrays = list(request.beside.array_records.values())
        if len(arrays) != 1:
            raise ClientInputError("a SecAgg train message must carry one ArrayRecord")
        model = {k: a.numpy() for k, a in arrays[0].items()}
        layout = _layout(request.settings, {k: tuple(v.shape) for k, v in model.items()})
        if layout.length != request.params.vector_length:
            raise ClientInputError("the SecAgg layout does not match the round's vector length")
        settings = request.settings
        # The client's own floors, before its data is touched (ConfigurationError: refused).
        if settings.weighted:
            check_weight_key(settings.weight_key, context.node_config)
        check_noise_floor(
            settings.noise_multiplier, node_noise_floor(context.node_config, 0.0), what="SecAgg"
        )
        # Extra records do not disturb a train function that reads its usual keys.
        reply = train()
        if reply.has_error():
            return reply  # this client drops out of the round; its masks are removed in Unmask
        content = reply.content
        trained_records = list(content.array_records.values())
        metric_records = list(content.metric_records.values())
        if len(trained_records) != 1 or len(metric_records) != 1:
            raise ClientInputError("the train reply must hold one ArrayRecord and one MetricRecord")
        metrics = metric_records[0]
        weight = 1.0
        if settings.weighted:
            value = metrics.get(settings.weight_key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ClientInputError(f"the train reply lacks a numeric {settings.weight_key!r}")
            weight = float(value)
        _check_named_metrics(settings.metrics, metrics)
        numbers = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        trained = {k: a.numpy() for k, a in trained_records[0].items()}
        vector, clipped = layout.encode(model, trained, float(weight), numbers)
        if clipped:
            log.warning("secagg_mod: %d update coordinates clipped to the clipping range", clipped)
        vector = layout.add_noise(vector, request.params.threshold)  # unchanged without dp
        masked = client.masked_input(request.sharers, vector)
        _slot(request.instance).store(context, client)
        return MaskedInputReply(masked)


def _check_named_metrics(names: tuple[str, ...], metrics: MetricRecord) -> None:
    """Refuse a named train metric that is not a number (e.g. a per-class list), loudly.

    Raises
    ------
    ClientInputError
        Naming the metric (never its value): the client leaves the round with that reason.
    """
    for key in names:
        value = metrics.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ClientInputError(
                f"train metric {key!r} is not a number; SecAgg averages scalar metrics only"
            )


_MOD = SecAggMod()


def secagg_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Client mod of Bonawitz SecAgg for an unchanged ``@app.train`` (module docstring).

    Parameters
    ----------
    msg : Message
        The incoming message.
    context : Context
        The node's context (its ``state`` keeps the round's secrets).
    call_next : ClientAppCallable
        The rest of the ClientApp.

    Returns
    -------
    Message
        The protocol reply, or the untouched reply of ``call_next`` (messages without a SecAgg
        record, and SecAgg messages of an instance other than ``"model"``).

    Raises
    ------
    ClientInputError
        If a SecAgg message of instance ``"model"`` is malformed, has an unknown phase or is
        inconsistent with this client's state, or a SecAgg record names no valid instance
        (Flower turns it into an error reply; the server drops the client from the round).
    """
    return _MOD(msg, context, call_next)
