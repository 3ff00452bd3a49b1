"""The PHFL byte format of PrivHFL's three-party messages, their errors and their transcript.

Every message the querier ``Q``, an answerer ``A`` and the server ``S`` exchange in secure
querying (:mod:`flwr_fsl.families.privhfl.protocol`, the ops in
:mod:`flwr_fsl.families.privhfl.ops`) is one :class:`Message`; :func:`expect` parses one and
checks it is the message the receiver's op expects; :class:`Transcript` counts them.

**Wire format** of every message (version 2): ``b"PHFL"``, version ``u8``, kind ``u8``, step
``u64`` (the op label), array count ``u8``, one zero byte, arrays (each: dtype code ``u8`` 1
for ``uint64``, ndim ``u8``, six zero bytes, the dims as ``u64``, the little-endian words;
shapes checked by the receiver against what the op expects), then a byte string (its length
``u32``, four zero bytes, the bytes: a DCF public part, or empty). No trailing bytes; every
zero byte is checked.

**Alignment** (version 2, issue 26): every array's words and the byte string start at a
multiple of 8 bytes from the message's start, so the receiver's views of them (and a DCF
public part generated in place) are aligned ``uint64`` arrays. Version 1 had no zero bytes
and put the DCF public part at an odd offset: its Gen kernel took ~14% and the evaluation
~30% longer on the misaligned words (each 8-byte word crossing a cache line once in eight).
Version-1 messages are refused (messages live for one session, and all three parties run the
same code).
"""

from __future__ import annotations

import ctypes
import math
import struct
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.core.wireformat import (
    MAX_ARRAY_NDIM,
    MAX_MESSAGE_BYTES,
    Reader,
    WireFormatError,
    register_magic,
)

__all__ = [
    "KIND_NAMES",
    "OFFLINE_KINDS",
    "Message",
    "MessageBuffers",
    "PrivHFLMessageError",
    "QuerierMessageError",
    "ServerMessageError",
    "Transcript",
    "Wire",
    "as_bytes",
    "expect",
    "message_size",
]

_U64 = np.uint64
_PREFAULT_BYTES = 1 << 24  # messages from 16 MiB on are assembled in a prefaulted buffer
_MADV_POPULATE_WRITE = 23  # Linux >= 5.14: fault a range in, writable, in one call
_PAGE = 4096
_LEND_BYTES = 1 << 18  # messages from 256 KiB on are built in a driver's lent buffer

Wire = bytes | memoryview
"""A message as a party sends it: ``bytes``, or a read-only view of a lent buffer."""


def _prefault_api() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]] | None:
    """Return ``(PyBytes_FromStringAndSize, PyBytes_AsString, madvise)``, or ``None`` off Linux."""
    if not sys.platform.startswith("linux") or sys.implementation.name != "cpython":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):  # pragma: no cover - no libc symbol
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    new = ctypes.pythonapi.PyBytes_FromStringAndSize
    new.argtypes, new.restype = [ctypes.c_void_p, ctypes.c_ssize_t], ctypes.py_object
    addr = ctypes.pythonapi.PyBytes_AsString
    addr.argtypes, addr.restype = [ctypes.py_object], ctypes.c_void_p
    return new, addr, madvise


_API = _prefault_api()


class _Memory:
    """A writable ``uint8`` view of ``size`` bytes at ``address`` that keeps ``owner`` alive.

    Through ``__array_interface__``: a ``ctypes`` array type per size would be cached by
    ``ctypes`` for ever (one new type per message length).
    """

    def __init__(self, owner: object, address: int, size: int) -> None:
        self.owner = owner
        self.__array_interface__ = {
            "data": (address, False),
            "shape": (size,),
            "typestr": "|u1",
            "version": 3,
        }


