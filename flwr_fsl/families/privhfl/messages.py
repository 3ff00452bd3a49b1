"""The messages and client state of PrivHFL's secure answering (``answering="secure"``).

The server (:class:`~flwr_fsl.families.privhfl.strategy.PrivHFL`) is the third computing party of
:mod:`flwr_fsl.families.privhfl.protocol`; every exchange runs through
:mod:`flwr_fsl.families.privhfl.flow` (schedule, deals, answerer state). What travels in a
Flower message is one byte string under :data:`SECURE_KEY` (a ``ConfigRecord``
``{"blob": bytes}``) in one of the formats below (``b"PHFW"``, version ``u8`` 1, a kind
``u8``, the fields, no trailing bytes; :mod:`flwr_fsl.core.wireformat` fields):

==============  ===============  ==========================================================
phase           direction        content
==============  ===============  ==========================================================
``keys``        S -> node        :class:`KeysRequest`: the run's 16-byte session id
``keys``        node -> S        :class:`KeysReply`: a fresh X25519 public key, the node's
                                 architecture (:func:`~flwr_fsl.families.privhfl.flow.
                                 architecture_to_bytes`)
``generate``    S -> Q           :class:`GenerateRequest`: settings, session number, per
                                 answerer: node id, public key, architecture, ``Sk_SQ``
``generate``    Q -> S           :class:`GenerateReply`: batch, per answerer: ``Sk_QA``
                                 sealed to the answerer, the share and every deal
``step``        S -> A           :class:`StepRequest`: step ``k``, per querier: node id,
                                 (step 1) the sealed ``Sk_QA``, ``Sk_SA`` and batch, then
                                 ``S``'s bytes for step ``k``
``step``        A -> S           :class:`StepReply`: per querier: ``A``'s bytes for step ``k``
                                 (paper's DReLU: plus its first messages of step ``k + 1``)
``sign``        S -> Q           paper's DReLU only, per comparison step: :class:`SignRequest`
                                 (per answerer ``S``'s ``drelu-z``); ``Q`` replies
                                 :class:`SignReply` (its ``DReLU(z) - delta'`` per answerer)
``retrain``     S -> Q           :class:`RetrainRequest`: settings, session number, the
                                 ``agg-S`` message (masked sum, answerers included)
==============  ===============  ==========================================================

**Seeds.** ``Sk_QA`` (querier-answerer) is drawn by ``Q`` and sealed to ``A``'s X25519 key
(:func:`~flwr_fsl.crypto.sealing.seal_for`, purpose :data:`SEED_PURPOSE`, bound to the
run's session id, the round and the settings, sender and recipient node ids): ``S`` relays it
and cannot open it. ``Sk_SQ`` and ``Sk_SA`` are the server's own seeds with each client: ``S``
draws them and sends them on the client's link (the transport's TLS; the threat model is
honest-but-curious and ``S`` colludes with no client). The public keys are relayed by ``S``
unauthenticated: an active server could substitute them — outside the threat model.

**Client state** (bytes in ``Context.state``, strict codecs): the X25519 private key of the
round (:data:`KEY_SLOT`), the querier's sessions (:class:`QuerierState`) and the answerer's
sessions (:class:`~flwr_fsl.families.privhfl.flow.AnswererState`, one per querier).

Every decoder raises :class:`~flwr_fsl.core.wireformat.WireFormatError` (a
:class:`~flwr_fsl.core.errors.ClientInputError`) on malformed bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.crypto.prg import SEED_BYTES
from flwr_fsl.crypto.sealing import RoundBinding
from flwr_fsl.families.privhfl.config import PrivHFLConfig
from flwr_fsl.families.privhfl.wire import MessageBuffers, Wire, assemble

__all__ = [
    "KEY_SLOT",
    "SECURE_KEY",
    "SEED_PURPOSE",
    "AnswererInfo",
    "GenerateReply",
    "GenerateRequest",
    "KeysReply",
    "KeysRequest",
    "QuerierState",
    "RetrainRequest",
    "SessionDeal",
    "SignReply",
    "SignRequest",
    "StepEntry",
    "StepReply",
    "StepRequest",
    "binding",
    "encode_generate_reply",
]

SECURE_KEY = "fsl.privhfl.secure"
"""``ConfigRecord`` ``{"blob": bytes}`` of every secure-answering message."""
KEY_SLOT = "fsl.privhfl.secure-key"
SEED_PURPOSE = "privhfl-seed-qa"
"""Sealing purpose of ``Sk_QA``."""
_MAGIC = register_magic(
    b"PHFW", "PrivHFL secure-answering messages (flwr_fsl.families.privhfl.messages)"
)
_VERSION = 1
_PUBLIC_BYTES = 32
_SESSION_ID_BYTES = 16
_MAX_BATCH = 10_000_000
K_KEYS_REQ, K_KEYS_REP, K_GEN_REQ, K_GEN_REP, K_STEP_REQ, K_STEP_REP = 1, 2, 3, 4, 5, 6
K_RETRAIN, K_QSTATE, K_SIGN_REQ, K_SIGN_REP = 7, 8, 9, 10
_RELU = {"drelu": 0, "dcf": 1}


def _start(kind: int) -> Writer:
    w = Writer()
    w.parts = [_MAGIC, bytes([_VERSION, kind])]
    return w


def _open(data: object, kind: int, what: str) -> Reader:
    r = Reader.versioned(data, _MAGIC, _VERSION, what)
    if r.u8("kind") != kind:
        raise WireFormatError(f"not {what}")
    return r


def _write_config(w: Writer, config: PrivHFLConfig) -> None:
    w.u8(_RELU[config.comparison])
    w.u8(config.frac_bits)
    w.u8(config.bound_bits)


def _read_config(r: Reader) -> PrivHFLConfig:
    relu, frac, bound = r.u8("relu"), r.u8("frac bits"), r.u8("bound bits")
    names = {v: k for k, v in _RELU.items()}
    if relu not in names:
        raise WireFormatError(f"unknown comparison code {relu}")
    try:
        return PrivHFLConfig(comparison=names[relu], frac_bits=frac, bound_bits=bound)  # type: ignore[arg-type]
    except (ConfigurationError, ValueError, TypeError) as err:
        raise WireFormatError(f"invalid settings: {err}") from err


def _batch(r: Reader) -> int:
    b = r.u32("batch")
    if not 1 <= b <= _MAX_BATCH:
        raise WireFormatError(f"batch must be in [1, {_MAX_BATCH}]")
    return b


def _ids_unique(ids: list[int], what: str) -> None:
    if len(set(ids)) != len(ids):
        raise WireFormatError(f"{what}: repeated node id")


def _write_node_bytes(w: Writer, entries: tuple[tuple[int, bytes], ...]) -> None:
    w.count(len(entries))
    for node, data in entries:
        w.u64(node)
        w.raw(data)


def _read_node_bytes(r: Reader, node: str, what: str) -> tuple[tuple[int, bytes], ...]:
    """Read ``(node id, bytes)`` entries; node ids must be distinct."""
    n = r.count("entries", 12)
    entries = tuple((r.u64(node), r.raw("data")) for _ in range(n))
    _ids_unique([i for i, _ in entries], what)
    return entries


def binding(
    run_session: bytes, server_round: int, config: PrivHFLConfig, session: int
) -> RoundBinding:
    """Return what ``Sk_QA``'s sealing is bound to: run session id, round, settings, session."""
    w = Writer()
    _write_config(w, config)
    w.u32(session)
    return RoundBinding.of(run_session, server_round, b"privhfl-secure/v1" + w.payload())


