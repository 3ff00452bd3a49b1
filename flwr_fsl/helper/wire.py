"""Wire format between S0 and the helper server S1: strict, versioned, length-prefixed, no pickle.

Every gRPC request and response body (and a sealed PSR answer's plaintext) is one message::

    magic  b"FSHW"   4 bytes
    version          u8   (4; v1 had no session ids, v3 let S0 name its session)
    kind             u8   (:class:`Kind`)
    reserved         u16  (0)
    body             kind-specific fields, then nothing: trailing bytes are an error

All integers are little-endian. Field types:

* ``u8``, ``u32``, ``u64``;
* ``bytes``: ``u32`` length, then the bytes;
* ``ids``: ``u32`` count, then ``count`` ``u64``;
* ``array``: dtype code ``u8`` (1 uint64, 2 int64, 3 float32, 4 float64, 5 uint8), ``ndim`` ``u8``
  (0..4), ``ndim`` ``u64`` dimensions, then the elements as raw little-endian C-order bytes;
* ``items``: ``u32`` count, then per item the fields listed;
* ``session``: exactly 16 raw bytes, the session id S1 drew for the run in ``OPEN_SESSION``
  (S1 keeps every round, U-DPF key and PSR table per session, so one helper serves many runs
  at once). The session's 32-byte secret is not in any body: it travels beside the body
  (gRPC metadata ``x-flwr-fsl-session-secret``, an argument of
  :meth:`HelperService.handle <flwr_fsl.helper.service.HelperService.handle>` in process).

The field reader and writer are :mod:`flwr_fsl.core.wireformat`'s (one strict codec toolkit for
every binary format); a plugged-in service registers its own kinds (128..255) with
:func:`register_message`.

Bodies:

=====================  ==========================================================================
kind                   body
=====================  ==========================================================================
HEALTH (1)             empty
PUBLIC_KEY (2)         empty
OPEN_ROUND (3)         session, round ``u64``, params ``bytes`` (``SSAParams.to_bytes()``)
ADD_CLIENTS (4)        session, round ``u64``, items (client ``u64``, public, sealed ``bytes``)
ADD_HINTS (5)          session, round ``u64``, items (client ``u64``, hint ``bytes``)
FINISH_ROUND (6)       session, round ``u64``
ABORT_ROUND (7)        session, round ``u64``
SET_MODEL (8)          session, round ``u64``, table ``array`` (uint64, 2-d)
PSR_ANSWER (9)         session, round ``u64``, items (client ``u64``, public, sealed ``bytes``)
CLOSE_SESSION (10)     session
OPEN_SESSION (11)      empty (S1 draws the session id and its secret)
OPEN_CHECKED_ROUND (12) session, round ``u64``, params ``bytes``, digest key (exactly 16 raw
                       bytes): :class:`OpenCheckedRoundRequest`, ``OPEN_ROUND``'s second version
                       for checked rounds; the round's secret key of the key-check digest
                       (version 3, :mod:`flwr_fsl.families.ssa.verify`), drawn by S0 and
                       sent only to S1 (``OPEN_ROUND`` still opens a round: digest version 2)
ADD_CHECKED (24)       session, round ``u64``, items (client ``u64``, public, sealed, digest
                       ``bytes``): :class:`AddCheckedRequest`, a checked round's uploads with
                       S0's key-check digest (:mod:`flwr_fsl.families.ssa.verify`); S1 answers
                       CLIENT_RESULTS with its own digest as the payload of each accepted client
ADD_CHECKED_HINTS (25) the same with U-DPF hints in place of public parts
OK (64)                empty
HEALTH_INFO (65)       protocol version ``u32``, public key ``bytes`` (32) (nothing about
                       sessions or rounds: ``Health`` needs no token)
PUBLIC_KEY_INFO (66)   public key ``bytes`` (32)
CLIENT_RESULTS (67)    items (client ``u64``, status ``u8`` 0 ok / 1 rejected, payload ``bytes``:
                       empty or a sealed answer when ok, the UTF-8 reason when rejected)
SHARE (68)             contributing clients ``ids``, share ``array`` (uint64, ``(m, tau)``)
ARRAY (69)             ``array`` (the plaintext of a sealed PSR answer)
SESSION_INFO (70)      session, secret (exactly 32 raw bytes): the answer to ``OPEN_SESSION``
=====================  ==========================================================================

**Limits.** A message is at most :data:`MAX_MESSAGE_BYTES` (512 MiB, the gRPC message limit
set on both ends), a list at most :data:`MAX_ITEMS` items, an array at most
:data:`MAX_ARRAY_NDIM` dimensions. Every length is checked against the bytes actually left
before anything is allocated, so a short message with a huge declared length fails fast.

**Errors.** :class:`~flwr_fsl.helper.errors.WireFormatError` for anything malformed: bad magic,
version, kind or reserved bytes, truncation, trailing bytes, unknown dtype, oversize.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import ClassVar, TypeVar

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.wireformat import (
    MAX_ARRAY_NDIM,
    MAX_ITEMS,
    MAX_MESSAGE_BYTES,
    WireFormatError,
    register_magic,
)
from flwr_fsl.core.wireformat import Reader as _Reader
from flwr_fsl.core.wireformat import Writer as _Writer

__all__ = [
    "MAGIC",
    "MAX_ARRAY_NDIM",
    "MAX_ITEMS",
    "MAX_MESSAGE_BYTES",
    "SECRET_BYTES",
    "SESSION_BYTES",
    "VERSION",
    "AbortRoundRequest",
    "AddCheckedHintsRequest",
    "AddCheckedRequest",
    "AddClientsRequest",
    "AddHintsRequest",
    "ArrayMessage",
    "CheckedItem",
    "ClientResult",
    "ClientResultsResponse",
    "CloseSessionRequest",
    "FinishRoundRequest",
    "HealthRequest",
    "HealthResponse",
    "HintItem",
    "Kind",
    "Message",
    "OkResponse",
    "OpenCheckedRoundRequest",
    "OpenRoundRequest",
    "OpenSessionRequest",
    "PsrAnswerRequest",
    "PublicKeyRequest",
    "PublicKeyResponse",
    "SealedItem",
    "SessionInfoResponse",
    "SetModelRequest",
    "ShareResponse",
    "WireFormatError",
    "decode",
    "encode",
    "register_message",
]

MAGIC = register_magic(b"FSHW", "helper wire message, S0 <-> S1 (flwr_fsl.helper.wire)")
VERSION = 4  # v4: S1 draws session ids and secrets (SESSION_INFO); HEALTH_INFO lists no rounds
SESSION_BYTES = 16
"""Length of a session id: S1 draws one per ``OPEN_SESSION`` (one per run)."""
SECRET_BYTES = 32
"""Length of a session secret: every later call of the session must carry it."""
_DIGEST_KEY_BYTES = 16  # flwr_fsl.families.ssa.verify.DIGEST_KEY_BYTES
_HEADER = struct.Struct("<4sBBH")


class Kind(IntEnum):
    """Message kinds (requests below 64, responses from 64)."""

    HEALTH = 1
    PUBLIC_KEY = 2
    OPEN_ROUND = 3
    ADD_CLIENTS = 4
    ADD_HINTS = 5
    FINISH_ROUND = 6
    ABORT_ROUND = 7
    SET_MODEL = 8
    PSR_ANSWER = 9
    CLOSE_SESSION = 10
    OPEN_SESSION = 11
    OPEN_CHECKED_ROUND = 12
    ADD_CHECKED = 24
    ADD_CHECKED_HINTS = 25
    OK = 64
    HEALTH_INFO = 65
    PUBLIC_KEY_INFO = 66
    CLIENT_RESULTS = 67
    SHARE = 68
    ARRAY = 69
    SESSION_INFO = 70


# ------------------------------------------------------------------------------------------------
# Field reader / writer
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# Messages
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SealedItem:
    """One client's public part and the material sealed to S1 (an SSA upload or a PSR query)."""

    client_id: int
    public_part: bytes = field(repr=False)
    sealed: bytes = field(repr=False)


