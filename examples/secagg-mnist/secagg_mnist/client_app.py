"""secagg-mnist: a Flower ClientApp whose train replies leave the client masked (Bonawitz SecAgg).

The ``@app.train`` and ``@app.evaluate`` functions are those of any Flower PyTorch app: they
receive the full model and return the full trained weights, ``train_loss`` and
``num-examples``. ``secagg_mod`` answers the protocol's control phases (key advertisement, key
sharing, unmasking) itself and, on the SecAgg train phase, replaces the reply by one masked
vector of uint64 words holding ``w_i - w`` and the weight 1 (``num-examples * (w_i - w)`` and
``num-examples`` with ``weighted = true``); ``train_loss`` stays on the client. Plain train
messages (no SecAgg record: the FedAvg arm) and evaluation pass through untouched, so one
ClientApp serves every arm of the comparison.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.mods import secagg_mod
from secagg_mnist.task import Net, load_data
from secagg_mnist.task import test as test_fn
from secagg_mnist.task import train as train_fn

# The only change to a standard Flower app: the SecAgg client mod.
app = ClientApp(mods=[secagg_mod])


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on the local partition."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x_train, y_train, _, _ = load_data(context)
    config = msg.content["config"]
    seed = int(context.run_config.get("seed", 42))
    seed += 1000 * int(config.get("server-round", 0)) + int(context.node_config["partition-id"])
    torch.manual_seed(seed)
    train_loss = train_fn(
        model,
        x_train,
        y_train,
        epochs=int(context.run_config.get("local-epochs", 1)),
        lr=float(config.get("lr", context.run_config.get("lr", 0.05))),
        batch_size=int(context.run_config.get("batch-size", 32)),
        seed=seed,
    )
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(x_train)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the local validation split."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    _, _, x_val, y_val = load_data(context)
    loss, accuracy = test_fn(model, x_val, y_val)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(x_val)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