@dataclass(frozen=True)
class KeysRequest:
    """``S -> node`` (``keys``): the run's session id."""

    run_session: bytes = field(repr=False)

    def to_bytes(self) -> bytes:
        """Encode."""
        w = _start(K_KEYS_REQ)
        w.fixed(self.run_session, _SESSION_ID_BYTES)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> KeysRequest:
        """Decode strictly."""
        r = _open(data, K_KEYS_REQ, "a PrivHFL keys request")
        out = cls(r.fixed(_SESSION_ID_BYTES, "session id"))
        r.done()
        return out


@dataclass(frozen=True)
class KeysReply:
    """``node -> S`` (``keys``): X25519 public key and architecture bytes."""

    public_key: bytes = field(repr=False)
    architecture: bytes = field(repr=False)

    def to_bytes(self) -> bytes:
        """Encode."""
        w = _start(K_KEYS_REP)
        w.fixed(self.public_key, _PUBLIC_BYTES)
        w.raw(self.architecture)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> KeysReply:
        """Decode strictly (the architecture bytes are decoded by the caller)."""
        r = _open(data, K_KEYS_REP, "a PrivHFL keys reply")
        out = cls(r.fixed(_PUBLIC_BYTES, "public key"), r.raw("architecture"))
        r.done()
        return out


