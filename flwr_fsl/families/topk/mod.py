"""``topk_mod``: turn a ClientApp's dense train reply into a top-k submodel update.

Add it to an existing app without touching the ``@app.train`` function::

    app = ClientApp(mods=[topk_mod])

Settings come from the run config (``flwr run --run-config``) and may be overridden per round
by the server through the train message's ``ConfigRecord`` (same keys):

- ``topk-ratio`` (float in (0, 1]) or ``topk-count`` (int): how much to keep; absent, or
  ratio 1.0, passes the dense reply through unchanged;
- ``topk-scope``: ``"global"`` (default) or ``"per-tensor"``;
- ``topk-error-feedback``: bool, default True; the dropped remainder is kept in
  ``context.state`` (the :class:`~flwr_fsl.core.state.StateSlot` :data:`RESIDUAL`, a
  :class:`Residual` under :data:`RESIDUAL_KEY`) and added to the next round's update;
- ``topk-groups``: comma-separated tensor names sent as whole rows (mega-elements);
- ``topk-session``: an id of the training the message belongs to (usually set by the server
  in the train ``ConfigRecord``); when it changes, the error-feedback residual starts afresh,
  so a ServerApp that trains several models in one Flower run does not carry one's remainder
  into the next.

The update is the trained weights minus the weights the message brought; it is sent in the
:mod:`flwr_fsl.submodel.codec` format, with the reply's metrics kept as they are.

``topk_mod`` is a :class:`~flwr_fsl.core.phases.PhaseMod` with one ``runs_train`` phase,
:data:`TOPK_TRAIN`, recognised by the message type (``train`` or ``train.<action>``) and the
top-k settings being on (:meth:`TopKMod.phase_of`): the train message carries no record of
its own, so every other message passes through untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MessageType, RecordDict
from numpy.typing import NDArray

from flwr_fsl.core.checks import check_bool, check_choice, check_int, check_real, check_str
from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.phases import Phase, PhaseMod
from flwr_fsl.core.records import encode_update
from flwr_fsl.core.state import StateSlot
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.submodel import TopKConfig, sparsify
from flwr_fsl.submodel.codec import HEADER_KEY
from flwr_fsl.submodel.topk import SCOPES

__all__ = [
    "RESIDUAL",
    "RESIDUAL_KEY",
    "TOPK_TRAIN",
    "Residual",
    "SubmodelReply",
    "TopKMod",
    "TrainRequest",
    "topk_config",
    "topk_mod",
]

RESIDUAL_KEY = "fsl.topk.residual"
TOPK_FAMILY = "fsl.topk"
_KEYS = ("topk-ratio", "topk-count", "topk-scope", "topk-error-feedback", "topk-groups")
_RESIDUAL_MAGIC = register_magic(
    b"FSTK", "top-k error-feedback residual (flwr_fsl.families.topk.mod)"
)
_RESIDUAL_VERSION = 1
_MAX_NDIM = 32


def topk_config(run_config: Mapping[str, Any], message: Message | RecordDict) -> TopKConfig | None:
    """Read the top-k settings for this message (run config, overridden by its ConfigRecords).

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The node's run config.
    message : Message or RecordDict
        The train message or its content (its ConfigRecords may override the run config).

    Returns
    -------
    TopKConfig or None
        None when top-k is off (no ratio/count, or ratio 1.0).

    Raises
    ------
    ConfigurationError
        If a setting is invalid; the message names its key (``topk-ratio``, ...).
    """
    content = message.content if isinstance(message, Message) else message
    settings = {k: run_config[k] for k in _KEYS if k in run_config}
    for record in content.config_records.values():
        settings.update({k: record[k] for k in _KEYS if k in record})
    ratio, count = settings.get("topk-ratio"), settings.get("topk-count")
    if count is not None and ratio is not None:
        # A server-side override of one replaces the other from the run config.
        overridden = next(
            (k for r in content.config_records.values() for k in _KEYS[:2] if k in r),
            None,
        )
        ratio, count = (ratio, None) if overridden == "topk-ratio" else (None, count)
    if ratio is None and count is None:
        return None
    # Each value checked by its key (a client's own run config may be wrong too).
    groups = check_str("topk-groups", settings.get("topk-groups", "") or "", empty=True)
    config = TopKConfig(
        ratio=None if ratio is None else check_real("topk-ratio", ratio, 0, 1, low_open=True),
        count=None if count is None else check_int("topk-count", count, 1),
        scope=check_choice("topk-scope", settings.get("topk-scope", "global"), SCOPES),
        error_feedback=check_bool("topk-error-feedback", settings.get("topk-error-feedback", True)),
        groups=tuple(g.strip() for g in groups.split(",") if g.strip()),
    )
    return None if config.is_dense else config


# ---- the error-feedback state ------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Residual:
    """The error-feedback remainder of one training, kept between rounds.

    Format v1: magic ``FSTK``, version ``u8``, the session (``raw`` UTF-8), the tensor count,
    then per tensor its name (``raw`` UTF-8), dtype (``raw`` NumPy dtype string), ``ndim``
    (``u8``), the shape (``u64`` each) and the little-endian data (``raw``).

    Attributes
    ----------
    session : str
        The ``topk-session`` of the training it belongs to ("" when none is named).
    arrays : Mapping[str, numpy.ndarray]
        The dropped remainder per tensor.
    """

    session: str
    arrays: Mapping[str, NDArray[np.generic]] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """Serialize the residual (format v1)."""
        w = Writer()
        w.fixed(_RESIDUAL_MAGIC, len(_RESIDUAL_MAGIC))
        w.u8(_RESIDUAL_VERSION)
        w.raw(self.session.encode())
        w.count(len(self.arrays))
        for name, value in self.arrays.items():
            array = np.asarray(value)
            dtype = array.dtype.newbyteorder("<")
            w.raw(name.encode())
            w.raw(dtype.str.encode())
            w.u8(array.ndim)
            for d in array.shape:
                w.u64(d)
            w.raw(np.ascontiguousarray(array, dtype=dtype).tobytes())
        return w.payload()

    @classmethod
    def from_bytes(cls, data: bytes) -> Residual:
        """Parse :meth:`to_bytes` output strictly.

        Raises
        ------
        WireFormatError
            On any malformed, truncated or extended input.
        """
        r = Reader.versioned(data, _RESIDUAL_MAGIC, _RESIDUAL_VERSION, "a top-k residual")
        try:
            session = r.raw("session").decode()
            arrays: dict[str, NDArray[np.generic]] = {}
            for _ in range(r.count("tensors", 4)):
                name = r.raw("name").decode()
                dtype = np.dtype(r.raw("dtype").decode())
                if dtype.kind not in "fiu" or name in arrays:
                    raise WireFormatError("bad residual tensor")
                ndim = r.u8("ndim")
                if ndim > _MAX_NDIM:
                    raise WireFormatError("bad residual tensor")
                shape = tuple(r.u64("shape") for _ in range(ndim))
                raw = r.raw("data")
                if len(raw) != int(np.prod(shape, dtype=object)) * dtype.itemsize:
                    raise WireFormatError("residual data does not fit its shape")
                arrays[name] = (
                    np.frombuffer(raw, dtype).reshape(shape).astype(dtype.newbyteorder("="))
                )
            r.done()
        except (UnicodeDecodeError, TypeError, ValueError) as err:
            if isinstance(err, WireFormatError):
                raise
            raise WireFormatError("malformed top-k residual") from None
        return cls(session, arrays)


RESIDUAL: StateSlot[Residual] = StateSlot(RESIDUAL_KEY, Residual.to_bytes, Residual.from_bytes)
"""Where ``topk_mod`` keeps its :class:`Residual` in ``Context.state``."""


# ---- the phase -----------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TrainRequest:
    """A train message as it came: its content, the model it brings and its ``topk-session``.

    Attributes
    ----------
    content : RecordDict
        The message's own content.
    model : Mapping[str, numpy.ndarray]
        The arrays of its one ``ArrayRecord``.
    session : str
        The ``topk-session`` a config record names ("" when none does).
    """

    content: RecordDict
    model: Mapping[str, NDArray[np.generic]]
    session: str

    def to_record(self) -> RecordDict:
        """Return the message content."""
        return self.content

    @classmethod
    def from_record(cls, content: RecordDict) -> TrainRequest:
        """Parse a train message.

        Raises
        ------
        ClientInputError
            If it has not exactly one ``ArrayRecord``.
        """
        _, record = _single_array_record(content, "train message")
        session = ""
        for config in content.config_records.values():
            if "topk-session" in config:
                session = str(config["topk-session"])
                break
        return cls(content, {k: v.numpy() for k, v in record.items()}, session)


@dataclass(frozen=True, eq=False)
class SubmodelReply:
    """The train reply: the :mod:`flwr_fsl.submodel.codec` update and the reply's other records."""

    content: RecordDict

    def to_record(self) -> RecordDict:
        """Return the reply content."""
        return self.content

    @classmethod
    def from_record(cls, content: RecordDict) -> SubmodelReply:
        """Wrap a reply content (the strategy decodes it against the model it sent).

        Raises
        ------
        ClientInputError
            If it carries no submodel update header.
        """
        if HEADER_KEY not in content:
            raise ClientInputError(f"the reply carries no {HEADER_KEY!r} record")
        return cls(content)