class MessageBuffers:
    """The message buffers of an in-process driver: lent for one op, handed back when it ends.

    A driver that runs every party in one process owns both ends of each message's life: it
    knows a message is dead once the op that consumes it has ended (a DCF deal once the
    answerer and the server have evaluated it, an opening once the peer has combined it).
    Building each large message in fresh memory costs its page faults every time (on the
    benchmark machine, a VM whose freed memory goes back to its host, ~0.15 s per query of
    VGG-7 at width 64: ~306 MB of deals); here the driver hands its parties this pool
    (their ``buffers`` attribute), every message of at least ``min_bytes`` is written into a
    lent buffer (:func:`assemble`) and travels as a read-only ``memoryview`` of it, which the
    receiver parses in place (:meth:`Message.from_bytes`), and the driver calls
    :meth:`recycle` at the end of each op: the buffers are then lent again, already mapped.

    The contract on the parties: no array or view of a received message is kept past the op
    that consumes it (what outlives the op is computed from it, or copied). ``poison`` makes
    a test of that: every buffer handed back is overwritten, so a view kept too long reads
    garbage and the result changes.

    One driver, one thread: the pool is not shared. It holds at most as many buffers as
    one op had messages lent at once (three for a DCF comparison), each as large as the
    largest message it carried; :meth:`release` frees them.

    Parameters
    ----------
    min_bytes : int, optional
        Shorter messages are plain ``bytes`` (default 256 KiB).
    poison : int, optional
        A byte value written over every buffer handed back (tests).

    Raises
    ------
    ConfigurationError
        If ``min_bytes`` is not a positive integer or ``poison`` not a byte value.
    """

    def __init__(self, min_bytes: int = _LEND_BYTES, poison: int | None = None) -> None:
        if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 1:
            raise ConfigurationError(f"min_bytes must be a positive integer, got {min_bytes!r}")
        if poison is not None and (not isinstance(poison, int) or not 0 <= poison <= 255):
            raise ConfigurationError(f"poison must be a byte value, got {poison!r}")
        self.min_bytes = min_bytes
        self.poison = poison
        self._free: list[NDArray[np.uint8]] = []
        self._lent: list[NDArray[np.uint8]] = []

    @property
    def held_bytes(self) -> int:
        """Bytes of every buffer the pool holds, lent or free."""
        return sum(b.size for b in self._free + self._lent)

    def lend(self, size: int) -> NDArray[np.uint8] | None:
        """Return ``size`` writable bytes (``uint8``) of a buffer lent until :meth:`recycle`.

        The smallest free buffer that fits; else a new one (a free one too small to hold it
        is dropped, so the pool holds no more buffers than an op lends). ``None`` for a
        message shorter than ``min_bytes``.
        """
        if size < self.min_bytes:
            return None
        fits = [i for i, b in enumerate(self._free) if b.size >= size]
        if fits:
            buf = self._free.pop(min(fits, key=lambda i: self._free[i].size))
        else:
            if self._free:
                self._free.pop(min(range(len(self._free)), key=lambda i: self._free[i].size))
            buf = np.empty(size, dtype=np.uint8)
            if _API is not None and size >= _PREFAULT_BYTES:  # one call faults it all in
                _API[2](buf.ctypes.data, size, _MADV_POPULATE_WRITE)
        self._lent.append(buf)
        return buf[:size]

    def recycle(self) -> None:
        """Take every lent buffer back: the messages written in them are dead (op ended)."""
        if self.poison is not None:
            for buf in self._lent:
                buf.fill(self.poison)
        self._free += self._lent
        self._lent = []

    def release(self) -> None:
        """Drop every buffer (freed once no message view refers to it)."""
        self._free, self._lent = [], []


def as_bytes(data: Wire) -> bytes:
    """Return a message as ``bytes`` (no copy when it is; a lent view is copied out)."""
    return data if isinstance(data, bytes) else bytes(data)