@dataclass(frozen=True)
class AnswererInfo:
    """One answerer as the querier is told: node id, public key, architecture, ``Sk_SQ``."""

    node: int
    public_key: bytes = field(repr=False)
    architecture: bytes = field(repr=False)
    server_querier: bytes = field(repr=False)


@dataclass(frozen=True)
class GenerateRequest:
    """``S -> Q`` (``generate``): settings, session number, the answerers."""

    config: PrivHFLConfig
    session: int
    run_session: bytes = field(repr=False)
    answerers: tuple[AnswererInfo, ...] = ()

    def to_bytes(self) -> bytes:
        """Encode."""
        w = _start(K_GEN_REQ)
        _write_config(w, self.config)
        w.u32(self.session)
        w.fixed(self.run_session, _SESSION_ID_BYTES)
        w.count(len(self.answerers))
        for a in self.answerers:
            w.u64(a.node)
            w.fixed(a.public_key, _PUBLIC_BYTES)
            w.raw(a.architecture)
            w.fixed(a.server_querier, SEED_BYTES)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> GenerateRequest:
        """Decode strictly (at least one answerer, distinct node ids)."""
        r = _open(data, K_GEN_REQ, "a PrivHFL generate request")
        config = _read_config(r)
        session = r.u32("session")
        run_session = r.fixed(_SESSION_ID_BYTES, "session id")
        n = r.count("answerers", 8 + _PUBLIC_BYTES + 4 + SEED_BYTES)
        answerers = tuple(
            AnswererInfo(
                r.u64("node"),
                r.fixed(_PUBLIC_BYTES, "public key"),
                r.raw("architecture"),
                r.fixed(SEED_BYTES, "Sk_SQ"),
            )
            for _ in range(n)
        )
        r.done()
        if not answerers:
            raise WireFormatError("a generate request needs at least one answerer")
        _ids_unique([a.node for a in answerers], "generate request")
        return cls(config, session, run_session, answerers)


@dataclass(frozen=True)
class SessionDeal:
    """What ``Q`` sends for one answerer: ``Sk_QA`` sealed to it, the share and the deals."""

    node: int
    sealed_seed: bytes = field(repr=False)
    messages: tuple[bytes, ...] = field(default=(), repr=False)


def _read_list(r: Reader, what: str) -> tuple[bytes, ...]:
    n = r.count(what, 4)
    return tuple(r.raw(what) for _ in range(n))


@dataclass(frozen=True)
class GenerateReply:
    """``Q -> S`` (``generate``): the batch size and one :class:`SessionDeal` per answerer."""

    batch: int
    sessions: tuple[SessionDeal, ...] = ()

    def to_bytes(self) -> bytes:
        """Encode."""
        return encode_generate_reply(
            self.batch,
            [
                (s.node, s.sealed_seed, [len(m) for m in s.messages], s.messages)
                for s in self.sessions
            ],
        )

    @classmethod
    def from_bytes(cls, data: object) -> GenerateReply:
        """Decode strictly (distinct node ids)."""
        r = _open(data, K_GEN_REP, "a PrivHFL generate reply")
        batch = _batch(r)
        n = r.count("sessions", 16)
        sessions = tuple(
            SessionDeal(r.u64("node"), r.raw("sealed seed"), _read_list(r, "messages"))
            for _ in range(n)
        )
        r.done()
        _ids_unique([s.node for s in sessions], "generate reply")
        return cls(batch, sessions)


_Sessions = Sequence[tuple[int, bytes, Sequence[int], Iterable[bytes]]]


