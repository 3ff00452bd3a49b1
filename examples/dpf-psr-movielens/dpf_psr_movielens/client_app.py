"""dpf-psr-movielens: the ClientApp — one MovieLens user with private item rows.

The user's ``@app.train`` is ordinary matrix-factorisation SGD: it receives the model, trains
the item rows of its own ratings and its personal parameters, and returns the full item table.
What differs between the two runs of the ServerApp is how the rows travel:

- **secure** (index mode): :class:`~flwr_fsl.families.ssa.index_mod.PrivateRows` retrieves the
  user's rows with two-server PSR in a ``query.psr`` phase (neither server learns which rows), fills
  them into an otherwise zero table for ``@app.train``, and uploads the changed rows as
  mega-elements with SSA — from the second round on as U-DPF hints, since the row set is fixed;
- **plaintext** baseline: the train message carries the whole table, and ``@app.train``
  replies with a row-sparse update (:mod:`flwr_fsl.submodel` codec) of the same rows for
  :class:`~flwr_fsl.strategies.FedSubAvg`.

The user embedding and bias never leave the node: they live in ``Context.state``, one set per
training (the ServerApp names each training with ``training-id``, so the plaintext run after
the secure one starts from fresh personal parameters).
"""

from __future__ import annotations

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from numpy.typing import NDArray

from dpf_psr_movielens.task import (
    TABLE,
    Settings,
    UserData,
    initial_user,
    mse,
    train_user,
    user_data,
)
from flwr_fsl.core.records import encode_update
from flwr_fsl.families.ssa.index_mod import PrivateRows
from flwr_fsl.families.ssa.records import find_ssa_round
from flwr_fsl.submodel import Encoding, SubmodelUpdate, TensorUpdate

USER_STATE = "movielens.user"
USER_ARRAYS = "movielens.user.params"
TRAINING_ID = "training-id"


def _user(context: Context) -> tuple[int, Settings, UserData]:
    settings = Settings.from_run_config(context.run_config)
    user = int(context.node_config["partition-id"])
    return user, settings, user_data(user, settings.max_rows, settings.test_fraction, settings.seed)


def client_rows(context: Context) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Return the user's row set and a count of 1 per row.

    A user rates an item at most once, so each row's update rests on exactly one rating: every
    user that updated a row gets the same weight in that row's average.
    """
    _, _, data = _user(context)
    return data.rows, np.ones(data.rows.size)


rows = PrivateRows(TABLE, rows=client_rows)


app = ClientApp(mods=[rows.mod])


@app.query("psr")
def query(msg: Message, context: Context) -> Message:
    """Answer the retrieval phase with PSR keys for this user's rows."""
    return rows.query(msg, context)


def load_user_params(context: Context, training: str, settings: Settings) -> NDArray[np.float32]:
    """Return the user's personal parameters of this training (fresh ones if none yet)."""
    state = context.state.config_records.get(USER_STATE)
    if state is not None and state.get(TRAINING_ID) == training:
        return context.state.array_records[USER_ARRAYS]["params"].numpy()
    return initial_user(settings, int(context.node_config["partition-id"]))


def store_user_params(context: Context, training: str, params: NDArray[np.float32]) -> None:
    """Keep the user's personal parameters in ``Context.state`` (they are never sent)."""
    context.state[USER_STATE] = ConfigRecord({TRAINING_ID: training})
    context.state[USER_ARRAYS] = ArrayRecord({"params": Array(params)})


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the user's item rows and personal parameters on its training ratings."""
    user, settings, data = _user(context)
    config = msg.content["config"]
    training = str(config.get(TRAINING_ID, ""))
    server_round = int(config.get("server-round", 0))  # type: ignore[arg-type]
    received = msg.content.array_records["arrays"][TABLE].numpy()
    trained, params, loss = train_user(
        received,
        load_user_params(context, training, settings),
        data.train_items,
        data.train_ratings,
        mean=settings.global_mean,
        epochs=settings.local_epochs,
        lr=settings.lr,
        reg=settings.reg,
        seed=settings.seed * 1_000_003 + 1000 * server_round + user,
    )
    store_user_params(context, training, params)
    metrics = MetricRecord({"train-mse": loss, "num-examples": int(data.train_items.size)})
    if find_ssa_round(msg.content) is not None:
        # Secure run: return the whole table; PrivateRows uploads only this user's rows.
        arrays = ArrayRecord({TABLE: Array(trained)})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
    # Plaintext run: send the same rows' deltas in the clear (row-sparse codec, count 1 each).
    idx, counts = client_rows(context)
    delta = trained[idx] - received[idx]
    update = SubmodelUpdate({TABLE: TensorUpdate(Encoding.ROWS, delta, idx, counts)})
    content = encode_update(update)
    content["metrics"] = metrics
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Return the squared error on the user's held-out ratings (full table, local params)."""
    _, settings, data = _user(context)
    training = str(msg.content["config"].get(TRAINING_ID, ""))
    table = msg.content.array_records["arrays"][TABLE].numpy()
    params = load_user_params(context, training, settings)
    error = mse(table, params, data.test_items, data.test_ratings, settings.global_mean)
    baseline = float(np.mean((np.float32(settings.global_mean) - data.test_ratings) ** 2))
    metrics = MetricRecord(
        {"mse": error, "mean-only-mse": baseline, "num-examples": int(data.test_items.size)}
    )
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
