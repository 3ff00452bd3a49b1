"""Wire format between S0 and the helper server S1: strict, versioned, length-prefixed, no pickle.

Every gRPC request and response body (and a sealed PSR answer's plaintext) is one message::

    magic  b"FSHW"   4 bytes
    version          u8   (1)
    kind             u8   (:class:`Kind`)
    reserved         u16  (0)
    body             kind-specific fields, then nothing: trailing bytes are an error

All integers are little-endian. Field types:

* ``u8``, ``u32``, ``u64``;
* ``bytes``: ``u32`` length, then the bytes;
* ``ids``: ``u32`` count, then ``count`` ``u64``;
* ``array``: dtype code ``u8`` (1 uint64, 2 int64, 3 float32, 4 float64, 5 uint8), ``ndim`` ``u8``
  (0..4), ``ndim`` ``u64`` dimensions, then the elements as raw little-endian C-order bytes;
* ``items``: ``u32`` count, then per item the fields listed.

Bodies:

=====================  ==========================================================================
kind                   body
=====================  ==========================================================================
HEALTH (1)             empty
PUBLIC_KEY (2)         empty
OPEN_ROUND (3)         round ``u64``, params ``bytes`` (``SSAParams.to_bytes()``)
ADD_CLIENTS (4)        round ``u64``, items (client ``u64``, public part, sealed: ``bytes``)
ADD_HINTS (5)          round ``u64``, items (client ``u64``, hint ``bytes``)
FINISH_ROUND (6)       round ``u64``
ABORT_ROUND (7)        round ``u64``
SET_MODEL (8)          round ``u64``, table ``array`` (uint64, 2-d)
PSR_ANSWER (9)         round ``u64``, items (client ``u64``, public part, sealed: ``bytes``)
OK (64)                empty
HEALTH_INFO (65)       protocol version ``u32``, public key ``bytes`` (32), open rounds ``ids``
PUBLIC_KEY_INFO (66)   public key ``bytes`` (32)
CLIENT_RESULTS (67)    items (client ``u64``, status ``u8`` 0 ok / 1 rejected, payload ``bytes``:
                       empty or a sealed answer when ok, the UTF-8 reason when rejected)
SHARE (68)             contributing clients ``ids``, share ``array`` (uint64, ``(m, tau)``)
ARRAY (69)             ``array`` (the plaintext of a sealed PSR answer)
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

from flwr_fsl.helper.errors import WireFormatError

__all__ = [
    "MAGIC",
    "MAX_ARRAY_NDIM",
    "MAX_ITEMS",
    "MAX_MESSAGE_BYTES",
    "VERSION",
    "AbortRoundRequest",
    "AddClientsRequest",
    "AddHintsRequest",
    "ArrayMessage",
    "ClientResult",
    "ClientResultsResponse",
    "FinishRoundRequest",
    "HealthRequest",
    "HealthResponse",
    "HintItem",
    "Kind",
    "Message",
    "OkResponse",
    "OpenRoundRequest",
    "PsrAnswerRequest",
    "PublicKeyRequest",
    "PublicKeyResponse",
    "SealedItem",
    "SetModelRequest",
    "ShareResponse",
    "WireFormatError",
    "decode",
    "encode",
]

MAGIC = b"FSHW"
VERSION = 1
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
"""Largest message in bytes (and the gRPC send/receive limit of both ends)."""
MAX_ITEMS = 100_000
"""Most items (clients) in one list."""
MAX_ARRAY_NDIM = 4
"""Most dimensions of an array field."""
_HEADER = struct.Struct("<4sBBH")
_U64_MAX = (1 << 64) - 1

_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<u8"),
    2: np.dtype("<i8"),
    3: np.dtype("<f4"),
    4: np.dtype("<f8"),
    5: np.dtype("u1"),
}
_DTYPE_CODES = {(dt.kind, dt.itemsize): code for code, dt in _DTYPES.items()}


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
    OK = 64
    HEALTH_INFO = 65
    PUBLIC_KEY_INFO = 66
    CLIENT_RESULTS = 67
    SHARE = 68
    ARRAY = 69


# ------------------------------------------------------------------------------------------------
# Field reader / writer
# ------------------------------------------------------------------------------------------------


class _Writer:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u8(self, v: int) -> None:
        self.parts.append(struct.pack("<B", _check_uint(v, 0xFF, "u8")))

    def u32(self, v: int) -> None:
        self.parts.append(struct.pack("<I", _check_uint(v, 0xFFFFFFFF, "u32")))

    def u64(self, v: int) -> None:
        self.parts.append(struct.pack("<Q", _check_uint(v, _U64_MAX, "u64")))

    def raw(self, b: bytes) -> None:
        if not isinstance(b, bytes | bytearray | memoryview):
            raise WireFormatError(f"expected bytes, got {type(b).__name__}")
        data = bytes(b)
        self.u32(len(data))
        self.parts.append(data)

    def count(self, n: int) -> None:
        if n > MAX_ITEMS:
            raise WireFormatError(f"{n} items exceed the limit of {MAX_ITEMS}")
        self.u32(n)

    def ids(self, ids: Sequence[int]) -> None:
        self.count(len(ids))
        for i in ids:
            self.u64(i)

    def array(self, a: NDArray[np.generic]) -> None:
        arr = np.asarray(a)
        code = _DTYPE_CODES.get((arr.dtype.kind, arr.dtype.itemsize))
        if code is None:
            raise WireFormatError(f"unsupported array dtype {arr.dtype}")
        if arr.ndim > MAX_ARRAY_NDIM:
            raise WireFormatError(f"array has {arr.ndim} dimensions, at most {MAX_ARRAY_NDIM}")
        self.u8(code)
        self.u8(arr.ndim)
        for d in arr.shape:
            self.u64(d)
        self.parts.append(np.ascontiguousarray(arr, dtype=_DTYPES[code]).tobytes())

    def finish(self, kind: Kind) -> bytes:
        out = _HEADER.pack(MAGIC, VERSION, int(kind), 0) + b"".join(self.parts)
        if len(out) > MAX_MESSAGE_BYTES:
            raise WireFormatError(
                f"message of {len(out)} bytes exceeds the limit of {MAX_MESSAGE_BYTES}"
            )
        return out


def _check_uint(v: int, top: int, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 0 <= int(v) <= top:
        raise WireFormatError(f"{name} field must be an integer in [0, {top}], got {v!r}")
    return int(v)


class _Reader:
    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def _take(self, n: int, what: str) -> bytes:
        if n > len(self.data) - self.pos:
            raise WireFormatError(
                f"truncated message: {what} needs {n} bytes, {len(self.data) - self.pos} left"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self, what: str) -> int:
        return int(self._take(1, what)[0])

    def u32(self, what: str) -> int:
        return int(struct.unpack("<I", self._take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack("<Q", self._take(8, what))[0])

    def raw(self, what: str) -> bytes:
        return self._take(self.u32(f"{what} length"), what)

    def count(self, what: str, min_item_bytes: int) -> int:
        n = self.u32(f"{what} count")
        if n > MAX_ITEMS:
            raise WireFormatError(f"{what}: {n} items exceed the limit of {MAX_ITEMS}")
        if n * min_item_bytes > len(self.data) - self.pos:
            raise WireFormatError(f"truncated message: {n} {what} declared, too few bytes")
        return n

    def ids(self, what: str) -> tuple[int, ...]:
        n = self.count(what, 8)
        return tuple(self.u64(what) for _ in range(n))

    def array(self, what: str) -> NDArray[np.generic]:
        code = self.u8(f"{what} dtype")
        if code not in _DTYPES:
            raise WireFormatError(f"{what}: unknown dtype code {code}")
        ndim = self.u8(f"{what} ndim")
        if ndim > MAX_ARRAY_NDIM:
            raise WireFormatError(f"{what}: {ndim} dimensions, at most {MAX_ARRAY_NDIM}")
        shape = tuple(self.u64(f"{what} shape") for _ in range(ndim))
        dtype = _DTYPES[code]
        size = 1
        for d in shape:
            size *= d
        nbytes = size * dtype.itemsize
        if nbytes > len(self.data) - self.pos:
            raise WireFormatError(
                f"truncated message: {what} of shape {shape} needs {nbytes} bytes, "
                f"{len(self.data) - self.pos} left"
            )
        extent = 1
        for d in shape:
            extent *= max(d, 1)
        if extent * dtype.itemsize > MAX_MESSAGE_BYTES:  # also bounds empty arrays' shapes
            raise WireFormatError(f"{what}: shape {shape} exceeds the message size limit")
        raw = self._take(nbytes, what)
        return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))

    def array_u64(self, what: str) -> NDArray[np.uint64]:
        arr = self.array(what)
        if arr.dtype != np.uint64:
            raise WireFormatError(f"{what} must be a uint64 array, got {arr.dtype}")
        return arr.astype(np.uint64, copy=False)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise WireFormatError(f"{len(self.data) - self.pos} trailing bytes after the message")


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
    """One client's public U-DPF hint."""

    client_id: int
    hint: bytes = field(repr=False)


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

    KIND: ClassVar[Kind]

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