@overload
def assemble(
    parts: Sequence[bytes | memoryview],
    size: int,
    fill: Callable[[NDArray[np.uint8]], None] | None = None,
    into: None = None,
) -> bytes: ...
@overload
def assemble(
    parts: Sequence[bytes | memoryview],
    size: int,
    fill: Callable[[NDArray[np.uint8]], None] | None,
    into: MessageBuffers | None,
) -> Wire: ...
def assemble(
    parts: Sequence[bytes | memoryview],
    size: int,
    fill: Callable[[NDArray[np.uint8]], None] | None = None,
    into: MessageBuffers | None = None,
) -> Wire:
    """Return ``b"".join(parts)`` (``size`` bytes), faulting a large result's pages in at once.

    A fresh message of hundreds of megabytes is new memory: ``b"".join`` takes one page fault
    per 4 KiB page while it copies, and on the benchmark machine the faults, not the copy,
    are the cost (0.21 s for 300 MB, of which ~0.03 s is the copy). Here a large message is
    allocated uninitialised with ``PyBytes_FromStringAndSize(NULL, size)`` (the C API's way
    to build a ``bytes`` object in place: it is filled before anything else can see it),
    its pages are faulted in with one ``madvise(MADV_POPULATE_WRITE)`` (0.07 s for the same
    300 MB) and the parts are copied in. The bytes are those of the join; where the call is
    missing (not Linux, a kernel before 5.14, not CPython) this is the join, or the copy into
    pages faulted one by one. With ``into`` a message of at least its ``min_bytes`` is
    written into a buffer it lends instead (already mapped when it was used before: no
    faults) and returned as a read-only ``memoryview`` of it (:class:`MessageBuffers`).

    Parameters
    ----------
    parts : sequence of bytes or memoryview
        The buffers, in order.
    size : int
        The message's length.
    fill : callable, optional
        Writes the rest of the message, ``size - sum(len(parts))`` bytes, into the writable
        ``uint8`` array it is given (every byte: the message is uninitialised memory); the
        parts alone by default.
    into : MessageBuffers, optional
        The driver's buffers to write a large message into.

    Returns
    -------
    bytes or memoryview
        The concatenation (and what ``fill`` wrote); a view of a lent buffer with ``into``.

    Raises
    ------
    ConfigurationError
        If the parts and ``fill`` do not make ``size`` bytes.
    """
    lent = into.lend(size) if into is not None else None
    if lent is not None:
        _write(lent, parts, fill, size)
        return memoryview(lent.data).toreadonly()
    if fill is None and (_API is None or size < _PREFAULT_BYTES):
        return b"".join(parts)
    out: bytes | bytearray
    if _API is None:
        out = bytearray(size)
        dst = np.frombuffer(out, dtype=np.uint8)
    else:
        new, address, madvise = _API
        out = new(None, size)
        base = address(out)
        lo = (base + _PAGE - 1) & ~(_PAGE - 1)
        hi = (base + size) & ~(_PAGE - 1)
        if size >= _PREFAULT_BYTES and hi > lo:
            madvise(lo, hi - lo, _MADV_POPULATE_WRITE)  # best effort: writes fault the rest
        dst = np.asarray(_Memory(out, base, size))
    _write(dst, parts, fill, size)
    del dst
    return bytes(out) if isinstance(out, bytearray) else out


def _write(
    dst: NDArray[np.uint8],
    parts: Sequence[bytes | memoryview],
    fill: Callable[[NDArray[np.uint8]], None] | None,
    size: int,
) -> None:
    """Copy ``parts`` into ``dst``, then let ``fill`` write the rest (``size`` bytes in all)."""
    pos = 0
    for part in parts:
        src = np.frombuffer(part, dtype=np.uint8)
        dst[pos : pos + src.size] = src
        pos += src.size
    if fill is not None:
        fill(dst[pos:])
        pos = size
    if pos != size:  # never exposed half-filled
        raise ConfigurationError(f"message parts hold {pos} bytes, expected {size}")


