"""Pseudorandom generator, PRF and stream: everything built from AES-128 in ``cryptography``.

* **MMO PRG/hash.** Fixed-key AES in Matyas–Meyer–Oseas mode, ``MMO_K(x) = AES_K(x) ^ x``, with
  public keys. The DPF tree expands a node's block ``x`` with two fixed keys, as
  google/distributed_point_functions does: ``left = AES_{K_L}(x) ^ x`` and
  ``right = AES_{K_R}(x) ^ x`` (:data:`MMO_KEY_LEFT`, :data:`MMO_KEY_RIGHT`), so a tree level's
  AES input is just its blocks, encrypted once per key. A leaf seed converts to output words
  through the third key :data:`MMO_KEY` with a small public tweak ``j = (2 + i, epoch)`` XORed
  into the block: ``H_j(s) = AES_K(s ^ j) ^ s ^ j`` (the low 64-bit word carries a counter,
  the high word the U-DPF epoch). Seeds are 128-bit blocks whose lowest bit is reserved for the
  control bit, so a seed carries 127 random bits. Unlike google/distributed_point_functions,
  which clears the bit before expanding, the tree PRG's input is the whole block *with* the
  node's control bit in bit 0 (``x = s | t``; children ``AES_{K_c}(x) ^ x``, whose bit 0 is the
  child's control bit): a corrected child block is the next level's AES input as it stands,
  with no separate control-bit arrays. The leaf conversion hashes the seed with bit 0 clear.
  Whole tree levels go through batched AES calls
  (:class:`~flwr_fsl.kernels.aes.BatchedAES`, one per key and level); the numba kernels in
  :mod:`flwr_fsl.kernels.dpf_kernels` do the feed-forward XOR fused with the tree logic, and
  :func:`mmo_hash` / :func:`mmo_prg` here are the plain references used by tests and small
  callers.
* **PRF.** ``PRF(key, i) = AES_key(i || tag)``: a client's λ-bit master seed is the AES key, the
  counter ``i`` (a bin index) is the low word and a domain tag the high word (Cui §4: per-bin DPF
  root seeds from one master seed). AES is a PRP, hence a PRF for far fewer than 2^64 queries.
* **CTR stream.** AES-128-CTR keystream as uint64 words, for masks and seeded randomness:
  :func:`ctr_stream` for one draw, :func:`ctr_words` for the words at given positions (random
  access, e.g. the coordinates of a subset mask), :class:`PRGStream` to read one keystream in
  successive draws (ring/field sampling, seeded shares and Beaver triples).
  :meth:`PRGStream.from_seed` keys a stream with ``PRF(seed, index || tag)``, so one shared
  seed yields independent streams for independent uses (never two uses under one
  ``(tag, index)``).

Seeds and blocks are numpy ``uint64`` arrays of shape ``(n, 2)``: word 0 holds bytes 0..7 of the
block (little-endian), word 1 bytes 8..15.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.kernels.aes import BLOCK_BYTES, BatchedAES

__all__ = [
    "MMO_KEY",
    "MMO_KEY_LEFT",
    "MMO_KEY_PROOF",
    "MMO_KEY_RIGHT",
    "SEED_BYTES",
    "TAG_ROOT_SEED",
    "TAG_STREAM",
    "MMOCiphers",
    "PRGStream",
    "ctr_stream",
    "ctr_words",
    "derive_root_seeds",
    "mmo_hash",
    "mmo_prg",
    "prf_blocks",
    "random_seeds",
]

SEED_BYTES = 16
"""Bytes in a seed / master seed / PRF key (λ = 128)."""

MMO_KEY = bytes.fromhex("666c77725f66736c2f6d6d6f2f763100")  # b"flwr_fsl/mmo/v1\0"
"""Public fixed AES key of the MMO hash and of the DPF leaf conversion (any fixed key works)."""

MMO_KEY_LEFT = b"flwr_fsl/mmo/v2L"
"""Public fixed AES key of the DPF tree's left child: ``left = AES_{K_L}(x) ^ x``."""

