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
  :class:`~flwr_fsl.families.width.rules.WidthAssignment` and
  :class:`~flwr_fsl.families.width.messages.WidthSettings` (strict codecs), writes the rate
  into the message's config (the settings' ``config_key``) as :data:`RATE_CONFIG_KEY` and
  runs your function (the width record stays
  beside the usual records; a train function that reads its usual keys ignores it). It checks
  that the reply's one ``ArrayRecord`` has exactly the tensors and shapes it received (a
  model built at the wrong rate is reported here, on the client, with the shapes), and adds a
  record naming the assignment's digest, by which the server matches the reply to the slice
  it sent.

The two phases are :data:`~flwr_fsl.families.width.records.CAPACITY` and
:data:`~flwr_fsl.families.width.records.TRAIN`, answered by :class:`WidthMod`, a
:class:`~flwr_fsl.core.phases.PhaseMod`.

The server chooses (and so knows) every client's channels; this mod hides nothing. Errors
raise :class:`~flwr_fsl.core.errors.ClientInputError` (Flower turns them into an error reply, and
the server drops the node from the round with the text as the reason).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from flwr.app import Context, Message
from flwr.clientapp.typing import ClientAppCallable

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.phases import Phase, PhaseMod
from flwr_fsl.families.width.records import (
    CAPACITY,
    RATE_CONFIG_KEY,
    RATE_NODE_CONFIG_KEY,
    TRAIN,
    WIDTH_KEY,
    CapacityReply,
    CapacityRequest,
    WidthTrainReply,
    WidthTrainRequest,
)
from flwr_fsl.families.width.rules import CapacityMix, parse_rate

__all__ = [
    "MIX_RUN_CONFIG_KEY",
    "RATE_CONFIG_KEY",
    "RATE_NODE_CONFIG_KEY",
    "WIDTH_KEY",
    "WidthMod",
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
    return Message(CapacityReply(rate).to_record(), reply_to=msg)


def _shapes(record: Any) -> dict[str, tuple[int, ...]]:
    return {name: tuple(array.shape) for name, array in record.items()}


class WidthMod(PhaseMod):
    """The client side of ``WidthFedAvg`` (the module docstring) as a phase mod."""

    family: ClassVar[str] = WIDTH_KEY
    title: ClassVar[str] = "width"
    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = {p.name: p for p in (CAPACITY, TRAIN)}

    @staticmethod
    def on_capacity(request: CapacityRequest, context: Context) -> CapacityReply:
        """Answer the node's capacity (the train function is not called)."""
        return CapacityReply(capacity_of(context))

    @staticmethod
    def on_train(
        request: WidthTrainRequest, context: Context, train: Callable[[], Message]
    ) -> WidthTrainReply | Message:
        """Set the rate in the train config, run the train function, check its slice."""
        config_key = request.settings.config_key
        configs = request.beside.config_records
        if config_key not in configs:
            raise ClientInputError("the width record names no config record of the message")
        arrays = list(request.beside.array_records.values())
        if len(arrays) != 1:
            raise ClientInputError("a width train message must carry one ArrayRecord")
        sent = _shapes(arrays[0])
        rate = request.assignment.rate
        # The request's records are the message's own: the train function sees the rate.
        configs[config_key][RATE_CONFIG_KEY] = rate
        reply = train()
        if reply.has_error():
            return reply
        trained = list(reply.content.array_records.values())
        if len(trained) != 1:
            raise ClientInputError("the train reply must hold exactly one ArrayRecord")
        got = _shapes(trained[0])
        if got != sent:
            wrong = [
                f"{n}: {got.get(n)} (expected {sent.get(n)})"
                for n in sorted(set(got) | set(sent))
                if got.get(n) != sent.get(n)
            ]
            raise ClientInputError(
                f"the train reply does not match the width slice at rate {rate} "
                f"(build the model from config[{RATE_CONFIG_KEY!r}]): {'; '.join(wrong[:4])}"
            )
        return WidthTrainReply(request.assignment.digest, reply.content)


_MOD = WidthMod()


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
    return _MOD(msg, context, call_next)
