"""``topk_mod``: turn a ClientApp's dense train reply into a top-k submodel update.

Add it to an existing app without touching the ``@app.train`` function::

    app = ClientApp(mods=[topk_mod])

Settings come from the run config (``flwr run --run-config``) and may be overridden per round
by the server through the train message's ``ConfigRecord`` (same keys):

- ``topk-ratio`` (float in (0, 1]) or ``topk-count`` (int): how much to keep; absent, or
  ratio 1.0, passes the dense reply through unchanged;
- ``topk-scope``: ``"global"`` (default) or ``"per-tensor"``;
- ``topk-error-feedback``: bool, default True; the dropped remainder is kept in
  ``context.state`` (ArrayRecord :data:`RESIDUAL_KEY`) and added to the next round's update;
- ``topk-groups``: comma-separated tensor names sent as whole rows (mega-elements);
- ``topk-session``: an id of the training the message belongs to (usually set by the server
  in the train ``ConfigRecord``); when it changes, the error-feedback residual starts afresh,
  so a ServerApp that trains several models in one Flower run does not carry one's remainder
  into the next.

The update is the trained weights minus the weights the message brought; it is sent in the
:mod:`flwr_fsl.submodel.codec` format, with the reply's metrics kept as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.records import encode_update
from flwr_fsl.submodel import TopKConfig, sparsify

RESIDUAL_KEY = "fsl.topk.residual"
SESSION_KEY = "fsl.topk.session"
_KEYS = ("topk-ratio", "topk-count", "topk-scope", "topk-error-feedback", "topk-groups")


def topk_config(run_config: Mapping[str, Any], message: Message) -> TopKConfig | None:
    """Read the top-k settings for this message (run config, overridden by its ConfigRecords).

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The node's run config.
    message : Message
        The train message (its ConfigRecords may override the run config).

    Returns
    -------
    TopKConfig or None
        None when top-k is off (no ratio/count, or ratio 1.0).

    Raises
    ------
    ValueError
        If the settings are invalid.
    """
    settings = {k: run_config[k] for k in _KEYS if k in run_config}
    for record in message.content.config_records.values():
        settings.update({k: record[k] for k in _KEYS if k in record})
    ratio, count = settings.get("topk-ratio"), settings.get("topk-count")
    if count is not None and ratio is not None:
        # A server-side override of one replaces the other from the run config.
        overridden = next(
            (k for r in message.content.config_records.values() for k in _KEYS[:2] if k in r),
            None,
        )
        ratio, count = (ratio, None) if overridden == "topk-ratio" else (None, count)
    if ratio is None and count is None:
        return None
    groups = str(settings.get("topk-groups", "") or "")
    config = TopKConfig(
        ratio=None if ratio is None else float(ratio),
        count=None if count is None else int(count),
        scope=str(settings.get("topk-scope", "global")),
        error_feedback=bool(settings.get("topk-error-feedback", True)),
        groups=tuple(g.strip() for g in groups.split(",") if g.strip()),
    )
    return None if config.is_dense else config


def _single_array_record(content: RecordDict, what: str) -> tuple[str, ArrayRecord]:
    records = content.array_records
    if len(records) != 1:
        # The train message is the server's (drop-worthy input); the reply is this app's own.
        error = ClientInputError if what == "train message" else ConfigurationError
        raise error(f"topk_mod expects one ArrayRecord in the {what}, got {len(records)}")
    return next(iter(records.items()))


def topk_mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
    """Client mod: sparsify the train reply to its top-k coordinates (with error feedback).

    Parameters
    ----------
    msg : Message
        The incoming message; only ``train`` messages are changed.
    context : Context
        The node's context (run config, persistent state for the residual).
    call_next : ClientAppCallable
        The rest of the ClientApp (the user's train function).

    Returns
    -------
    Message
        The reply: a submodel update, or the unchanged reply if top-k is off or the train
        function returned an error.

    Raises
    ------
    ConfigurationError
        If the settings are invalid or the reply's arrays do not match the received model.
    """
    if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
        return call_next(msg, context)
    config = topk_config(context.run_config, msg)
    if config is None:
        return call_next(msg, context)
    _, received_record = _single_array_record(msg.content, "train message")
    received = {k: v.numpy() for k, v in received_record.items()}
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    reply_key, trained_record = _single_array_record(reply.content, "train reply")
    if set(trained_record.keys()) != set(received):
        raise ConfigurationError("the train reply's arrays do not match the received model's names")
    deltas: dict[str, NDArray[np.generic]] = {}
    for name, array in trained_record.items():
        trained = array.numpy()
        if trained.shape != received[name].shape or trained.dtype != received[name].dtype:
            raise ConfigurationError(f"the train reply changed the shape or dtype of {name!r}")
        deltas[name] = trained - received[name]
    session = _session(msg)
    residuals = _load_residuals(context, deltas, session) if config.error_feedback else None
    update, new_residuals = sparsify(deltas, config, residuals)
    if config.error_feedback:
        context.state[RESIDUAL_KEY] = ArrayRecord(
            {k: Array(np.asarray(v, order="C")) for k, v in new_residuals.items()}
        )
        context.state[SESSION_KEY] = ConfigRecord({"id": session})
    content = encode_update(update)
    for key, record in reply.content.items():
        if key != reply_key:
            content[key] = record
    return Message(content, reply_to=msg)


def _session(msg: Message) -> str:
    for record in msg.content.config_records.values():
        if "topk-session" in record:
            return str(record["topk-session"])
    return ""


def _load_residuals(
    context: Context, deltas: Mapping[str, NDArray[np.generic]], session: str
) -> dict[str, NDArray[np.generic]] | None:
    if RESIDUAL_KEY not in context.state.array_records:
        return None
    stored_session = context.state.config_records.get(SESSION_KEY, ConfigRecord()).get("id", "")
    if stored_session != session:
        return None  # a new training: its first update starts without a remainder
    stored = {k: v.numpy() for k, v in context.state.array_records[RESIDUAL_KEY].items()}
    if any(k not in deltas or stored[k].shape != deltas[k].shape for k in stored):
        # The model changed under us (a new run in the same node): start afresh.
        return None
    return stored
