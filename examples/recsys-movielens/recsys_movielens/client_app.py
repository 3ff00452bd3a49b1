"""recsys-movielens: the ClientApp — one MovieLens user training the DIN-like CTR model.

``@app.train`` is ordinary local training (:func:`flwr_fsl.models.din.train_samples`: Adam with
fresh state each round, so only the rows of the user's items and their genres move). What it
returns depends on the arm (the ``upload`` key of the train config):

- ``"dense"`` (FedAvg): every tensor's delta, dense —
  :class:`~flwr_fsl.strategies.FedSubAvg` on dense replies is FedAvg (weighted by
  ``num-examples``);
- ``"rows"`` (plaintext FedSubAvg): the item rows and genre rows it trained as row-sparse
  deltas (count 1 each) and the dense tensors' deltas;
- ``"model"`` (the secure arms): the whole trained model; the client mods turn it into the
  protocol's upload (``secagg_mod``: one masked vector of the whole model).

The client's rows of each table come from :func:`recsys_movielens.task.user_rows` (its
training items; the genres through the public item -> genre map). Evaluation is centralized
(the ServerApp's ``evaluate_fn``), so there is no ``@app.evaluate``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.records import encode_update
from flwr_fsl.models.din import train_samples
from flwr_fsl.mods import secagg_mod
from flwr_fsl.submodel import Encoding, SubmodelUpdate, TensorUpdate
from recsys_movielens.task import Settings, settings_config, settings_ctr, user_rows

UPLOAD_KEY = "upload"
UPLOADS = ("dense", "rows", "model")

torch.set_num_threads(1)  # one client per core: the simulation runs many side by side

app = ClientApp(mods=[secagg_mod])


def _user(context: Context) -> tuple[int, Settings]:
    return int(context.node_config["partition-id"]), Settings.from_run_config(context.run_config)


def row_update(
    received: dict[str, NDArray[Any]],
    trained: dict[str, NDArray[Any]],
    rows: dict[str, NDArray[np.int64]],
) -> SubmodelUpdate:
    """Return the plaintext submodel update: row-sparse deltas of the tables, dense the rest."""
    tensors = {}
    for name, new in trained.items():
        delta = (new - received[name]).astype(np.float32)
        if name in rows:
            idx = rows[name]
            counts = np.ones(idx.size, np.float64)
            tensors[name] = TensorUpdate(Encoding.ROWS, delta[idx], idx, counts)
        else:
            tensors[name] = TensorUpdate(Encoding.DENSE, delta)
    return SubmodelUpdate(tensors)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train on the user's samples; reply as the arm's ``upload`` key asks."""
    user, settings = _user(context)
    config = msg.content["config"]
    upload = str(config.get(UPLOAD_KEY, "model"))
    if upload not in UPLOADS:
        raise ConfigurationError(f"train config {UPLOAD_KEY!r} must be one of {UPLOADS}")
    server_round = int(config.get("server-round", 0))  # type: ignore[arg-type]
    data = settings_ctr(settings, user)
    received = {k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}
    trained, loss = train_samples(
        settings_config(settings),
        received,
        data.train,
        epochs=settings.local_epochs,
        lr=settings.lr,
        batch_size=settings.batch_size,
        seed=settings.seed * 1_000_003 + 1000 * server_round + user,
    )
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(data.train)})
    if upload == "model":
        arrays = ArrayRecord({k: Array(v) for k, v in trained.items()})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
    if upload == "rows":
        update = row_update(received, trained, user_rows(settings, user))
    else:
        deltas = {
            k: TensorUpdate(Encoding.DENSE, (v - received[k]).astype(np.float32))
            for k, v in trained.items()
        }
        update = SubmodelUpdate(deltas)
    content = encode_update(update)
    content["metrics"] = metrics
    return Message(content, reply_to=msg)