@dataclass(frozen=True)
class HintItem:
    """One client's public U-DPF hint and its binding sealed to S1."""

    client_id: int
    hint: bytes = field(repr=False)
    sealed: bytes = field(repr=False)


@dataclass(frozen=True)
class ClientResult:
    """Outcome for one client: ``ok`` with an optional payload, or rejected with a reason."""

    client_id: int
    ok: bool
    payload: bytes = field(default=b"", repr=False)

    @property
    def reason(self) -> str:
        """The rejection reason (empty when ok)."""
        return "" if self.ok else self.payload.decode("utf-8", errors="replace")


class Message:
    """Base of all wire messages."""

    KIND: ClassVar[Kind | int]

    def _write(self, w: _Writer) -> None:
        """Write the body (nothing by default)."""

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls()


def _read_items(r: _Reader) -> tuple[SealedItem, ...]:
    n = r.count("items", 16)
    return tuple(
        SealedItem(r.u64("client id"), r.raw("public part"), r.raw("sealed")) for _ in range(n)
    )


def _write_items(w: _Writer, items: Sequence[SealedItem]) -> None:
    w.count(len(items))
    for it in items:
        w.u64(it.client_id)
        w.raw(it.public_part)
        w.raw(it.sealed)


@dataclass(frozen=True)
class HealthRequest(Message):
    """Ask S1 for its status."""

    KIND: ClassVar[Kind] = Kind.HEALTH


