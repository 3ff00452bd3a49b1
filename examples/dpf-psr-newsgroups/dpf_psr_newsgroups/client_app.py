"""dpf-psr-newsgroups: the ClientApp — one client's documents, with private word rows.

The client's ``@app.train`` is ordinary minibatch SGD: it receives the table, trains the rows
of its own words and the classifier rows, and returns the full table. What differs between the
two runs of the ServerApp is how the rows travel:

- **secure** (index mode): :class:`~flwr_fsl.families.ssa.index_mod.PrivateRows` retrieves the
  client's
  rows with two-server PSR in a ``query.psr`` phase (neither server learns which words), fills
  them into an otherwise zero table for ``@app.train``, and uploads the changed rows as
  mega-elements with SSA — from the second round on as U-DPF hints, since the row set is fixed;
- **plaintext** baseline: the train message carries the whole table, and ``@app.train``
  replies with a row-sparse update (:mod:`flwr_fsl.submodel` codec) of the same rows and counts
  for :class:`~flwr_fsl.strategies.FedSubAvg` — which shows the server every client's word set.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from numpy.typing import NDArray

from dpf_psr_newsgroups.task import (
    TABLE,
    ClientData,
    Settings,
    client_data,
    table_shape,
    train_client,
)
from flwr_fsl.core.records import encode_update
from flwr_fsl.families.ssa.index_mod import PrivateRows
from flwr_fsl.families.ssa.records import find_ssa_round
from flwr_fsl.submodel import Encoding, SubmodelUpdate, TensorUpdate


def _client(context: Context) -> tuple[int, Settings, ClientData]:
    settings = Settings.from_run_config(context.run_config)
    pid = int(context.node_config["partition-id"])
    num = int(context.node_config["num-partitions"])
    return pid, settings, client_data(pid, num, settings)


def client_rows(context: Context) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Return the client's row set (its words and the head rows) and each row's count."""
    _, _, data = _client(context)
    return data.rows, data.counts


rows = PrivateRows(TABLE, rows=client_rows)


app = ClientApp(mods=[rows.mod])


@app.query("psr")
def query(msg: Message, context: Context) -> Message:
    """Answer the retrieval phase with PSR keys for this client's rows."""
    return rows.query(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the client's word rows and the head rows on its documents."""
    pid, settings, data = _client(context)
    server_round = int(msg.content["config"].get("server-round", 0))  # type: ignore[arg-type]
    received = msg.content.array_records["arrays"][TABLE].numpy()
    trained, loss = train_client(
        received,
        data,
        table_shape(settings),
        epochs=settings.local_epochs,
        lr=settings.lr,
        batch_size=settings.batch_size,
        seed=settings.seed * 1_000_003 + 1000 * server_round + pid,
    )
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(data.docs)})
    if find_ssa_round(msg.content) is not None:
        # Secure run: return the whole table; PrivateRows uploads only this client's rows.
        arrays = ArrayRecord({TABLE: Array(trained)})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
    # Plaintext run: the same rows' deltas and counts in the clear (row-sparse codec).
    delta = trained[data.rows] - received[data.rows]
    update = SubmodelUpdate(
        {TABLE: TensorUpdate(Encoding.ROWS, delta, np.array(data.rows), np.array(data.counts))}
    )
    content = encode_update(update)
    content["metrics"] = metrics
    return Message(content, reply_to=msg)
