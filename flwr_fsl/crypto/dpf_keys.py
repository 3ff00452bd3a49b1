"""Key format of the DPFs of :mod:`flwr_fsl.crypto.dpf`: key shares and public parts.

The algorithm (Gen, evaluation) is in :mod:`flwr_fsl.crypto.dpf`, the U-DPF hints
(:class:`~flwr_fsl.crypto.udpf.UpdateHint`, kind 3 below) and updates in
:mod:`flwr_fsl.crypto.udpf`; :mod:`flwr_fsl.crypto.dpf` re-exports every name here. The byte
offsets of a public body are :mod:`flwr_fsl.crypto.dpf_wire`'s, so a blob is written once into
one preallocated buffer.

**Key split (Cui §4).** A key share is ``(party, root seed, public part)``. The public part
(:class:`DPFPublicKey` / :class:`DPFPublicBatch`: per-level seed and control-bit correction words,
the leaf correction word, ``domain_bits``, ``tau`` and the epoch) is identical for both servers;
only the 16-byte root seed differs. For many keys (one per cuckoo bin) the root seeds of server
``b`` are ``PRF(msk_b, i)`` (:func:`~flwr_fsl.crypto.prg.derive_root_seeds`), so a client sends
the public part once and one 16-byte master seed to each server
(:meth:`DPFKeyBatch.from_master_seed`).

**Errors.** :class:`DPFKeyError` (a :class:`ValueError`) for any malformed key, public part,
hint or serialized blob and for keys that do not fit together; plain :class:`ValueError` for a
bad argument (alpha or a point outside the domain, wrong beta shape, bad epoch).

**Wire format** (version 2; little-endian, no pickle, strict length, canonical: one byte string
per key set). A 16-byte header: ``b"FDPF"``, version 2, kind (1 public part, 2 key shares,
3 U-DPF hint), party (0/1, 255 when none), a zero byte, ``tau`` (u32), number of keys ``m``
(u32). Key shares then put ``m`` 16-byte root seeds before the public body. The public body:

* ``epoch_mode`` (u8): 0 when ``m >= 1`` and all keys share one epoch (the common case: Gen and
  :func:`~flwr_fsl.crypto.udpf.update_batch` give every key of a batch the same epoch), else 1
  (keys of different epochs, e.g. :meth:`DPFPublicBatch.concatenate` of batches updated in
  different rounds, or ``m == 0``); any other value, or a mode that is not the one these rules
  pick, is rejected;
* ``domain_bits`` (m u8), then zeros up to a multiple of 8 bytes counted from ``epoch_mode``;
* ``epochs``: one u64 (mode 0) or m u64 (mode 1);
* ``cw_leaf`` (m*W u64);
* ``cw_seeds`` (L*16 bytes, ``L`` = total tree levels, keys' levels concatenated in key order);
* ``cw_bits``: ``ceil(L / 4)`` bytes, 2 bits per level (bit 0 left, bit 1 right correction),
  level ``i`` at bits ``2 * (i % 4)`` and ``2 * (i % 4) + 1`` of byte ``i // 4``; the unused
  high bits of the last byte must be 0.

**Version 3** (verifiable keys, :mod:`flwr_fsl.crypto.vdpf`): the same header with version 3
and the same body followed by ``cw_proof`` (m*8 u64: each key's 64-byte proof correction word
``cs``); public parts and key shares without ``cw_proof`` keep writing version 2, byte for byte.
A hint (always version 2) carries its epoch (u64) and ``cw_leaf`` (m*W u64) after the header.
Public parts and key shares are written field by field into one buffer of their final size
(:mod:`flwr_fsl.crypto.dpf_wire`); every blob is read by
:class:`~flwr_fsl.core.wireformat.Reader` (each length checked before anything is allocated).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import Reader, Writer, register_magic
from flwr_fsl.crypto.dpf_wire import (
    EPOCH_PER_KEY,
    EPOCH_SHARED,
    PublicLayout,
    public_layout,
    u64_view,
    write_public_body,
)
from flwr_fsl.crypto.prg import SEED_BYTES, derive_root_seeds

__all__ = [
    "MAX_DOMAIN_BITS",
    "MAX_TAU",
    "PROOF_WORDS",
    "DPFKey",
    "DPFKeyBatch",
    "DPFKeyError",
    "DPFPublicBatch",
    "DPFPublicKey",
]

MAX_DOMAIN_BITS = 63
"""Largest supported ``domain_bits`` (points are uint64)."""
MAX_TAU = 1 << 20
"""Largest supported number of output words per point."""

_U64 = np.uint64
_MAGIC = register_magic(
    b"FDPF", "DPF key set: public part, key shares, U-DPF hint (flwr_fsl.crypto.dpf_keys)"
)
_VERSION = 2
_PROOF_VERSION = 3  # version 2 plus each key's proof correction word (verifiable DPF)
PROOF_WORDS = 8
"""uint64 words of one verifiable-DPF proof correction word / per-leaf proof (4 AES blocks)."""
_KIND_PUBLIC, _KIND_KEYS, _KIND_HINT = 1, 2, 3
_NO_PARTY = 255
_EPOCH_SHARED, _EPOCH_PER_KEY = EPOCH_SHARED, EPOCH_PER_KEY
_HEADER_BYTES = 16  # magic, version, kind, party, zero (u8 each), tau, m (u32)
_GEN_CHUNK = 8192  # keys per Gen chunk: 4 blocks each per level -> 512 KiB buffers


class DPFKeyError(ClientInputError):
    """A DPF key, public part, hint or serialized blob is malformed or keys do not fit together.

    It is a :class:`ValueError`, so callers may catch either.
    """


# ------------------------------------------------------------------------------------------------
# Geometry and argument checks
# ------------------------------------------------------------------------------------------------


def _group(tau: int) -> int:
    """Points per leaf seed: 2 for odd ``tau`` (early termination), else 1."""
    return 2 if tau % 2 else 1


def _tree_levels(domain_bits: NDArray[np.uint8] | NDArray[np.int64], tau: int) -> NDArray[np.int64]:
    """Return the number of tree levels (correction words) of keys with these domain sizes."""
    d = np.asarray(domain_bits, dtype=np.int64)
    return np.maximum(d - (_group(tau) - 1), 0)


def _as_u64(values: ArrayLike, name: str) -> NDArray[np.uint64]:
    """Convert integers to uint64 with Z_2^64 wraparound (negative ints allowed); reject floats."""
    if isinstance(values, np.ndarray):
        arr = values
    else:
        try:
            arr = np.asarray(values)
        except OverflowError:  # pragma: no cover - numpy version dependent
            arr = np.asarray(values, dtype=object)
    if arr.size == 0:
        return np.zeros(arr.shape, dtype=_U64)
    if arr.dtype == object:
        try:
            return np.array([int(v) % (1 << 64) for v in arr.reshape(-1)], dtype=_U64).reshape(
                arr.shape
            )
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"{name} must contain integers") from exc
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ConfigurationError(f"{name} must be integers in Z_2^64, got dtype {arr.dtype}")
    return arr.astype(_U64)


def _as_index(values: ArrayLike, name: str) -> NDArray[np.uint64]:
    """Non-negative integer indices as uint64 (rejects floats and negatives)."""
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros(arr.shape, dtype=_U64)
    if arr.dtype == object:
        if any(not isinstance(v, int | np.integer) or v < 0 or v >= 1 << 64 for v in arr.flat):
            raise ConfigurationError(f"{name} must be non-negative integers below 2**64")
        return arr.astype(_U64)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ConfigurationError(f"{name} must be integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.signedinteger) and arr.size and int(arr.min()) < 0:
        raise ConfigurationError(f"{name} must be non-negative")
    return arr.astype(_U64)


def _check_epoch(epoch: int) -> int:
    if not isinstance(epoch, int | np.integer) or isinstance(epoch, bool):
        raise ConfigurationError(f"epoch must be an integer, got {type(epoch).__name__}")
    if not 0 <= int(epoch) < 1 << 64:
        raise ConfigurationError(f"epoch must be in [0, 2**64), got {epoch}")
    return int(epoch)


def _check_party(party: int) -> int:
    if party not in (0, 1) or isinstance(party, bool):
        raise DPFKeyError(f"party must be 0 or 1, got {party!r}")
    return int(party)


def _betas_matrix(betas: ArrayLike, m: int) -> NDArray[np.uint64]:
    arr = _as_u64(betas, "betas")
    if arr.ndim == 1:
        arr = arr.reshape(m, 1) if arr.shape[0] == m else arr
    if arr.ndim != 2 or arr.shape[0] != m:
        raise ConfigurationError(f"betas must have shape ({m},) or ({m}, tau), got {arr.shape}")
    if not 1 <= arr.shape[1] <= MAX_TAU:
        raise ConfigurationError(f"tau must be in [1, {MAX_TAU}], got {arr.shape[1]}")
    return np.ascontiguousarray(arr)


# ------------------------------------------------------------------------------------------------
# Key material
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DPFPublicBatch:
    """Public part of ``m`` DPF keys (identical for both servers), stored level-concatenated.

    Parameters
    ----------
    tau : int
        Output words per point (1 for a scalar ``beta``).
    domain_bits : numpy.ndarray
        ``(m,)`` domain size in bits of each key (0..63; bins may differ).
    epochs : numpy.ndarray
        ``(m,)`` uint64 U-DPF epoch of each key's leaf correction word (0 after Gen).
    cw_seeds : numpy.ndarray
        ``(L, 2)`` uint64 seed correction words, key ``j``'s levels at rows
        ``level_offsets[j]:level_offsets[j+1]``; bit 0 is always 0.
    cw_bits : numpy.ndarray
        ``(L,)`` uint8 control-bit corrections (bit 0 left, bit 1 right).
    cw_leaf : numpy.ndarray
        ``(m, W)`` uint64 leaf correction words, ``W = group * tau`` (see module docstring).
    cw_proof : numpy.ndarray or None
        ``(m, PROOF_WORDS)`` uint64 proof correction words of verifiable keys
        (:mod:`flwr_fsl.crypto.vdpf`; only with even ``tau``), or None (plain keys).

    Raises
    ------
    DPFKeyError
        If a field has the wrong type, shape or range (e.g. a control-bit byte above 3).

    Notes
    -----
    A batch made by key generation (:mod:`flwr_fsl.crypto.dpf_gen`) holds its serialized form:
    its arrays are read-only (the seed and leaf words are views of that blob) and
    :meth:`to_bytes` returns the blob itself.
    """

    tau: int
    domain_bits: NDArray[np.uint8]
    epochs: NDArray[np.uint64]
    cw_seeds: NDArray[np.uint64]
    cw_bits: NDArray[np.uint8]
    cw_leaf: NDArray[np.uint64]
    cw_proof: NDArray[np.uint64] | None = None
    level_offsets: NDArray[np.int64] = field(init=False, repr=False)
    _wire: bytes | None = field(init=False, repr=False, default=None)
    _end: int = field(init=False, repr=False, default=-1)  # public part's end in _wire

    def __post_init__(self) -> None:
        tau = self.tau
        if (
            not isinstance(tau, int | np.integer)
            or isinstance(tau, bool)
            or not 1 <= tau <= MAX_TAU
        ):
            raise DPFKeyError(f"tau must be an integer in [1, {MAX_TAU}], got {tau!r}")
        object.__setattr__(self, "tau", int(tau))
        d = np.asarray(self.domain_bits)
        if d.ndim != 1 or not np.issubdtype(d.dtype, np.integer):
            raise DPFKeyError(f"domain_bits must be a 1-D integer array, got {d.dtype} {d.shape}")
        if d.size and (int(d.min()) < 0 or int(d.max()) > MAX_DOMAIN_BITS):
            raise DPFKeyError(f"domain_bits must be in [0, {MAX_DOMAIN_BITS}]")
        m = d.shape[0]
        levels = _tree_levels(d, int(tau))
        offsets = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(levels, out=offsets[1:])
        n_levels = int(offsets[-1])
        w = _group(int(tau)) * int(tau)
        checks: list[tuple[str, Any, tuple[int, ...], type]] = [
            ("epochs", self.epochs, (m,), np.uint64),
            ("cw_seeds", self.cw_seeds, (n_levels, 2), np.uint64),
            ("cw_bits", self.cw_bits, (n_levels,), np.uint8),
            ("cw_leaf", self.cw_leaf, (m, w), np.uint64),
        ]
        if self.cw_proof is not None:
            if int(tau) % 2:
                raise DPFKeyError("verifiable keys (cw_proof) need an even tau")
            checks.append(("cw_proof", self.cw_proof, (m, PROOF_WORDS), np.uint64))
        for name, arr, shape, dtype in checks:
            if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.shape != shape:
                got = (arr.dtype, arr.shape) if isinstance(arr, np.ndarray) else type(arr)
                raise DPFKeyError(f"{name} must be {np.dtype(dtype)} of shape {shape}, got {got}")
            object.__setattr__(self, name, np.ascontiguousarray(arr))
        if n_levels and int(self.cw_bits.max()) > 3:
            raise DPFKeyError("bad control bits: a control-bit correction byte exceeds 3")
        if n_levels and np.any(self.cw_seeds.reshape(-1)[::2] & _U64(1)):
            raise DPFKeyError("bad control bits: a seed correction word has its lowest bit set")
        object.__setattr__(self, "domain_bits", d.astype(np.uint8))
        object.__setattr__(self, "level_offsets", offsets)

    @property
    def num_keys(self) -> int:
        """Number of keys ``m``."""
        return int(self.domain_bits.shape[0])

    @property
    def leaf_words(self) -> int:
        """Words ``W`` of one leaf correction word."""
        return _group(self.tau) * self.tau

    @property
    def num_points(self) -> NDArray[np.int64]:
        """``(m,)`` domain size ``2**domain_bits`` of each key."""
        return np.left_shift(np.int64(1), self.domain_bits.astype(np.int64))

    def key(self, j: int) -> DPFPublicKey:
        """Return the public part of key ``j`` as a :class:`DPFPublicKey`."""
        lo, hi = int(self.level_offsets[j]), int(self.level_offsets[j + 1])
        return DPFPublicKey(
            domain_bits=int(self.domain_bits[j]),
            tau=self.tau,
            epoch=int(self.epochs[j]),
            cw_seeds=self.cw_seeds[lo:hi].copy(),
            cw_bits=self.cw_bits[lo:hi].copy(),
            cw_leaf=self.cw_leaf[j].copy(),
            cw_proof=None if self.cw_proof is None else self.cw_proof[j].copy(),
        )

    @classmethod
    def concatenate(cls, parts: Sequence[DPFPublicBatch]) -> DPFPublicBatch:
        """Concatenate public batches with the same ``tau``.

        Raises
        ------
        DPFKeyError
            If ``parts`` is empty or the ``tau`` differ.
        """
        if not parts:
            raise DPFKeyError("nothing to concatenate")
        tau = parts[0].tau
        if any(p.tau != tau for p in parts):
            raise DPFKeyError("cannot mix keys with different tau")
        proofs = [p.cw_proof for p in parts]
        if any(q is None for q in proofs) and any(q is not None for q in proofs):
            raise DPFKeyError("cannot mix verifiable and plain keys")
        return cls(
            tau=tau,
            domain_bits=np.concatenate([p.domain_bits for p in parts]),
            epochs=np.concatenate([p.epochs for p in parts]),
            cw_seeds=np.concatenate([p.cw_seeds for p in parts]),
            cw_bits=np.concatenate([p.cw_bits for p in parts]),
            cw_leaf=np.concatenate([p.cw_leaf for p in parts]),
            cw_proof=None if proofs[0] is None else np.concatenate(proofs),  # type: ignore[arg-type]
        )

    @property
    def version(self) -> int:
        """Wire format version: 3 for verifiable keys (with ``cw_proof``), else 2."""
        return _VERSION if self.cw_proof is None else _PROOF_VERSION

    def layout(self, start: int = _HEADER_BYTES) -> PublicLayout:
        """Return where each field of this batch's public body goes (body at byte ``start``)."""
        shared = self.num_keys >= 1 and bool(np.all(self.epochs == self.epochs[0]))
        levels = int(self.level_offsets[-1])
        proof = self.cw_proof is not None
        return public_layout(start, self.num_keys, self.leaf_words, levels, proof, shared)

    def _write_body(self, buf: NDArray[np.uint8], lay: PublicLayout) -> None:
        """Write the public body into ``buf`` at ``lay`` (see module docstring)."""
        if self._wire is not None:  # written once already: copy the body as it stands
            body = np.frombuffer(self._wire, np.uint8, self._end - _HEADER_BYTES, _HEADER_BYTES)
            buf[lay.start : lay.end] = body
            return
        words = (self.cw_leaf, self.cw_seeds, self.cw_bits, self.cw_proof)
        write_public_body(buf, lay, self.domain_bits, self.epochs, *words)

    def to_bytes(self) -> bytes:
        """Serialize (kind 1, see module docstring); a batch from Gen returns its blob as is."""
        if self._wire is not None:
            if self._end != len(self._wire):  # a trailer follows: keep the public part only
                object.__setattr__(self, "_wire", self._wire[: self._end])
            return self._wire
        lay = self.layout()
        buf = np.empty(lay.end, np.uint8)
        _write_header(buf, _KIND_PUBLIC, _NO_PARTY, self.tau, self.num_keys, self.version)
        self._write_body(buf, lay)
        return buf.tobytes()

    def wire_view(self) -> memoryview:
        """Return :meth:`to_bytes` as a read-only view (no copy of a blob Gen wrote)."""
        if self._wire is None:
            return memoryview(self.to_bytes())
        return memoryview(self._wire)[: self._end]

    def blob(self) -> bytes:
        """Return the bytes key generation wrote: :meth:`to_bytes`, then any trailer it reserved.

        :func:`~flwr_fsl.crypto.dpf_gen.gen_public` can write a trailer (a value check's) after
        the public part in the same blob, so an upload is copied out once. The first
        :meth:`to_bytes` of such a batch copies the public part out and keeps only that (the
        blob belongs to the upload): from then on this is :meth:`to_bytes`.
        """
        return self._wire if self._wire is not None else self.to_bytes()

    @classmethod
    def _from_wire(
        cls, wire: bytes | None, fields: dict[str, Any], end: int | None = None
    ) -> DPFPublicBatch:
        """Wrap a public part that key generation wrote in place, with its blob cached.

        ``fields`` are every field's value (``level_offsets`` included), typically read-only
        views of ``wire``; arrays are made read-only, so the cached blob stays what
        :meth:`to_bytes` would write. ``wire[:end]`` is the public part (``end`` None: all of
        it; a trailer may follow); with ``wire`` None nothing is cached. Gen's arrays are
        correct by construction and are not validated again (a decoded blob is:
        :meth:`from_bytes`).
        """
        batch = object.__new__(cls)
        for name, value in fields.items():
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
            object.__setattr__(batch, name, value)
        object.__setattr__(batch, "_wire", wire)
        object.__setattr__(batch, "_end", -1 if wire is None else end or len(wire))
        return batch

    @classmethod
    def from_bytes(cls, data: bytes) -> DPFPublicBatch:
        """Parse and validate a serialized public part.

        Raises
        ------
        DPFKeyError
            If the blob is truncated, too long, or any field is invalid.
        """
        r, tau, m, _, version = _parse_header(data, _KIND_PUBLIC)
        return _parse_public_body(r, tau, m, version)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DPFPublicBatch) and self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class DPFPublicKey:
    """Public part of one DPF key (correction words), identical for both servers.

    Parameters
    ----------
    domain_bits : int
        Domain ``[0, 2**domain_bits)``.
    tau : int
        Output words per point.
    epoch : int
        U-DPF epoch of the leaf correction word (0 after Gen).
    cw_seeds : numpy.ndarray
        ``(levels, 2)`` uint64 seed correction words.
    cw_bits : numpy.ndarray
        ``(levels,)`` uint8 control-bit corrections (bit 0 left, bit 1 right).
    cw_leaf : numpy.ndarray
        ``(W,)`` uint64 leaf correction word.
    cw_proof : numpy.ndarray or None
        ``(PROOF_WORDS,)`` uint64 proof correction word of a verifiable key, or None.

    Raises
    ------
    DPFKeyError
        If a field is malformed (checked as a batch of one).
    """

    domain_bits: int
    tau: int
    epoch: int
    cw_seeds: NDArray[np.uint64]
    cw_bits: NDArray[np.uint8]
    cw_leaf: NDArray[np.uint64]
    cw_proof: NDArray[np.uint64] | None = None

    def __post_init__(self) -> None:
        self.as_batch()  # validates

    def as_batch(self) -> DPFPublicBatch:
        """Return this public part as a batch of one key.

        Raises
        ------
        DPFKeyError
            If a field is malformed.
        """
        for name in ("domain_bits", "epoch"):
            v = getattr(self, name)
            if not isinstance(v, int | np.integer) or isinstance(v, bool):
                raise DPFKeyError(f"{name} must be an integer, got {v!r}")
        if not 0 <= int(self.domain_bits) <= MAX_DOMAIN_BITS:
            raise DPFKeyError(f"domain_bits must be in [0, {MAX_DOMAIN_BITS}]")
        if not 0 <= int(self.epoch) < 1 << 64:
            raise DPFKeyError("epoch must be in [0, 2**64)")
        leaf = self.cw_leaf
        if not isinstance(leaf, np.ndarray) or leaf.ndim != 1:
            raise DPFKeyError("cw_leaf must be a 1-D uint64 array")
        return DPFPublicBatch(
            tau=self.tau,
            domain_bits=np.array([self.domain_bits], dtype=np.uint8),
            epochs=np.array([self.epoch], dtype=_U64),
            cw_seeds=self.cw_seeds,
            cw_bits=self.cw_bits,
            cw_leaf=leaf.reshape(1, -1),
            cw_proof=None if self.cw_proof is None else np.asarray(self.cw_proof).reshape(1, -1),
        )

    def to_bytes(self) -> bytes:
        """Serialize as a public batch of one key (kind 1)."""
        return self.as_batch().to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> DPFPublicKey:
        """Parse a public part that must hold exactly one key.

        Raises
        ------
        DPFKeyError
            If the blob is malformed or holds a number of keys other than one.
        """
        batch = DPFPublicBatch.from_bytes(data)
        if batch.num_keys != 1:
            raise DPFKeyError(f"expected one key, got {batch.num_keys}")
        return batch.key(0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DPFPublicKey) and self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]