# Message kinds and whether they can be sent before the query exists (offline).
SHARE, MATMUL_DEAL, MATMUL_A, MATMUL_S = 1, 2, 3, 4
DRELU_A, DRELU_S, DRELU_Q, TRIPLE_DEAL, BEAVER_A, BEAVER_S = 5, 6, 7, 8, 9, 10
DCF_DEAL, DCF_RELAY, DCF_OPEN_A, DCF_OPEN_S = 11, 12, 13, 14
AGG_A, AGG_S = 15, 16
DCF_KEYS = 17  # issue 26: the DCF deal that S forwards to A unchanged (replaces 11 and 12)
KIND_NAMES = {
    SHARE: "share",
    MATMUL_DEAL: "matmul-deal",
    MATMUL_A: "matmul-E",
    MATMUL_S: "matmul-F",
    DRELU_A: "drelu-z0",
    DRELU_S: "drelu-z",
    DRELU_Q: "drelu-sign",
    TRIPLE_DEAL: "triple-deal",
    BEAVER_A: "beaver-A",
    BEAVER_S: "beaver-S",
    DCF_DEAL: "dcf-deal",
    DCF_RELAY: "dcf-relay",
    DCF_OPEN_A: "dcf-open-A",
    DCF_OPEN_S: "dcf-open-S",
    AGG_A: "agg-A",
    AGG_S: "agg-S",
    DCF_KEYS: "dcf-keys",
}
OFFLINE_KINDS = frozenset({MATMUL_DEAL, MATMUL_A, TRIPLE_DEAL, DCF_DEAL, DCF_RELAY, DCF_KEYS})
_MAGIC = register_magic(b"PHFL", "PrivHFL protocol message (flwr_fsl.families.privhfl.wire)")
_VERSION = 2  # 1: no alignment padding (issue 26)
_MAX_ARRAYS = 8


class PrivHFLMessageError(ClientInputError):
    """A PrivHFL message is malformed, of the wrong kind or step, or has a wrong shape."""


class QuerierMessageError(PrivHFLMessageError):
    """A message dealt by the querier is malformed: its query fails (no answerer is blamed)."""


class ServerMessageError(RoundFailedError):
    """The querier got a malformed message from the server: the query fails loudly."""


