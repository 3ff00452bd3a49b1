"""Distributed point functions (BGI16 tree, λ = 128) over Z_2^64, batched, with Cui's U-DPF.

A DPF shares the point function ``f(x) = beta if x == alpha else 0`` on the domain
``[0, 2**domain_bits)`` between two servers: ``evaluate(k0, x) + evaluate(k1, x) == f(x)`` in
``Z_2^64`` (``beta`` is one word, or a vector of ``tau`` words: a mega-element / a row with a
count word appended). Construction: Boyle–Gilboa–Ishai, "Function Secret Sharing: Improvements
and Extensions" (CCS 2016), Fig. 1, with these choices:

* PRG: fixed-key AES-128 in Matyas–Meyer–Oseas mode with two fixed keys, as in
  google/distributed_point_functions (:mod:`flwr_fsl.crypto.prg`): the children of seed ``s``
  are ``AES_{K_L}(x) ^ x`` and ``AES_{K_R}(x) ^ x`` of the block ``x = s | t``: a seed is a
  128-bit block whose lowest bit is reserved for the control bit, and the PRG input is the seed
  *with* the node's control bit in that bit (children's bit 0 are their control bits). Root
  seeds and correction seeds keep bit 0 clear on the wire. A whole tree level of many keys is
  two AES calls (one per key) over the same buffer of blocks.
* Early termination (BGI16 §3.2.1) when ``tau`` is odd: one leaf seed converts to one or more
  whole AES blocks, i.e. ``W = group * tau`` words with ``group = 2`` points per leaf seed for
  odd ``tau`` and ``group = 1`` for even ``tau``; the tree then has ``domain_bits - 1`` levels
  (odd ``tau``, ``domain_bits >= 1``) or ``domain_bits`` levels (even ``tau``).
* Leaf conversion ``H(s, e)``: MMO blocks ``s ^ (2 + q, e)``, ``q < W / 2``, under the third
  fixed key (:data:`~flwr_fsl.crypto.prg.MMO_KEY`); ``e`` is the key's epoch (0 unless
  updated), so the conversion doubles as Cui's epoch-keyed hash (§5).

**Key split (Cui §4).** A key share is ``(party, root seed, public part)``. The public part
(:class:`DPFPublicKey` / :class:`DPFPublicBatch`: per-level seed and control-bit correction words,
the leaf correction word, ``domain_bits``, ``tau`` and the epoch) is identical for both servers;
only the 16-byte root seed differs. For many keys (one per cuckoo bin) the root seeds of server
``b`` are ``PRF(msk_b, i)`` (:func:`~flwr_fsl.crypto.prg.derive_root_seeds`), so a client sends
the public part once and one 16-byte master seed to each server
(:meth:`DPFKeyBatch.from_master_seed`).

**Threat model.** Semi-honest servers that do not collude; a client may be malicious only in
that it can send malformed keys, which the decoders reject with :class:`DPFKeyError` (this
module does not verify that a well-formed key encodes a point function: that is a sketching
protocol's job, Cui §3.1). Each server alone sees its root seed and the public part; both are
pseudorandom and independent of ``alpha`` and ``beta`` (BGI16 Thm. 3.3 with AES-MMO modelled as
a PRG): the server learns only what is public by design — ``domain_bits``, ``tau`` and the
epoch. A U-DPF hint (§5) is a fresh leaf correction word masked by ``H(s_0, e) - H(s_1, e)`` at
a new epoch ``e``; its security needs every epoch to be used once per key pair, which
:func:`update` and :func:`next_hint` enforce (epochs strictly increase).

**Errors.** :class:`DPFKeyError` (a :class:`ValueError`) for any malformed key, public part,
hint or serialized blob and for keys that do not fit together; plain :class:`ValueError` for a
bad argument (alpha or a point outside the domain, wrong beta shape, bad epoch).

**Wire format** (version 2; little-endian, no pickle, strict length, canonical: one byte string
per key set). A 16-byte header: ``b"FDPF"``, version 2, kind (1 public part, 2 key shares,
3 U-DPF hint), party (0/1, 255 when none), a zero byte, ``tau`` (u32), number of keys ``m``
(u32). Key shares then put ``m`` 16-byte root seeds before the public body. The public body:

* ``epoch_mode`` (u8): 0 when ``m >= 1`` and all keys share one epoch (the common case: Gen and
  :func:`update_batch` give every key of a batch the same epoch), else 1 (keys of different
  epochs, e.g. :meth:`DPFPublicBatch.concatenate` of batches updated in different rounds, or
  ``m == 0``); any other value, or a mode that is not the one these rules pick, is rejected;
* ``domain_bits`` (m u8), then zeros up to a multiple of 8 bytes counted from ``epoch_mode``;
* ``epochs``: one u64 (mode 0) or m u64 (mode 1);
* ``cw_leaf`` (m*W u64);
* ``cw_seeds`` (L*16 bytes, ``L`` = total tree levels, keys' levels concatenated in key order);
* ``cw_bits``: ``ceil(L / 4)`` bytes, 2 bits per level (bit 0 left, bit 1 right correction),
  level ``i`` at bits ``2 * (i % 4)`` and ``2 * (i % 4) + 1`` of byte ``i // 4``; the unused
  high bits of the last byte must be 0.

A hint carries its epoch (u64) and ``cw_leaf`` (m*W u64) after the header.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.wireformat import register_magic
from flwr_fsl.crypto.prg import SEED_BYTES, _mmo_ciphers, derive_root_seeds, random_seeds
from flwr_fsl.kernels import dpf_kernels as _k

__all__ = [
    "MAX_DOMAIN_BITS",
    "MAX_TAU",
    "DPFKey",
    "DPFKeyBatch",
    "DPFKeyError",
    "DPFPublicBatch",
    "DPFPublicKey",
    "UpdateHint",
    "evaluate",
    "evaluate_at",
    "evaluate_at_batch",
    "evaluate_batch",
    "generate_keys",
    "generate_keys_batch",
    "next_hint",
    "next_hint_batch",
    "update",
    "update_batch",
]

MAX_DOMAIN_BITS = 63
"""Largest supported ``domain_bits`` (points are uint64)."""
MAX_TAU = 1 << 20
"""Largest supported number of output words per point."""

_U64 = np.uint64
_MAGIC = register_magic(
    b"FDPF", "DPF key set: public part, key shares, U-DPF hint (flwr_fsl.crypto.dpf)"
)
_VERSION = 2
_KIND_PUBLIC, _KIND_KEYS, _KIND_HINT = 1, 2, 3
_NO_PARTY = 255
_EPOCH_SHARED, _EPOCH_PER_KEY = 0, 1
_HEADER = np.dtype(
    [
        ("magic", "S4"),
        ("version", "u1"),
        ("kind", "u1"),
        ("party", "u1"),
        ("zero", "u1"),
        ("tau", "<u4"),
        ("m", "<u4"),
    ]
)
_GEN_CHUNK = 8192  # keys per Gen chunk: 4 blocks each per level -> 512 KiB buffers
# AES blocks per full-domain chunk (512 KiB per level buffer): half the AES calls and kernel
# dispatches of 2^14, measured ~10% faster at depth 9 and 20 on a 1 MiB-L2 core.
_FD_BUDGET = 1 << 15


class DPFKeyError(ClientInputError):
    """A DPF key, public part, hint or serialized blob is malformed or keys do not fit together.

    It is a :class:`ValueError`, so callers may catch either.
    """


# ------------------------------------------------------------------------------------------------
# Geometry helpers
# ------------------------------------------------------------------------------------------------


def _group(tau: int) -> int:
    """Points per leaf seed: 2 for odd ``tau`` (early termination), else 1."""
    return 2 if tau % 2 else 1


def _tree_levels(domain_bits: NDArray[np.uint8] | NDArray[np.int64], tau: int) -> NDArray[np.int64]:
    """Return the number of tree levels (correction words) of keys with these domain sizes."""
    d = np.asarray(domain_bits, dtype=np.int64)
    return np.maximum(d - (_group(tau) - 1), 0)


def _split_points(
    points: NDArray[np.uint64], domain_bits: NDArray[np.int64], tau: int
) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Split points into (tree path bits, position inside the leaf group)."""
    if _group(tau) == 2:
        has_tree = domain_bits >= 1
        path = np.where(has_tree, points >> _U64(1), _U64(0)).astype(_U64)
        pos = np.where(has_tree, points & _U64(1), _U64(0)).astype(np.int64)
        return path, pos
    return points.astype(_U64, copy=True), np.zeros(points.shape, dtype=np.int64)


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
            raise ValueError(f"{name} must contain integers") from exc
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be integers in Z_2^64, got dtype {arr.dtype}")
    return arr.astype(_U64)