@dataclass(frozen=True)
class PublicKeyRequest(Message):
    """Ask S1 for its public key."""

    KIND: ClassVar[Kind] = Kind.PUBLIC_KEY


def _write_session(w: _Writer, session: bytes) -> None:
    w.fixed(session, SESSION_BYTES)


def _read_session(r: _Reader) -> bytes:
    return r.fixed(SESSION_BYTES, "session id")


@dataclass(frozen=True)
class OpenSessionRequest(Message):
    """Start a new session (a run); S1 draws its id and secret and keeps it until closed or idle."""

    KIND: ClassVar[Kind] = Kind.OPEN_SESSION


@dataclass(frozen=True)
class SessionInfoResponse(Message):
    """A new session: the id S1 drew (clients bind sealed material to it) and its secret.

    Only S0 gets the secret; every later call of the session must carry it.
    """

    KIND: ClassVar[Kind] = Kind.SESSION_INFO
    session: bytes
    secret: bytes = field(repr=False)

    def _write(self, w: _Writer) -> None:
        _write_session(w, self.session)
        w.fixed(self.secret, SECRET_BYTES)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(_read_session(r), r.fixed(SECRET_BYTES, "session secret"))


@dataclass(frozen=True)
class CloseSessionRequest(Message):
    """Drop a session and everything S1 keeps for it (rounds, U-DPF keys)."""

    KIND: ClassVar[Kind] = Kind.CLOSE_SESSION
    session: bytes

    def _write(self, w: _Writer) -> None:
        _write_session(w, self.session)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(_read_session(r))


@dataclass(frozen=True)
class _RoundOnly(Message):
    session: bytes
    round_id: int

    def _write(self, w: _Writer) -> None:
        _write_session(w, self.session)
        w.u64(self.round_id)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(_read_session(r), r.u64("round"))


@dataclass(frozen=True)
class FinishRoundRequest(_RoundOnly):
    """Close a round and return S1's aggregate share."""

    KIND: ClassVar[Kind] = Kind.FINISH_ROUND


@dataclass(frozen=True)
class AbortRoundRequest(_RoundOnly):
    """Drop a round without a result."""

    KIND: ClassVar[Kind] = Kind.ABORT_ROUND


