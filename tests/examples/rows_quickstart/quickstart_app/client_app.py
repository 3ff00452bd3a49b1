"""rows-app: the ClientApp, one user whose rated items are its private rows."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.mods import PrivateRows
from quickstart_app.task import Net, load_data, my_item_ids
from quickstart_app.task import train as train_fn

rows = PrivateRows("item_emb.weight", rows=my_item_ids)
app = ClientApp(mods=[rows.mod])
app.query("psr")(rows.query)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the model on local data (the table holds this user's rows only)."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    items, ratings = load_data(
        context.node_config["partition-id"], context.node_config["num-partitions"]
    )
    train_loss = train_fn(
        model, items, ratings, context.run_config["local-epochs"], msg.content["config"]["lr"]
    )
    metrics = {"train_loss": train_loss, "num-examples": len(ratings)}
    content = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}
    )
    return Message(content=content, reply_to=msg)


torch.set_num_threads(1)
