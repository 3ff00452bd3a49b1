"""InProcessGrid: wire copies, persistent node state, Flower's run-config rule, fault injection."""

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.testing import InProcessGrid


def _app() -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        arrays = msg.content["arrays"]
        arrays["w"] = Array(arrays["w"].numpy() + 1)  # mutates the client's copy only
        calls = int(context.state.config_records.get("n", ConfigRecord({"n": 0}))["n"]) + 1
        context.state["n"] = ConfigRecord({"n": calls})
        if context.run_config.get("misbehave"):
            context.run_config["topk-ratio"] = 0.5
        metrics = MetricRecord({"num-examples": 1, "calls": calls})
        return Message(RecordDict({"arrays": arrays, "m": metrics}), reply_to=msg)

    return app


def _message(grid: InProcessGrid, record: ArrayRecord) -> Message:
    node = next(iter(grid.get_node_ids()))
    return Message(RecordDict({"arrays": record}), node, "train")


def test_messages_are_copies_and_state_persists() -> None:
    grid = InProcessGrid(_app(), 1)
    record = ArrayRecord({"w": Array(np.zeros(3, np.float32))})
    for expected_calls in (1, 2):
        (reply,) = grid.send_and_receive([_message(grid, record)])
        assert reply.content["m"]["calls"] == expected_calls
        np.testing.assert_array_equal(reply.content["arrays"]["w"].numpy(), np.ones(3))
    np.testing.assert_array_equal(record["w"].numpy(), np.zeros(3))


def test_changing_the_run_config_is_an_error_reply() -> None:
    grid = InProcessGrid(_app(), 1, {"misbehave": True})
    record = ArrayRecord({"w": Array(np.zeros(3, np.float32))})
    (reply,) = grid.send_and_receive([_message(grid, record)])
    assert reply.has_error() and "run_config" in reply.error.reason
    assert dict(grid.context(next(iter(grid.get_node_ids()))).run_config) == {"misbehave": True}


def test_dropped_node_sends_no_reply() -> None:
    grid = InProcessGrid(_app(), 2, drop_nodes=lambda node, _: True)
    record = ArrayRecord({"w": Array(np.zeros(3, np.float32))})
    assert list(grid.send_and_receive([_message(grid, record)])) == []