def _as_index(values: ArrayLike, name: str) -> NDArray[np.uint64]:
    """Non-negative integer indices as uint64 (rejects floats and negatives)."""
    arr = np.asarray(values)
    if arr.size == 0:
        return np.zeros(arr.shape, dtype=_U64)
    if arr.dtype == object:
        if any(not isinstance(v, int | np.integer) or v < 0 or v >= 1 << 64 for v in arr.flat):
            raise ValueError(f"{name} must be non-negative integers below 2**64")
        return arr.astype(_U64)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.signedinteger) and arr.size and int(arr.min()) < 0:
        raise ValueError(f"{name} must be non-negative")
    return arr.astype(_U64)


def _check_domain_bits(domain_bits: ArrayLike, m: int) -> NDArray[np.int64]:
    d = np.asarray(domain_bits)
    if d.dtype == np.bool_ or not np.issubdtype(d.dtype, np.integer):
        raise ValueError(f"domain_bits must be integers, got dtype {d.dtype}")
    if d.ndim == 0:
        d = np.full(m, int(d), dtype=np.int64)
    if d.shape != (m,):
        raise ValueError(f"domain_bits must be a scalar or have shape ({m},), got {d.shape}")
    if m and (int(d.min()) < 0 or int(d.max()) > MAX_DOMAIN_BITS):
        raise ValueError(f"domain_bits must be in [0, {MAX_DOMAIN_BITS}]")
    return d.astype(np.int64)


def _check_epoch(epoch: int) -> int:
    if not isinstance(epoch, int | np.integer) or isinstance(epoch, bool):
        raise ValueError(f"epoch must be an integer, got {type(epoch).__name__}")
    if not 0 <= int(epoch) < 1 << 64:
        raise ValueError(f"epoch must be in [0, 2**64), got {epoch}")
    return int(epoch)