MMO_KEY_RIGHT = b"flwr_fsl/mmo/v2R"
"""Public fixed AES key of the DPF tree's right child: ``right = AES_{K_R}(x) ^ x``."""

MMO_KEY_PROOF = b"flwr_fsl/vdpf/v1"
"""Public fixed AES key of the verifiable DPF's leaf proof hash (:mod:`flwr_fsl.crypto.vdpf`)."""

TAG_ROOT_SEED = 0x746F6F722D667064  # b"dpf-root" little-endian
"""High-word domain tag of the PRF when it derives DPF root seeds from a master seed."""

TAG_STREAM = 0x6D61657274732D67  # b"g-stream" little-endian
"""Default high-word domain tag of the PRF when it derives a :class:`PRGStream` key."""

_U64 = np.uint64


class MMOCiphers(NamedTuple):
    """The process-wide fixed-key AES objects of the MMO constructions."""

    left: BatchedAES
    """Under :data:`MMO_KEY_LEFT`: left children of the DPF tree."""
    right: BatchedAES
    """Under :data:`MMO_KEY_RIGHT`: right children of the DPF tree."""
    value: BatchedAES
    """Under :data:`MMO_KEY`: :func:`mmo_hash` and the DPF leaf conversion."""
    proof: BatchedAES
    """Under :data:`MMO_KEY_PROOF`: the verifiable DPF's per-leaf proof hash."""


# One set per thread: a ``cryptography`` cipher context (and BatchedAES's scratch buffer) must not
# be used by two threads at once ("Already borrowed"), and S1 evaluates the keys of concurrent
# sessions in different gRPC worker threads.
_MMO = threading.local()


def _mmo_ciphers() -> MMOCiphers:
    """Return this thread's fixed-key AES objects (left, right, value, proof) of the MMO PRG."""
    ciphers: MMOCiphers | None = getattr(_MMO, "ciphers", None)
    if ciphers is None:
        ciphers = MMOCiphers(
            BatchedAES(MMO_KEY_LEFT),
            BatchedAES(MMO_KEY_RIGHT),
            BatchedAES(MMO_KEY),
            BatchedAES(MMO_KEY_PROOF),
        )
        _MMO.ciphers = ciphers
    return ciphers


def _check_blocks(blocks: NDArray[np.uint64], name: str) -> NDArray[np.uint64]:
    arr = np.asarray(blocks)
    if arr.dtype != np.uint64 or arr.ndim != 2 or arr.shape[1] != 2:
        raise ConfigurationError(
            f"{name} must be a uint64 array of shape (n, 2), got {arr.dtype} {arr.shape}"
        )
    return np.ascontiguousarray(arr)


def _check_key(key: bytes, name: str) -> bytes:
    if not isinstance(key, bytes | bytearray) or len(key) != SEED_BYTES:
        got = len(key) if isinstance(key, bytes | bytearray) else type(key).__name__
        raise ConfigurationError(f"{name} must be {SEED_BYTES} bytes, got {got!r}")
    return bytes(key)


def mmo_hash(
    blocks: NDArray[np.uint64], tweaks: NDArray[np.uint64] | None = None
) -> NDArray[np.uint64]:
    """Matyas–Meyer–Oseas hash ``AES_K(x) ^ x`` of ``x = blocks ^ tweaks`` under :data:`MMO_KEY`.

    Parameters
    ----------
    blocks : numpy.ndarray
        ``uint64`` array of shape ``(n, 2)``.
    tweaks : numpy.ndarray, optional
        ``uint64`` array broadcastable to ``(n, 2)`` XORed into the blocks first (default: none).

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of shape ``(n, 2)``.

    Raises
    ------
    ValueError
        If ``blocks`` is not a ``(n, 2)`` uint64 array.
    """
    x = _check_blocks(blocks, "blocks")
    if tweaks is not None:
        x = np.ascontiguousarray(x ^ np.asarray(tweaks, dtype=_U64))
    out = np.empty_like(x)
    _mmo_ciphers().value.encrypt_into(x, out)
    out ^= x
    return out


