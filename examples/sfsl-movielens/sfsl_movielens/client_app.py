"""sfsl-movielens: the ClientApp — one MovieLens user, one ClientApp for every arm.

The user's ``@app.train`` is ordinary matrix-factorisation SGD on its own ratings; its
personal parameters ``p_u, b_u`` never leave the node (``Context.state``, one set per arm:
the ServerApp names each arm's training with ``training-id``). What differs between the arms
is how the item rows travel, and the mods in front of ``@app.train`` take care of it:

===============  =========================================================================
arm              train message -> reply
===============  =========================================================================
``fedavg``       whole table -> whole trained table (Flower's dense reply)
``fedsubavg``    whole table -> the user's rows' deltas, row-sparse, count 1 per row
``sfsl-cppK``    Niu et al.: :class:`~flwr_fsl.mods.PerturbedRows` answers the PSU and the
                 perturbation phases and masks ``(v Δ, v)`` of the rows of ``S'' ∩ S``
``ssa-psr``      Cui et al.: :class:`~flwr_fsl.mods.PrivateRows` (two-server PSR + SSA)
``secagg``       Bonawitz SecAgg: :func:`~flwr_fsl.mods.secagg_mod` masks the dense update
===============  =========================================================================

The library mods stack: each answers the SecAgg messages of its own ``instance`` and passes
the others on — :class:`~flwr_fsl.mods.PerturbedRows` the ``"union"`` / ``"rows"``
aggregations of ``SFSLFedSubAvg``, :func:`~flwr_fsl.mods.secagg_mod` the ``"model"`` one of
``SecAggFedAvg``. One ``PerturbedRows`` serves the five CPPs and the DP arm (it accepts the
paper's noiseless rounds: ``noise_floor=0.0``): ``SFSLFedSubAvg`` sends the
round's train config with the perturb phase, :func:`choose_rr` reads the arm's CPP from it
(``sfsl-cpp``; the run config's when the server names none), and ``session_key =
"training-id"`` (the harness's per-arm session id) gives every arm its own memo of permanent
answers, so no arm starts from another arm's randomized response.

:func:`timing_mod` (outermost) adds up the wall time this node spends on a round's training
messages (every phase of every protocol, mods included) and reports it as ``client-s`` in
the round's evaluate reply. Evaluation also returns the predicted and true ratings of the
held-out ratings (``scores``, ``labels``) so that the ServerApp can pool them into one AUC.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from numpy.typing import NDArray

from flwr_fsl.core.records import encode_update
from flwr_fsl.families.secagg.records import SECAGG_KEY
from flwr_fsl.families.sfsl.perturb import RRParams
from flwr_fsl.families.ssa.records import find_ssa_round
from flwr_fsl.mods import PerturbedRows, PrivateRows, secagg_mod
from flwr_fsl.submodel import Encoding, SubmodelUpdate, TensorUpdate
from sfsl_movielens.task import (
    CPPS,
    TABLE,
    Settings,
    UserData,
    initial_user,
    mse,
    predict,
    rr_params,
    train_user,
    user_data,
)

USER_STATE = "movielens.user"
USER_ARRAYS = "movielens.user.params"
CLOCK_STATE = "sfsl-movielens.clock"
TRAINING_ID = "training-id"
CPP_KEY = "sfsl-cpp"
REPLY_KEY = "reply"  # "dense" or "rows": the shape of a plaintext arm's train reply


def _user(context: Context) -> tuple[int, Settings, UserData]:
    settings = Settings.from_run_config(context.run_config)
    user = int(context.node_config["partition-id"])
    return user, settings, user_data(user, settings.max_rows, settings.test_fraction, settings.seed)


def client_rows(context: Context) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Return the user's row set and a count of 1 per row.

    A user rates an item at most once, so each row's update rests on exactly one rating: every
    user that updated a row gets the same weight in that row's average (in every arm that
    averages rows by count: fedsubavg, sfsl-*, ssa-psr).
    """
    _, _, data = _user(context)
    return data.rows, np.ones(data.rows.size)


def choose_rr(config: ConfigRecord, context: Context) -> RRParams:
    """Return the randomized response of the CPP the arm's train config names.

    The run config's ``sfsl-cpp`` when the config names none (a plain ``SFSLFedSubAvg`` run).
    """
    cpp = config.get(CPP_KEY, Settings.from_run_config(context.run_config).sfsl_cpp)
    if not isinstance(cpp, str) or cpp not in CPPS:
        raise ValueError(f"the server asks for an unknown CPP (one of {', '.join(CPPS)})")
    return rr_params(cpp)