def _check_party(party: int) -> int:
    if party not in (0, 1) or isinstance(party, bool):
        raise DPFKeyError(f"party must be 0 or 1, got {party!r}")
    return int(party)


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

    Raises
    ------
    DPFKeyError
        If a field has the wrong type, shape or range (e.g. a control-bit byte above 3).
    """

    tau: int
    domain_bits: NDArray[np.uint8]
    epochs: NDArray[np.uint64]
    cw_seeds: NDArray[np.uint64]
    cw_bits: NDArray[np.uint8]
    cw_leaf: NDArray[np.uint64]
    level_offsets: NDArray[np.int64] = field(init=False, repr=False)

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
        for name, arr, shape, dtype in checks:
            if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.shape != shape:
                got = (arr.dtype, arr.shape) if isinstance(arr, np.ndarray) else type(arr)
                raise DPFKeyError(f"{name} must be {np.dtype(dtype)} of shape {shape}, got {got}")
            object.__setattr__(self, name, np.ascontiguousarray(arr))
        if n_levels and int(self.cw_bits.max()) > 3:
            raise DPFKeyError("bad control bits: a control-bit correction byte exceeds 3")
        if n_levels and np.any(self.cw_seeds[:, 0] & _U64(1)):
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
        return cls(
            tau=tau,
            domain_bits=np.concatenate([p.domain_bits for p in parts]),
            epochs=np.concatenate([p.epochs for p in parts]),
            cw_seeds=np.concatenate([p.cw_seeds for p in parts]),
            cw_bits=np.concatenate([p.cw_bits for p in parts]),
            cw_leaf=np.concatenate([p.cw_leaf for p in parts]),
        )

    def _body(self) -> bytes:
        """Serialize the public body (everything after the header; see module docstring)."""
        m = self.num_keys
        shared = m >= 1 and bool(np.all(self.epochs == self.epochs[0]))
        epochs = self.epochs[:1] if shared else self.epochs
        mode = _EPOCH_SHARED if shared else _EPOCH_PER_KEY
        return b"".join(
            [
                bytes([mode]),
                self.domain_bits.tobytes(),
                bytes((-(1 + m)) % 8),
                epochs.astype("<u8").tobytes(),
                self.cw_leaf.astype("<u8").tobytes(),
                self.cw_seeds.astype("<u8").tobytes(),
                _pack_cw_bits(self.cw_bits),
            ]
        )

    def to_bytes(self) -> bytes:
        """Serialize (kind 1, see module docstring)."""
        return _header(_KIND_PUBLIC, _NO_PARTY, self.tau, self.num_keys) + self._body()

    @classmethod
    def from_bytes(cls, data: bytes) -> DPFPublicBatch:
        """Parse and validate a serialized public part.

        Raises
        ------
        DPFKeyError
            If the blob is truncated, too long, or any field is invalid.
        """
        tau, m, _ = _parse_header(data, _KIND_PUBLIC)
        pub, end = _parse_public_body(data, 16, tau, m)
        if end != len(data):
            raise DPFKeyError(f"public part: {len(data) - end} trailing bytes")
        return pub

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
        head = _header(_KIND_KEYS, self.party, pub.tau, pub.num_keys)
        return head + self.root_seeds.astype("<u8").tobytes() + pub._body()

    @classmethod
    def from_bytes(cls, data: bytes) -> DPFKeyBatch:
        """Parse and validate serialized key shares.

        Raises
        ------
        DPFKeyError
            If the blob is truncated, too long, or any field is invalid.
        """
        tau, m, party = _parse_header(data, _KIND_KEYS)
        end = 16 + 16 * m
        if len(data) < end:
            raise DPFKeyError(f"truncated key shares: {len(data)} bytes, need at least {end}")
        seeds = np.frombuffer(data, dtype="<u8", count=2 * m, offset=16).astype(_U64)
        pub, end = _parse_public_body(data, end, tau, m)
        if end != len(data):
            raise DPFKeyError(f"key shares: {len(data) - end} trailing bytes")
        return cls(party=party, root_seeds=seeds.reshape(m, 2), public=pub)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DPFKeyBatch) and self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class UpdateHint:
    """U-DPF hint (Cui §5): new leaf correction words of ``m`` keys for one epoch.

    The same hint goes to both servers (it is public); applying it with :func:`update` moves a
    key pair from ``f_{alpha, beta}`` to ``f_{alpha, beta'}``.

    Parameters
    ----------
    epoch : int
        The new epoch (strictly larger than the keys' epochs).
    tau : int
        Output words per point.
    cw_leaf : numpy.ndarray
        ``(m, W)`` uint64 new leaf correction words.

    Raises
    ------
    DPFKeyError
        If a field is malformed.
    """

    epoch: int
    tau: int
    cw_leaf: NDArray[np.uint64]

    def __post_init__(self) -> None:
        if not isinstance(self.epoch, int | np.integer) or not 0 <= int(self.epoch) < 1 << 64:
            raise DPFKeyError(f"hint epoch must be an integer in [0, 2**64), got {self.epoch!r}")
        if not isinstance(self.tau, int | np.integer) or not 1 <= int(self.tau) <= MAX_TAU:
            raise DPFKeyError(f"hint tau must be in [1, {MAX_TAU}], got {self.tau!r}")
        w = _group(int(self.tau)) * int(self.tau)
        leaf = self.cw_leaf
        if not isinstance(leaf, np.ndarray) or leaf.dtype != _U64 or leaf.ndim != 2:
            raise DPFKeyError("hint cw_leaf must be a 2-D uint64 array")
        if leaf.shape[1] != w:
            raise DPFKeyError(f"hint cw_leaf has {leaf.shape[1]} words per key, tau needs {w}")
        object.__setattr__(self, "epoch", int(self.epoch))
        object.__setattr__(self, "tau", int(self.tau))
        object.__setattr__(self, "cw_leaf", np.ascontiguousarray(leaf))

    def to_bytes(self) -> bytes:
        """Serialize (kind 3)."""
        m = self.cw_leaf.shape[0]
        return (
            _header(_KIND_HINT, _NO_PARTY, self.tau, m)
            + np.array([self.epoch], dtype="<u8").tobytes()
            + self.cw_leaf.astype("<u8").tobytes()
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> UpdateHint:
        """Parse and validate a serialized hint.

        Raises
        ------
        DPFKeyError
            If the blob is truncated, too long or malformed.
        """
        tau, m, _ = _parse_header(data, _KIND_HINT)
        w = _group(tau) * tau
        need = 16 + 8 + 8 * m * w
        if len(data) != need:
            raise DPFKeyError(f"hint has {len(data)} bytes, expected {need}")
        epoch = int(np.frombuffer(data, dtype="<u8", count=1, offset=16)[0])
        leaf = np.frombuffer(data, dtype="<u8", count=m * w, offset=24).astype(_U64)
        return cls(epoch=epoch, tau=tau, cw_leaf=leaf.reshape(m, w))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UpdateHint) and self.to_bytes() == other.to_bytes()

    __hash__ = None  # type: ignore[assignment]


def _header(kind: int, party: int, tau: int, m: int) -> bytes:
    head = np.zeros(1, dtype=_HEADER)
    head["magic"] = _MAGIC
    head["version"] = _VERSION
    head["kind"] = kind
    head["party"] = party
    head["tau"] = tau
    head["m"] = m
    return head.tobytes()


def _parse_header(data: bytes, kind: int) -> tuple[int, int, int]:
    """Check a blob's header; return ``(tau, m, party)``."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DPFKeyError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEADER.itemsize:
        raise DPFKeyError(f"truncated: {len(data)} bytes, header needs {_HEADER.itemsize}")
    head = np.frombuffer(data, dtype=_HEADER, count=1)[0]
    if bytes(head["magic"]) != _MAGIC:
        raise DPFKeyError("not a DPF blob (bad magic)")
    if int(head["version"]) != _VERSION:
        raise DPFKeyError(f"unsupported DPF format version {int(head['version'])}")
    if int(head["kind"]) != kind:
        raise DPFKeyError(f"wrong blob kind {int(head['kind'])}, expected {kind}")
    party = int(head["party"])
    want_party = kind == _KIND_KEYS
    if (want_party and party not in (0, 1)) or (not want_party and party != _NO_PARTY):
        raise DPFKeyError(f"bad party byte {party}")
    if int(head["zero"]) != 0:
        raise DPFKeyError("reserved header byte is not zero")
    tau = int(head["tau"])
    if not 1 <= tau <= MAX_TAU:
        raise DPFKeyError(f"tau must be in [1, {MAX_TAU}], got {tau}")
    return tau, int(head["m"]), party


def _pack_cw_bits(bits: NDArray[np.uint8]) -> bytes:
    """Pack 2-bit control-bit corrections 4 per byte, level ``i`` at bit ``2 * (i % 4)``."""
    n = bits.shape[0]
    padded = np.zeros(4 * ((n + 3) // 4), dtype=np.uint8)
    padded[:n] = bits
    quads = padded.reshape(-1, 4)
    packed = quads[:, 0] | (quads[:, 1] << 2) | (quads[:, 2] << 4) | (quads[:, 3] << 6)
    return packed.astype(np.uint8).tobytes()


def _unpack_cw_bits(packed: NDArray[np.uint8], n_levels: int) -> NDArray[np.uint8]:
    """Inverse of :func:`_pack_cw_bits`; rejects non-zero padding bits in the last byte."""
    quads = np.stack([(packed >> np.uint8(2 * i)) & np.uint8(3) for i in range(4)], axis=1)
    flat = quads.reshape(-1)
    if np.any(flat[n_levels:]):
        raise DPFKeyError("bad control bits: non-zero padding bits after the last level")
    return np.ascontiguousarray(flat[:n_levels], dtype=np.uint8)


def _need(data: bytes, end: int, what: str) -> None:
    """Raise :class:`DPFKeyError` unless ``data`` reaches ``end`` (where ``what`` ends)."""
    if len(data) < end:
        raise DPFKeyError(f"truncated public part: {len(data)} bytes, {what} needs {end}")


def _parse_public_body(data: bytes, off: int, tau: int, m: int) -> tuple[DPFPublicBatch, int]:
    """Parse a public body starting at ``off``; return it and its end (== ``len(data)``)."""
    w = _group(tau) * tau
    head_end = off + 1 + m + (-(1 + m)) % 8
    _need(data, head_end, "epoch_mode and domain_bits")
    mode = data[off]
    if mode not in (_EPOCH_SHARED, _EPOCH_PER_KEY):
        raise DPFKeyError(f"bad epoch_mode byte {mode}")
    dbits = np.frombuffer(data, dtype=np.uint8, count=m, offset=off + 1).copy()
    if any(data[off + 1 + m : head_end]):
        raise DPFKeyError("non-zero padding after domain_bits")
    if m and int(dbits.max()) > MAX_DOMAIN_BITS:
        raise DPFKeyError(f"wrong domain: domain_bits above {MAX_DOMAIN_BITS}")
    n_epochs = 1 if mode == _EPOCH_SHARED else m
    off = head_end
    _need(data, off + 8 * n_epochs, "epochs")
    epochs = np.frombuffer(data, dtype="<u8", count=n_epochs, offset=off).astype(_U64)
    off += 8 * n_epochs
    if mode == _EPOCH_SHARED:
        if m == 0:
            raise DPFKeyError("epoch_mode 0 (one shared epoch) needs at least one key")
        epochs = np.full(m, epochs[0], dtype=_U64)
    elif m and np.all(epochs == epochs[0]):
        raise DPFKeyError("epoch_mode 1 (per-key epochs) but all keys share one epoch")
    _need(data, off + 8 * m * w, "cw_leaf")
    leaf = np.frombuffer(data, dtype="<u8", count=m * w, offset=off).astype(_U64).reshape(m, w)
    off += 8 * m * w
    n_levels = int(_tree_levels(dbits, tau).sum())
    _need(data, off + 16 * n_levels, "cw_seeds")
    cw_seeds = np.frombuffer(data, dtype="<u8", count=2 * n_levels, offset=off).astype(_U64)
    off += 16 * n_levels
    n_packed = (n_levels + 3) // 4
    end = off + n_packed
    _need(data, end, "cw_bits")
    if len(data) > end:
        raise DPFKeyError(f"{len(data) - end} trailing bytes after the public part")
    packed = np.frombuffer(data, dtype=np.uint8, count=n_packed, offset=off)
    pub = DPFPublicBatch(
        tau=tau,
        domain_bits=dbits,
        epochs=epochs,
        cw_seeds=cw_seeds.reshape(n_levels, 2),
        cw_bits=_unpack_cw_bits(packed, n_levels),
        cw_leaf=leaf,
    )
    return pub, end


# ------------------------------------------------------------------------------------------------
# Gen
# ------------------------------------------------------------------------------------------------


def _betas_matrix(betas: ArrayLike, m: int) -> NDArray[np.uint64]:
    arr = _as_u64(betas, "betas")
    if arr.ndim == 1:
        arr = arr.reshape(m, 1) if arr.shape[0] == m else arr
    if arr.ndim != 2 or arr.shape[0] != m:
        raise ValueError(f"betas must have shape ({m},) or ({m}, tau), got {arr.shape}")
    if not 1 <= arr.shape[1] <= MAX_TAU:
        raise ValueError(f"tau must be in [1, {MAX_TAU}], got {arr.shape[1]}")
    return np.ascontiguousarray(arr)


def _gen_core(
    alphas: NDArray[np.uint64],
    betas: NDArray[np.uint64],
    dbits: NDArray[np.int64],
    root0: NDArray[np.uint64],
    root1: NDArray[np.uint64],
    epoch: int,
) -> DPFPublicBatch:
    """Generate the public part of ``m`` keys for the given root seeds (validated inputs)."""
    m, tau = betas.shape
    group = _group(tau)
    half_w = group * tau // 2
    tl = _tree_levels(dbits, tau)
    offsets = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(tl, out=offsets[1:])
    if group == 2:
        path = np.where(dbits >= 1, alphas >> _U64(1), _U64(0)).astype(_U64)
        gpos = np.where(dbits >= 1, alphas & _U64(1), _U64(0)).astype(np.int64)
    else:
        path = alphas.astype(_U64)
        gpos = np.zeros(m, dtype=np.int64)
    epochs = np.full(m, epoch, dtype=_U64)
    cw_seeds = np.empty((int(offsets[-1]), 2), dtype=_U64)
    cw_bits = np.empty(int(offsets[-1]), dtype=np.uint8)
    cw_leaf = np.empty((m, 2 * half_w), dtype=_U64)

    order = np.argsort(-tl, kind="stable").astype(np.int64)
    neg_sorted = -tl[order]
    aes = _mmo_ciphers()
    chunk = min(_GEN_CHUNK, max(m, 1))
    seeds = np.empty((2 * chunk, 2), dtype=_U64)  # party b's seed of key i at row 2 * i + b
    enc_l = np.empty((2 * chunk + 1, 2), dtype=_U64)
    enc_r = np.empty((2 * chunk + 1, 2), dtype=_U64)
    conv = np.empty((2 * chunk * half_w, 2), dtype=_U64)
    conv_enc = np.empty((2 * chunk * half_w + 1, 2), dtype=_U64)
    state_t = np.empty((chunk, 2), dtype=np.uint8)
    for lo in range(0, m, chunk):
        n = min(chunk, m - lo)
        _k.gen_init(order, lo, n, root0, root1, state_t, seeds)
        neg = neg_sorted[lo : lo + n]
        for level in range(int(-neg[0]) if n else 0):
            active = int(np.searchsorted(neg, -level, side="left"))
            aes.left.encrypt_prefix_into(seeds[: 2 * active], enc_l)
            aes.right.encrypt_prefix_into(seeds[: 2 * active], enc_r)
            _k.gen_level(
                enc_l,
                enc_r,
                seeds,
                active,
                level,
                order,
                lo,
                path,
                tl,
                offsets,
                state_t,
                cw_seeds,
                cw_bits,
            )
        _k.leaf_blocks_pair(n, seeds, epochs, order, lo, half_w, conv)
        nb = 2 * n * half_w
        aes.value.encrypt_prefix_into(conv[:nb], conv_enc)
        _k.leaf_correction(conv_enc, conv, n, order, lo, state_t, gpos, betas, half_w, cw_leaf)
    return DPFPublicBatch(
        tau=tau,
        domain_bits=dbits.astype(np.uint8),
        epochs=epochs,
        cw_seeds=cw_seeds,
        cw_bits=cw_bits,
        cw_leaf=cw_leaf,
    )


def generate_keys_batch(
    alphas: ArrayLike,
    betas: ArrayLike,
    domain_bits: ArrayLike,
    *,
    master_seeds: tuple[bytes, bytes] | None = None,
    epoch: int = 0,
) -> tuple[DPFKeyBatch, DPFKeyBatch]:
    """Generate ``m`` DPF key pairs at once (e.g. one per cuckoo bin).

    Root seeds of party ``b`` are ``PRF(master_seeds[b], j)`` for key ``j``, so each server's
    private material is one 16-byte master seed (Cui §4).

    Parameters
    ----------
    alphas : array_like
        ``(m,)`` points, ``alphas[j] < 2**domain_bits[j]``.
    betas : array_like
        ``(m,)`` (``tau = 1``) or ``(m, tau)`` values in Z_2^64 (integers; negative values wrap).
    domain_bits : int or array_like
        Domain size in bits, one for all keys or ``(m,)``; each in ``[0, 63]``.
    master_seeds : tuple of bytes, optional
        The two 16-byte master seeds; fresh random ones from the OS by default.
    epoch : int, optional
        Initial U-DPF epoch (default 0).

    Returns
    -------
    tuple of DPFKeyBatch
        Party 0's and party 1's shares; both hold the same :class:`DPFPublicBatch`.

    Raises
    ------
    ValueError
        If an alpha is outside its domain, shapes disagree, values are not integers or a
        master seed is not 16 bytes.
    """
    a = _as_index(alphas, "alphas")
    if a.ndim != 1:
        raise ValueError(f"alphas must be 1-D, got shape {a.shape}")
    m = a.shape[0]
    b = _betas_matrix(betas, m)
    d = _check_domain_bits(domain_bits, m)
    e = _check_epoch(epoch)
    if m and np.any((d < 64) & (a >> np.minimum(d, 63).astype(_U64) != 0)):
        raise ValueError("every alpha must be below 2**domain_bits")
    if master_seeds is None:
        msk = (random_seeds(1).tobytes(), random_seeds(1).tobytes())
    else:
        if len(master_seeds) != 2:
            raise ValueError("master_seeds must be a pair of 16-byte seeds")
        msk = (bytes(master_seeds[0]), bytes(master_seeds[1]))
        if any(len(s) != SEED_BYTES for s in msk):
            raise ValueError(f"master seeds must be {SEED_BYTES} bytes each")
    root0 = derive_root_seeds(msk[0], m)
    root1 = derive_root_seeds(msk[1], m)
    pub = _gen_core(a, b, d, root0, root1, e)
    return (
        DPFKeyBatch(party=0, root_seeds=root0, public=pub),
        DPFKeyBatch(party=1, root_seeds=root1, public=pub),
    )


def generate_keys(
    alpha: int,
    beta: int | ArrayLike,
    domain_bits: int,
    *,
    root_seeds: tuple[bytes, bytes] | None = None,
    epoch: int = 0,
) -> tuple[DPFKey, DPFKey]:
    """Generate a DPF key pair for ``f(x) = beta if x == alpha else 0`` on ``[0, 2**domain_bits)``.

    Parameters
    ----------
    alpha : int
        The point, ``0 <= alpha < 2**domain_bits``.
    beta : int or array_like
        Value in Z_2^64 (an int; ``tau = 1``) or a 1-D vector of ``tau`` integers.
    domain_bits : int
        Domain size in bits, ``0 <= domain_bits <= 63``.
    root_seeds : tuple of bytes, optional
        The two 16-byte root seeds (lowest bit 0); fresh random ones by default.
    epoch : int, optional
        Initial U-DPF epoch (default 0).

    Returns
    -------
    tuple of DPFKey
        ``(k0, k1)``, sharing one :class:`DPFPublicKey`.

    Raises
    ------
    ValueError
        If an argument is out of range or malformed (root seeds: :class:`DPFKeyError`).
    """
    if not isinstance(domain_bits, int | np.integer) or isinstance(domain_bits, bool):
        raise ValueError(f"domain_bits must be an integer, got {domain_bits!r}")
    if not isinstance(alpha, int | np.integer) or isinstance(alpha, bool):
        raise ValueError(f"alpha must be an integer, got {alpha!r}")
    if not 0 <= int(domain_bits) <= MAX_DOMAIN_BITS:
        raise ValueError(f"domain_bits must be in [0, {MAX_DOMAIN_BITS}], got {domain_bits}")
    if not 0 <= int(alpha) < 1 << int(domain_bits):
        raise ValueError(f"alpha={alpha} is outside [0, 2**{domain_bits})")
    bvec = _as_u64(beta, "beta")
    if bvec.ndim > 1 or bvec.size == 0:
        raise ValueError(f"beta must be an integer or a non-empty 1-D vector, got {bvec.shape}")
    bmat = bvec.reshape(1, -1)
    if bmat.shape[1] > MAX_TAU:
        raise ValueError(f"tau must be at most {MAX_TAU}")
    if root_seeds is None:
        r0, r1 = random_seeds(1), random_seeds(1)
    else:
        if len(root_seeds) != 2:
            raise ValueError("root_seeds must be a pair of 16-byte seeds")
        r0 = _seed_from_bytes(root_seeds[0], "root seed 0")
        r1 = _seed_from_bytes(root_seeds[1], "root seed 1")
    pub = _gen_core(
        np.array([alpha], dtype=_U64),
        bmat,
        np.array([domain_bits], dtype=np.int64),
        r0,
        r1,
        _check_epoch(epoch),
    ).key(0)
    return (
        DPFKey(party=0, seed=r0.astype("<u8").tobytes(), public=pub),
        DPFKey(party=1, seed=r1.astype("<u8").tobytes(), public=pub),
    )


# ------------------------------------------------------------------------------------------------
# Evaluation
# ------------------------------------------------------------------------------------------------


def evaluate_at_batch(
    keys: DPFKeyBatch, key_indices: ArrayLike, points: ArrayLike
) -> NDArray[np.uint64]:
    """Evaluate key ``key_indices[i]`` of a batch at ``points[i]`` for all ``i``.

    Parameters
    ----------
    keys : DPFKeyBatch
        One server's key shares.
    key_indices : array_like
        ``(n,)`` indices into the batch.
    points : array_like
        ``(n,)`` points, each inside its key's domain.

    Returns
    -------
    numpy.ndarray
        ``(n, tau)`` uint64 shares of ``f(points[i])``.

    Raises
    ------
    ValueError
        If an index or point is out of range or the shapes differ.
    """
    pub = keys.public
    idx = _as_index(key_indices, "key_indices").astype(np.int64)
    pts = _as_index(points, "points")
    if idx.ndim != 1 or pts.shape != idx.shape:
        raise ValueError(
            f"key_indices and points must be 1-D of one length: {idx.shape} {pts.shape}"
        )
    n = idx.shape[0]
    if n and int(idx.max()) >= pub.num_keys:
        raise ValueError(f"key index out of range (batch has {pub.num_keys} keys)")
    tau = pub.tau
    out = np.empty((n, tau), dtype=_U64)
    if n == 0:
        return out
    d = pub.domain_bits.astype(np.int64)[idx]
    if np.any(pts >> d.astype(_U64) != 0):
        raise ValueError("every point must be below 2**domain_bits of its key")
    tl_all = _tree_levels(pub.domain_bits, tau)
    path, gpos = _split_points(pts, d, tau)
    key_s = np.ascontiguousarray(idx)
    path_s = np.ascontiguousarray(path)
    seed = np.array(keys.root_seeds[key_s], dtype=_U64, order="C")
    seed[:, 0] |= _U64(keys.party)  # the control bit rides in bit 0 of the seed block
    t_state = np.full(n, keys.party, dtype=np.uint8)
    # Each level's AES input: the seeds of points going left (left key), then right (right key).
    blocks = np.empty((n, 2), dtype=_U64)
    enc = np.empty((n + 1, 2), dtype=_U64)
    who = np.arange(n, dtype=np.int64)
    who_next = np.empty(n, dtype=np.int64)
    mv_b, mv_e = blocks.data.cast("B"), enc.data.cast("B")
    aes = _mmo_ciphers()
    count, n_left = _k.point_place(who, n, 0, key_s, path_s, tl_all, seed, who_next, blocks)
    level = 0
    while count:
        who, who_next = who_next, who
        aes.left.encrypt_view_into(mv_b[: 16 * n_left], mv_e)
        aes.right.encrypt_view_into(mv_b[16 * n_left : 16 * count], mv_e[16 * n_left :])
        _k.point_level(
            enc,
            blocks,
            count,
            n_left,
            level,
            who,
            key_s,
            pub.level_offsets,
            pub.cw_seeds,
            pub.cw_bits,
            seed,
            t_state,
        )
        level += 1
        count, n_left = _k.point_place(
            who, count, level, key_s, path_s, tl_all, seed, who_next, blocks
        )
    half_w = pub.leaf_words // 2
    conv = np.empty((n * half_w, 2), dtype=_U64)
    conv_enc = np.empty((n * half_w + 1, 2), dtype=_U64)
    _k.point_leaf_blocks(seed, key_s, pub.epochs, half_w, conv)
    aes.value.encrypt_prefix_into(conv, conv_enc)
    _k.point_leaves(
        conv_enc,
        conv,
        t_state,
        key_s,
        np.ascontiguousarray(gpos),
        pub.cw_leaf,
        half_w,
        tau,
        keys.party,
        out,
    )
    return out


def evaluate_at(key: DPFKey, points: ArrayLike) -> NDArray[np.uint64]:
    """Evaluate one key share at ``points``.

    Parameters
    ----------
    key : DPFKey
        One server's share.
    points : array_like
        1-D points (or one int) inside the key's domain.

    Returns
    -------
    numpy.ndarray
        ``(n, tau)`` uint64 shares; ``evaluate_at(k0, x) + evaluate_at(k1, x) == f(x)``.

    Raises
    ------
    ValueError
        If a point is outside the domain.
    """
    pts = _as_index(points, "points").reshape(-1)
    return evaluate_at_batch(key.as_batch(), np.zeros(pts.shape[0], dtype=np.int64), pts)


def _split_tasks(
    keys: DPFKeyBatch,
    tasks_i: NDArray[np.int64],
    seeds: NDArray[np.uint64],
    t: NDArray[np.uint8],
    max_h: int,
) -> tuple[NDArray[np.int64], NDArray[np.uint64], NDArray[np.uint8]]:
    """Expand task roots one level at a time until every task has height <= ``max_h``."""
    pub = keys.public
    group = _group(pub.tau)
    aes = _mmo_ciphers()
    while True:
        keep = tasks_i[:, 3] < tasks_i[:, 4]  # drop subtrees entirely past the length limit
        tasks_i, seeds, t = tasks_i[keep], seeds[keep], t[keep]
        big = tasks_i[:, 2] > max_h
        if not big.any():
            return tasks_i, seeds, t
        sel = tasks_i[big]
        n = sel.shape[0]
        parents = np.ascontiguousarray(seeds[big])
        enc_l = np.empty((n + 1, 2), dtype=_U64)
        enc_r = np.empty((n + 1, 2), dtype=_U64)
        aes.left.encrypt_prefix_into(parents, enc_l)
        aes.right.encrypt_prefix_into(parents, enc_r)
        cw_idx = pub.level_offsets[sel[:, 0]] + sel[:, 1]
        child_s = np.empty((2 * n, 2), dtype=_U64)
        child_t = np.empty(2 * n, dtype=np.uint8)
        _k.expand_nodes(
            enc_l,
            enc_r,
            parents,
            np.ascontiguousarray(t[big]),
            cw_idx,
            pub.cw_seeds,
            pub.cw_bits,
            child_s,
            child_t,
        )
        child = np.repeat(sel, 2, axis=0)
        child[:, 1] += 1
        child[:, 2] -= 1
        span = np.left_shift(np.int64(1), child[:, 2]) * group
        child[1::2, 3] += span[1::2]
        tasks_i = np.concatenate([tasks_i[~big], child])
        seeds = np.concatenate([seeds[~big], child_s])
        t = np.concatenate([t[~big], child_t])


def evaluate_batch(
    keys: DPFKeyBatch,
    *,
    lengths: ArrayLike | None = None,
    out: NDArray[np.uint64] | None = None,
) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
    """Full-domain evaluation of every key of a batch (keys may have different domains).

    Levels of many keys are expanded together, one AES call per fixed key and level, in
    cache-sized chunks.

    Parameters
    ----------
    keys : DPFKeyBatch
        One server's key shares.
    lengths : array_like, optional
        ``(m,)`` number of leading points to produce per key (e.g. a simple-hash bin's real
        length, at most ``2**domain_bits``); default: the whole domain.
    out : numpy.ndarray, optional
        Preallocated ``(P, tau)`` uint64 output to fill (``P`` = total points).

    Returns
    -------
    values : numpy.ndarray
        ``(P, tau)`` uint64; key ``j``'s shares are rows ``offsets[j]:offsets[j+1]``.
    offsets : numpy.ndarray
        ``(m + 1,)`` int64 row offsets.

    Raises
    ------
    ValueError
        If ``lengths`` or ``out`` has the wrong shape or range.
    """
    pub = keys.public
    m, tau = pub.num_keys, pub.tau
    full = pub.num_points
    if lengths is None:
        npts = full
    else:
        npts = _as_index(lengths, "lengths").astype(np.int64)
        if npts.shape != (m,):
            raise ValueError(f"lengths must have shape ({m},), got {npts.shape}")
        if m and np.any(npts > full):
            raise ValueError("lengths must not exceed 2**domain_bits")
    offsets = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(npts, out=offsets[1:])
    total = int(offsets[-1])
    if out is None:
        out = np.empty((total, tau), dtype=_U64)
    elif out.dtype != _U64 or out.shape != (total, tau) or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous uint64 of shape ({total}, {tau})")
    if total == 0:
        return out, offsets
    group = _group(tau)
    half_w = pub.leaf_words // 2
    per_leaf = max(1, half_w)  # AES blocks per leaf: one seed per child, half_w to convert
    max_h = max(0, int(np.log2(max(_FD_BUDGET // per_leaf, 1))))
    tl = _tree_levels(pub.domain_bits, tau)
    tasks_i = np.stack(
        [np.arange(m), np.zeros(m, np.int64), tl, offsets[:-1], offsets[1:]], axis=1
    ).astype(np.int64)
    seeds = keys.root_seeds.copy()
    seeds[:, 0] |= _U64(keys.party)  # the control bit rides in bit 0 of the seed block
    t = np.full(m, keys.party, dtype=np.uint8)
    tasks_i, seeds, t = _split_tasks(keys, tasks_i, seeds, t, max_h)
    order = np.argsort(-tasks_i[:, 2], kind="stable")
    tasks_i = np.ascontiguousarray(tasks_i[order])
    seeds = np.ascontiguousarray(seeds[order])
    t = np.ascontiguousarray(t[order])
    cost = np.left_shift(np.int64(1), tasks_i[:, 2]) * per_leaf
    bounds = _k.chunk_bounds(cost, _FD_BUDGET)
    cap = int(max(np.add.reduceat(cost, bounds[:-1]).max(), 2)) if len(bounds) > 1 else 2
    # Level buffers, allocated once and reused by every chunk (ping-pong between two).
    buf_a = np.empty((cap + 1, 2), dtype=_U64)
    buf_b = np.empty((cap + 1, 2), dtype=_U64)
    enc_l = np.empty((cap + 1, 2), dtype=_U64)
    enc_r = np.empty((cap + 1, 2), dtype=_U64)
    t_a = np.empty(cap, dtype=np.uint8)
    t_b = np.empty(cap, dtype=np.uint8)
    flat = out.reshape(-1)
    aes = _mmo_ciphers()
    left, right, value = (
        aes.left.encrypt_view_into,
        aes.right.encrypt_view_into,
        aes.value.encrypt_view_into,
    )
    # Byte views taken once: slicing a memoryview is far cheaper than re-viewing arrays per call.
    mv = {id(b): b.data.cast("B") for b in (buf_a, buf_b)}
    mv_l, mv_r = enc_l.data.cast("B"), enc_r.data.cast("B")
    common = (tasks_i, seeds, t, pub.level_offsets, pub.cw_seeds, pub.cw_bits, pub.epochs, half_w)
    fd_level = _k.fd_level
    for c in range(len(bounds) - 1):
        lo, hi = int(bounds[c]), int(bounds[c + 1])
        h = int(tasks_i[lo, 2])
        n = fd_level(enc_l, enc_r, buf_a, t_a, buf_a, t_a, lo, hi, -1, h, *common)
        src, dst, t_src, t_dst = buf_a, buf_b, t_a, t_b
        for level in range(h):
            mv_src = mv[id(src)][: 16 * n]
            left(mv_src, mv_l)
            right(mv_src, mv_r)
            n = fd_level(enc_l, enc_r, src, t_src, dst, t_dst, lo, hi, level, h, *common)
            src, dst, t_src, t_dst = dst, src, t_dst, t_src
        value(mv[id(src)][: 16 * n * half_w], mv_l)
        _k.fd_leaves(
            enc_l, src, t_src, lo, hi, tasks_i, pub.cw_leaf, half_w, tau, group, keys.party, flat
        )
    return out, offsets


def evaluate(key: DPFKey) -> NDArray[np.uint64]:
    """Full-domain evaluation of one key share.

    Parameters
    ----------
    key : DPFKey
        One server's share.

    Returns
    -------
    numpy.ndarray
        ``(2**domain_bits, tau)`` uint64 shares of ``f`` on the whole domain.
    """
    values, _ = evaluate_batch(key.as_batch())
    return values


# ------------------------------------------------------------------------------------------------
# Updatable DPF (Cui §5)
# ------------------------------------------------------------------------------------------------


def _check_pair(k0: DPFKeyBatch, k1: DPFKeyBatch) -> None:
    if k0.party != 0 or k1.party != 1:
        raise DPFKeyError("need party 0's and party 1's shares, in that order")
    if k0.public is not k1.public and k0.public.to_bytes() != k1.public.to_bytes():
        raise DPFKeyError("the two shares have different public parts")


def next_hint_batch(
    k0: DPFKeyBatch,
    k1: DPFKeyBatch,
    new_betas: ArrayLike,
    epoch: int,
    *,
    alphas: ArrayLike | None = None,
) -> UpdateHint:
    """Client side of U-DPF: the hint moving ``m`` key pairs to new values at a new epoch.

    The new leaf correction word is ``CW = (-1)^t1 * (beta' - H(s0, e) + H(s1, e))`` with the
    two leaf seeds on the ``alpha`` path and ``H`` the epoch-keyed conversion. The path is found
    from the two shares (control bits differ exactly on it); with odd ``tau`` the point's last
    bit sits in the leaf group and is read from the current ``beta`` unless ``alphas`` is given.

    Parameters
    ----------
    k0, k1 : DPFKeyBatch
        Both parties' current shares (the client keeps them).
    new_betas : array_like
        ``(m,)`` or ``(m, tau)`` new values.
    epoch : int
        The new epoch, larger than every key's current epoch.
    alphas : array_like, optional
        ``(m,)`` points; needed only when ``tau`` is odd, a current ``beta`` is 0 and the new
        one is not (then the point's last bit is not recoverable from the keys).

    Returns
    -------
    UpdateHint
        The public hint for both servers.

    Raises
    ------
    DPFKeyError
        If the shares are not the two halves of the same point functions.
    ValueError
        If the epoch is not fresh, shapes disagree, or ``alphas`` is needed / inconsistent.
    """
    _check_pair(k0, k1)
    pub = k0.public
    m, tau = pub.num_keys, pub.tau
    betas = _betas_matrix(new_betas, m)
    if betas.shape[1] != tau:
        raise ValueError(f"new betas have tau={betas.shape[1]}, keys have tau={tau}")
    e = _check_epoch(epoch)
    if m and e <= int(pub.epochs.max()):
        raise ValueError(f"epoch {e} is not newer than the keys' epochs")
    group = _group(tau)
    half_w = pub.leaf_words // 2
    w = 2 * half_w
    tl = _tree_levels(pub.domain_bits, tau)
    order = np.argsort(-tl, kind="stable").astype(np.int64)
    neg_sorted = -tl[order]
    aes = _mmo_ciphers()
    path_bits = np.zeros(m, dtype=_U64)
    bad = np.zeros(m, dtype=np.uint8)
    h_old = np.empty((m, 2, w), dtype=_U64)
    h_new = np.empty((m, 2, w), dtype=_U64)
    t1 = np.empty(m, dtype=np.uint8)
    new_epochs = np.full(m, e, dtype=_U64)
    chunk = min(_GEN_CHUNK, max(m, 1))
    seeds = np.empty((2 * chunk, 2), dtype=_U64)  # party b's seed of key i at row 2 * i + b
    enc_l = np.empty((2 * chunk + 1, 2), dtype=_U64)
    enc_r = np.empty((2 * chunk + 1, 2), dtype=_U64)
    conv = np.empty((2 * chunk * half_w, 2), dtype=_U64)
    conv_enc = np.empty((2 * chunk * half_w + 1, 2), dtype=_U64)
    words = np.empty((chunk, 2, w), dtype=_U64)
    state_t = np.empty((chunk, 2), dtype=np.uint8)
    for lo in range(0, m, chunk):
        n = min(chunk, m - lo)
        rows = order[lo : lo + n]
        _k.gen_init(order, lo, n, k0.root_seeds, k1.root_seeds, state_t, seeds)
        neg = neg_sorted[lo : lo + n]
        for level in range(int(-neg[0])):
            active = int(np.searchsorted(neg, -level, side="left"))
            aes.left.encrypt_prefix_into(seeds[: 2 * active], enc_l)
            aes.right.encrypt_prefix_into(seeds[: 2 * active], enc_r)
            _k.pair_path_level(
                enc_l,
                enc_r,
                seeds,
                active,
                level,
                order,
                lo,
                pub.level_offsets,
                pub.cw_seeds,
                pub.cw_bits,
                state_t,
                path_bits,
                bad,
            )
        t1[rows] = state_t[:n, 1]
        if np.any(state_t[:n, 0] == state_t[:n, 1]):
            bad[rows[state_t[:n, 0] == state_t[:n, 1]]] = 1
        for ep, dest in ((pub.epochs, h_old), (new_epochs, h_new)):
            _k.leaf_blocks_pair(n, seeds, ep, order, lo, half_w, conv)
            aes.value.encrypt_prefix_into(conv[: 2 * n * half_w], conv_enc)
            _k.leaf_words_pair(conv_enc, conv, n, half_w, words)
            dest[rows] = words[:n]
    if bad.any():
        raise DPFKeyError(f"{int(bad.sum())} key pair(s) do not share one point function")
    sign = np.where(t1 == 1, _U64(0xFFFFFFFFFFFFFFFF), _U64(1)).astype(_U64)[:, None]
    dbits = pub.domain_bits.astype(np.int64)
    gpos = np.zeros(m, dtype=np.int64)
    if group == 2:
        has = dbits >= 1
        if alphas is not None:
            a = _as_index(alphas, "alphas")
            if a.shape != (m,):
                raise ValueError(f"alphas must have shape ({m},), got {a.shape}")
            if np.any(np.where(has, a >> _U64(1), _U64(0)) != path_bits) or np.any(
                (~has) & (a != 0)
            ):
                raise ValueError("alphas do not match the keys' points")
            gpos = np.where(has, a & _U64(1), _U64(0)).astype(np.int64)
        else:
            u_old = sign * pub.cw_leaf + h_old[:, 0] - h_old[:, 1]
            nz = np.stack([u_old[:, :tau].any(axis=1), u_old[:, tau:].any(axis=1)], axis=1)
            if np.any(nz.all(axis=1)):
                raise DPFKeyError("a key pair encodes a non-zero value at two points")
            unknown = has & ~nz.any(axis=1) & betas.any(axis=1)
            if unknown.any():
                raise ValueError(
                    f"{int(unknown.sum())} key(s) hold beta = 0, so the point's last bit is not "
                    "in the keys: pass alphas"
                )
            gpos = np.where(nz[:, 1], 1, 0).astype(np.int64)
    u = np.zeros((m, w), dtype=_U64)
    cols = gpos[:, None] * tau + np.arange(tau)[None, :]
    np.put_along_axis(u, cols, betas, axis=1)
    cw = sign * (u - h_new[:, 0] + h_new[:, 1])
    return UpdateHint(epoch=e, tau=tau, cw_leaf=np.ascontiguousarray(cw, dtype=_U64))


def next_hint(
    k0: DPFKey,
    k1: DPFKey,
    new_beta: int | ArrayLike,
    epoch: int,
    *,
    alpha: int | None = None,
) -> UpdateHint:
    """Client side of U-DPF for one key pair (see :func:`next_hint_batch`).

    Parameters
    ----------
    k0, k1 : DPFKey
        Both parties' current shares.
    new_beta : int or array_like
        New value (``tau`` words).
    epoch : int
        The new epoch, larger than the keys' epoch.
    alpha : int, optional
        The point; needed only in the case described in :func:`next_hint_batch`.

    Returns
    -------
    UpdateHint
        The public hint for both servers.

    Raises
    ------
    DPFKeyError
        If the shares are not the two halves of one point function.
    ValueError
        If the epoch is not fresh or ``new_beta`` has the wrong size.
    """
    b = _as_u64(new_beta, "new_beta").reshape(1, -1)
    alphas = None if alpha is None else [alpha]
    return next_hint_batch(k0.as_batch(), k1.as_batch(), b, epoch, alphas=alphas)


def update_batch(keys: DPFKeyBatch, hint: UpdateHint, epoch: int) -> DPFKeyBatch:
    """Server side of U-DPF: replace the leaf correction words of a batch with a hint's.

    Parameters
    ----------
    keys : DPFKeyBatch
        One server's shares (any party).
    hint : UpdateHint
        The hint for ``epoch``.
    epoch : int
        The epoch the server expects (binds the hint to the round).

    Returns
    -------
    DPFKeyBatch
        New shares for ``epoch``; the old ones stay valid for their own epoch.

    Raises
    ------
    DPFKeyError
        If the hint is for another epoch, another ``tau`` or number of keys, or not newer than
        the keys.
    """
    if not isinstance(hint, UpdateHint):
        raise DPFKeyError("hint must be an UpdateHint")
    pub = keys.public
    if hint.epoch != epoch:
        raise DPFKeyError(f"hint is for epoch {hint.epoch}, expected {epoch}")
    if hint.tau != pub.tau or hint.cw_leaf.shape[0] != pub.num_keys:
        raise DPFKeyError(
            f"hint is for {hint.cw_leaf.shape[0]} keys with tau={hint.tau}, "
            f"keys are {pub.num_keys} with tau={pub.tau}"
        )
    if pub.num_keys and hint.epoch <= int(pub.epochs.max()):
        raise DPFKeyError(f"stale hint: epoch {hint.epoch} is not newer than the keys' epochs")
    new_pub = DPFPublicBatch(
        tau=pub.tau,
        domain_bits=pub.domain_bits,
        epochs=np.full(pub.num_keys, hint.epoch, dtype=_U64),
        cw_seeds=pub.cw_seeds,
        cw_bits=pub.cw_bits,
        cw_leaf=hint.cw_leaf.copy(),
    )
    return DPFKeyBatch(party=keys.party, root_seeds=keys.root_seeds, public=new_pub)


def update(key: DPFKey, hint: UpdateHint, epoch: int) -> DPFKey:
    """Server side of U-DPF for one key (see :func:`update_batch`).

    Parameters
    ----------
    key : DPFKey
        One server's share.
    hint : UpdateHint
        The hint for ``epoch`` (one key).
    epoch : int
        The epoch the server expects.

    Returns
    -------
    DPFKey
        The updated share.

    Raises
    ------
    DPFKeyError
        As :func:`update_batch`.
    """
    return update_batch(key.as_batch(), hint, epoch).key(0)
