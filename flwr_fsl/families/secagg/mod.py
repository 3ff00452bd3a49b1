"""``secagg_mod``: the client side of :class:`~flwr_fsl.strategies.SecAggFedAvg`.

Put it in front of an unchanged ``@app.train`` (``ClientApp(mods=[secagg_mod])``). It
answers the SecAgg control phases itself (``advertise``, ``share``, ``unmask``: ``train``
messages whose SecAgg record names the phase, so they need no registered function of their
own and never reach your code). On the SecAgg ``train`` phase it runs your train
function on the message (the SecAgg record sits beside its usual records), then replaces the
reply by the masked vector of
:class:`~flwr_fsl.families.secagg.vector.WeightedVector`: the weighted update, the weight
(``num-examples``, or the strategy's ``weighted_by_key``) and the weighted train metrics the
strategy asked for. The reply carries nothing else: no arrays, no weight, no metric in the
clear. Train messages without a SecAgg record, evaluation and other queries pass through.

The mod owns the SecAgg ``instance`` ``"model"`` (SecAggFedAvg's). SecAgg messages of another
instance (e.g. the ``"union"`` and ``"rows"`` aggregations of
:class:`~flwr_fsl.strategies.SFSLFedSubAvg`) pass through to the next mod untouched, so it
stacks with :class:`~flwr_fsl.mods.PerturbedRows` in one ClientApp, in either order
(``ClientApp(mods=[rows.mod, secagg_mod])``). A message of its own instance with an unknown
phase, or a SecAgg record whose ``instance`` is not a valid name, is refused
(:class:`~flwr_fsl.core.errors.ClientInputError`).

The round's secrets (two X25519 private keys, the self-mask seed, this client's own share)
live in ``Context.state`` between the messages of one round and are replaced by the next
round's. Error texts name the check that failed, never a value, an index or a weight.
"""

from __future__ import annotations

import logging

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.state import StateSlot
from flwr_fsl.families.secagg.protocol import SecAggClient, SecAggParams, decode_ids
from flwr_fsl.families.secagg.records import SECAGG_KEY, masked_input_record, read_secagg_bytes
from flwr_fsl.families.secagg.vector import WeightedVector

__all__ = [
    "MODEL_INSTANCE",
    "layout_from_config",
    "record_instance",
    "round_client",
    "secagg_control",
    "secagg_mod",
    "store_client",
]

log = logging.getLogger(__name__)

MODEL_INSTANCE = "model"
"""The SecAgg instance :func:`secagg_mod` answers (the one ``SecAggFedAvg`` runs)."""


def _slot(instance: str) -> StateSlot[SecAggClient]:
    # One slot per aggregation of a round (Niu runs two: the union and the rows).
    name = "fsl.secagg.client-state" if instance == MODEL_INSTANCE else f"fsl.secagg.{instance}"
    return StateSlot(name, SecAggClient.to_bytes, SecAggClient.from_bytes)


def record_instance(record: ConfigRecord) -> str:
    """Return the SecAgg instance a message's SecAgg record names (``"model"`` if none).

    Raises
    ------
    ClientInputError
        If the ``instance`` field is not a string that is a Python identifier.
    """
    instance = record.get("instance", MODEL_INSTANCE)
    if not isinstance(instance, str) or not instance.isidentifier():
        raise ClientInputError("the SecAgg record names no valid instance")
    return instance


def layout_from_config(record: ConfigRecord, shapes: dict[str, tuple[int, ...]]) -> WeightedVector:
    """Rebuild the round's :class:`WeightedVector` from the train message's SecAgg record.

    Raises
    ------
    ClientInputError
        If a field is missing or of the wrong type, or the settings are invalid.
    """
    try:
        names = tuple(str(n) for n in record["names"])  # type: ignore[union-attr]
        metrics = tuple(str(n) for n in record["metrics"])  # type: ignore[union-attr]
        settings = {
            k: record[k] for k in ("clip", "max-weight", "max-metric", "frac-bits", "max-clients")
        }
    except (KeyError, TypeError) as err:
        raise ClientInputError("the SecAgg record lacks a layout field") from err
    if any(n not in shapes for n in names):
        raise ClientInputError("the SecAgg layout names an array the message does not carry")
    try:
        return WeightedVector(
            names,
            tuple(shapes[n] for n in names),
            metrics,
            float(settings["clip"]),  # type: ignore[arg-type]
            float(settings["max-weight"]),  # type: ignore[arg-type]
            float(settings["max-metric"]),  # type: ignore[arg-type]
            int(settings["frac-bits"]),  # type: ignore[arg-type]
            int(settings["max-clients"]),  # type: ignore[arg-type]
        )
    except (ValueError, TypeError) as err:
        raise ClientInputError("the SecAgg layout settings are invalid") from err