@overload
def encode_generate_reply(batch: int, sessions: _Sessions, into: None = None) -> bytes: ...
@overload
def encode_generate_reply(batch: int, sessions: _Sessions, into: MessageBuffers) -> Wire: ...
def encode_generate_reply(
    batch: int, sessions: _Sessions, into: MessageBuffers | None = None
) -> Wire:
    """Encode a :class:`GenerateReply` whose messages are made while it is written.

    The reply is sized from the messages' announced lengths and allocated once
    (:func:`~flwr_fsl.families.privhfl.wire.assemble`); each message is copied in as its
    iterable yields it and then dropped, so a session's deals
    (:class:`~flwr_fsl.families.privhfl.flow.QuerierDeals`) are never all in memory next to
    the reply (a join needs both: twice the deals at the peak). The bytes are those of
    :meth:`GenerateReply.to_bytes` for the same messages. With ``into`` (a process that
    also consumes the reply) it is written into a buffer that pool lends.

    Parameters
    ----------
    batch : int
        The batch size.
    sessions : sequence of tuple
        Per answerer ``(node, sealed seed, message lengths, messages)``.
    into : MessageBuffers, optional
        Buffers to write the reply into (:func:`~flwr_fsl.families.privhfl.wire.assemble`).

    Returns
    -------
    bytes or memoryview
        The reply (a read-only view of a lent buffer with ``into``).

    Raises
    ------
    WireFormatError
        If a field is out of range, or a message is not bytes or not of its announced length.
    """
    w = _start(K_GEN_REP)
    w.u32(batch)
    w.count(len(sessions))
    heads, total = [w.payload()], 0
    for node, sealed, sizes, _ in sessions:
        h = Writer()
        h.u64(node)
        h.raw(sealed)
        h.count(len(sizes))
        heads.append(h.payload())
        total += sum(4 + _check_u32(n) for n in sizes)
    total += sum(len(h) for h in heads)

    def fill(dst: NDArray[np.uint8]) -> None:
        pos = 0

        def put(data: bytes | memoryview) -> None:
            nonlocal pos
            src = np.frombuffer(data, dtype=np.uint8)
            dst[pos : pos + src.size] = src
            pos += src.size

        put(heads[0])
        for head, (_, _, sizes, messages) in zip(heads[1:], sessions, strict=True):
            put(head)
            made = iter(messages)
            for k, size in enumerate(sizes):
                message = next(made, None)
                if not isinstance(message, bytes | bytearray | memoryview):
                    raise WireFormatError(
                        f"message {k}: expected bytes, got {type(message).__name__}"
                    )
                if memoryview(message).nbytes != size:
                    raise WireFormatError(
                        f"message {k} holds {memoryview(message).nbytes} bytes, announced {size}"
                    )
                put(struct.pack("<I", size))
                put(message)
                del message  # freed before the next is made: one deal beside the reply at a time
            if next(made, None) is not None:  # (also lets a generator finish its work)
                raise WireFormatError(f"more messages than the {len(sizes)} announced")

    return assemble([], total, fill, into)


