"""Key format of the DCFs of :mod:`flwr_fsl.crypto.dcf`: key shares, public parts, wire format.

The algorithm (the tree PRG, Gen and evaluation) is in :mod:`flwr_fsl.crypto.dcf`, which
re-exports every public name here.

**Key split.** As for the DPF (Cui §4), a key share is ``(party, root seed, public part)``. The
public part (:class:`DCFPublicBatch`: per level a 16-byte seed correction, ``tau`` value words
and two control bits, plus ``tau`` final words) is the same for both parties; only the 16-byte
root seed differs, and the root seeds of a batch may come from one master seed per party
(:meth:`DCFKeyBatch.from_master_seed`), so a dealer who shares a PRG seed with each party sends
only the public part. Size: ``m * (domain_bits * (17 + 8 tau) + 8 tau)`` bytes for ``m`` keys
(per level 16 seed bytes, ``8 tau`` value bytes and one control-bit byte; :func:`public_size`),
plus a 24-byte header.

**Errors.** :class:`DCFKeyError` (a :class:`~flwr_fsl.core.errors.ClientInputError`, a
:class:`ValueError`) for any malformed key, public part or blob and keys that do not fit.

**Wire format** (version 2; little-endian, no pickle, exact length). A 24-byte header:
``b"FDCF"``, version 2 (u8), kind (u8: 1 public part, 2 key shares), party (u8: 0/1, 255 for a
public part), ``domain_bits`` (u8), ``tau`` (u32), number of keys ``m`` (u32), 8 zero bytes.
Key shares then carry ``m`` 16-byte root seeds (bit 0 clear). The public body, level-major
(level ``i``'s corrections of all ``m`` keys are adjacent, the order in which an evaluation
reads them): ``cw_seeds`` (``domain_bits * m`` blocks of 16 bytes, bit 0 clear), ``cw_values``
(``domain_bits * m * tau`` u64),
``cw_bits`` (``domain_bits * m`` bytes, each in 0..3: bit 0 left, bit 1 right correction),
``cw_final`` (``m * tau`` u64). The length is checked against the header before
anything is allocated; any other length, a non-canonical bit or a bad header field is refused.

**Deferred check.** The canonical-bit check reads every seed correction (half the public
part: ~150 MB per PrivHFL query). An evaluator that decodes a public part only to evaluate
every key at every level (:func:`~flwr_fsl.crypto.dcf.evaluate_paired`, ``tau = 2``) may
decode with ``DCFPublicBatch.from_bytes(data, defer_check=True)``: the evaluation then ORs
the words it reads anyway and refuses a non-canonical part with the same
:class:`DCFKeyError` before returning any share; any other use of the batch
(:meth:`DCFPublicBatch.verify`, serializing it, another evaluation) runs the check first.

**Versions.** Version 2 (issue 26) changed the tree PRG behind the same layout: one value per
node instead of one per child (:mod:`flwr_fsl.crypto.dcf`), so version-1 correction words mean
something else. Version-1 blobs are refused (nothing decodes an older DCF version: keys are
dealt per session and never stored).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, cast

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.wireformat import Reader, Writer, register_magic
from flwr_fsl.crypto.prg import SEED_BYTES, derive_root_seeds
from flwr_fsl.kernels import dcf_kernels as _k

__all__ = [
    "MAX_DOMAIN_BITS",
    "MAX_TAU",
    "DCFKeyBatch",
    "DCFKeyError",
    "DCFPublicBatch",
    "assemble_public",
    "public_size",
    "public_views",
]


MAX_DOMAIN_BITS = 64
"""Largest supported ``domain_bits`` (points are uint64)."""
MAX_TAU = 64
"""Largest supported number of output words per comparison."""
_U64 = np.uint64
_MAGIC = register_magic(b"FDCF", "DCF key set: public part, key shares (flwr_fsl.crypto.dcf_keys)")
_VERSION = 2  # 1: a value per child (issue 26 retired it: 2 + 2Q blocks per Gen node)
_KIND_PUBLIC, _KIND_KEYS = 1, 2
_NO_PARTY = 255
_HEADER_BYTES = 24  # magic, version, kind, party, domain_bits (u8 each), tau, m (u32), 8 zeros


class DCFKeyError(ClientInputError):
    """A DCF key, public part or serialized blob is malformed, or keys do not fit together."""


def public_size(domain_bits: int, tau: int, m: int = 1) -> int:
    """Bytes of the serialized public part of ``m`` keys (header included).

    Parameters
    ----------
    domain_bits : int
        Domain size in bits.
    tau : int
        Output words per comparison.
    m : int, optional
        Number of keys.

    Returns
    -------
    int
        ``24 + m * (domain_bits * (17 + 8 tau) + 8 tau)``.
    """
    return _HEADER_BYTES + m * (domain_bits * (17 + 8 * tau) + 8 * tau)


def _check_geometry(domain_bits: object, tau: object) -> tuple[int, int]:
    for name, v, lo, hi in (
        ("domain_bits", domain_bits, 1, MAX_DOMAIN_BITS),
        ("tau", tau, 1, MAX_TAU),
    ):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or not lo <= int(v) <= hi:
            raise DCFKeyError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return int(domain_bits), int(tau)  # type: ignore[call-overload]


def _u64_array(arr: object, shape: tuple[int, ...], name: str) -> NDArray[np.uint64]:
    if not isinstance(arr, np.ndarray) or arr.dtype != _U64 or arr.shape != shape:
        got = f"{arr.dtype} {arr.shape}" if isinstance(arr, np.ndarray) else type(arr).__name__
        raise DCFKeyError(f"{name} must be a uint64 array of shape {shape}, got {got}")
    return np.ascontiguousarray(arr)


@dataclass(frozen=True, eq=False)
class DCFPublicBatch:
    """The public part of ``m`` DCF keys (identical for both parties).

    Parameters
    ----------
    domain_bits : int
        Domain ``[0, 2**domain_bits)``, in ``[1, 64]``.
    tau : int
        Output words per comparison, in ``[1, 64]``.
    cw_seeds : numpy.ndarray
        ``(domain_bits, m, 2)`` uint64 seed corrections (bit 0 clear), level-major.
    cw_values : numpy.ndarray
        ``(domain_bits, m, tau)`` uint64 value corrections.
    cw_bits : numpy.ndarray
        ``(domain_bits, m)`` uint8 control-bit corrections (bit 0 left, bit 1 right).
    cw_final : numpy.ndarray
        ``(m, tau)`` uint64 last corrections.

    Raises
    ------
    DCFKeyError
        If a field has the wrong type or shape or a bit is not canonical.
    """

    domain_bits: int
    tau: int
    cw_seeds: NDArray[np.uint64]
    cw_values: NDArray[np.uint64]
    cw_bits: NDArray[np.uint8]
    cw_final: NDArray[np.uint64]
    deferred: ClassVar[bool] = False
    """Whether the canonical check is still to run (``from_bytes(..., defer_check=True)``)."""

    def __post_init__(self) -> None:
        n, tau = _check_geometry(self.domain_bits, self.tau)
        if not isinstance(self.cw_final, np.ndarray) or self.cw_final.ndim != 2:
            raise DCFKeyError("cw_final must be a 2-D uint64 array (m, tau)")
        m = self.cw_final.shape[0]
        object.__setattr__(self, "cw_final", _u64_array(self.cw_final, (m, tau), "cw_final"))
        object.__setattr__(self, "cw_seeds", _u64_array(self.cw_seeds, (n, m, 2), "cw_seeds"))
        object.__setattr__(self, "cw_values", _u64_array(self.cw_values, (n, m, tau), "cw_values"))
        bits = self.cw_bits
        if not isinstance(bits, np.ndarray) or bits.dtype != np.uint8 or bits.shape != (n, m):
            raise DCFKeyError(f"cw_bits must be a uint8 array of shape {(n, m)}")
        object.__setattr__(self, "cw_bits", np.ascontiguousarray(bits))
        if m:
            _refuse_flagged(int(_k.public_flags(self.cw_seeds, self.cw_bits)))

    def verify(self) -> None:
        """Run the canonical check a deferred decode skipped (nothing to do otherwise).

        Raises
        ------
        DCFKeyError
            If a correction is not canonical.
        """
        if self.deferred:
            self.settle(int(_k.public_flags(self.cw_seeds, self.cw_bits)))

    def settle(self, flags: int) -> None:
        """End a deferred check with the flags of a pass over *every* correction.

        Parameters
        ----------
        flags : int
            :func:`~flwr_fsl.kernels.dcf_kernels.public_flags` of all ``(level, key)``
            corrections (an evaluation of every key at every level returns them).

        Raises
        ------
        DCFKeyError
            If the flags mark a non-canonical correction (the batch stays deferred).
        """
        _refuse_flagged(flags)
        object.__setattr__(self, "deferred", False)

    @property
    def num_keys(self) -> int:
        """Number of keys ``m``."""
        return int(self.cw_final.shape[0])

    def _body(self) -> list[memoryview]:
        """Return the body's fields as byte views (the caller joins them: one copy in all)."""
        self.verify()  # never serialize what a validating decode refuses
        return [
            np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"), copy=False))
            .reshape(-1)
            .view(np.uint8)
            .data
            for a in (self.cw_seeds, self.cw_values, self.cw_bits, self.cw_final)
        ]

    def to_parts(self) -> tuple[bytes | memoryview, ...]:
        """Return the serialization as buffers (header, then views of the fields), no copy.

        ``b"".join(parts)`` is :meth:`to_bytes`; a caller that embeds the public part in a
        larger message joins these parts with its own fields (one copy in all).
        """
        head = _header(_KIND_PUBLIC, _NO_PARTY, self.domain_bits, self.tau, self.num_keys)
        return (head, *self._body())

    def to_bytes(self) -> bytes:
        """Serialize (format in the module docstring)."""
        return b"".join(self.to_parts())

    @classmethod
    def from_bytes(cls, data: object, *, defer_check: bool = False) -> DCFPublicBatch:
        """Parse and validate a serialized public part.

        Parameters
        ----------
        data : bytes or memoryview
            The serialized public part.
        defer_check : bool, optional
            Leave the canonical-bit check to the evaluation (module docstring: *Deferred
            check*); the header, geometry and length are checked here either way.

        Returns
        -------
        DCFPublicBatch
            The public part (read-only views of ``data`` where it is bytes).

        Raises
        ------
        DCFKeyError
            If the bytes are not exactly one well-formed public part.
        """
        r, n, tau, m, _ = _parse_header(data, _KIND_PUBLIC)
        return _parse_public_body(r, n, tau, m, defer_check)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DCFPublicBatch) and self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]