@dataclass(frozen=True)
class _RoundOnly(Message):
    round_id: int

    def _write(self, w: _Writer) -> None:
        w.u64(self.round_id)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(r.u64("round"))


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
    round_id: int
    params: bytes

    def _write(self, w: _Writer) -> None:
        w.u64(self.round_id)
        w.raw(self.params)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(r.u64("round"), r.raw("params"))


@dataclass(frozen=True)
class AddClientsRequest(Message):
    """Relay clients' SSA uploads (public part + material sealed to S1)."""

    KIND: ClassVar[Kind] = Kind.ADD_CLIENTS
    round_id: int
    uploads: tuple[SealedItem, ...]

    def _write(self, w: _Writer) -> None:
        w.u64(self.round_id)
        _write_items(w, self.uploads)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(r.u64("round"), _read_items(r))


@dataclass(frozen=True)
class PsrAnswerRequest(Message):
    """Relay clients' PSR queries (public part + material sealed to S1)."""

    KIND: ClassVar[Kind] = Kind.PSR_ANSWER
    round_id: int
    queries: tuple[SealedItem, ...]

    def _write(self, w: _Writer) -> None:
        w.u64(self.round_id)
        _write_items(w, self.queries)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(r.u64("round"), _read_items(r))


@dataclass(frozen=True)
class AddHintsRequest(Message):
    """Relay clients' public U-DPF hints."""

    KIND: ClassVar[Kind] = Kind.ADD_HINTS
    round_id: int
    hints: tuple[HintItem, ...]

    def _write(self, w: _Writer) -> None:
        w.u64(self.round_id)
        w.count(len(self.hints))
        for h in self.hints:
            w.u64(h.client_id)
            w.raw(h.hint)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        round_id = r.u64("round")
        n = r.count("hints", 12)
        return cls(round_id, tuple(HintItem(r.u64("client id"), r.raw("hint")) for _ in range(n)))