@dataclass(frozen=True)
class OpenRoundRequest(Message):
    """Start a round with its public parameters."""

    KIND: ClassVar[Kind] = Kind.OPEN_ROUND
    session: bytes
    round_id: int
    params: bytes

    def _write(self, w: _Writer) -> None:
        _write_session(w, self.session)
        w.u64(self.round_id)
        w.raw(self.params)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(_read_session(r), r.u64("round"), r.raw("params"))


@dataclass(frozen=True)
class OpenCheckedRoundRequest(OpenRoundRequest):
    """Start a checked round: its public parameters and the round's secret digest key.

    The key (16 bytes, never shown by ``repr``) keys the key-check digest (version 3); S0
    draws it per round and sends it to S1 only.
    """

    KIND: ClassVar[Kind] = Kind.OPEN_CHECKED_ROUND
    digest_key: bytes = field(default=b"", repr=False)

    def _write(self, w: _Writer) -> None:
        super()._write(w)
        w.fixed(self.digest_key, _DIGEST_KEY_BYTES)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        session, round_id, params = _read_session(r), r.u64("round"), r.raw("params")
        return cls(session, round_id, params, r.fixed(_DIGEST_KEY_BYTES, "digest key"))


@dataclass(frozen=True)
class AddClientsRequest(Message):
    """Relay clients' SSA uploads (public part + material sealed to S1)."""

    KIND: ClassVar[Kind] = Kind.ADD_CLIENTS
    session: bytes
    round_id: int
    uploads: tuple[SealedItem, ...]

    def _write(self, w: _Writer) -> None:
        _write_session(w, self.session)
        w.u64(self.round_id)
        _write_items(w, self.uploads)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(_read_session(r), r.u64("round"), _read_items(r))


@dataclass(frozen=True)
class PsrAnswerRequest(Message):
    """Relay clients' PSR queries (public part + material sealed to S1)."""

    KIND: ClassVar[Kind] = Kind.PSR_ANSWER
    session: bytes
    round_id: int
    queries: tuple[SealedItem, ...]

    def _write(self, w: _Writer) -> None:
        _write_session(w, self.session)
        w.u64(self.round_id)
        _write_items(w, self.queries)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(_read_session(r), r.u64("round"), _read_items(r))


@dataclass(frozen=True)
class AddHintsRequest(Message):
    """Relay clients' public U-DPF hints."""

    KIND: ClassVar[Kind] = Kind.ADD_HINTS
    session: bytes
    round_id: int
    hints: tuple[HintItem, ...]

    def _write(self, w: _Writer) -> None:
        _write_session(w, self.session)
        w.u64(self.round_id)
        w.count(len(self.hints))
        for h in self.hints:
            w.u64(h.client_id)
            w.raw(h.hint)
            w.raw(h.sealed)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        session, round_id = _read_session(r), r.u64("round")
        n = r.count("hints", 16)
        hints = tuple(
            HintItem(r.u64("client id"), r.raw("hint"), r.raw("sealed")) for _ in range(n)
        )
        return cls(session, round_id, hints)


@dataclass(frozen=True, eq=False)
class SetModelRequest(Message):
    """Give S1 the table (ring words) PSR queries of the round are answered from."""

    KIND: ClassVar[Kind] = Kind.SET_MODEL
    session: bytes
    round_id: int
    table: NDArray[np.uint64] = field(repr=False)

    def _write(self, w: _Writer) -> None:
        _write_session(w, self.session)
        w.u64(self.round_id)
        w.array(self.table)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(_read_session(r), r.u64("round"), r.array_u64("table"))


@dataclass(frozen=True)
class OkResponse(Message):
    """A call succeeded without a result."""

    KIND: ClassVar[Kind] = Kind.OK


@dataclass(frozen=True)
class HealthResponse(Message):
    """S1's status: wire protocol version and public key (nothing about sessions or rounds)."""

    KIND: ClassVar[Kind] = Kind.HEALTH_INFO
    protocol_version: int
    public_key: bytes

    def _write(self, w: _Writer) -> None:
        w.u32(self.protocol_version)
        w.raw(self.public_key)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(r.u32("protocol version"), r.raw("public key"))