def _refuse_flagged(flags: int) -> None:
    """Raise the reason for :func:`~flwr_fsl.kernels.dcf_kernels.public_flags` ``flags``."""
    if flags & ~1:  # a bit correction above 3 (reported first, as before the flags)
        raise DCFKeyError("cw_bits entries must be in 0..3 (two control-bit corrections)")
    if flags:
        raise DCFKeyError("seed corrections must have bit 0 clear")


def assemble_public(
    domain_bits: int,
    tau: int,
    cws: tuple[NDArray[np.uint64], NDArray[np.uint64], NDArray[np.uint8], NDArray[np.uint64]],
    deferred: bool,
) -> DCFPublicBatch:
    """Build a public part from fields of the right types and shapes, without the check pass.

    For callers whose fields are valid by construction: Gen's output (``deferred=False``,
    canonical as generated) and a parsed body (``deferred=True``: the check is owed).
    """
    pub = object.__new__(DCFPublicBatch)
    names = ("domain_bits", "tau", "cw_seeds", "cw_values", "cw_bits", "cw_final")
    for name, value in zip(names, (domain_bits, tau, *cws), strict=True):
        object.__setattr__(pub, name, value)
    if deferred:
        object.__setattr__(pub, "deferred", True)
    return pub


def _header(kind: int, party: int, domain_bits: int, tau: int, m: int) -> bytes:
    """Return the 24-byte header (module docstring)."""
    w = Writer(DCFKeyError)
    w.fixed(_MAGIC, len(_MAGIC))
    for byte in (_VERSION, kind, party, domain_bits):
        w.u8(byte)
    w.u32(tau)
    w.u32(m)
    w.fixed(bytes(8), 8)
    return w.payload()