def mmo_prg(
    seeds: NDArray[np.uint64],
) -> tuple[NDArray[np.uint64], NDArray[np.uint8], NDArray[np.uint64], NDArray[np.uint8]]:
    """Expand seed blocks into left/right child seeds and control bits (reference, not hot).

    The input block is the whole 128-bit seed block ``x = s | t`` *including* the node's
    control bit ``t`` in bit 0 (the DPF keeps the bit inside the block, so a tree level's AES
    input is its blocks as they stand). ``G(x) = (AES_{K_L}(x) ^ x, AES_{K_R}(x) ^ x)``; each
    child block's lowest bit is the child's control bit and is cleared from the child seed.

    Parameters
    ----------
    seeds : numpy.ndarray
        ``uint64`` array of shape ``(n, 2)``: seed blocks, control bit in bit 0.

    Returns
    -------
    tuple of numpy.ndarray
        ``(left_seeds, left_bits, right_seeds, right_bits)``; seeds ``(n, 2)`` uint64 with bit 0
        cleared, bits ``(n,)`` uint8.

    Raises
    ------
    ValueError
        If ``seeds`` is not a ``(n, 2)`` uint64 array.
    """
    s = _check_blocks(seeds, "seeds")
    ciphers = _mmo_ciphers()
    children = []
    for aes in (ciphers.left, ciphers.right):
        h = np.empty_like(s)
        aes.encrypt_into(s, h)
        h ^= s
        bits = (h[:, 0] & _U64(1)).astype(np.uint8)
        h[:, 0] &= ~_U64(1)
        children.append((h, bits))
    return children[0][0], children[0][1], children[1][0], children[1][1]


def prf_blocks(key: bytes, counters: NDArray[np.uint64], tag: int) -> NDArray[np.uint64]:
    """Keyed PRF ``AES_key(counter || tag)`` for many counters in one AES call.

    Parameters
    ----------
    key : bytes
        16-byte PRF key (e.g. a client's master seed).
    counters : numpy.ndarray
        1-D array of non-negative integers (the low 64-bit word of each input block).
    tag : int
        Domain tag in ``[0, 2**64)`` (the high word), separating uses of the same key.

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of shape ``(len(counters), 2)``.

    Raises
    ------
    ConfigurationError
        If the key is not 16 bytes, counters are not 1-D non-negative integers, or the tag is
        out of range.
    """
    k = _check_key(key, "PRF key")
    c = np.asarray(counters)
    if c.ndim != 1 or not np.issubdtype(c.dtype, np.integer):
        raise ConfigurationError(f"counters must be a 1-D integer array, got {c.dtype} {c.shape}")
    if c.size and np.issubdtype(c.dtype, np.signedinteger) and int(c.min()) < 0:
        raise ConfigurationError("counters must be non-negative")
    if not 0 <= int(tag) < 1 << 64:
        raise ConfigurationError(f"tag must be in [0, 2**64), got {tag}")
    blocks = np.empty((c.size, 2), dtype=_U64)
    blocks[:, 0] = c
    blocks[:, 1] = _U64(tag)
    out = np.empty((c.size + 1, 2), dtype=_U64)  # one spare block: AES writes in place
    BatchedAES(k).encrypt_prefix_into(blocks, out)
    return out[: c.size]


def derive_root_seeds(master_seed: bytes, count: int) -> NDArray[np.uint64]:
    """Per-bin DPF root seeds ``PRF(master_seed, i)`` for ``i < count``, control bit cleared.

    Parameters
    ----------
    master_seed : bytes
        A server's 16-byte master seed from the client (Cui §4).
    count : int
        Number of root seeds (bins).

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of shape ``(count, 2)`` whose lowest bit is 0.

    Raises
    ------
    ConfigurationError
        If the master seed is not 16 bytes or ``count`` is negative.
    """
    if not isinstance(count, int | np.integer) or count < 0:
        raise ConfigurationError(f"count must be a non-negative integer, got {count!r}")
    seeds = prf_blocks(
        _check_key(master_seed, "master seed"), np.arange(int(count), dtype=_U64), TAG_ROOT_SEED
    )
    seeds[:, 0] &= ~_U64(1)
    return seeds


