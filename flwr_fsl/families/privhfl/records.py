"""PrivHFL's Flower records: the keys, phases and array records its strategy and mod share.

Every server message carries a ``ConfigRecord`` under :data:`PRIVHFL_KEY` (one
:class:`PhaseConfig`, checked against the message type); queries and logits travel as single
float32 arrays under :data:`QUERIES_KEY` and :data:`LOGITS_KEY`, read back with their shape,
type and range checked (:func:`read_queries`, :func:`read_logits`); the secure arm's protocol
bytes travel as ``{"blob": bytes}`` under :data:`~flwr_fsl.families.privhfl.messages.SECURE_KEY`
(:func:`secure_record`). Malformed input raises :class:`~flwr_fsl.core.errors.ClientInputError`.

Each phase is a typed :class:`~flwr_fsl.core.phases.Phase` (:data:`PRIVHFL_PHASES`, one per
name of :data:`PHASE_TYPES`, travelling as its message type) that both ends import: a request
is a :class:`PhaseRequest` (the :class:`PhaseConfig` and the records the phase carries), a
reply a :class:`PhaseReply` built by its constructor per phase.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.phases import Phase
from flwr_fsl.families.privhfl.messages import SECURE_KEY
from flwr_fsl.families.privhfl.queries import EXPANSIONS, STRATEGIES
from flwr_fsl.models.privhfl import (
    IMAGE_SHAPE,
)

__all__ = [
    "ACTION",
    "ANSWER",
    "EVALUATE",
    "GENERATE",
    "KEYS",
    "LOCAL",
    "LOGITS_KEY",
    "PHASE_TYPES",
    "PRIVHFL_KEY",
    "PRIVHFL_PHASES",
    "QUERIES_KEY",
    "QUERY_FAILED_KEY",
    "RETRAIN",
    "SIGN",
    "STEP",
    "VERSION",
    "PhaseConfig",
    "PhaseReply",
    "PhaseRequest",
    "PrivHFLPhase",
    "logits_record",
    "node_seed",
    "queries_record",
    "read_logits",
    "read_queries",
    "read_query_failure",
    "read_secure_blob",
    "secure_record",
]

PRIVHFL_KEY = "fsl.privhfl"
QUERY_FAILED_KEY = "fsl.privhfl.query-failed"
"""``ConfigRecord`` of a ``retrain`` reply whose query failed (field ``reason``); absent else."""
"""``ConfigRecord`` of every server message: the phase and its settings."""
QUERIES_KEY = "fsl.privhfl.queries"
"""``ArrayRecord`` ``{"x": float32 (B, *image_shape)}``: a querier's queries."""
LOGITS_KEY = "fsl.privhfl.logits"
"""``ArrayRecord`` ``{"logits": float32 (B, classes)}``: an answer, or the sum sent back."""
ACTION = "privhfl"
"""The action of the three message types (``train.privhfl`` ...)."""
VERSION = 1
PHASE_TYPES: dict[str, str] = {
    "local": f"train.{ACTION}",
    "retrain": f"train.{ACTION}",
    "generate": f"query.{ACTION}",
    "answer": f"query.{ACTION}",
    "keys": f"query.{ACTION}",
    "step": f"query.{ACTION}",
    "sign": f"query.{ACTION}",
    "evaluate": f"evaluate.{ACTION}",
}
"""Phase -> the Flower message type it travels as."""