@dataclass(frozen=True, eq=False)
class Message:
    """One protocol message: kind, step (op label), uint64 arrays and an optional blob.

    Zero-copy: :meth:`to_bytes` writes every array and the blob with one join (the blob may be
    given as a tuple of buffers, e.g. a DCF public part's header and fields, so it is never
    assembled on its own), or into a driver's lent buffer (:class:`MessageBuffers`), and
    :meth:`from_bytes` returns read-only views of the message: the arrays are
    ``numpy.frombuffer`` views and the blob a ``memoryview`` slice (a DCF public part of
    hundreds of megabytes is then copied once per hop, by the sender's join).
    """

    kind: int
    step: int
    arrays: tuple[NDArray[np.uint64], ...] = ()
    blob: bytes | memoryview | tuple[bytes | memoryview, ...] = b""

    def blob_buffer(self) -> bytes | memoryview:
        """Return the blob as one buffer (a parsed message's read-only view; parts joined)."""
        return b"".join(self.blob) if isinstance(self.blob, tuple) else self.blob

    def blob_bytes(self) -> int:
        """Length of the blob in bytes."""
        parts = self.blob if isinstance(self.blob, tuple) else (self.blob,)
        return sum(memoryview(p).nbytes for p in parts)

    @overload
    def to_bytes(self, into: None = None) -> bytes: ...
    @overload
    def to_bytes(self, into: MessageBuffers | None) -> Wire: ...
    def to_bytes(self, into: MessageBuffers | None = None) -> Wire:
        """Serialize (format in the module docstring); ``into``: as for :meth:`to_bytes_filled`."""
        return self.to_bytes_filled(into=into)

    def to_bytes_filled(
        self,
        blob_bytes: int = 0,
        fill: Callable[[NDArray[np.uint8]], None] | None = None,
        into: MessageBuffers | None = None,
    ) -> Wire:
        """Serialize, with a blob that ``fill`` writes straight into the message.

        Parameters
        ----------
        blob_bytes : int, optional
            Length of the blob ``fill`` writes (the message's own ``blob`` must then be
            empty).
        fill : callable, optional
            Called once with a writable ``uint8`` array of ``blob_bytes`` bytes inside the
            message being built; it must write every byte. Without it this is
            :meth:`to_bytes`.
        into : MessageBuffers, optional
            An in-process driver's buffers: a large message is written into one it lends
            and returned as a read-only view of it, dead once the driver recycles it.

        Returns
        -------
        bytes or memoryview
            The message (the same bytes either way).

        Raises
        ------
        ConfigurationError
            If a field is malformed or the message would exceed the size limit.
        """
        if fill is not None and self.blob_bytes():
            raise ConfigurationError("a message with a blob to fill must have an empty blob")
        if self.kind not in KIND_NAMES:
            raise ConfigurationError(f"unknown message kind {self.kind}")
        if len(self.arrays) > _MAX_ARRAYS:
            raise ConfigurationError(f"at most {_MAX_ARRAYS} arrays per message")
        # Fields as in the module docstring; array data joins as views: one copy in all.
        parts: list[bytes | memoryview] = [
            _MAGIC + struct.pack("<BBQBx", _VERSION, self.kind, self.step, len(self.arrays))
        ]
        for a in self.arrays:
            if not isinstance(a, np.ndarray) or a.dtype != _U64:
                raise ConfigurationError("message arrays must be uint64")
            if a.ndim > MAX_ARRAY_NDIM:
                raise ConfigurationError(f"message arrays have at most {MAX_ARRAY_NDIM} dimensions")
            # dtype code 1 (uint64), ndim, six zero bytes (the words stay 8-aligned), dims, words
            parts.append(struct.pack(f"<BB6x{a.ndim}Q", 1, a.ndim, *a.shape))
            parts.append(np.ascontiguousarray(a, dtype="<u8").reshape(-1).view(np.uint8).data)
        blob = self.blob if isinstance(self.blob, tuple) else (self.blob,)
        if not all(isinstance(p, bytes | memoryview) for p in blob):
            raise ConfigurationError("the blob must be bytes (or a tuple of byte buffers)")
        length = self.blob_bytes() if fill is None else int(blob_bytes)
        size = message_size([a.shape for a in self.arrays], length)
        if size > MAX_MESSAGE_BYTES:  # checked before the join allocates
            raise ConfigurationError(f"message of {size} bytes exceeds {MAX_MESSAGE_BYTES}")
        parts.append(struct.pack("<I4x", length))
        if fill is None:
            parts += blob
        return assemble(parts, size, fill, into)

    @classmethod
    def from_bytes(cls, data: object) -> Message:
        """Parse a message (any kind; :func:`expect` also checks kind, step and shapes).

        The arrays and the blob are read-only views of ``data`` when it is ``bytes`` or a
        read-only ``memoryview`` (a message in a driver's lent buffer, :class:`MessageBuffers`:
        the views must not outlive the op that consumes it); copies otherwise, so a mutable
        buffer changed later cannot change them.

        Raises
        ------
        PrivHFLMessageError
            If the bytes are not exactly one well-formed message.
        """
        try:
            if isinstance(data, bytes | bytearray | memoryview) and len(data) > MAX_MESSAGE_BYTES:
                raise PrivHFLMessageError(f"message exceeds {MAX_MESSAGE_BYTES} bytes")
            r = _reader(data)
            kind = r.u8("kind")
            if kind not in KIND_NAMES:
                raise PrivHFLMessageError(f"unknown PrivHFL message kind {kind}")
            step = r.u64("step")
            count = r.u8("array count")
            if count > _MAX_ARRAYS:
                raise PrivHFLMessageError(f"{count} arrays, at most {_MAX_ARRAYS}")
            _zeros(r, 1, "header")
            arrays = tuple(_array_view(r, f"array {i}") for i in range(count))
            length = r.u32("blob length")
            _zeros(r, 4, "blob length")
            start = r.pos
            if length > len(r.data) - start:
                raise PrivHFLMessageError(
                    f"truncated message: blob needs {length} bytes, {len(r.data) - start} left"
                )
            r.pos = start + length
            blob = memoryview(r.data)[start : start + length]
            r.done()
        except PrivHFLMessageError:
            raise
        except WireFormatError as err:
            raise PrivHFLMessageError(str(err)) from err
        return cls(kind, step, arrays, blob.toreadonly())