def random_seeds(count: int) -> NDArray[np.uint64]:
    """Return ``count`` fresh random seeds from the OS CSPRNG, control bit cleared.

    Parameters
    ----------
    count : int
        Number of seeds.

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of shape ``(count, 2)`` whose lowest bit is 0.

    Raises
    ------
    ConfigurationError
        If ``count`` is negative.
    """
    if not isinstance(count, int | np.integer) or count < 0:
        raise ConfigurationError(f"count must be a non-negative integer, got {count!r}")
    seeds = np.frombuffer(os.urandom(SEED_BYTES * count), dtype=_U64).reshape(count, 2).copy()
    seeds[:, 0] &= ~_U64(1)
    return seeds


def ctr_stream(key: bytes, nonce: bytes, n_words: int) -> NDArray[np.uint64]:
    """AES-128-CTR keystream as ``n_words`` uint64 words (masks, seeded randomness).

    Parameters
    ----------
    key : bytes
        16-byte AES key.
    nonce : bytes
        16-byte initial counter block; never reuse a (key, nonce) pair for two masks.
    n_words : int
        Number of 64-bit words to produce.

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of shape ``(n_words,)``.

    Raises
    ------
    ConfigurationError
        If the key or nonce is not 16 bytes or ``n_words`` is negative.
    """
    k = _check_key(key, "CTR key")
    iv = _check_key(nonce, "CTR nonce")
    if not isinstance(n_words, int | np.integer) or n_words < 0:
        raise ConfigurationError(f"n_words must be a non-negative integer, got {n_words!r}")
    nbytes = 8 * int(n_words)
    out = np.empty(nbytes + BLOCK_BYTES, dtype=np.uint8)
    if nbytes:
        enc = Cipher(algorithms.AES(k), modes.CTR(iv)).encryptor()
        enc.update_into(np.zeros(nbytes, dtype=np.uint8).data, out.data)
    return out[:nbytes].view(_U64)


def ctr_words(key: bytes, positions: ArrayLike) -> NDArray[np.uint64]:
    """Words at ``positions`` of the AES-128-CTR keystream under ``key`` and the zero nonce.

    Random access into :func:`ctr_stream`: ``ctr_words(key, p)`` equals
    ``ctr_stream(key, bytes(16), n)[p]`` for any ``n > max(p)``, without the words in between.
    Word ``p`` is the ``p % 2``-th little-endian half of keystream block ``p // 2``, which is
    ``AES_key(c)`` of the 128-bit big-endian counter block ``c = p // 2``; every block needed is
    encrypted once, all in one batched AES call.

    Parameters
    ----------
    key : bytes
        16-byte AES key.
    positions : array_like
        1-D non-negative integer word positions, in any order (repeats allowed).

    Returns
    -------
    numpy.ndarray
        ``uint64`` array of shape ``(len(positions),)``.

    Raises
    ------
    ConfigurationError
        If the key is not 16 bytes, or ``positions`` is not a 1-D array of non-negative
        integers.
    """
    k = _check_key(key, "CTR key")
    pos = np.asarray(positions)
    if pos.ndim != 1 or not (pos.size == 0 or np.issubdtype(pos.dtype, np.integer)):
        raise ConfigurationError(
            f"positions must be a 1-D integer array, got {pos.dtype} {pos.shape}"
        )
    if pos.size == 0:
        return np.zeros(0, dtype=_U64)
    if np.issubdtype(pos.dtype, np.signedinteger) and int(pos.min()) < 0:
        raise ConfigurationError("positions must be non-negative")
    words = pos.astype(_U64)
    blocks = np.unique(words >> _U64(1))
    counters = np.zeros((blocks.size, 2), dtype=">u8")  # bytes 8..15: the big-endian counter
    counters[:, 1] = blocks
    stream = np.empty((blocks.size, 2), dtype="<u8")
    BatchedAES(k).encrypt_into(counters, stream)
    halves = (words & _U64(1)).astype(np.intp)
    return stream[np.searchsorted(blocks, words >> _U64(1)), halves].astype(_U64, copy=False)