def _parse_header(data: object, kind: int) -> tuple[Reader, int, int, int, int]:
    """Check magic, version, kind, geometry and the exact length of a blob.

    Returns ``(reader at the body, domain_bits, tau, m, party)``.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DCFKeyError(f"a serialized DCF must be bytes, got {type(data).__name__}")
    # bytes and read-only views are parsed in place (the fields become read-only views).
    readonly = isinstance(data, memoryview) and data.readonly and data.format == "B"
    raw = data if isinstance(data, bytes) or readonly else bytes(data)
    if len(raw) < _HEADER_BYTES:
        raise DCFKeyError(f"DCF blob too short for its header ({len(raw)} < {_HEADER_BYTES} bytes)")
    # A read-only memoryview reads like bytes (Reader.words then returns views of it).
    r = Reader(cast(bytes, raw), 0, DCFKeyError)
    if r.fixed(len(_MAGIC), "magic") != _MAGIC:
        raise DCFKeyError("not a DCF blob (bad magic)")
    version, got_kind, party, n = (r.u8(what) for what in ("version", "kind", "party", "bits"))
    tau, m = r.u32("tau"), r.u32("number of keys")
    if version != _VERSION:
        raise DCFKeyError(f"unsupported DCF format version {version}")
    if got_kind != kind:
        raise DCFKeyError(f"expected DCF blob kind {kind}, got {got_kind}")
    if r.fixed(8, "padding") != bytes(8):
        raise DCFKeyError("DCF header padding must be zero")
    n, tau = _check_geometry(n, tau)
    if kind == _KIND_PUBLIC and party != _NO_PARTY:
        raise DCFKeyError(f"a public part names no party (255), got {party}")
    if kind == _KIND_KEYS and party not in (0, 1):
        raise DCFKeyError(f"party must be 0 or 1, got {party}")
    seeds = m * SEED_BYTES if kind == _KIND_KEYS else 0
    expected = public_size(n, tau, m) + seeds
    if len(raw) != expected:
        raise DCFKeyError(
            f"DCF blob of {m} keys (domain_bits={n}, tau={tau}) must be {expected} bytes, got "
            f"{len(raw)}"
        )
    return r, n, tau, m, party


def public_views(
    out: NDArray[np.uint8], domain_bits: int, tau: int, m: int
) -> tuple[NDArray[np.uint64], NDArray[np.uint64], NDArray[np.uint8], NDArray[np.uint64]]:
    """Write a public part's header into ``out`` and return its fields as views of ``out``.

    ``out`` is a writable ``uint8`` buffer of :func:`public_size` bytes (for example inside a
    message being built); the returned ``(cw_seeds, cw_values, cw_bits, cw_final)`` views,
    of the shapes :class:`DCFPublicBatch` takes, sit at their wire offsets (little-endian
    machine; possibly unaligned), so a generator that fills them has written the serialized
    public part in place.

    Parameters
    ----------
    out : numpy.ndarray
        The buffer (1-D ``uint8``, writable, exactly ``public_size(domain_bits, tau, m)`` bytes).
    domain_bits, tau, m : int
        Geometry.

    Returns
    -------
    tuple of numpy.ndarray
        The four fields (uninitialised).

    Raises
    ------
    DCFKeyError
        If the buffer does not fit.
    """
    n, tau = _check_geometry(domain_bits, tau)
    size = public_size(n, tau, m)
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != np.uint8
        or out.shape != (size,)
        or not out.flags.writeable
        or np.little_endian is False
    ):
        raise DCFKeyError(f"the public part needs a writable 1-D uint8 buffer of {size} bytes")
    out[:_HEADER_BYTES] = np.frombuffer(_header(_KIND_PUBLIC, _NO_PARTY, n, tau, m), np.uint8)
    pos = _HEADER_BYTES
    seeds: NDArray[np.uint64] = out[pos : pos + 16 * n * m].view(np.uint64)
    pos += 16 * n * m
    values: NDArray[np.uint64] = out[pos : pos + 8 * n * m * tau].view(np.uint64)
    pos += 8 * n * m * tau
    bits = out[pos : pos + n * m]
    final: NDArray[np.uint64] = out[pos + n * m :].view(np.uint64)
    return (
        seeds.reshape(n, m, 2),
        values.reshape(n, m, tau),
        bits.reshape(n, m),
        final.reshape(m, tau),
    )


def _words(r: Reader, count: int, dtype: str, what: str) -> NDArray[np.generic]:
    """Return ``count`` words of the message, native byte order, as a read-only view."""
    return r.words(count, dtype, what).astype(np.dtype(dtype).newbyteorder("="), copy=False)


def _parse_public_body(
    r: Reader, n: int, tau: int, m: int, defer_check: bool = False
) -> DCFPublicBatch:
    cw_seeds = _words(r, m * n * 2, "<u8", "cw_seeds").reshape(n, m, 2)
    cw_values = _words(r, m * n * tau, "<u8", "cw_values").reshape(n, m, tau)
    cw_bits = _words(r, m * n, "u1", "cw_bits").reshape(n, m)
    cw_final = _words(r, m * tau, "<u8", "cw_final").reshape(m, tau)
    r.done()
    cws = (cw_seeds, cw_values, cw_bits, cw_final)
    if defer_check and m:
        return assemble_public(n, tau, cws, deferred=True)  # type: ignore[arg-type]
    return DCFPublicBatch(n, tau, *cws)  # type: ignore[arg-type]


@dataclass(frozen=True, eq=False)
class DCFKeyBatch:
    """One party's shares of ``m`` DCF keys: its root seeds and the common public part.

    Parameters
    ----------
    party : int
        0 or 1.
    root_seeds : numpy.ndarray
        ``(m, 2)`` uint64 root seeds (bit 0 clear).
    public : DCFPublicBatch
        The public part.

    Raises
    ------
    DCFKeyError
        If the fields do not fit together.
    """

    party: int
    root_seeds: NDArray[np.uint64]
    public: DCFPublicBatch

    def __post_init__(self) -> None:
        if isinstance(self.party, bool) or self.party not in (0, 1):
            raise DCFKeyError(f"party must be 0 or 1, got {self.party!r}")
        if not isinstance(self.public, DCFPublicBatch):
            raise DCFKeyError("public must be a DCFPublicBatch")
        seeds = _u64_array(self.root_seeds, (self.public.num_keys, 2), "root_seeds")
        if seeds.size and int(np.bitwise_or.reduce(seeds[:, 0])) & 1:  # one pass, no temporary
            raise DCFKeyError("root seeds must have bit 0 clear")
        object.__setattr__(self, "root_seeds", seeds)

    @classmethod
    def from_master_seed(
        cls, party: int, master_seed: bytes, public: DCFPublicBatch
    ) -> DCFKeyBatch:
        """Rebuild party ``party``'s keys from its 16-byte master seed and the public part.

        Parameters
        ----------
        party : int
            0 or 1.
        master_seed : bytes
            The seed :func:`generate_keys_batch` was given for this party.
        public : DCFPublicBatch
            The public part.

        Returns
        -------
        DCFKeyBatch
            The key shares.
        """
        return cls(party, derive_root_seeds(master_seed, public.num_keys), public)

    @property
    def num_keys(self) -> int:
        """Number of keys ``m``."""
        return self.public.num_keys

    def to_bytes(self) -> bytes:
        """Serialize (format in the module docstring)."""
        p = self.public
        head = _header(_KIND_KEYS, self.party, p.domain_bits, p.tau, p.num_keys)
        return b"".join([head, self.root_seeds.astype("<u8").tobytes(), *p._body()])

    @classmethod
    def from_bytes(cls, data: object) -> DCFKeyBatch:
        """Parse and validate serialized key shares.

        Raises
        ------
        DCFKeyError
            If the bytes are not exactly one well-formed key batch.
        """
        r, n, tau, m, party = _parse_header(data, _KIND_KEYS)
        seeds = r.words(m * 2, "<u8", "root seeds").astype(_U64).reshape(m, 2)
        return cls(party, seeds, _parse_public_body(r, n, tau, m))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DCFKeyBatch) and self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]