def _reader(data: object) -> Reader:
    """Start reading a message after its version: a lent (read-only) view in place."""
    if not (
        isinstance(data, memoryview) and data.readonly and data.format == "B" and data.c_contiguous
    ):
        return Reader.versioned(data, _MAGIC, _VERSION, "PrivHFL message")
    r = Reader(data, len(_MAGIC))  # type: ignore[arg-type]  # read like bytes, no copy
    if data[: len(_MAGIC)] != _MAGIC:
        raise WireFormatError("not PrivHFL message")
    found = r.u8("version")
    if found != _VERSION:
        raise WireFormatError(f"unsupported PrivHFL message version {found}")
    return r


def message_size(shapes: Sequence[tuple[int, ...]], blob_bytes: int = 0) -> int:
    """Length in bytes of a message with arrays of these shapes and a blob of ``blob_bytes``.

    The 16-byte header; per array 8 bytes, 8 per dimension and 8 per word; the blob's 8-byte
    length and its bytes (module docstring). A reply can be sized before its messages exist.
    """
    size = 16 + 8 + int(blob_bytes)
    for shape in shapes:
        size += 8 + 8 * len(shape) + 8 * math.prod(shape)
    return size


def _zeros(r: Reader, n: int, what: str) -> None:
    """Read ``n`` alignment bytes, which must be zero (one encoding per message)."""
    if r.fixed(n, f"{what} padding") != bytes(n):
        raise PrivHFLMessageError(f"the padding after the {what} must be zero")


def _array_view(r: Reader, what: str) -> NDArray[np.uint64]:
    """Read an array field as a read-only ``uint64`` view of the message (no copy)."""
    code = r.u8(f"{what} dtype")
    if code != 1:
        raise PrivHFLMessageError(f"{what} must be a uint64 array (dtype code 1), got {code}")
    ndim = r.u8(f"{what} ndim")
    _zeros(r, 6, f"{what} ndim")
    if ndim > MAX_ARRAY_NDIM:
        raise PrivHFLMessageError(f"{what}: {ndim} dimensions, at most {MAX_ARRAY_NDIM}")
    shape = tuple(r.u64(f"{what} shape") for _ in range(ndim))
    extent = 1
    for d in shape:
        extent *= max(d, 1)
    if extent * 8 > MAX_MESSAGE_BYTES:  # also bounds empty arrays' shapes
        raise PrivHFLMessageError(f"{what}: shape {shape} exceeds the message size limit")
    words = r.words(math.prod(shape), "<u8", what)
    return words.astype(_U64, copy=False).reshape(shape)