# -- the phase record -------------------------------------------------------------------------
@dataclass(frozen=True)
class PhaseConfig:
    """The settings of one PrivHFL message (its :data:`PRIVHFL_KEY` record).

    Every field is always present on the wire; a phase ignores the ones it does not use.

    Attributes
    ----------
    phase : str
        One of :data:`PHASE_TYPES`.
    server_round : int
        The round (>= 1); a retrain message must name the round of the stored queries.
    seed : int
        The server's seed for this node and phase, in ``[0, 2^63)``: training initialisation
        and shuffling (``local``, ``retrain``). It does not decide a ``generate``'s queries:
        the querier draws its own seed (:meth:`~flwr_fsl.families.privhfl.mod.PrivHFLClient.
        query_seed`), so the server cannot recompute the query set.
    epochs, lr, batch_size : int, float, int
        Training settings (``local`` / ``retrain``).
    expansion, pool_size, num_queries, selection : str, int, int, str
        Query generation (``generate``): one of
        :data:`~flwr_fsl.families.privhfl.queries.EXPANSIONS`, the pool size, how many to select,
        one of :data:`~flwr_fsl.families.privhfl.queries.STRATEGIES`.
    temperature : float
        Soft labels are ``softmax(sum of logits / temperature)`` (the paper: 1).
    answerers : int
        ``retrain``: how many answerers' logits the sum holds (0: re-train on private data).
    optimizer : str
        ``local``: ``"sgd"`` (the paper's) or ``"adam"``.
    """

    phase: str
    server_round: int
    seed: int
    epochs: int = 1
    lr: float = 0.01
    batch_size: int = 32
    expansion: str = "mixup"
    pool_size: int = 1
    num_queries: int = 1
    selection: str = "random"
    temperature: float = 1.0
    answerers: int = 0
    optimizer: str = "sgd"

    _WIRE: ClassVar[dict[str, str]] = {
        "server_round": "server-round",
        "batch_size": "batch-size",
        "pool_size": "pool-size",
        "num_queries": "num-queries",
    }
    MAX_COUNT: ClassVar[int] = 10_000_000

    def __post_init__(self) -> None:  # noqa: C901
        if self.phase not in PHASE_TYPES:
            raise ConfigurationError(f"unknown PrivHFL phase {self.phase!r}")
        ints = {
            "server_round": (1, 1 << 31),
            "seed": (0, (1 << 63) - 1),
            "epochs": (0, 10_000),
            "batch_size": (1, self.MAX_COUNT),
            "pool_size": (1, self.MAX_COUNT),
            "num_queries": (1, self.MAX_COUNT),
            "answerers": (0, 1_000_000),
        }
        for name, (low, high) in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigurationError(f"{name} must be an int in [{low}, {high}]")
        for name in ("lr", "temperature"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"{name} must be a number")
            if not (math.isfinite(value) and 0 < value <= 1e6):
                raise ConfigurationError(f"{name} must be finite and in (0, 1e6]")
        if self.expansion not in EXPANSIONS:
            raise ConfigurationError(f"expansion must be one of {EXPANSIONS}")
        if self.selection not in STRATEGIES:
            raise ConfigurationError(f"selection must be one of {STRATEGIES}")
        if self.optimizer not in ("sgd", "adam"):
            raise ConfigurationError("optimizer must be 'sgd' or 'adam'")
        if self.num_queries > self.pool_size:
            raise ConfigurationError("num_queries must not exceed pool_size")

    @property
    def message_type(self) -> str:
        """The Flower message type of this phase."""
        return PHASE_TYPES[self.phase]

    def to_record(self) -> ConfigRecord:
        """Return the wire record (every field, with its version)."""
        out: dict[str, Any] = {"version": VERSION}
        for f in fields(self):
            out[self._WIRE.get(f.name, f.name)] = getattr(self, f.name)
        return ConfigRecord(out)

    @classmethod
    def from_record(
        cls, record: ConfigRecord | None, message_type: str | None = None
    ) -> PhaseConfig:
        """Read a :data:`PRIVHFL_KEY` record strictly.

        Parameters
        ----------
        record : ConfigRecord or None
            The record.
        message_type : str, optional
            The message's type; the phase must travel as it.

        Raises
        ------
        ClientInputError
            If the record is missing, has another version, a missing or unknown field, a
            field of the wrong type or out of range, or a phase that does not match
            ``message_type``.
        """
        if record is None:
            raise ClientInputError("the message has no PrivHFL record")
        names = {cls._WIRE.get(f.name, f.name): f.name for f in fields(cls)}
        keys = set(record.keys())
        if keys != set(names) | {"version"}:
            raise ClientInputError("the PrivHFL record has missing or unknown fields")
        version = record["version"]
        if isinstance(version, bool) or version != VERSION:
            raise ClientInputError("unsupported PrivHFL record version")
        for wire, name in names.items():
            value = record[wire]
            expected: type | tuple[type, ...] = int
            if name in ("phase", "expansion", "selection", "optimizer"):
                expected = str
            elif name in ("lr", "temperature"):
                expected = (int, float)
            if isinstance(value, bool) or not isinstance(value, expected):
                raise ClientInputError(f"PrivHFL field {wire!r} has the wrong type")
        # Every value's type was checked above; the dataclass checks the ranges.
        values: dict[str, Any] = {name: record[wire] for wire, name in names.items()}
        try:
            config = cls(**values)
        except ValueError as err:
            raise ClientInputError(f"invalid PrivHFL record: {err}") from err
        if message_type is not None and config.message_type != message_type:
            raise ClientInputError("the PrivHFL phase does not match the message type")
        return config


