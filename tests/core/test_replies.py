"""Which reply is a node's answer (flwr_fsl.core.replies): stale, duplicated, equivocating, error.

Issue 24 item 7: a reply that fails the round/phase checks must not block the same node's valid
reply; a duplicated reply in a streamed phase costs nothing (identical) or only its node
(different); the SuperLink's "Node Unavailable" error reply (source node 1) is recorded under
the node its request was sent to.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.app.error import Error

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.strategies import FedSubAvg, RoundState
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import make_app

SUPERLINK_NODE_ID = 1  # flwr.common.constant.SUPERLINK_NODE_ID


@pytest.fixture(autouse=True)
def _task_identity() -> None:
    InProcessGrid(make_app(), 1)  # sets Flower's TaskIdentity, which Message() needs


def _number(_node: int, content: RecordDict) -> int:
    value = content["m"]["x"]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ClientInputError("x must be an int")
    return value


def _reply(request: Message, x: object) -> Message:
    return Message(RecordDict({"m": ConfigRecord({"x": x})}), reply_to=request)  # type: ignore[dict-item]


class _ScriptedGrid:
    """A grid whose replies per pull are scripted from the pushed messages."""

    synchronous = True

    def __init__(self, script: object) -> None:
        self.script = script
        self.sent: list[Message] = []

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for i, msg in enumerate(messages):
            msg.metadata.__dict__["_message_id"] = f"m{i}"
            self.sent.append(msg)
            ids.append(f"m{i}")
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        by_node = {m.metadata.dst_node_id: m for m in self.sent}
        return self.script(by_node)  # type: ignore[operator,no-any-return]


def _stream(script: object, nodes: list[int]) -> tuple[dict[int, int], RoundState]:
    strategy = FedSubAvg()
    state = strategy.round_state(3)
    state.sampled, state.survivors = list(nodes), list(nodes)
    content = RecordDict({"c": ConfigRecord({"x": 0})})
    messages = strategy.prepare(state, "p", dict.fromkeys(nodes, content), "query.p")
    got = dict(strategy.stream(_ScriptedGrid(script), state, "p", messages, _number))  # type: ignore[arg-type]
    return got, state


def test_a_duplicated_reply_in_a_streamed_phase_is_taken_once() -> None:
    got, state = _stream(
        lambda m: [_reply(m[7], 1), _reply(m[8], 2), _reply(m[7], 1)],
        [7, 8],
    )
    assert got == {7: 1, 8: 2} and state.dropped == {} and state.failure is None
    assert state.survivors == [7, 8]


def test_two_different_replies_in_a_streamed_phase_cost_only_that_node() -> None:
    got, state = _stream(
        lambda m: [_reply(m[7], 1), _reply(m[8], 2), _reply(m[7], 5)],
        [7, 8],
    )
    assert got == {8: 2} and set(state.dropped) == {7} and state.failure is None
    assert "2 different replies" in state.dropped[7]
    assert state.survivors == [8]


def test_a_stale_reply_first_does_not_block_the_fresh_one_in_a_stream() -> None:
    def script(m: dict[int, Message]) -> list[Message]:
        stale = _reply(m[7], 99)
        stale.metadata.group_id = "2"  # last round's reply
        return [stale, _reply(m[7], 1), _reply(m[8], 2)]

    got, state = _stream(script, [7, 8])
    assert got == {7: 1, 8: 2} and state.dropped == {}


def test_a_superlink_error_reply_is_recorded_under_the_node_it_was_sent_to() -> None:
    def script(m: dict[int, Message]) -> list[Message]:
        # What the SuperLink makes for a dead node: source and destination are its own id.
        error = Message(Error(code=5, reason="Error: Node Unavailable"), reply_to=m[9])
        error.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
        error.metadata.__dict__["_dst_node_id"] = SUPERLINK_NODE_ID
        return [_reply(m[7], 1), error]

    got, state = _stream(script, [7, 9])
    assert got == {7: 1}
    assert set(state.dropped) == {9} and "Node Unavailable" in state.dropped[9]


def test_receive_maps_superlink_errors_too() -> None:
    strategy = FedSubAvg()
    state = strategy.round_state(1)
    state.sampled, state.survivors = [4, 5], [4, 5]
    content = RecordDict({"c": ConfigRecord({"x": 0})})
    messages = strategy.prepare(state, "p", dict.fromkeys([4, 5], content), "query.p")
    _ScriptedGrid(None).push_messages(messages)  # assigns the message ids
    error = Message(Error(code=5, reason="Error: Node Unavailable"), reply_to=messages[1])
    error.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
    got = strategy.receive(state, "p", [_reply(messages[0], 3), error], _number)
    assert got == {4: 3} and set(state.dropped) == {5}
