"""Strict binary reader and writer shared by every binary format of the package (bottom layer).

Little-endian fields, each length checked against the bytes actually left *before* anything is
allocated, so a short input with a huge declared length fails fast and cheaply:

* ``u8``, ``u32``, ``u64``;
* ``bytes``: ``u32`` length, then the bytes; ``fixed(n)``: exactly ``n`` raw bytes;
* ``ids``: ``u32`` count, then ``count`` ``u64``;
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
came from one party are dropped with a reason, never crash the reader.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
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
    """Append fields; :meth:`payload` returns the bytes."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u8(self, v: int) -> None:
        """Append an unsigned byte."""
        self.parts.append(struct.pack("<B", _check_uint(v, 0xFF, "u8")))

    def u32(self, v: int) -> None:
        """Append a u32."""
        self.parts.append(struct.pack("<I", _check_uint(v, 0xFFFFFFFF, "u32")))

    def u64(self, v: int) -> None:
        """Append a u64."""
        self.parts.append(struct.pack("<Q", _check_uint(v, _U64_MAX, "u64")))

    def raw(self, b: bytes) -> None:
        """Append ``u32`` length then the bytes."""
        if not isinstance(b, bytes | bytearray | memoryview):
            raise WireFormatError(f"expected bytes, got {type(b).__name__}")
        data = bytes(b)
        self.u32(len(data))
        self.parts.append(data)

    def count(self, n: int) -> None:
        """Append a list count (at most :data:`MAX_ITEMS`)."""
        if n > MAX_ITEMS:
            raise WireFormatError(f"{n} items exceed the limit of {MAX_ITEMS}")
        self.u32(n)

    def ids(self, ids: Sequence[int]) -> None:
        """Append a list of u64 ids."""
        self.count(len(ids))
        for i in ids:
            self.u64(i)

    def array(self, a: NDArray[np.generic]) -> None:
        """Append an array field (dtype code, ndim, shape, data)."""
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

    def fixed(self, b: bytes, n: int) -> None:
        """Append exactly ``n`` raw bytes."""
        if not isinstance(b, bytes | bytearray) or len(b) != n:
            raise WireFormatError(f"expected exactly {n} bytes")
        self.parts.append(bytes(b))

    def payload(self) -> bytes:
        """Return everything appended so far."""
        return b"".join(self.parts)


def _check_uint(v: int, top: int, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 0 <= int(v) <= top:
        raise WireFormatError(f"{name} field must be an integer in [0, {top}], got {v!r}")
    return int(v)


class Reader:
    """Read fields strictly from ``data`` from ``pos`` on; :meth:`done` rejects trailing bytes."""

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    @classmethod
    def versioned(cls, data: object, magic: bytes, version: int, what: str) -> Reader:
        """Start reading a ``magic + u8 version`` format; return the reader after the header.

        Raises
        ------
        WireFormatError
            If ``data`` is not bytes, or the magic or version is not the expected one.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise WireFormatError(f"{what} must be bytes")
        data = bytes(data)
        if data[: len(magic)] != magic:
            raise WireFormatError(f"not {what}")
        reader = cls(data, len(magic))
        found = reader.u8("version")
        if found != version:
            raise WireFormatError(f"unsupported {what} version {found}")
        return reader

    def _take(self, n: int, what: str) -> bytes:
        if n > len(self.data) - self.pos:
            raise WireFormatError(
                f"truncated message: {what} needs {n} bytes, {len(self.data) - self.pos} left"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self, what: str) -> int:
        """Read an unsigned byte."""
        return int(self._take(1, what)[0])

    def u32(self, what: str) -> int:
        """Read a u32."""
        return int(struct.unpack("<I", self._take(4, what))[0])

    def u64(self, what: str) -> int:
        """Read a u64."""
        return int(struct.unpack("<Q", self._take(8, what))[0])

    def raw(self, what: str) -> bytes:
        """Read a length-prefixed byte string."""
        return self._take(self.u32(f"{what} length"), what)

    def fixed(self, n: int, what: str) -> bytes:
        """Read exactly ``n`` raw bytes."""
        return self._take(n, what)

    def count(self, what: str, min_item_bytes: int) -> int:
        """Read a list count, checking it against the limit and the bytes left."""
        n = self.u32(f"{what} count")
        if n > MAX_ITEMS:
            raise WireFormatError(f"{what}: {n} items exceed the limit of {MAX_ITEMS}")
        if n * min_item_bytes > len(self.data) - self.pos:
            raise WireFormatError(f"truncated message: {n} {what} declared, too few bytes")
        return n

    def ids(self, what: str) -> tuple[int, ...]:
        """Read a list of u64 ids."""
        n = self.count(what, 8)
        return tuple(self.u64(what) for _ in range(n))

    def array(self, what: str) -> NDArray[np.generic]:
        """Read an array field (size checked before allocating)."""
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
        """Read an array field that must be uint64."""
        arr = self.array(what)
        if arr.dtype != np.uint64:
            raise WireFormatError(f"{what} must be a uint64 array, got {arr.dtype}")
        return arr.astype(np.uint64, copy=False)

    def vector(self, what: str, dtype: type[np.generic]) -> NDArray[Any]:
        """Read an array field that must be 1-D of exactly ``dtype`` (e.g. ``np.int64``)."""
        arr = self.array(what)
        if arr.ndim != 1 or arr.dtype != np.dtype(dtype):
            raise WireFormatError(f"{what} must be a 1-D {np.dtype(dtype)} array")
        return arr

    def done(self) -> None:
        """Reject trailing bytes."""
        if self.pos != len(self.data):
            left = len(self.data) - self.pos
            raise WireFormatError(f"{left} trailing bytes after the message")
