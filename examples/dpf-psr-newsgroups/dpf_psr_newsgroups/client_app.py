"""dpf-psr-newsgroups: the ClientApp — one client's documents, with private word rows.

The client's ``@app.train`` is ordinary minibatch SGD: it receives the table and the classifier
head, trains the rows of its own words and the head, and returns both. What differs between the
two runs of the ServerApp is how they travel:

- **secure** (index mode, a mixed round): :class:`~flwr_fsl.families.ssa.mixed_mod.PrivateTables`
  retrieves the client's word rows with two-server PSR in a ``query.psr`` phase (neither server
  learns which words), fills them into an otherwise zero table for ``@app.train``, and uploads
  the changed rows as mega-elements with SSA, and the head (sent in the clear: it is the public
  global model) as a dense part of the same two-server round;
- **plaintext** baseline: the train message carries the whole model, and ``@app.train``
  replies with a row-sparse update of the same rows and counts plus the dense head
  (:mod:`flwr_fsl.submodel` codec) for :class:`~flwr_fsl.strategies.FedSubAvg` — which shows
  the server every client's word set.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from numpy.typing import NDArray

from dpf_psr_newsgroups.task import (
    HEAD,
    TABLE,
    ClientData,
    Settings,
    client_data,
    model_tables,
    table_shape,
    train_client,
)
from flwr_fsl.core.records import encode_update
from flwr_fsl.families.ssa.mixed_mod import PrivateTables
from flwr_fsl.families.ssa.records import find_ssa_round
from flwr_fsl.submodel import Encoding, SubmodelUpdate, TensorUpdate


def _client(context: Context) -> tuple[int, Settings, ClientData]:
    settings = Settings.from_run_config(context.run_config)
    pid = int(context.node_config["partition-id"])
    num = int(context.node_config["num-partitions"])
    return pid, settings, client_data(pid, num, settings)


def client_rows(context: Context) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Return the client's row set (its words) and each row's count."""
    _, _, data = _client(context)
    return data.rows, data.counts


# The table names must match the server's; each table's max_rows comes with the round.
rows = PrivateTables(model_tables(Settings()), rows=client_rows)


app = ClientApp(mods=[rows.mod])


@app.query("psr")
def query(msg: Message, context: Context) -> Message:
    """Answer the retrieval phase with PSR keys for this client's rows."""
    return rows.query(msg, context)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the client's word rows and the head on its documents."""
    pid, settings, data = _client(context)
    server_round = int(msg.content["config"].get("server-round", 0))  # type: ignore[arg-type]
    arrays = msg.content.array_records["arrays"]
    received, head = arrays[TABLE].numpy(), arrays[HEAD].numpy()
    trained, trained_head, loss = train_client(
        received,
        head,
        data,
        table_shape(settings),
        epochs=settings.local_epochs,
        lr=settings.lr,
        batch_size=settings.batch_size,
        seed=settings.seed * 1_000_003 + 1000 * server_round + pid,
    )
    metrics = MetricRecord({"train-loss": loss, "num-examples": len(data.docs)})
    if find_ssa_round(msg.content) is not None:
        # Secure run: return the whole model; PrivateTables uploads only this client's rows
        # and the head.
        out = ArrayRecord({TABLE: Array(trained), HEAD: Array(trained_head)})
        return Message(RecordDict({"arrays": out, "metrics": metrics}), reply_to=msg)
    # Plaintext run: the same rows' deltas and counts, and the head's delta, in the clear.
    delta = trained[data.rows] - received[data.rows]
    rows_part = TensorUpdate(Encoding.ROWS, delta, np.array(data.rows), np.array(data.counts))
    head_part = TensorUpdate(Encoding.DENSE, trained_head - head)
    update = SubmodelUpdate({TABLE: rows_part, HEAD: head_part})
    content = encode_update(update)
    content["metrics"] = metrics
    return Message(content, reply_to=msg)
