"""quickstart-app: a Flower / PyTorch app."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from quickstart_app.task import Net, load_data
from quickstart_app.task import test as test_fn
from quickstart_app.task import train as train_fn

# Flower ClientApp
app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the model on local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    x, y = load_data(partition_id, num_partitions)
    train_loss = train_fn(
        model, x, y, context.run_config["local-epochs"], msg.content["config"]["lr"]
    )
    model_record = ArrayRecord(model.state_dict())
    metrics = {"train_loss": train_loss, "num-examples": len(y)}
    content = RecordDict({"arrays": model_record, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the model on local data."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = load_data(context.node_config["partition-id"], context.node_config["num-partitions"])
    eval_loss, eval_acc = test_fn(model, x, y)
    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(y)}
    content = RecordDict({"metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


torch.set_num_threads(1)