def round_client(msg: Message, context: Context) -> tuple[SecAggClient, SecAggParams]:
    """Return this node's SecAgg state for the round (and instance) ``msg`` belongs to.

    Raises
    ------
    ClientInputError
        If the message's parameters are malformed or the node holds no state for them.
    """
    record = msg.content.config_records[SECAGG_KEY]
    params = SecAggParams.from_bytes(read_secagg_bytes(msg.content, "params"))
    client = _slot(record_instance(record)).load(context)
    if client is None or client.params != params or client.node != context.node_id:
        raise ClientInputError("no SecAgg state for this round (its key advertisement was lost)")
    return client, params


def store_client(msg: Message, context: Context, client: SecAggClient) -> None:
    """Keep ``client`` as this node's state for the instance of ``msg``."""
    _slot(record_instance(msg.content.config_records[SECAGG_KEY])).store(context, client)


def _reply(msg: Message, **fields: bytes) -> Message:
    return Message(RecordDict({SECAGG_KEY: ConfigRecord(dict(fields))}), reply_to=msg)


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
    record = msg.content.config_records.get(SECAGG_KEY)
    if not msg.metadata.message_type.startswith(MessageType.TRAIN) or record is None:
        return call_next(msg, context)
    if record_instance(record) != MODEL_INSTANCE:
        return call_next(msg, context)  # another aggregation's message: its own mod answers
    answer = secagg_control(msg, context)
    if answer is not None:
        return answer
    if record.get("phase") == "train":
        return _train(msg, context, call_next)
    raise ClientInputError("unknown SecAgg phase")


def secagg_control(msg: Message, context: Context) -> Message | None:
    """Answer a SecAgg control phase (advertise, share, unmask) of any instance.

    Returns None for other messages (the masked phase is the caller's: it knows the vector).

    Raises
    ------
    ClientInputError
        If the SecAgg message is malformed or inconsistent with this node's state.
    """
    record = msg.content.config_records.get(SECAGG_KEY)
    if record is None:
        return None
    phase = record.get("phase")
    if phase == "advertise":
        params = SecAggParams.from_bytes(read_secagg_bytes(msg.content, "params"))
        client = SecAggClient(int(context.node_id), params)
        store_client(msg, context, client)
        return _reply(msg, advertise=client.advertise())
    if phase == "share":
        client, _ = round_client(msg, context)
        bundle = client.share_keys(read_secagg_bytes(msg.content, "roster"))
        store_client(msg, context, client)
        return _reply(msg, shares=bundle)
    if phase == "unmask":
        client, _ = round_client(msg, context)
        answer = client.unmask(read_secagg_bytes(msg.content, "request"))
        store_client(msg, context, client)
        return _reply(msg, unmask=answer)
    return None


def _train(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    client, params = round_client(msg, context)
    record = msg.content.config_records[SECAGG_KEY]
    sharers, _ = decode_ids(read_secagg_bytes(msg.content, "sharers"))
    weight_key = record.get("weight-key")
    if not isinstance(weight_key, str):
        raise ClientInputError("the SecAgg record lacks the weight key")
    arrays = [r for r in msg.content.array_records.values()]
    if len(arrays) != 1:
        raise ClientInputError("a SecAgg train message must carry one ArrayRecord")
    model = {k: a.numpy() for k, a in arrays[0].items()}
    layout = layout_from_config(record, {k: tuple(v.shape) for k, v in model.items()})
    if layout.length != params.vector_length:
        raise ClientInputError("the SecAgg layout does not match the round's vector length")
    # Extra records do not disturb a train function that reads its usual keys.
    reply = call_next(msg, context)
    if reply.has_error():
        return reply  # this client drops out of the round; its masks are removed in Unmask
    content = reply.content
    trained_records = list(content.array_records.values())
    metric_records = list(content.metric_records.values())
    if len(trained_records) != 1 or len(metric_records) != 1:
        raise ClientInputError("the train reply must hold one ArrayRecord and one MetricRecord")
    metrics = metric_records[0]
    weight = metrics.get(weight_key)
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise ClientInputError(f"the train reply lacks a numeric {weight_key!r}")
    numbers = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    trained = {k: a.numpy() for k, a in trained_records[0].items()}
    vector, clipped = layout.encode(model, trained, float(weight), numbers)
    if clipped:
        log.warning("secagg_mod: %d update coordinates clipped to the clipping range", clipped)
    masked = client.masked_input(sharers, vector)
    store_client(msg, context, client)
    return Message(masked_input_record(masked), reply_to=msg)