# -- array records ----------------------------------------------------------------------------
def _one_array(content: RecordDict, key: str, name: str) -> NDArray[Any]:
    record = content.array_records.get(key)
    if record is None:
        raise ClientInputError(f"the message has no {key!r} ArrayRecord")
    if list(record.keys()) != [name]:
        raise ClientInputError(f"{key!r} must hold exactly one array named {name!r}")
    array = record[name]
    if array.dtype != "float32":
        raise ClientInputError(f"{key!r} must be float32")
    try:
        value = array.numpy()
    except (ValueError, TypeError, OSError, EOFError) as err:
        raise ClientInputError(f"{key!r} does not decode") from err
    if value.dtype != np.float32:
        raise ClientInputError(f"{key!r} must be float32")
    return value


def _checked(value: NDArray[Any], key: str, max_abs: float) -> NDArray[np.float32]:
    if not np.isfinite(value).all():
        raise ClientInputError(f"{key!r} holds a non-finite value")
    if value.size and float(np.abs(value).max()) > max_abs:
        raise ClientInputError(f"{key!r} holds a value beyond its bound")
    return value.astype(np.float32, copy=False)


def queries_record(x: NDArray[np.floating]) -> ArrayRecord:
    """Return the :data:`QUERIES_KEY` record for query images ``x``."""
    return ArrayRecord({"x": Array(np.ascontiguousarray(x, dtype=np.float32))})


def logits_record(z: NDArray[np.floating]) -> ArrayRecord:
    """Return the :data:`LOGITS_KEY` record for logits ``z``."""
    return ArrayRecord({"logits": Array(np.ascontiguousarray(z, dtype=np.float32))})


def read_queries(
    content: RecordDict,
    max_count: int,
    image_shape: tuple[int, ...] = IMAGE_SHAPE,
    max_abs: float = 1e3,
    count: int | None = None,
) -> NDArray[np.float32]:
    """Read query images strictly: float32 ``(B, *image_shape)``, ``1 <= B <= max_count``.

    Parameters
    ----------
    content : RecordDict
        A message's content with a :data:`QUERIES_KEY` record.
    max_count : int
        Most queries accepted.
    image_shape : tuple[int, ...]
        Shape of one image.
    max_abs : float
        Largest ``|pixel|``.
    count : int, optional
        The exact number expected.

    Raises
    ------
    ClientInputError
        If the record is missing or malformed, of another shape or count, or holds a
        non-finite or out-of-range pixel.
    """
    x = _one_array(content, QUERIES_KEY, "x")
    if x.ndim != 1 + len(image_shape) or tuple(x.shape[1:]) != tuple(image_shape):
        raise ClientInputError(f"{QUERIES_KEY!r} must have shape (B, {image_shape})")
    if not 1 <= len(x) <= max_count or (count is not None and len(x) != count):
        raise ClientInputError(f"{QUERIES_KEY!r} holds an unexpected number of queries")
    return _checked(x, QUERIES_KEY, max_abs)


def read_logits(
    content: RecordDict, rows: int, num_classes: int, max_abs: float = 1e4
) -> NDArray[np.float32]:
    """Read logits strictly: float32 ``(rows, num_classes)``, finite, ``|z| <= max_abs``.

    Raises
    ------
    ClientInputError
        If the record is missing, malformed, of another shape or out of range.
    """
    z = _one_array(content, LOGITS_KEY, "logits")
    if z.shape != (rows, num_classes):
        raise ClientInputError(f"{LOGITS_KEY!r} must have shape ({rows}, {num_classes})")
    return _checked(z, LOGITS_KEY, max_abs)


