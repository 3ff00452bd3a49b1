"""``width_mod``: the client side of :class:`~flwr_fsl.strategies.WidthFedAvg` (width extraction).

Put it in front of your ``@app.train`` (``ClientApp(mods=[width_mod])``). The strategy sends
each client only its *width slice* of the global model (HeteroFL / FedRolex / random /
SESA-shard channels, :mod:`flwr_fsl.families.width.rules`), shaped like the model built at the
client's rate. The only change your train function needs is to build the model at that rate::

    @app.train()
    def train(msg, context):
        rate = msg.content["config"].get("width-rate", 1.0)     # set by width_mod
        net = WidthMLP(rate)                                    # was: WidthMLP()
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        ...  # train as before, reply ArrayRecord(net.state_dict()) + "num-examples"

What the mod does, by message (``train`` messages carrying the :data:`WIDTH_KEY` record; all
other messages — evaluation, queries, plain train rounds — pass through untouched):

* ``phase = "capacity"``: answers the node's capacity itself (your function is not called):
  the node config's ``width-rate`` (a number in (0, 1] or HeteroFL's letter ``a``..``e``), or,
  for simulations where every node has the same node config, the rate of its
  ``partition-id`` in HeteroFL's fixed assignment of the run config's ``width-mix``
  (e.g. ``"a1-b1-c1"``, :meth:`~flwr_fsl.families.width.rules.CapacityMix.fixed`);
* ``phase = "train"``: decodes the round's
  :class:`~flwr_fsl.families.width.rules.WidthAssignment` (strict codec), writes its rate into the
  message's config as :data:`RATE_CONFIG_KEY` and runs your function (the width record stays
  beside the usual records; a train function that reads its usual keys ignores it). It checks
  that the reply's one ``ArrayRecord`` has exactly the tensors and shapes it received (a
  model built at the wrong rate is reported here, on the client, with the shapes), and adds a
  record naming the assignment's digest, by which the server matches the reply to the slice
  it sent.

The server chooses (and so knows) every client's channels; this mod hides nothing. Errors
raise :class:`~flwr_fsl.core.errors.ClientInputError` (Flower turns them into an error reply, and
the server drops the node from the round with the text as the reason).
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.families.width.records import RATE_CONFIG_KEY, RATE_NODE_CONFIG_KEY, WIDTH_KEY
from flwr_fsl.families.width.rules import CapacityMix, WidthAssignment, parse_rate

__all__ = [
    "MIX_RUN_CONFIG_KEY",
    "RATE_CONFIG_KEY",
    "RATE_NODE_CONFIG_KEY",
    "WIDTH_KEY",
    "capacity_of",
    "capacity_reply",
    "width_mod",
]

MIX_RUN_CONFIG_KEY = "width-mix"
"""Run config key of a fixed capacity mix assigned by ``partition-id`` (simulations)."""


def capacity_of(context: Context) -> float:
    """Return this node's capacity from its node config (or the run config's fixed mix).

    Parameters
    ----------
    context : Context
        The node's context.

    Returns
    -------
    float
        The rate, in ``(0, 1]``.

    Raises
    ------
    ClientInputError
        If neither source is configured or a value is invalid.
    """
    node = context.node_config
    try:
        if RATE_NODE_CONFIG_KEY in node:
            return parse_rate(node[RATE_NODE_CONFIG_KEY], f"node config {RATE_NODE_CONFIG_KEY!r}")
        mix = context.run_config.get(MIX_RUN_CONFIG_KEY)
        if mix is None:
            raise ClientInputError(
                f"no capacity: set node config {RATE_NODE_CONFIG_KEY!r} or run config "
                f"{MIX_RUN_CONFIG_KEY!r}"
            )
        pid, num = node.get("partition-id"), node.get("num-partitions")
        if not (isinstance(pid, int) and isinstance(num, int) and 0 <= pid < num):
            raise ClientInputError(
                f"run config {MIX_RUN_CONFIG_KEY!r} needs integer node config 'partition-id' "
                "< 'num-partitions'"
            )
        return CapacityMix.parse(str(mix)).fixed(num)[pid]
    except ClientInputError:
        raise
    except ValueError as err:
        raise ClientInputError(str(err)) from err


def capacity_reply(msg: Message, rate: float) -> Message:
    """Build the reply to a capacity request."""
    record = ConfigRecord({"phase": "capacity", "rate": float(rate)})
    return Message(RecordDict({WIDTH_KEY: record}), reply_to=msg)


def width_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Client mod of width extraction (module docstring).

    Parameters
    ----------
    msg : Message
        The incoming message.
    context : Context
        The node's context (its node config holds the capacity).
    call_next : ClientAppCallable
        The rest of the ClientApp.

    Returns
    -------
    Message
        The capacity reply, the train reply with the assignment's digest added, or the
        untouched reply of ``call_next``.

    Raises
    ------
    ClientInputError
        If the width record is malformed, the node has no valid capacity, or the train
        function's reply does not match the slice it was given.
    """
    record = msg.content.config_records.get(WIDTH_KEY)
    if record is None or not msg.metadata.message_type.startswith(MessageType.TRAIN):
        return call_next(msg, context)
    phase = record.get("phase")
    if phase == "capacity":
        return capacity_reply(msg, capacity_of(context))
    if phase != "train":
        raise ClientInputError("unknown width phase")
    assignment = WidthAssignment.from_bytes(record.get("assignment"))
    config_key = record.get("config-key")
    if not isinstance(config_key, str) or config_key not in msg.content.config_records:
        raise ClientInputError("the width record names no config record of the message")
    arrays = list(msg.content.array_records.values())
    if len(arrays) != 1:
        raise ClientInputError("a width train message must carry one ArrayRecord")
    sent = {name: tuple(array.shape) for name, array in arrays[0].items()}
    msg.content.config_records[config_key][RATE_CONFIG_KEY] = assignment.rate
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    trained = list(reply.content.array_records.values())
    if len(trained) != 1:
        raise ClientInputError("the train reply must hold exactly one ArrayRecord")
    got = {name: tuple(array.shape) for name, array in trained[0].items()}
    if got != sent:
        wrong = [
            f"{n}: {got.get(n)} (expected {sent.get(n)})"
            for n in sorted(set(got) | set(sent))
            if got.get(n) != sent.get(n)
        ]
        raise ClientInputError(
            f"the train reply does not match the width slice at rate {assignment.rate} "
            f"(build the model from config[{RATE_CONFIG_KEY!r}]): {'; '.join(wrong[:4])}"
        )
    reply.content[WIDTH_KEY] = ConfigRecord({"phase": "train", "digest": assignment.digest})
    return reply