@dataclass(frozen=True, eq=False)
class SetModelRequest(Message):
    """Give S1 the table (ring words) PSR queries of the round are answered from."""

    KIND: ClassVar[Kind] = Kind.SET_MODEL
    round_id: int
    table: NDArray[np.uint64] = field(repr=False)

    def _write(self, w: _Writer) -> None:
        w.u64(self.round_id)
        w.array(self.table)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(r.u64("round"), r.array_u64("table"))


@dataclass(frozen=True)
class OkResponse(Message):
    """A call succeeded without a result."""

    KIND: ClassVar[Kind] = Kind.OK


@dataclass(frozen=True)
class HealthResponse(Message):
    """S1's status: wire protocol version, public key and open rounds."""

    KIND: ClassVar[Kind] = Kind.HEALTH_INFO
    protocol_version: int
    public_key: bytes
    open_rounds: tuple[int, ...]

    def _write(self, w: _Writer) -> None:
        w.u32(self.protocol_version)
        w.raw(self.public_key)
        w.ids(self.open_rounds)

    @classmethod
    def _read(cls, r: _Reader) -> Message:
        return cls(r.u32("protocol version"), r.raw("public key"), r.ids("open rounds"))


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
        AddClientsRequest,
        AddHintsRequest,
        FinishRoundRequest,
        AbortRoundRequest,
        SetModelRequest,
        PsrAnswerRequest,
        OkResponse,
        HealthResponse,
        PublicKeyResponse,
        ClientResultsResponse,
        ShareResponse,
        ArrayMessage,
    )
}

M = TypeVar("M", bound=Message)


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
    if not isinstance(message, Message) or type(message) not in _BY_KIND.values():
        raise WireFormatError(f"not a wire message: {type(message).__name__}")
    w = _Writer()
    message._write(w)
    return w.finish(message.KIND)


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
        raise WireFormatError(f"expected a {expected.KIND.name} message, got {cls.KIND.name}")
    r = _Reader(buf, _HEADER.size)
    message = cls._read(r)
    r.done()
    return message  # type: ignore[return-value]
