"""Strict binary reader and writer shared by every binary format of the package (bottom layer).

Little-endian fields, each length checked against the bytes actually left *before* anything is
allocated, so a short input with a huge declared length fails fast and cheaply:

* ``u8``, ``u16``, ``u32``, ``u64``; ``f64``: the IEEE-754 binary64 bits (the bytes of a ``u64``);
* ``bytes``: ``u32`` length, then the bytes; ``fixed(n)``: exactly ``n`` raw bytes;
  ``words(n, dtype)``: ``n`` raw little-endian elements (the count known from elsewhere);
* ``ids``: ``u32`` count, then ``count`` ``u64`` (a *canonical* id set is sorted without
  repeats, and its reader refuses ids that are not strictly increasing);
* ``node_map``: ``u32`` count, then per entry a ``u64`` node id (strictly increasing) and the
  entry: ``fixed(size)`` bytes, or a ``bytes`` field where the entries vary in size;
* ``array``: dtype code ``u8`` (1 uint64, 2 int64, 3 float32, 4 float64, 5 uint8), ``ndim``
  ``u8`` (0..4), ``ndim`` ``u64`` dimensions, then the elements as raw little-endian C-order
  bytes;
* a list: ``u32`` count (at most :data:`MAX_ITEMS`), then the items.

Formats built on it (the helper wire format :mod:`flwr_fsl.helper.wire`, the sealed PSR answer
of :mod:`flwr_fsl.crypto.sealing`) add their own magic, version and kind.

**Format tags.** Every binary format of the package starts with a 4-byte magic, and every
magic is declared once through :func:`register_magic` in the module that owns the format, so
importing the package fills :data:`MAGICS` (magic -> the format and its module) and two
formats can never share a tag (``tests/test_magics.py`` checks that no magic bypasses it).

Every malformed
input raises :class:`WireFormatError`, a :class:`~flwr_fsl.core.errors.ClientInputError`: bytes that
came from one party are dropped with a reason, never crash the reader. A format that has its own
:class:`~flwr_fsl.core.errors.ClientInputError` subclass passes it as ``error`` to
:class:`Reader` and :class:`Writer`, which then raise that class instead.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError

__all__ = [
    "MAGICS",
    "MAGIC_BYTES",
    "MAX_ARRAY_NDIM",
    "MAX_ITEMS",
    "MAX_MESSAGE_BYTES",
    "Reader",
    "WireFormatError",
    "Writer",
    "register_magic",
]

MAX_MESSAGE_BYTES = 512 * 1024 * 1024
"""Largest message in bytes (and the gRPC send/receive limit of both ends of the helper link)."""
MAX_ITEMS = 100_000
"""Most items in one list."""
MAX_ARRAY_NDIM = 4
"""Most dimensions of an array field."""
_U64_MAX = (1 << 64) - 1

_DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<u8"),
    2: np.dtype("<i8"),
    3: np.dtype("<f4"),
    4: np.dtype("<f8"),
    5: np.dtype("u1"),
}
_DTYPE_CODES = {(dt.kind, dt.itemsize): code for code, dt in _DTYPES.items()}


class WireFormatError(ClientInputError):
    """Bytes are not a well-formed message of a binary format of this package."""


MAGICS: dict[bytes, str] = {}
"""Every registered format tag: 4-byte magic -> a short description naming format and module."""
MAGIC_BYTES = 4
"""Length of a format magic."""


def register_magic(magic: bytes, name: str) -> bytes:
    """Declare a format's 4-byte magic (once per process) and return it.

    Parameters
    ----------
    magic : bytes
        The tag, exactly :data:`MAGIC_BYTES` bytes.
    name : str
        What the format is and which module owns it, e.g.
        ``"DPF key set (flwr_fsl.crypto.dpf)"``.

    Returns
    -------
    bytes
        ``magic``, so a module writes ``_MAGIC = register_magic(b"FDPF", "...")``.

    Raises
    ------
    ConfigurationError
        If ``magic`` is not bytes of length 4, ``name`` is empty, or the magic is already
        registered (two formats must never share a tag).
    """
    if not isinstance(magic, bytes) or len(magic) != MAGIC_BYTES:
        raise ConfigurationError(f"a format magic must be {MAGIC_BYTES} bytes, got {magic!r}")
    if not isinstance(name, str) or not name:
        raise ConfigurationError("a format magic needs a description")
    if magic in MAGICS:
        raise ConfigurationError(
            f"format magic {magic!r} is already registered for {MAGICS[magic]}"
        )
    MAGICS[magic] = name
    return magic


class Writer:
    """Append fields; :meth:`payload` returns the bytes.

    Parameters
    ----------
    error : type of ClientInputError
        What a field that cannot be written raises (default :class:`WireFormatError`).
    """

    def __init__(self, error: type[ClientInputError] = WireFormatError) -> None:
        self.parts: list[bytes] = []
        self.error = error

    def u8(self, v: int) -> None:
        """Append an unsigned byte."""
        self.parts.append(struct.pack("<B", _check_uint(v, 0xFF, "u8", self.error)))

    def u16(self, v: int) -> None:
        """Append a u16."""
        self.parts.append(struct.pack("<H", _check_uint(v, 0xFFFF, "u16", self.error)))

    def u32(self, v: int) -> None:
        """Append a u32."""
        self.parts.append(struct.pack("<I", _check_uint(v, 0xFFFFFFFF, "u32", self.error)))

    def u64(self, v: int) -> None:
        """Append a u64."""
        self.parts.append(struct.pack("<Q", _check_uint(v, _U64_MAX, "u64", self.error)))

    def f64(self, v: float) -> None:
        """Append a float as its IEEE-754 binary64 bits."""
        if isinstance(v, bool) or not isinstance(v, int | float | np.floating | np.integer):
            raise self.error(f"f64 field must be a number, got {v!r}")
        self.parts.append(struct.pack("<d", float(v)))

    def raw(self, b: bytes) -> None:
        """Append ``u32`` length then the bytes."""
        if not isinstance(b, bytes | bytearray | memoryview):
            raise self.error(f"expected bytes, got {type(b).__name__}")
        data = bytes(b)
        self.u32(len(data))
        self.parts.append(data)

    def count(self, n: int, limit: int | None = MAX_ITEMS) -> None:
        """Append a list count (at most ``limit``; ``None``: any ``u32``, the reader bounds it)."""
        if limit is not None and n > limit:
            raise self.error(f"{n} items exceed the limit of {limit}")
        self.u32(n)

    def ids(
        self, ids: Iterable[int], *, canonical: bool = False, limit: int | None = MAX_ITEMS
    ) -> None:
        """Append a list of u64 ids: as given, or (``canonical``) sorted without repeats."""
        values = [_check_uint(i, _U64_MAX, "id", self.error) for i in ids]
        if canonical:
            values = sorted(set(values))
        self.count(len(values), limit)
        self.parts.append(np.asarray(values, dtype="<u8").tobytes())

    def node_map(
        self, entries: Mapping[int, bytes], size: int | None, *, limit: int | None = MAX_ITEMS
    ) -> None:
        """Append node id -> bytes in id order (``size`` bytes each, or ``None``: ``bytes``)."""
        nodes = sorted(_check_uint(n, _U64_MAX, "node id", self.error) for n in entries)
        self.count(len(nodes), limit)
        for node in nodes:
            self.u64(node)
            if size is None:
                self.raw(entries[node])
            else:
                self.fixed(entries[node], size)

    def words(self, values: object, dtype: str) -> None:
        """Append the elements of ``values`` as raw ``dtype`` (e.g. ``"<u4"``), no count."""
        self.parts.append(np.asarray(values, dtype=_word_dtype(dtype, self.error)).tobytes())

    def array(self, a: NDArray[np.generic]) -> None:
        """Append an array field (dtype code, ndim, shape, data)."""
        arr = np.asarray(a)
        code = _DTYPE_CODES.get((arr.dtype.kind, arr.dtype.itemsize))
        if code is None:
            raise self.error(f"unsupported array dtype {arr.dtype}")
        if arr.ndim > MAX_ARRAY_NDIM:
            raise self.error(f"array has {arr.ndim} dimensions, at most {MAX_ARRAY_NDIM}")
        self.u8(code)
        self.u8(arr.ndim)
        for d in arr.shape:
            self.u64(d)
        self.parts.append(np.ascontiguousarray(arr, dtype=_DTYPES[code]).tobytes())

    def fixed(self, b: bytes, n: int) -> None:
        """Append exactly ``n`` raw bytes."""
        if not isinstance(b, bytes | bytearray) or len(b) != n:
            raise self.error(f"expected exactly {n} bytes")
        self.parts.append(bytes(b))

    def payload(self) -> bytes:
        """Return everything appended so far."""
        return b"".join(self.parts)


def _check_uint(
    v: object, top: int, name: str, error: type[ClientInputError] = WireFormatError
) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 0 <= int(v) <= top:
        raise error(f"{name} field must be an integer in [0, {top}], got {v!r}")
    return int(v)


def _word_dtype(dtype: str, error: type[ClientInputError]) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.kind not in "uif" or dt != dt.newbyteorder("<"):
        raise error(f"words must be a little-endian numeric dtype, got {dtype!r}")
    return dt


class Reader:
    """Read fields strictly from ``data`` from ``pos`` on; :meth:`done` rejects trailing bytes.

    Parameters
    ----------
    data : bytes
        The message.
    pos : int
        Where to start reading.
    error : type of ClientInputError
        What malformed input raises (default :class:`WireFormatError`).
    """

    def __init__(
        self, data: bytes, pos: int = 0, error: type[ClientInputError] = WireFormatError
    ) -> None:
        self.data = data
        self.pos = pos
        self.error = error

    @classmethod
    def versioned(
        cls,
        data: object,
        magic: bytes,
        version: int,
        what: str,
        error: type[ClientInputError] = WireFormatError,
    ) -> Reader:
        """Start reading a ``magic + u8 version`` format; return the reader after the header.

        Raises
        ------
        WireFormatError
            (or ``error``) If ``data`` is not bytes, or the magic or version is not the
            expected one.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise error(f"{what} must be bytes")
        data = bytes(data)
        if data[: len(magic)] != magic:
            raise error(f"not {what}")
        reader = cls(data, len(magic), error)
        found = reader.u8("version")
        if found != version:
            raise error(f"unsupported {what} version {found}")
        return reader

    def _advance(self, n: int, what: str) -> int:
        """Check that ``n`` bytes are left, step over them and return where they start."""
        if n < 0 or n > len(self.data) - self.pos:
            raise self.error(
                f"truncated message: {what} needs {n} bytes, {len(self.data) - self.pos} left"
            )
        start = self.pos
        self.pos += n
        return start

    def _take(self, n: int, what: str) -> bytes:
        start = self._advance(n, what)
        return self.data[start : self.pos]

    def u8(self, what: str) -> int:
        """Read an unsigned byte."""
        return int(self._take(1, what)[0])

    def u16(self, what: str) -> int:
        """Read a u16."""
        return int(struct.unpack("<H", self._take(2, what))[0])

    def u32(self, what: str) -> int:
        """Read a u32."""
        return int(struct.unpack("<I", self._take(4, what))[0])

    def u64(self, what: str) -> int:
        """Read a u64."""
        return int(struct.unpack("<Q", self._take(8, what))[0])

    def f64(self, what: str) -> float:
        """Read a float from its IEEE-754 binary64 bits."""
        return float(struct.unpack("<d", self._take(8, what))[0])

    def raw(self, what: str) -> bytes:
        """Read a length-prefixed byte string."""
        return self._take(self.u32(f"{what} length"), what)

    def fixed(self, n: int, what: str) -> bytes:
        """Read exactly ``n`` raw bytes."""
        return self._take(n, what)

    def words(self, count: int, dtype: str, what: str) -> NDArray[Any]:
        """Read ``count`` raw ``dtype`` elements (e.g. ``"<u4"``; bytes checked first).

        From ``bytes`` or a read-only ``memoryview`` the result is a read-only view of the
        message (no copy: keys and rows can be megabytes); from a mutable buffer it is a copy.
        """
        dt = _word_dtype(dtype, self.error)
        start = self._advance(int(count) * dt.itemsize, what)
        if isinstance(self.data, bytes) or (
            isinstance(self.data, memoryview) and self.data.readonly
        ):
            return np.frombuffer(self.data, dtype=dt, count=int(count), offset=start)
        return np.frombuffer(bytes(self.data[start : self.pos]), dtype=dt)

    def count(self, what: str, min_item_bytes: int, limit: int = MAX_ITEMS) -> int:
        """Read a list count, checking it against ``limit`` and the bytes left."""
        n = self.u32(f"{what} count")
        if n > limit:
            raise self.error(f"{what}: {n} items exceed the limit of {limit}")
        if n * min_item_bytes > len(self.data) - self.pos:
            raise self.error(f"truncated message: {n} {what} declared, too few bytes")
        return n

    def ids(
        self, what: str, *, increasing: bool = False, limit: int = MAX_ITEMS
    ) -> tuple[int, ...]:
        """Read a list of u64 ids (``increasing``: a canonical set, strictly increasing)."""
        values = self.words(self.count(what, 8, limit), "<u8", what)
        if increasing and values.size > 1 and not np.all(values[1:] > values[:-1]):
            raise self.error(f"{what} ids must be strictly increasing")
        return tuple(int(v) for v in values.tolist())

    def node_map(self, what: str, size: int | None, *, limit: int = MAX_ITEMS) -> dict[int, bytes]:
        """Read node id -> bytes, ids strictly increasing (``size`` bytes each, or ``None``)."""
        n = self.count(what, 8 + (4 if size is None else size), limit)
        out: dict[int, bytes] = {}
        previous = -1
        for _ in range(n):
            node = self.u64(f"{what} id")
            if node <= previous:
                raise self.error(f"{what} ids must be strictly increasing")
            previous = node
            out[node] = self.raw(what) if size is None else self._take(size, what)
        return out

    def array(self, what: str) -> NDArray[np.generic]:
        """Read an array field (size checked before allocating)."""
        code = self.u8(f"{what} dtype")
        if code not in _DTYPES:
            raise self.error(f"{what}: unknown dtype code {code}")
        ndim = self.u8(f"{what} ndim")
        if ndim > MAX_ARRAY_NDIM:
            raise self.error(f"{what}: {ndim} dimensions, at most {MAX_ARRAY_NDIM}")
        shape = tuple(self.u64(f"{what} shape") for _ in range(ndim))
        dtype = _DTYPES[code]
        size = 1
        for d in shape:
            size *= d
        nbytes = size * dtype.itemsize
        if nbytes > len(self.data) - self.pos:
            raise self.error(
                f"truncated message: {what} of shape {shape} needs {nbytes} bytes, "
                f"{len(self.data) - self.pos} left"
            )
        extent = 1
        for d in shape:
            extent *= max(d, 1)
        if extent * dtype.itemsize > MAX_MESSAGE_BYTES:  # also bounds empty arrays' shapes
            raise self.error(f"{what}: shape {shape} exceeds the message size limit")
        raw = self._take(nbytes, what)
        return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))

    def array_u64(self, what: str) -> NDArray[np.uint64]:
        """Read an array field that must be uint64."""
        arr = self.array(what)
        if arr.dtype != np.uint64:
            raise self.error(f"{what} must be a uint64 array, got {arr.dtype}")
        return arr.astype(np.uint64, copy=False)

    def vector(self, what: str, dtype: type[np.generic]) -> NDArray[Any]:
        """Read an array field that must be 1-D of exactly ``dtype`` (e.g. ``np.int64``)."""
        arr = self.array(what)
        if arr.ndim != 1 or arr.dtype != np.dtype(dtype):
            raise self.error(f"{what} must be a 1-D {np.dtype(dtype)} array")
        return arr

    def done(self) -> None:
        """Reject trailing bytes."""
        if self.pos != len(self.data):
            left = len(self.data) - self.pos
            raise self.error(f"{left} trailing bytes after the message")