def _check_u32(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 0xFFFFFFFF:
        raise WireFormatError(f"message length must be a u32, got {n!r}")
    return n


@dataclass(frozen=True)
class StepEntry:
    """One querier's session in a step: (step 1 only) sealed seed, ``Sk_SA``, batch; data."""

    querier: int
    data: bytes = field(repr=False)
    sealed_seed: bytes = field(default=b"", repr=False)
    server_answerer: bytes = field(default=b"", repr=False)
    batch: int = 0


@dataclass(frozen=True)
class StepRequest:
    """``S -> A`` (``step``): settings, step, session number, run session id, entries."""

    config: PrivHFLConfig
    step: int
    session: int
    run_session: bytes = field(repr=False)
    entries: tuple[StepEntry, ...] = ()

    def to_bytes(self) -> bytes:
        """Encode."""
        w = _start(K_STEP_REQ)
        _write_config(w, self.config)
        w.u32(self.step)
        w.u32(self.session)
        w.fixed(self.run_session, _SESSION_ID_BYTES)
        w.count(len(self.entries))
        for e in self.entries:
            w.u64(e.querier)
            if self.step == 1:
                w.raw(e.sealed_seed)
                w.fixed(e.server_answerer, SEED_BYTES)
                w.u32(e.batch)
            w.raw(e.data)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> StepRequest:
        """Decode strictly (step >= 1, at least one entry, distinct querier ids)."""
        r = _open(data, K_STEP_REQ, "a PrivHFL step request")
        config = _read_config(r)
        step = r.u32("step")
        if step < 1:
            raise WireFormatError("step must be >= 1")
        session = r.u32("session")
        run_session = r.fixed(_SESSION_ID_BYTES, "session id")
        n = r.count("entries", 12)
        entries = []
        for _ in range(n):
            q = r.u64("querier")
            if step == 1:
                sealed, sa, batch = r.raw("sealed seed"), r.fixed(SEED_BYTES, "Sk_SA"), _batch(r)
                entries.append(StepEntry(q, r.raw("data"), sealed, sa, batch))
            else:
                entries.append(StepEntry(q, r.raw("data")))
        r.done()
        if not entries:
            raise WireFormatError("a step request needs at least one entry")
        _ids_unique([e.querier for e in entries], "step request")
        return cls(config, step, session, run_session, tuple(entries))


@dataclass(frozen=True)
class StepReply:
    """``A -> S`` (``step``): per querier, ``A``'s bytes for the step."""

    entries: tuple[tuple[int, bytes], ...] = ()

    def to_bytes(self) -> bytes:
        """Encode."""
        w = _start(K_STEP_REP)
        _write_node_bytes(w, self.entries)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> StepReply:
        """Decode strictly (distinct querier ids)."""
        r = _open(data, K_STEP_REP, "a PrivHFL step reply")
        entries = _read_node_bytes(r, "querier", "step reply")
        r.done()
        return cls(entries)


@dataclass(frozen=True)
class SignRequest:
    """``S -> Q`` (``sign``, paper's DReLU only): per answerer, the ``drelu-z`` of step ``k``."""

    config: PrivHFLConfig
    step: int
    session: int
    entries: tuple[tuple[int, bytes], ...] = ()

    def to_bytes(self) -> bytes:
        """Encode."""
        w = _start(K_SIGN_REQ)
        _write_config(w, self.config)
        w.u32(self.step)
        w.u32(self.session)
        _write_node_bytes(w, self.entries)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> SignRequest:
        """Decode strictly (step >= 1, at least one entry, distinct answerer ids)."""
        r = _open(data, K_SIGN_REQ, "a PrivHFL sign request")
        config = _read_config(r)
        step, session = r.u32("step"), r.u32("session")
        entries = _read_node_bytes(r, "answerer", "sign request")
        r.done()
        if step < 1 or not entries:
            raise WireFormatError("a sign request needs step >= 1 and at least one entry")
        return cls(config, step, session, entries)


@dataclass(frozen=True)
class SignReply:
    """``Q -> S`` (``sign``): per answerer, ``DReLU(z) - delta'``."""

    entries: tuple[tuple[int, bytes], ...] = ()

    def to_bytes(self) -> bytes:
        """Encode."""
        w = _start(K_SIGN_REP)
        _write_node_bytes(w, self.entries)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> SignReply:
        """Decode strictly (distinct answerer ids)."""
        r = _open(data, K_SIGN_REP, "a PrivHFL sign reply")
        entries = _read_node_bytes(r, "answerer", "sign reply")
        r.done()
        return cls(entries)


@dataclass(frozen=True)
class RetrainRequest:
    """``S -> Q`` (``retrain``): settings, session number and the ``agg-S`` message."""

    config: PrivHFLConfig
    session: int
    aggregate: bytes = field(repr=False)

    def to_bytes(self) -> bytes:
        """Encode."""
        w = _start(K_RETRAIN)
        _write_config(w, self.config)
        w.u32(self.session)
        w.raw(self.aggregate)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> RetrainRequest:
        """Decode strictly."""
        r = _open(data, K_RETRAIN, "a PrivHFL retrain request")
        out = cls(_read_config(r), r.u32("session"), r.raw("aggregate"))
        r.done()
        return out


@dataclass(frozen=True)
class QuerierSessionState:
    """The querier's record of one session: answerer, seeds, architecture, op count."""

    node: int
    querier_answerer: bytes = field(repr=False)
    server_querier: bytes = field(repr=False)
    architecture: bytes = field(repr=False)
    ops: int = 0


@dataclass(frozen=True)
class QuerierState:
    """What the querier keeps from ``generate`` to ``retrain`` (``Context.state`` bytes)."""

    server_round: int
    session: int
    batch: int
    sessions: tuple[QuerierSessionState, ...] = ()

    def to_bytes(self) -> bytes:
        """Encode."""
        w = _start(K_QSTATE)
        w.u32(self.server_round)
        w.u32(self.session)
        w.u32(self.batch)
        w.count(len(self.sessions))
        for s in self.sessions:
            w.u64(s.node)
            w.fixed(s.querier_answerer, SEED_BYTES)
            w.fixed(s.server_querier, SEED_BYTES)
            w.raw(s.architecture)
            w.u32(s.ops)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> QuerierState:
        """Decode strictly."""
        r = _open(data, K_QSTATE, "a PrivHFL querier state")
        rnd, session, batch = r.u32("round"), r.u32("session"), _batch(r)
        n = r.count("sessions", 8 + 2 * SEED_BYTES + 8)
        sessions = tuple(
            QuerierSessionState(
                r.u64("node"),
                r.fixed(SEED_BYTES, "Sk_QA"),
                r.fixed(SEED_BYTES, "Sk_SQ"),
                r.raw("architecture"),
                r.u32("ops"),
            )
            for _ in range(n)
        )
        r.done()
        _ids_unique([s.node for s in sessions], "querier state")
        return cls(rnd, session, batch, sessions)