def node_seed(seed: int, server_round: int, node: int, phase: str) -> int:
    """Return a per-node, per-round, per-phase seed in ``[0, 2^63)`` (SHA-256 of the values)."""
    digest = hashlib.sha256(f"privhfl/{seed}/{server_round}/{node}/{phase}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


# -- the secure blob record -------------------------------------------------------------------
def secure_record(blob: bytes) -> ConfigRecord:
    """Return the :data:`~flwr_fsl.families.privhfl.messages.SECURE_KEY` record of ``blob``."""
    return ConfigRecord({"blob": blob})


def read_secure_blob(record: ConfigRecord | None, missing: str) -> bytes:
    """Read a secure blob record strictly: exactly one bytes field ``blob``.

    Raises
    ------
    ClientInputError
        ``missing`` if the record is absent or has other fields; another text if the field
        is not bytes.
    """
    if record is None or list(record.keys()) != ["blob"]:
        raise ClientInputError(missing)
    blob = record["blob"]
    if not isinstance(blob, bytes):
        raise ClientInputError(f"{SECURE_KEY!r} 'blob' must be bytes")
    return blob


# -- the typed phases -------------------------------------------------------------------------
def _only(key: str, record: ArrayRecord | None) -> RecordDict:
    return RecordDict({} if record is None else {key: record})


@dataclass(frozen=True)
class PhaseRequest:
    """A PrivHFL request: the phase's :class:`PhaseConfig` and the records it carries.

    ``queries`` (``answer``: :func:`queries_record`), ``logits`` (plaintext ``retrain``:
    :func:`logits_record`) and ``secure`` (the secure arm's ``keys``, ``generate``, ``step``,
    ``sign``, ``retrain``: :func:`secure_record`) are kept as records, as they came, and read
    strictly by the client with its own bounds (:meth:`read_queries`, :meth:`read_logits`,
    :meth:`blob`).
    """

    config: PhaseConfig
    queries: ArrayRecord | None = None
    logits: ArrayRecord | None = None
    secure: ConfigRecord | None = None

    def to_record(self) -> RecordDict:
        """Return the message content: the phase record first, then the phase's records."""
        records: dict[str, ArrayRecord | MetricRecord | ConfigRecord] = {
            PRIVHFL_KEY: self.config.to_record()
        }
        for key, record in (
            (QUERIES_KEY, self.queries), (LOGITS_KEY, self.logits), (SECURE_KEY, self.secure)
        ):  # fmt: skip
            if record is not None:
                records[key] = record
        return RecordDict(records)

    @classmethod
    def from_record(cls, content: RecordDict) -> PhaseRequest:
        """Parse a request (:meth:`PhaseConfig.from_record`; the other records as they are).

        Raises
        ------
        ClientInputError
            If the phase record is missing or malformed.
        """
        return cls(
            PhaseConfig.from_record(content.config_records.get(PRIVHFL_KEY)),
            content.array_records.get(QUERIES_KEY),
            content.array_records.get(LOGITS_KEY),
            content.config_records.get(SECURE_KEY),
        )

    def read_queries(
        self, max_count: int, image_shape: tuple[int, ...], max_abs: float
    ) -> NDArray[np.float32]:
        """Return the queries to answer, read by :func:`read_queries` (ClientInputError)."""
        return read_queries(_only(QUERIES_KEY, self.queries), max_count, image_shape, max_abs)

    def read_logits(self, rows: int, num_classes: int, max_abs: float) -> NDArray[np.float32]:
        """Return the logit sum, read by :func:`read_logits` (ClientInputError)."""
        return read_logits(_only(LOGITS_KEY, self.logits), rows, num_classes, max_abs)

    def blob(self) -> bytes:
        """Return the secure arm's request bytes (ClientInputError if malformed)."""
        return read_secure_blob(self.secure, f"{SECURE_KEY!r} must hold exactly one field 'blob'")


@dataclass(frozen=True)
class PhaseReply:
    """A PrivHFL reply: its content, built by one constructor per phase.

    The strategy reads a reply with its own bounds (:func:`read_queries`, :func:`read_logits`
    on :attr:`content`, :meth:`blob`), so :meth:`from_record` keeps the content as it came.
    """

    content: RecordDict

    def to_record(self) -> RecordDict:
        """Return the reply's content."""
        return self.content

    @classmethod
    def from_record(cls, content: RecordDict) -> PhaseReply:
        """Wrap a reply content (read strictly by the strategy)."""
        return cls(content)

    @classmethod
    def trained(cls, num_examples: int, train_loss: float) -> PhaseReply:
        """``local`` / ``retrain`` of a client that reports them: ``num-examples``, ``train-loss``.

        Only where the node's own config opts in (``privhfl-report-train-metrics``); by
        default a client replies :meth:`done`.
        """
        metrics = MetricRecord({"num-examples": num_examples, "train-loss": train_loss})
        return cls(RecordDict({"metrics": metrics}))

    @classmethod
    def done(cls) -> PhaseReply:
        """``local`` / ``retrain`` (the default): an empty content, only that training ran.

        PrivHFL has no aggregate to weight, so the server needs neither the node's number of
        private images nor its training loss.
        """
        return cls(RecordDict())

    @classmethod
    def query_set(cls, queries: NDArray[np.floating]) -> PhaseReply:
        """Plaintext ``generate``: the queries and their number."""
        return cls(
            RecordDict(
                {
                    QUERIES_KEY: queries_record(queries),
                    "metrics": MetricRecord({"num-queries": len(queries)}),
                }
            )
        )

    @classmethod
    def answer(cls, logits: NDArray[np.floating]) -> PhaseReply:
        """``answer``: the logits on the queries."""
        return cls(RecordDict({LOGITS_KEY: logits_record(logits)}))

    @classmethod
    def sealed(cls, blob: bytes) -> PhaseReply:
        """Reply the secure arm's bytes."""
        return cls(RecordDict({SECURE_KEY: secure_record(blob)}))

    @classmethod
    def evaluated(
        cls, num_examples: int, accuracy: float, loss: float, num_parameters: int
    ) -> PhaseReply:
        """``evaluate``: this node's model on its evaluation data."""
        metrics = MetricRecord(
            {
                "num-examples": num_examples,
                "accuracy": accuracy,
                "loss": loss,
                "num-parameters": num_parameters,
            }
        )
        return cls(RecordDict({"metrics": metrics}))

    def with_query_failure(self, reason: str) -> PhaseReply:
        """Return this ``retrain`` reply with the querier's report that its query failed."""
        content = RecordDict(dict(self.content))
        content[QUERY_FAILED_KEY] = ConfigRecord({"reason": reason[:200]})
        return PhaseReply(content)

    def blob(self) -> bytes:
        """Return the secure arm's reply bytes (ClientInputError if malformed)."""
        record = self.content.config_records.get(SECURE_KEY)
        return read_secure_blob(record, f"the reply lacks the {SECURE_KEY!r} record")


@dataclass(frozen=True)
class PrivHFLPhase(Phase[PhaseRequest, PhaseReply]):
    """A PrivHFL phase: its request content is built as it always was.

    The phase record already names the phase (:class:`PhaseConfig`, after ``version``), so
    :meth:`build` keeps the record's field order rather than moving ``phase`` first.
    """

    def build(self, request: PhaseRequest) -> RecordDict:
        """Return the request's content (:meth:`PhaseRequest.to_record`).

        Raises
        ------
        ValueError
            If the request's config is of another phase (a bug, not bad input).
        """
        if request.config.phase != self.name:
            raise ValueError(f"a {self.name} request carries a {request.config.phase} config")
        return request.to_record()


def _phase(name: str) -> PrivHFLPhase:
    return PrivHFLPhase(PRIVHFL_KEY, name, PhaseRequest, PhaseReply, PHASE_TYPES[name])


LOCAL = _phase("local")
GENERATE = _phase("generate")
ANSWER = _phase("answer")
RETRAIN = _phase("retrain")
EVALUATE = _phase("evaluate")
KEYS = _phase("keys")
STEP = _phase("step")
SIGN = _phase("sign")
PRIVHFL_PHASES: dict[str, PrivHFLPhase] = {
    p.name: p for p in (LOCAL, GENERATE, ANSWER, RETRAIN, EVALUATE, KEYS, STEP, SIGN)
}
"""Phase name -> its :class:`PrivHFLPhase` (the names of :data:`PHASE_TYPES`)."""


def read_query_failure(content: RecordDict) -> tuple[str | None, RecordDict]:
    """Split a ``retrain`` reply: the querier's failure report (or None) and the rest.

    Raises
    ------
    ClientInputError
        If the report is not one ``reason`` string.
    """
    record = content.config_records.get(QUERY_FAILED_KEY)
    if record is None:
        return None, content
    reason = record.get("reason")
    if len(record) != 1 or not isinstance(reason, str):
        raise ClientInputError(f"{QUERY_FAILED_KEY!r} must hold one string field 'reason'")
    return reason, RecordDict({k: v for k, v in content.items() if k != QUERY_FAILED_KEY})