TOPK_TRAIN: Phase[TrainRequest, SubmodelReply] = Phase(
    TOPK_FAMILY, MessageType.TRAIN, TrainRequest, SubmodelReply, runs_train=True
)
"""A train message with top-k on: train, sparsify the update (no record of its own is sent)."""


def _single_array_record(content: RecordDict, what: str) -> tuple[str, ArrayRecord]:
    records = content.array_records
    if len(records) != 1:
        # The train message is the server's (drop-worthy input); the reply is this app's own.
        error = ClientInputError if what == "train message" else ConfigurationError
        raise error(f"topk_mod expects one ArrayRecord in the {what}, got {len(records)}")
    return next(iter(records.items()))


class TopKMod(PhaseMod):
    """Client mod: sparsify the train reply to its top-k coordinates (with error feedback)."""

    family: ClassVar[str] = TOPK_FAMILY
    title: ClassVar[str] = "top-k"
    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = {TOPK_TRAIN.name: TOPK_TRAIN}
    state: ClassVar[StateSlot[Residual]] = RESIDUAL

    def phase_of(self, msg: Message, context: Context) -> Phase[Any, Any] | None:
        """Return :data:`TOPK_TRAIN` for a train message with top-k on, else None.

        Raises
        ------
        ConfigurationError
            If the settings are invalid.
        """
        if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return None
        return None if topk_config(context.run_config, msg) is None else TOPK_TRAIN

    def on_train(
        self, request: TrainRequest, context: Context, train: Callable[[], Message]
    ) -> SubmodelReply | Message:
        """Train, then send the update's top-k coordinates (the remainder kept for later).

        Raises
        ------
        ConfigurationError
            If the settings are invalid or the reply's arrays do not match the received model.
        """
        config = topk_config(context.run_config, request.content)
        assert config is not None  # phase_of answers only with top-k on
        received = request.model
        reply = train()
        if reply.has_error():
            return reply
        reply_key, trained_record = _single_array_record(reply.content, "train reply")
        if set(trained_record.keys()) != set(received):
            raise ConfigurationError(
                "the train reply's arrays do not match the received model's names"
            )
        deltas: dict[str, NDArray[np.generic]] = {}
        for name, array in trained_record.items():
            trained = array.numpy()
            if trained.shape != received[name].shape or trained.dtype != received[name].dtype:
                raise ConfigurationError(f"the train reply changed the shape or dtype of {name!r}")
            deltas[name] = trained - received[name]
        residuals = (
            self._residuals(context, deltas, request.session) if config.error_feedback else None
        )
        update, new_residuals = sparsify(deltas, config, residuals)
        if config.error_feedback:
            self.state.store(context, Residual(request.session, new_residuals))
        content = encode_update(update)
        for key, record in reply.content.items():
            if key != reply_key:
                content[key] = record
        return SubmodelReply(content)

    def _residuals(
        self, context: Context, deltas: Mapping[str, NDArray[np.generic]], session: str
    ) -> dict[str, NDArray[np.generic]] | None:
        stored = self.state.load(context)
        if stored is None or stored.session != session:
            return None  # a new training: its first update starts without a remainder
        if any(k not in deltas or v.shape != deltas[k].shape for k, v in stored.arrays.items()):
            # The model changed under us (a new run in the same node): start afresh.
            return None
        return dict(stored.arrays)


topk_mod = TopKMod()
"""The mod instance to stack: ``ClientApp(mods=[topk_mod])``."""