def _check_seeds(seeds: Any, m: int, name: str) -> NDArray[np.uint64]:
    if not isinstance(seeds, np.ndarray) or seeds.dtype != _U64 or seeds.shape != (m, 2):
        got = (seeds.dtype, seeds.shape) if isinstance(seeds, np.ndarray) else type(seeds)
        raise DPFKeyError(f"{name} must be uint64 of shape ({m}, 2), got {got}")
    if m and np.any(seeds[:, 0] & _U64(1)):
        raise DPFKeyError(f"bad control bits: a {name} entry has its lowest bit set")
    return np.ascontiguousarray(seeds)


def _seed_from_bytes(seed: bytes, name: str) -> NDArray[np.uint64]:
    if not isinstance(seed, bytes | bytearray) or len(seed) != SEED_BYTES:
        raise DPFKeyError(f"{name} must be {SEED_BYTES} bytes")
    return _check_seeds(np.frombuffer(bytes(seed), dtype="<u8").astype(_U64).reshape(1, 2), 1, name)


@dataclass(frozen=True, eq=False)
class DPFKey:
    """One server's share of one DPF key: ``party``, private root ``seed`` and public part.

    Parameters
    ----------
    party : int
        0 or 1: which server holds the share (fixes the output sign and initial control bit).
    seed : bytes
        16-byte private root seed; its lowest bit (the control-bit position) must be 0.
    public : DPFPublicKey
        The public correction words.

    Raises
    ------
    DPFKeyError
        If the party, seed or public part is malformed.
    """

    party: int
    seed: bytes
    public: DPFPublicKey

    def __post_init__(self) -> None:
        _check_party(self.party)
        _seed_from_bytes(self.seed, "seed")
        if not isinstance(self.public, DPFPublicKey):
            raise DPFKeyError("public must be a DPFPublicKey")

    def as_batch(self) -> DPFKeyBatch:
        """Return this key as a batch of one."""
        return DPFKeyBatch(
            party=self.party,
            root_seeds=_seed_from_bytes(self.seed, "seed"),
            public=self.public.as_batch(),
        )

    def to_bytes(self) -> bytes:
        """Serialize as a key batch of one (kind 2)."""
        return self.as_batch().to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> DPFKey:
        """Parse a key share that must hold exactly one key.

        Raises
        ------
        DPFKeyError
            If the blob is malformed or holds a number of keys other than one.
        """
        batch = DPFKeyBatch.from_bytes(data)
        if batch.public.num_keys != 1:
            raise DPFKeyError(f"expected one key, got {batch.public.num_keys}")
        return batch.key(0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DPFKey) and self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class DPFKeyBatch:
    """One server's shares of ``m`` DPF keys: party, root seeds, shared public part.

    Parameters
    ----------
    party : int
        0 or 1.
    root_seeds : numpy.ndarray
        ``(m, 2)`` uint64 private root seeds (lowest bit 0), usually
        :func:`~flwr_fsl.crypto.prg.derive_root_seeds` of a master seed.
    public : DPFPublicBatch
        Public part of the ``m`` keys.

    Raises
    ------
    DPFKeyError
        If a field is malformed or the sizes disagree.
    """

    party: int
    root_seeds: NDArray[np.uint64]
    public: DPFPublicBatch

    def __post_init__(self) -> None:
        _check_party(self.party)
        if not isinstance(self.public, DPFPublicBatch):
            raise DPFKeyError("public must be a DPFPublicBatch")
        object.__setattr__(
            self, "root_seeds", _check_seeds(self.root_seeds, self.public.num_keys, "root_seeds")
        )

    @classmethod
    def from_master_seed(
        cls, party: int, public: DPFPublicBatch, master_seed: bytes
    ) -> DPFKeyBatch:
        """Rebuild a server's key shares from the public part and its 16-byte master seed.

        Raises
        ------
        DPFKeyError
            If the party or master seed is malformed.
        """
        if not isinstance(master_seed, bytes | bytearray) or len(master_seed) != SEED_BYTES:
            raise DPFKeyError(f"master seed must be {SEED_BYTES} bytes")
        seeds = derive_root_seeds(bytes(master_seed), public.num_keys)
        return cls(party=party, root_seeds=seeds, public=public)

    @classmethod
    def from_keys(cls, keys: Sequence[DPFKey]) -> DPFKeyBatch:
        """Stack single keys of one party and one ``tau`` into a batch.

        Raises
        ------
        DPFKeyError
            If ``keys`` is empty or parties or ``tau`` differ.
        """
        if not keys:
            raise DPFKeyError("no keys")
        if any(k.party != keys[0].party for k in keys):
            raise DPFKeyError("cannot mix the two parties' key shares")
        batches = [k.as_batch() for k in keys]
        return cls(
            party=keys[0].party,
            root_seeds=np.concatenate([b.root_seeds for b in batches]),
            public=DPFPublicBatch.concatenate([b.public for b in batches]),
        )

    def key(self, j: int) -> DPFKey:
        """Return key ``j`` as a :class:`DPFKey`."""
        seed = self.root_seeds[j].astype("<u8").tobytes()
        return DPFKey(party=self.party, seed=seed, public=self.public.key(j))

    def to_bytes(self) -> bytes:
        """Serialize (kind 2: party, root seeds and public part)."""
        pub = self.public
        m = pub.num_keys
        lay = pub.layout(_HEADER_BYTES + 16 * m)
        buf = np.empty(lay.end, np.uint8)
        _write_header(buf, _KIND_KEYS, self.party, pub.tau, m, pub.version)
        u64_view(buf, _HEADER_BYTES, 2 * m)[:] = self.root_seeds.reshape(-1)
        pub._write_body(buf, lay)
        return buf.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> DPFKeyBatch:
        """Parse and validate serialized key shares.

        Raises
        ------
        DPFKeyError
            If the blob is truncated, too long, or any field is invalid.
        """
        r, tau, m, party, version = _parse_header(data, _KIND_KEYS)
        seeds = r.words(2 * m, "<u8", "root seeds").astype(_U64)
        pub = _parse_public_body(r, tau, m, version)
        return cls(party=party, root_seeds=seeds.reshape(m, 2), public=pub)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DPFKeyBatch) and self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]