@dataclass(frozen=True)
class PublicKeyResponse(Message):
    """S1's raw X25519 public key."""

    KIND: ClassVar[Kind] = Kind.PUBLIC_KEY_INFO
    public_key: bytes

    def _write(self, w: _Writer) -> None:
        w.raw(self.public_key)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(r.raw("public key"))


@dataclass(frozen=True)
class ClientResultsResponse(Message):
    """Per-client outcomes of an ADD_CLIENTS, ADD_HINTS or PSR_ANSWER call."""

    KIND: ClassVar[Kind] = Kind.CLIENT_RESULTS
    results: tuple[ClientResult, ...]

    def _write(self, w: _Writer) -> None:
        w.count(len(self.results))
        for res in self.results:
            w.u64(res.client_id)
            w.u8(0 if res.ok else 1)
            w.raw(res.payload)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        n = r.count("results", 13)
        out = []
        for _ in range(n):
            cid = r.u64("client id")
            status = r.u8("status")
            if status not in (0, 1):
                raise WireFormatError(f"bad client status {status}")
            out.append(ClientResult(cid, status == 0, r.raw("payload")))
        return cls(tuple(out))


@dataclass(frozen=True, eq=False)
class ShareResponse(Message):
    """S1's aggregate share of a finished round and the clients in it."""

    KIND: ClassVar[Kind] = Kind.SHARE
    client_ids: tuple[int, ...]
    share: NDArray[np.uint64] = field(repr=False)

    def _write(self, w: _Writer) -> None:
        w.ids(self.client_ids)
        w.array(self.share)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(r.ids("client ids"), r.array_u64("share"))


@dataclass(frozen=True, eq=False)
class ArrayMessage(Message):
    """A lone array (the plaintext of a sealed PSR answer)."""

    KIND: ClassVar[Kind] = Kind.ARRAY
    array: NDArray[np.generic] = field(repr=False)

    def _write(self, w: _Writer) -> None:
        w.array(self.array)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(r.array("array"))


_BY_KIND: dict[int, type[Message]] = {
    cls.KIND: cls
    for cls in (
        HealthRequest,
        PublicKeyRequest,
        OpenRoundRequest,
        OpenCheckedRoundRequest,
        AddClientsRequest,
        AddHintsRequest,
        FinishRoundRequest,
        AbortRoundRequest,
        SetModelRequest,
        PsrAnswerRequest,
        CloseSessionRequest,
        OpenSessionRequest,
        OkResponse,
        HealthResponse,
        PublicKeyResponse,
        ClientResultsResponse,
        ShareResponse,
        ArrayMessage,
        SessionInfoResponse,
    )
}

M = TypeVar("M", bound=Message)


def register_message(cls: type[M]) -> type[M]:
    """Register a message class of a plugged-in helper service (usable as a class decorator).

    Kinds 1..63 are requests and 64..127 responses of the built-in services; a new service
    picks unused kinds in 128..255 for its own messages.

    Raises
    ------
    ConfigurationError
        If the class has no ``KIND``, or its kind is out of range or already taken by
        another class.
    """
    kind = int(getattr(cls, "KIND", -1))
    if not 1 <= kind <= 255:
        raise ConfigurationError(f"{cls.__name__}.KIND must be in [1, 255], got {kind}")
    taken = _BY_KIND.get(kind)
    if taken is not None and taken is not cls:
        raise ConfigurationError(f"message kind {kind} is taken by {taken.__name__}")
    _BY_KIND[kind] = cls
    return cls


def _name(cls: type[Message]) -> str:
    kind = cls.KIND
    return kind.name if isinstance(kind, Kind) else f"{cls.__name__} ({int(kind)})"


