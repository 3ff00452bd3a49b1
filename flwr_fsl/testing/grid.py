"""An in-process :class:`flwr.serverapp.Grid` that calls a ``ClientApp`` directly.

Strategy and client-mod tests, notebooks and the accuracy benchmarks use it instead of Ray:
the same ``ClientApp`` (with its mods) and the same strategy code run in one process in
seconds. Every message crosses the "wire" as Flower's protobuf encoding of its ``RecordDict``,
in both directions, so the client never shares objects with the server and byte counts match
a real deployment. Each node keeps its own :class:`flwr.app.Context` (``state`` persists across
rounds, as on a SuperNode; like a SuperNode, it refuses a ClientApp that changes the run config).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Sequence

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.app.user_config import UserConfig
from flwr.clientapp import ClientApp
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

log = logging.getLogger(__name__)

_SERVER_NODE_ID = 0
_CLIENT_ERROR_CODE = 1  # Flower's ErrorCode.CLIENT_APP_RAISED_EXCEPTION


def _copy_content(content: RecordDict) -> RecordDict:
    return recorddict_from_proto(recorddict_to_proto(content))


class InProcessGrid(Grid):
    """A Grid whose nodes are ``ClientApp`` calls in this process.

    Parameters
    ----------
    client_app : ClientApp
        The ClientApp (with its mods) every node runs.
    num_nodes : int
        Number of nodes (SuperNodes) in the grid.
    run_config : dict, optional
        The run config every node's ``Context.run_config`` holds.
    node_config_fn : Callable[[int], dict], optional
        Node index -> node config; defaults to
        ``{"partition-id": i, "num-partitions": num_nodes}``.
    run_id : int
        Run id stamped on messages.
    drop_nodes : Callable[[int, Message], bool], optional
        Fault injection for tests: if it returns True for ``(node_id, message)`` the node's
        reply is lost (as if the node went offline after receiving the message).
    tamper_replies : Callable[[int, Message, Message], Sequence[Message]], optional
        Fault injection for tests: called with ``(node_id, request, reply)`` for every reply
        (after ``drop_nodes``); the server receives the returned messages instead, in order
        (none: the reply is lost; two: a duplicate or a stale reply). See
        :mod:`flwr_fsl.testing.faults`.

    Raises
    ------
    ValueError
        If ``num_nodes`` is not positive.
    """

    #: Every reply exists when :meth:`push_messages` returns (a missing one never comes), so a
    #: caller that pulls replies as they arrive need not wait for a timeout.
    synchronous = True

    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_config: UserConfig | None = None,
        node_config_fn: Callable[[int], UserConfig] | None = None,
        run_id: int = 1,
        drop_nodes: Callable[[int, Message], bool] | None = None,
        tamper_replies: Callable[[int, Message, Message], Sequence[Message]] | None = None,
    ) -> None:
        if num_nodes <= 0:
            raise ValueError(f"num_nodes must be positive, got {num_nodes}")
        self._client_app = client_app
        self._run = Run.create_empty(run_id)
        self._run.override_config = dict(run_config or {})
        self._drop_nodes = drop_nodes
        self._tamper_replies = tamper_replies
        self._node_ids = [1000 + i for i in range(num_nodes)]
        make_config = node_config_fn or (lambda i: {"partition-id": i, "num-partitions": num_nodes})
        self._contexts = {
            node_id: Context(
                run_id=run_id,
                node_id=node_id,
                node_config=dict(make_config(i)),
                state=RecordDict(),
                run_config=dict(run_config or {}),
            )
            for i, node_id in enumerate(self._node_ids)
        }
        self._message_counter = itertools.count(1)
        self._replies: dict[str, list[Message]] = {}
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = _SERVER_NODE_ID
        TaskIdentity.task_id = 1

    # -- Grid API ---------------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        """Set the run (kept for API compatibility; the run id is fixed at construction)."""
        self._run = run

    @property
    def run(self) -> Run:
        """Run information."""
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Create a message addressed to ``dst_node_id``."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """Return the ids of all nodes."""
        return list(self._node_ids)

    def context(self, node_id: int) -> Context:
        """Return a node's persistent :class:`Context` (for inspection in tests)."""
        return self._contexts[node_id]

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message to its node, run the ClientApp, and keep the reply."""
        ids: list[str] = []
        for msg in messages:
            msg_id = f"msg-{next(self._message_counter)}"
            msg.metadata.__dict__["_message_id"] = msg_id
            ids.append(msg_id)
            reply = self._deliver(msg)
            if reply is None:
                continue
            replies = [reply]
            if self._tamper_replies is not None:
                replies = list(self._tamper_replies(msg.metadata.dst_node_id, msg, reply))
            if replies:
                self._replies[msg_id] = replies
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Return (and forget) the replies to the given message ids that exist."""
        return [r for i in message_ids if i in self._replies for r in self._replies.pop(i)]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Push the messages and return every reply (calls are synchronous here)."""
        return self.pull_messages(self.push_messages(messages))

    # -- internals ------------------------------------------------------------------------
    def _deliver(self, msg: Message) -> Message | None:
        node_id = msg.metadata.dst_node_id
        if node_id not in self._contexts:
            raise ValueError(f"unknown destination node {node_id}")
        received = Message(
            _copy_content(msg.content),
            node_id,
            msg.metadata.message_type,
            group_id=msg.metadata.group_id,
        )
        # The client sees the message as addressed to it, from the server.
        received.metadata.__dict__["_message_id"] = msg.metadata.message_id
        received.metadata.__dict__["_src_node_id"] = _SERVER_NODE_ID
        received.metadata.__dict__["_dst_node_id"] = node_id
        started = time.monotonic()
        context = self._contexts[node_id]
        run_config = dict(context.run_config)
        try:
            reply = self._client_app(received, context)
            if context.run_config != run_config:
                # As Flower's SuperNode: a ClientApp may not change the run config.
                context.run_config.clear()
                context.run_config.update(run_config)
                raise ValueError(
                    "The `run_config` field of the `Context` object cannot be modified"
                )
        except Exception as exc:
            log.warning("node %s raised %s: %s", node_id, type(exc).__name__, exc)
            return Message(
                Error(code=_CLIENT_ERROR_CODE, reason=f"{type(exc).__name__}: {exc}"),
                reply_to=msg,
            )
        log.debug("node %s answered in %.3fs", node_id, time.monotonic() - started)
        if self._drop_nodes is not None and self._drop_nodes(node_id, msg):
            return None
        if reply.has_error():
            return Message(reply.error, reply_to=msg)
        out = Message(_copy_content(reply.content), reply_to=msg)
        return out

    def __repr__(self) -> str:
        return f"InProcessGrid(num_nodes={len(self._node_ids)})"