def expect(
    data: object,
    kind: int,
    step: int,
    shapes: Sequence[tuple[int, ...]],
    *,
    blob: bool = False,
    sender: str = "peer",
) -> Message:
    """Parse ``data`` and check it is the expected message of this op.

    Parameters
    ----------
    data : bytes
        The received message.
    kind : int
        Expected kind.
    step : int
        Expected op label.
    shapes : sequence of tuple of int
        Expected shape of each array, in order.
    blob : bool, optional
        Whether a non-empty blob is expected (else it must be empty).
    sender : str, optional
        Who sent it, for the error message.

    Returns
    -------
    Message
        The message.

    Raises
    ------
    PrivHFLMessageError
        If anything differs.
    """
    try:
        msg = Message.from_bytes(data)
        _check_expected(msg, kind, step, shapes, blob, sender)
    except PrivHFLMessageError as err:
        if sender == "querier":
            raise QuerierMessageError(str(err)) from err
        raise
    return msg


def _check_expected(
    msg: Message,
    kind: int,
    step: int,
    shapes: Sequence[tuple[int, ...]],
    blob: bool,
    sender: str,
) -> None:
    what = f"{KIND_NAMES[kind]} message from {sender}"
    if msg.kind != kind:
        raise PrivHFLMessageError(f"expected a {what}, got kind {KIND_NAMES[msg.kind]}")
    if msg.step != step:
        raise PrivHFLMessageError(f"{what} is for step {msg.step}, expected {step}")
    got = [a.shape for a in msg.arrays]
    if got != [tuple(s) for s in shapes]:
        raise PrivHFLMessageError(f"{what} must carry arrays of shapes {list(shapes)}, got {got}")
    if bool(msg.blob) != blob:
        raise PrivHFLMessageError(f"{what} must {'' if blob else 'not '}carry a blob")


class Transcript:
    """What crossed between parties: sizes per kind and phase, per-party views, party times.

    Parameters
    ----------
    keep_views : bool, optional
        Keep every received message (decoded) per receiver, for view tests.
    clock : callable, optional
        The clock of :meth:`timed` (default ``time.perf_counter``; ``time.process_time``
        measures CPU time, which other load on the machine does not inflate).
    """

    def __init__(
        self, keep_views: bool = False, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.records: list[tuple[str, str, int, int]] = []
        self.views: dict[str, list[Message]] = defaultdict(list)
        self.keep_views = keep_views
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)

    def record(self, sender: str, receiver: str, data: Wire) -> None:
        """Count a message (and keep it, parsed, in the receiver's view: a lent one copied).

        Raises
        ------
        PrivHFLMessageError
            If the bytes do not start like a message (a view also needs the whole message).
        """
        if len(data) < 6 or data[:4] != _MAGIC or data[5] not in KIND_NAMES:
            raise PrivHFLMessageError("not a PrivHFL message")
        self.records.append((sender, receiver, data[5], len(data)))
        if self.keep_views:
            self.views[receiver].append(Message.from_bytes(as_bytes(data)))

    @contextmanager
    def timed(self, party: str) -> Iterator[None]:
        """Add the time spent in the block to ``party``'s total."""
        start = self.clock()
        try:
            yield
        finally:
            self.seconds[party] += self.clock() - start

    def bytes_total(self, phase: str | None = None) -> int:
        """Total bytes, optionally only ``"offline"`` or ``"online"`` kinds."""
        return sum(
            n
            for _, _, k, n in self.records
            if phase is None or (k in OFFLINE_KINDS) == (phase == "offline")
        )

    def bytes_by_link(self) -> dict[str, int]:
        """Bytes per ``"sender->receiver"`` link."""
        out: dict[str, int] = defaultdict(int)
        for s, r, _, n in self.records:
            out[f"{s}->{r}"] += n
        return dict(out)

    def bytes_by_kind(self) -> dict[str, int]:
        """Bytes per message kind."""
        out: dict[str, int] = defaultdict(int)
        for _, _, k, n in self.records:
            out[KIND_NAMES[k]] += n
        return dict(out)

    def kinds_received(self, party: str) -> list[str]:
        """Kinds of the messages ``party`` received, in order (needs ``keep_views``)."""
        return [KIND_NAMES[m.kind] for m in self.views[party]]
