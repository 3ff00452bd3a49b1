"""Small ClientApps for strategy and mod tests (deterministic updates, fault injection)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable, Mod

MODEL = {
    "conv.weight": np.linspace(-1, 1, 60, dtype=np.float32).reshape(3, 4, 5),
    "emb.weight": np.zeros((12, 4), np.float32),
    "fc.bias": np.ones(7, np.float32),
    "bn.num_batches_tracked": np.array(3, np.int64),
}


def model_record() -> ArrayRecord:
    return ArrayRecord({k: Array(v.copy()) for k, v in MODEL.items()})


def node_delta(pid: int, server_round: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([pid, server_round, sum(map(ord, name))])
    return rng.normal(size=shape).astype(np.float32)


def make_app(mods: list[Mod] | None = None) -> ClientApp:
    """A ClientApp whose train adds a deterministic per-node, per-round delta."""
    app = ClientApp(mods=mods or [])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        arrays = msg.content["arrays"]
        new = {}
        for name, array in arrays.items():
            value = array.numpy()
            if np.issubdtype(value.dtype, np.floating):
                value = value + node_delta(pid, rnd, name, value.shape)
            else:
                value = value + 1
            new[name] = Array(np.asarray(value, order="C"))
        metrics = MetricRecord({"num-examples": 10 * (pid + 1), "train-loss": float(pid)})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        metrics = MetricRecord({"num-examples": 5, "eval-loss": float(pid)})
        return Message(RecordDict({"metrics": metrics}), reply_to=msg)

    return app


def unit_weight_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Set the train reply's ``num-examples`` to 1 (put it outside ``topk_mod``).

    Plaintext ``FedSubAvg`` on such replies is what a secure strategy with unit weights (its
    default) computes: every client that chose a coordinate counts 1.
    """
    reply = call_next(msg, context)
    if msg.metadata.message_type == "train" and reply.has_content():
        for record in reply.content.metric_records.values():
            record["num-examples"] = 1
    return reply


def corrupt_mod(target_pid: int, corrupt: Callable[[RecordDict], RecordDict]) -> Mod:
    """A mod (put it outermost) that rewrites one node's train reply content."""

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        reply = call_next(msg, context)
        if (
            msg.metadata.message_type == "train"
            and int(context.node_config["partition-id"]) == target_pid
            and reply.has_content()
        ):
            return Message(corrupt(reply.content), reply_to=msg)
        return reply

    return mod
