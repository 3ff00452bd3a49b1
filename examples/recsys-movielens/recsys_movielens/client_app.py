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
  protocol's upload (``secagg_mod``: one masked vector of the whole model;
  :class:`~flwr_fsl.families.ssa.mixed_mod.PrivateTables`: the user retrieves its item and
  genre rows by two-server PSR in a ``query.psr`` phase, trains on them, and uploads each
  table's rows and the dense tensors as separate SSA parts).

The client's rows of each table come from :func:`recsys_movielens.task.user_rows` (its
training items; the genres through the public item -> genre map). Evaluation is centralized
(the ServerApp's ``evaluate_fn``), so there is no ``@app.evaluate``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.records import encode_update
from flwr_fsl.data import CTRSamples
from flwr_fsl.families.secagg.records import SECAGG_KEY
from flwr_fsl.families.sfsl.perturb import RRParams
from flwr_fsl.families.ssa.mixed_mod import PrivateTables
from flwr_fsl.models.din import train_samples
from flwr_fsl.mods import PerturbedRows, secagg_mod
from flwr_fsl.submodel import Encoding, SubmodelUpdate, TensorUpdate
from recsys_movielens.task import (
    CPPS,
    ITEM_TABLE,
    Settings,
    model_tables,
    settings_config,
    settings_ctr,
    user_rows,
)

UPLOAD_KEY = "upload"
UPLOADS = ("dense", "rows", "model")
CPP_KEY = "sfsl-cpp"
SESSION_KEY = "training-id"

torch.set_num_threads(1)  # one client per core: the simulation runs many side by side


def _user(context: Context) -> tuple[int, Settings]:
    return int(context.node_config["partition-id"]), Settings.from_run_config(context.run_config)


def _client_rows(context: Context) -> dict[str, tuple[NDArray[np.int64], NDArray[np.float64]]]:
    """Return the user's item rows, count 1 each (its genre rows follow by the public map)."""
    user, settings = _user(context)
    rows = settings_ctr(settings, user).rows
    return {ITEM_TABLE: (rows, np.ones(rows.size))}


@lru_cache(maxsize=4)
def private_tables(max_rows: int) -> PrivateTables:
    """Return the client side of the ``ssa`` arms for a run's ``max-rows`` (S0's spec too)."""
    config = settings_config(Settings())  # the row map and the genre count only
    return PrivateTables(model_tables(config, max_rows), rows=_client_rows)


def tables_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """:class:`PrivateTables`' mod for this run's table spec (other messages pass through)."""
    max_rows = Settings.from_run_config(context.run_config).max_rows
    return private_tables(max_rows).mod(msg, context, call_next)


def choose_rr(config: ConfigRecord, context: Context) -> RRParams:
    """Return the randomized response of the CPP the SFSL arm's train config names.

    Raises
    ------
    ClientInputError
        If the server names no known CPP.
    """
    cpp = config.get(CPP_KEY)
    if not isinstance(cpp, str) or cpp not in CPPS:
        raise ClientInputError(f"the server asks for an unknown CPP (one of {', '.join(CPPS)})")
    return RRParams.symmetric(*CPPS[cpp])


@lru_cache(maxsize=4)
def perturbed_rows(max_rows: int) -> PerturbedRows:
    """Return the client side of the SFSL arms for a run's ``max-rows`` (S0's spec too).

    A comparison app: its clients accept the paper's noiseless rounds (``noise_floor=0``; a
    deployed client keeps the default floor and refuses them), and every arm has its own memo
    of permanent answers (``session_key``: the harness's per-arm session id), kept for the run
    only (``persist_memo=False``).
    """
    config = settings_config(Settings())
    return PerturbedRows(
        model_tables(config, max_rows),
        rows=_client_rows,
        rr=choose_rr,
        session_key=SESSION_KEY,
        noise_floor=0.0,
        persist_memo=False,
    )


def sfsl_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """:class:`PerturbedRows`' mod for this run's table spec (other messages pass through)."""
    max_rows = Settings.from_run_config(context.run_config).max_rows
    return perturbed_rows(max_rows).mod(msg, context, call_next)


app = ClientApp(mods=[tables_mod, sfsl_mod, secagg_mod])


@app.query("psr")
def query(msg: Message, context: Context) -> Message:
    """Answer the retrieval phase of the ``ssa`` arms with PSR keys for the user's rows."""
    return private_tables(Settings.from_run_config(context.run_config).max_rows).query(msg, context)


def available_samples(samples: CTRSamples, items: NDArray[Any]) -> CTRSamples:
    """SFSL: keep the samples whose target came down; drop history items that did not.

    An SFSL client receives only the rows of its perturbed set ``S''`` (the others are zero)
    and uploads only the rows of ``S'' ∩ S``: it trains on what it received.
    """
    have = np.any(items != 0, axis=1)
    keep = have[samples.items]
    history = np.where(have[samples.history.clip(min=0)], samples.history, -1)
    return CTRSamples(samples.items[keep], history[keep], samples.labels[keep])


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
    samples = settings_ctr(settings, user).train
    received = {k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}
    secagg = msg.content.config_records.get(SECAGG_KEY)
    if secagg is not None and secagg.get("instance") == "rows":
        samples = available_samples(samples, received[ITEM_TABLE])
    trained, loss = train_samples(
        settings_config(settings),
        received,
        samples,
        epochs=settings.local_epochs,
        lr=settings.lr,
        batch_size=settings.batch_size,
        seed=settings.seed * 1_000_003 + 1000 * server_round + user,
    )
    # >= 1: an SFSL client that kept no real row still answers (its rows go up with count 0).
    metrics = MetricRecord({"train-loss": loss, "num-examples": max(1, len(samples))})
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