def encode(message: Message) -> bytes:
    """Serialize a message.

    Parameters
    ----------
    message : Message
        Any message of this module.

    Returns
    -------
    bytes
        Header and body.

    Raises
    ------
    WireFormatError
        If a field is out of range (negative or too-large integer, non-bytes, unsupported
        array dtype or rank, too many items) or the result exceeds :data:`MAX_MESSAGE_BYTES`.
    """
    if not isinstance(message, Message) or _BY_KIND.get(int(message.KIND)) is not type(message):
        raise WireFormatError(f"not a wire message: {type(message).__name__}")
    w = _Writer()
    message._write(w)
    out = _HEADER.pack(MAGIC, VERSION, int(message.KIND), 0) + w.payload()
    if len(out) > MAX_MESSAGE_BYTES:
        raise WireFormatError(
            f"message of {len(out)} bytes exceeds the limit of {MAX_MESSAGE_BYTES}"
        )
    return out


def decode(data: bytes, expected: type[M]) -> M:
    """Parse one message strictly.

    Parameters
    ----------
    data : bytes
        The serialized message.
    expected : type
        The message class the caller accepts.

    Returns
    -------
    Message
        An instance of ``expected``.

    Raises
    ------
    WireFormatError
        If the bytes are oversized, truncated or have trailing bytes, the magic, version or
        reserved field is wrong, or the kind is unknown or not ``expected``'s.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireFormatError(f"message must be bytes, got {type(data).__name__}")
    buf = bytes(data)
    if len(buf) > MAX_MESSAGE_BYTES:
        raise WireFormatError(f"message of {len(buf)} bytes exceeds {MAX_MESSAGE_BYTES}")
    if len(buf) < _HEADER.size:
        raise WireFormatError(f"truncated message: {len(buf)} bytes, header needs {_HEADER.size}")
    magic, version, kind, reserved = _HEADER.unpack_from(buf)
    if magic != MAGIC:
        raise WireFormatError("not a helper wire message (bad magic)")
    if version != VERSION:
        raise WireFormatError(f"unsupported wire version {version} (this build speaks {VERSION})")
    if reserved != 0:
        raise WireFormatError("reserved header field must be zero")
    cls = _BY_KIND.get(kind)
    if cls is None:
        raise WireFormatError(f"unknown message kind {kind}")
    if cls is not expected:
        raise WireFormatError(f"expected a {_name(expected)} message, got {_name(cls)}")
    r = _Reader(buf, _HEADER.size)
    message = cls._read(r)
    r.done()
    return message  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------
# Checked rounds (issue 21): uploads travel with S0's key-check digest
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckedItem:
    """One client's upload (public part, or U-DPF hint) with S0's key-check digest."""

    client_id: int
    body: bytes = field(repr=False)
    sealed: bytes = field(repr=False)
    digest: bytes = field(repr=False)


@register_message
@dataclass(frozen=True)
class AddCheckedRequest(Message):
    """Relay a checked round's SSA uploads with S0's key-check digests."""

    KIND: ClassVar[Kind] = Kind.ADD_CHECKED
    session: bytes
    round_id: int
    items: tuple[CheckedItem, ...]

    def _write(self, w: _Writer) -> None:
        _write_session(w, self.session)
        w.u64(self.round_id)
        w.count(len(self.items))
        for it in self.items:
            w.u64(it.client_id)
            w.raw(it.body)
            w.raw(it.sealed)
            w.raw(it.digest)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        session, round_id = _read_session(r), r.u64("round")
        n = r.count("items", 20)
        items = tuple(
            CheckedItem(r.u64("client id"), r.raw("body"), r.raw("sealed"), r.raw("digest"))
            for _ in range(n)
        )
        return cls(session, round_id, items)


@register_message
@dataclass(frozen=True)
class AddCheckedHintsRequest(AddCheckedRequest):
    """Relay a checked round's U-DPF hints with S0's key-check digests."""

    KIND: ClassVar[Kind] = Kind.ADD_CHECKED_HINTS