class PRGStream:
    """One AES-128-CTR keystream read in successive draws of uint64 words.

    ``PRGStream(key, nonce)`` followed by ``words(a)`` then ``words(b)`` returns exactly the
    words of ``ctr_stream(key, nonce, a + b)``: the stream keeps its position between draws, so
    two parties holding the same key derive the same values when they make the same draws in
    the same order. The nonce is the initial 128-bit counter block; two streams under one key
    with nearby nonces overlap, so separate uses by *key* (:meth:`from_seed`), not by nonce.

    Parameters
    ----------
    key : bytes
        16-byte AES key (a seed).
    nonce : bytes, optional
        16-byte initial counter block (default all zero).

    Raises
    ------
    ConfigurationError
        If the key or nonce is not 16 bytes.
    """

    __slots__ = ("_encryptor", "_words_read")

    def __init__(self, key: bytes, nonce: bytes = bytes(SEED_BYTES)) -> None:
        k = _check_key(key, "PRG key")
        iv = _check_key(nonce, "PRG nonce")
        self._encryptor = Cipher(algorithms.AES(k), modes.CTR(iv)).encryptor()
        self._words_read = 0

    @classmethod
    def from_seed(cls, seed: bytes, index: int = 0, tag: int = TAG_STREAM) -> PRGStream:
        """Return the stream keyed by ``PRF(seed, index || tag)`` (independent per index, tag).

        Parameters
        ----------
        seed : bytes
            16-byte shared seed.
        index : int, optional
            Counter in ``[0, 2**64)`` separating uses under one tag (e.g. a triple label).
        tag : int, optional
            Domain tag in ``[0, 2**64)`` separating kinds of use (default :data:`TAG_STREAM`).

        Returns
        -------
        PRGStream
            A stream at position 0.

        Raises
        ------
        ConfigurationError
            If the seed is not 16 bytes or ``index`` / ``tag`` is out of range.
        """
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise ConfigurationError(f"index must be an integer, got {index!r}")
        if not 0 <= int(index) < 1 << 64:
            raise ConfigurationError(f"index must be in [0, 2**64), got {index}")
        block = prf_blocks(_check_key(seed, "seed"), np.array([int(index)], dtype=_U64), tag)
        return cls(block.astype("<u8").tobytes())

    @classmethod
    def fresh(cls) -> PRGStream:
        """Return a stream under a fresh key from the OS CSPRNG."""
        return cls(os.urandom(SEED_BYTES))

    @property
    def words_read(self) -> int:
        """Number of uint64 words drawn so far (the stream position)."""
        return self._words_read

    def words(self, n_words: int) -> NDArray[np.uint64]:
        """Draw the next ``n_words`` keystream words.

        Parameters
        ----------
        n_words : int
            Number of 64-bit words (>= 0).

        Returns
        -------
        numpy.ndarray
            ``uint64`` array of shape ``(n_words,)``.

        Raises
        ------
        ConfigurationError
            If ``n_words`` is negative or not an integer.
        """
        if isinstance(n_words, bool) or not isinstance(n_words, int | np.integer) or n_words < 0:
            raise ConfigurationError(f"n_words must be a non-negative integer, got {n_words!r}")
        n = int(n_words)
        raw = self._encryptor.update(bytes(8 * n))
        self._words_read += n
        return np.frombuffer(raw, dtype=_U64).copy()