ssa_rows = PrivateRows(TABLE, rows=client_rows)
# A comparison app: it serves the paper's noiseless arms (sfsl-cpp1..5) beside the DP defaults
# (sfsl-dp), so its clients accept rounds without noise (noise_floor=0.0; a deployed client
# keeps the default floor 1.0 and refuses them), and every arm is its own training with its own
# memo scope (session_key), which outlives no run (persist_memo=False; a deployment keeps one
# scope, persisted for the client's lifetime by default).
perturbed_rows = PerturbedRows(
    TABLE,
    rows=client_rows,
    rr=choose_rr,
    session_key=TRAINING_ID,
    noise_floor=0.0,
    persist_memo=False,
)


def timing_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Add up this round's training time; report it as ``client-s`` when evaluating."""
    round_id = msg.metadata.group_id
    clock = context.state.config_records.get(CLOCK_STATE)
    spent = None
    if clock is not None and clock.get("round") == round_id:
        spent = float(clock["seconds"])  # type: ignore[arg-type]
    if msg.metadata.message_type.startswith(MessageType.EVALUATE):
        reply = call_next(msg, context)
        if spent is not None and reply.has_content():
            for metrics in reply.content.metric_records.values():
                metrics["client-s"] = spent
        if clock is not None:
            del context.state[CLOCK_STATE]  # reported: the next arm's round starts from zero
        return reply
    started = time.perf_counter()
    try:
        return call_next(msg, context)
    finally:
        total = (spent or 0.0) + time.perf_counter() - started
        context.state[CLOCK_STATE] = ConfigRecord({"round": round_id, "seconds": total})


app = ClientApp(mods=[timing_mod, ssa_rows.mod, perturbed_rows.mod, secagg_mod])


@app.query("psr")
def query(msg: Message, context: Context) -> Message:
    """Answer the retrieval phase of ``ssa-psr`` with PSR keys for this user's rows."""
    return ssa_rows.query(msg, context)


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
    """Train the item rows the user holds this round and its personal parameters."""
    user, settings, data = _user(context)
    config = msg.content["config"]
    training = str(config.get(TRAINING_ID, ""))
    server_round = int(config.get("server-round", 0))  # type: ignore[arg-type]
    received = msg.content.array_records["arrays"][TABLE].numpy()
    items, ratings = data.train_items, data.train_ratings
    secagg = msg.content.config_records.get(SECAGG_KEY)
    if secagg is not None and secagg.get("instance") == "rows":
        # SFSL: only the rows of the perturbed set S'' came down (the others are zero), so
        # the user trains on the ratings of S'' ∩ S; PerturbedRows uploads exactly those rows.
        perturbed = np.frombuffer(secagg["rows"], "<i8")  # type: ignore[arg-type]
        keep = np.isin(items, perturbed)
        items, ratings = items[keep], ratings[keep]
    trained, params, loss = train_user(
        received,
        load_user_params(context, training, settings),
        items,
        ratings,
        mean=settings.global_mean,
        epochs=settings.local_epochs,
        lr=settings.lr,
        reg=settings.reg,
        seed=settings.seed * 1_000_003 + 1000 * server_round + user,
    )
    store_user_params(context, training, params)
    # The weight only matters for dense averaging (fedavg, secagg); >= 1 so that a SFSL client
    # that kept no real row still answers (it uploads zero rows with count 0).
    metrics = MetricRecord({"train-mse": loss, "num-examples": max(1, int(items.size))})
    secure = secagg is not None or find_ssa_round(msg.content) is not None
    if secure or config.get(REPLY_KEY, "dense") == "dense":
        # Dense FedAvg, or a secure arm whose mod picks what to upload from the whole table.
        arrays = ArrayRecord({TABLE: Array(trained)})
        return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)
    # fedsubavg: the same rows' deltas in the clear (row-sparse codec, count 1 each).
    idx, counts = client_rows(context)
    delta = trained[idx] - received[idx]
    update = SubmodelUpdate({TABLE: TensorUpdate(Encoding.ROWS, delta, idx, counts)})
    content = encode_update(update)
    content["metrics"] = metrics
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Return MSE and the (score, label) pairs of the user's held-out ratings."""
    _, settings, data = _user(context)
    training = str(msg.content["config"].get(TRAINING_ID, ""))
    table = msg.content.array_records["arrays"][TABLE].numpy()
    params = load_user_params(context, training, settings)
    error = mse(table, params, data.test_items, data.test_ratings, settings.global_mean)
    baseline = float(np.mean((np.float32(settings.global_mean) - data.test_ratings) ** 2))
    scores = predict(table, params, data.test_items, settings.global_mean)
    labels = (data.test_ratings >= settings.positive_rating).astype(int)
    metrics = MetricRecord(
        {
            "mse": error,
            "mean-only-mse": baseline,
            "scores": [float(s) for s in scores],
            "labels": [int(v) for v in labels],
            "num-examples": int(data.test_items.size),
        }
    )
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