# ------------------------------------------------------------------------------------------------
# Wire format helpers
# ------------------------------------------------------------------------------------------------


def _header(kind: int, party: int, tau: int, m: int, version: int = _VERSION) -> Writer:
    """Return a writer holding the 16-byte header (module docstring)."""
    w = Writer(DPFKeyError)
    w.fixed(_MAGIC, len(_MAGIC))
    for byte in (version, kind, party, 0):
        w.u8(byte)
    w.u32(tau)
    w.u32(m)
    return w


def _write_header(
    buf: NDArray[np.uint8], kind: int, party: int, tau: int, m: int, version: int
) -> None:
    """Write the 16-byte header into ``buf[:16]``."""
    buf[:_HEADER_BYTES] = np.frombuffer(_header(kind, party, tau, m, version).payload(), np.uint8)


def _parse_header(data: bytes, kind: int) -> tuple[Reader, int, int, int, int]:
    """Check a blob's header; return ``(reader at the body, tau, m, party, version)``."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DPFKeyError(f"expected bytes, got {type(data).__name__}")
    frozen = isinstance(data, bytes) or (isinstance(data, memoryview) and data.readonly)
    r = Reader(data if frozen else bytes(data), 0, DPFKeyError)  # read-only views: no copy
    if len(r.data) < _HEADER_BYTES:
        raise DPFKeyError(f"truncated: {len(r.data)} bytes, header needs {_HEADER_BYTES}")
    if r.fixed(len(_MAGIC), "magic") != _MAGIC:
        raise DPFKeyError("not a DPF blob (bad magic)")
    version, got_kind, party, zero = (r.u8(what) for what in ("version", "kind", "party", "zero"))
    tau, m = r.u32("tau"), r.u32("number of keys")
    if version not in (_VERSION, _PROOF_VERSION):
        raise DPFKeyError(f"unsupported DPF format version {version}")
    if got_kind != kind:
        raise DPFKeyError(f"wrong blob kind {got_kind}, expected {kind}")
    want_party = kind == _KIND_KEYS
    if (want_party and party not in (0, 1)) or (not want_party and party != _NO_PARTY):
        raise DPFKeyError(f"bad party byte {party}")
    if zero != 0:
        raise DPFKeyError("reserved header byte is not zero")
    if not 1 <= tau <= MAX_TAU:
        raise DPFKeyError(f"tau must be in [1, {MAX_TAU}], got {tau}")
    return r, tau, m, party, version


def _unpack_cw_bits(packed: NDArray[np.uint8], n_levels: int) -> NDArray[np.uint8]:
    """Inverse of :func:`_pack_cw_bits`; rejects non-zero padding bits in the last byte."""
    quads = np.stack([(packed >> np.uint8(2 * i)) & np.uint8(3) for i in range(4)], axis=1)
    flat = quads.reshape(-1)
    if np.any(flat[n_levels:]):
        raise DPFKeyError("bad control bits: non-zero padding bits after the last level")
    return np.ascontiguousarray(flat[:n_levels], dtype=np.uint8)


def _parse_public_body(r: Reader, tau: int, m: int, version: int = _VERSION) -> DPFPublicBatch:
    """Parse a public body from ``r`` to the end of the message (module docstring)."""
    w = _group(tau) * tau
    mode = r.u8("epoch_mode")
    if mode not in (_EPOCH_SHARED, _EPOCH_PER_KEY):
        raise DPFKeyError(f"bad epoch_mode byte {mode}")
    dbits = r.words(m, "u1", "domain_bits").copy()
    if any(r.fixed((-(1 + m)) % 8, "padding after domain_bits")):
        raise DPFKeyError("non-zero padding after domain_bits")
    if m and int(dbits.max()) > MAX_DOMAIN_BITS:
        raise DPFKeyError(f"wrong domain: domain_bits above {MAX_DOMAIN_BITS}")
    n_epochs = 1 if mode == _EPOCH_SHARED else m
    # Little-endian words on a little-endian host: read-only views of the message, no copy
    # (about 21 MB per SSA client at m = 2**20; session 29). The public part is never written.
    epochs = r.words(n_epochs, "<u8", "epochs").astype(_U64, copy=False)
    if mode == _EPOCH_SHARED:
        if m == 0:
            raise DPFKeyError("epoch_mode 0 (one shared epoch) needs at least one key")
        epochs = np.full(m, epochs[0], dtype=_U64)
    elif m and np.all(epochs == epochs[0]):
        raise DPFKeyError("epoch_mode 1 (per-key epochs) but all keys share one epoch")
    leaf = r.words(m * w, "<u8", "cw_leaf").astype(_U64, copy=False).reshape(m, w)
    n_levels = int(_tree_levels(dbits, tau).sum())
    cw_seeds = r.words(2 * n_levels, "<u8", "cw_seeds").astype(_U64, copy=False)
    packed = r.words((n_levels + 3) // 4, "u1", "cw_bits")
    proof = None
    if version == _PROOF_VERSION:
        proof = r.words(m * PROOF_WORDS, "<u8", "cw_proof").astype(_U64, copy=False)
        proof = proof.reshape(m, PROOF_WORDS)
    r.done()
    return DPFPublicBatch(
        tau=tau,
        domain_bits=dbits,
        epochs=epochs,
        cw_seeds=cw_seeds.reshape(n_levels, 2),
        cw_bits=_unpack_cw_bits(packed, n_levels),
        cw_leaf=leaf,
        cw_proof=proof,
    )
