"""dpf-ssa-mnist: the ClientApp — a plain PyTorch train/evaluate plus two client mods.

``@app.train`` returns the full trained weights, as in any Flower app. ``topk_mod`` turns
them into the top-k update (with error feedback); ``ssa_mod`` turns that sparse update into
DPF keys for the two servers: S0's in the clear, S1's sealed to S1's public key, which the
mod checks against the key pinned in the run config (``ssa-helper-fingerprint`` or
``ssa-helper-key-file``). Train messages without SSA parameters (the plaintext comparison
run) pass ``ssa_mod`` untouched.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from dpf_ssa_mnist.task import Net, Settings, client_data, client_seed
from flwr_fsl.models import evaluate as evaluate_model
from flwr_fsl.models import train_one
from flwr_fsl.mods import ssa_mod, topk_mod

# The secure upload: ssa_mod (outermost) encodes what topk_mod (inner) selected.
app = ClientApp(mods=[ssa_mod, topk_mod])


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model on the local partition; return the full weights."""
    settings = Settings.from_run_config(context.run_config)
    config = msg.content.config_records["config"]
    server_round = int(config.get("server-round", 0))  # type: ignore[arg-type]
    x_train, y_train, _, _ = client_data(context)
    seed = client_seed(settings.task.seed, server_round, int(context.node_config["partition-id"]))
    torch.manual_seed(seed)
    model = Net()
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    train_loss = train_one(
        model,
        x_train,
        y_train,
        epochs=settings.task.local_epochs,
        lr=float(config.get("lr", settings.task.lr)),  # type: ignore[arg-type]
        batch_size=settings.task.batch_size,
        seed=seed,
    )
    metrics = MetricRecord({"train_loss": train_loss, "num-examples": len(x_train)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the local validation split."""
    model = Net()
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    _, _, x_val, y_val = client_data(context)
    loss, accuracy = evaluate_model(model, x_val, y_val)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(x_val)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
