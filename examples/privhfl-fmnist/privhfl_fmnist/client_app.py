"""privhfl-fmnist: the ClientApp — one node of PrivHFL with its own architecture and data.

There is no ``@app.train`` of the usual kind: :class:`~flwr_fsl.families.privhfl.mod.PrivHFLClient`
registers PrivHFL's handlers (``train.privhfl``: local training and re-training,
``query.privhfl``: query generation and answering — the secure arm's keys, generate, step and
sign phases by default, or plaintext — and ``evaluate.privhfl``). The app supplies only the node's
model (:func:`~privhfl_fmnist.task.model_for`, architecture by ``partition-id``) and data
(:func:`~privhfl_fmnist.task.node_data`). The node's trained weights stay in its
``Context.state``; no weight ever leaves it.

Each querier draws its query seeds itself (``os.urandom``), so the server cannot recompute
which private images a query mixes. A node that wants repeatable query sets sets its own key in
its node config (``privhfl-query-key``, 32+ hex digits, e.g. ``flower-supernode --node-config
"privhfl-query-key='...'"``): the key stays on the node, unlike a key written here, which
whoever builds this app (the server's side, in a deployment) would know.
"""

from __future__ import annotations

import dataclasses

from flwr.app import Context
from flwr.clientapp import ClientApp
from torch import nn

from flwr_fsl.families.privhfl.mod import PrivateData, PrivHFLClient
from privhfl_fmnist.task import Settings, model_for, node_data, partition_id


def query_key(context: Context) -> bytes | None:
    """Return this node's own query-seed key (node config ``privhfl-query-key``), if it has one."""
    value = context.node_config.get("privhfl-query-key")
    return bytes.fromhex(str(value)) if value else None


def model_fn(context: Context) -> nn.Module:
    """Return this node's untrained model (its architecture from ``partition-id``)."""
    return model_for(Settings.from_run_config(context.run_config), partition_id(context))


def data_fn(context: Context) -> PrivateData:
    """Return this node's private images, its evaluation data and its own query-seed key."""
    data = node_data(Settings.from_run_config(context.run_config), partition_id(context))
    return dataclasses.replace(data, query_key=query_key(context))


app = ClientApp()
# Clients share few cores in simulation: one torch thread per ClientApp.
PrivHFLClient(model_fn, data_fn, num_threads=1).register(app)
