"""privhfl-fmnist: the ClientApp — one node of PrivHFL with its own architecture and data.

There is no ``@app.train`` of the usual kind: :class:`~flwr_fsl.families.privhfl.mod.PrivHFLClient`
registers PrivHFL's handlers (``train.privhfl``: local training and re-training,
``query.privhfl``: query generation and answering — plaintext, or the secure arm's keys,
generate, step and sign phases — and ``evaluate.privhfl``). The app supplies only the node's
model (:func:`~privhfl_fmnist.task.model_for`, architecture by ``partition-id``) and data
(:func:`~privhfl_fmnist.task.node_data`). The node's trained weights stay in its
``Context.state``; no weight ever leaves it.
"""

from __future__ import annotations

from flwr.app import Context
from flwr.clientapp import ClientApp
from torch import nn

from flwr_fsl.families.privhfl.mod import PrivateData, PrivHFLClient
from privhfl_fmnist.task import Settings, model_for, node_data, partition_id


def model_fn(context: Context) -> nn.Module:
    """Return this node's untrained model (its architecture from ``partition-id``)."""
    return model_for(Settings.from_run_config(context.run_config), partition_id(context))


def data_fn(context: Context) -> PrivateData:
    """Return this node's private images and its evaluation data."""
    return node_data(Settings.from_run_config(context.run_config), partition_id(context))


app = ClientApp()
# Clients share few cores in simulation: one torch thread per ClientApp.
PrivHFLClient(model_fn, data_fn, num_threads=1).register(app)
