"""width-mnist: a Flower ClientApp whose clients train the width their capacity allows.

The ``@app.train`` function is that of any Flower PyTorch app — load the received arrays
into the model, train on the local data, reply the trained weights, ``train_loss`` and
``num-examples`` — with one change: it builds the model at the rate the client mod writes into
the config (``config["width-rate"]``; 1 when no mod set it). The mods do the rest:

- :func:`~flwr_fsl.mods.width_mod` (FedRolex / HeteroFL / random / plaintext shards, and the
  full-width target): the server sends each client only its width slice; the mod answers the
  capacity question from the node config (``width-rate``) or the run config's ``width-mix``,
  sets the rate, and checks the reply's shapes;
- :func:`~flwr_fsl.mods.sesa_mod` (SESA): the client secretly picks its shards, cuts its
  narrow model out of the whole global model it downloads, and replies a masked fixed-point
  shard vector instead of the trained weights (it answers SESA's other three phases itself).

Messages without either mod's record (Flower's own ``FedAvg`` arm) reach ``train`` untouched.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.families.width.records import RATE_CONFIG_KEY
from flwr_fsl.mods import sesa_mod, width_mod
from width_mnist.task import Settings, build_model, node_data
from width_mnist.task import train as train_fn

# The change to a standard Flower app: the two client mods.
app = ClientApp(mods=[sesa_mod, width_mod])


def train_seed(settings: Settings, server_round: int, partition_id: int) -> int:
    """Return the seed of one client's local training in one round (shuffling of its batches)."""
    return settings.seed + 1000 * server_round + partition_id


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received (narrow) model on the local partition."""
    settings = Settings.from_run_config(context.run_config)
    config = msg.content["config"]
    rate = float(config.get(RATE_CONFIG_KEY, 1.0))  # set by width_mod / sesa_mod
    net = build_model(settings.model, rate)
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = node_data(context)
    seed = train_seed(
        settings, int(config.get("server-round", 0)), int(context.node_config["partition-id"])
    )
    loss = train_fn(
        net,
        x,
        y,
        epochs=settings.local_epochs,
        lr=float(config.get("lr", settings.lr)),
        batch_size=settings.batch_size,
        seed=seed,
    )
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(x)})
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)
