"""The masks of a SecAgg round: ``PRG(s_uv)`` of a pair and ``PRG(b_u)`` of a client.

Both are AES-128-CTR streams with the zero nonce (:func:`flwr_fsl.crypto.prg.ctr_stream`, or
:func:`~flwr_fsl.crypto.prg.ctr_words` at given positions). The pair key is HKDF-SHA256 of
``X25519(s_u, s_v)`` with the round's parameter digest as salt and the pair and session in
its info (:func:`flwr_fsl.crypto.channel.agree_key`): bound to the run, the round and the
vector, so a masked input of another round never cancels. ``b_u`` is fresh every round.
Re-exported by :mod:`flwr_fsl.families.secagg.protocol`. Also here: the secrets behind the
masks (``b_u`` and the mask key) as Shamir field elements, 3 bytes a limb (``2^24 < p``), and
the round's Shamir scheme (cached per ``t`` and roster size).

:func:`add_streams` adds (or subtracts) many such full-length streams to one vector in place,
chunk by chunk (32 Ki words), so each keystream chunk is added while it is still in cache and
no vector-sized mask is ever allocated: the same words as summing :func:`pair_mask` /
:func:`self_mask` outputs, at about half the memory traffic (issue 26: a client's masking at
``L = 1M``, and the server's unmasking).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numpy.typing import NDArray

from flwr_fsl.core.errors import RoundFailedError
from flwr_fsl.crypto.channel import SealedBoxError, agree_key
from flwr_fsl.crypto.prg import ctr_stream, ctr_words
from flwr_fsl.crypto.sharing import Shamir
from flwr_fsl.families.secagg.messages import _LIMB, FIELD, SecAggError, SecAggParams

_U64 = np.uint64

__all__ = ["add_streams", "pair_key", "pair_mask", "self_mask"]

_MASK_INFO = b"flwr_fsl/secagg/pair-mask/v1\x00"
_CHUNK_WORDS = 1 << 15
_ZEROS = np.zeros(8 * _CHUNK_WORDS, dtype=np.uint8)
_ZEROS.flags.writeable = False


def _words_at(key: bytes, positions: NDArray[np.int64] | None, length: int) -> NDArray[np.uint64]:
    """Return AES-128-CTR stream words (zero nonce): all ``length``, or those at ``positions``."""
    return ctr_stream(key, bytes(16), length) if positions is None else ctr_words(key, positions)


def pair_key(
    params: SecAggParams, private: X25519PrivateKey, peer_public: bytes, low: int, high: int
) -> bytes:
    """``s_uv``: the AES key of the pair ``{low, high}``'s mask (both ends agree on it).

    Raises
    ------
    SecAggError
        If the peer key is not a usable X25519 public key (a low-order point).
    """
    info = _MASK_INFO + struct.pack("<QQ", low, high) + params.session
    try:
        return agree_key(private, peer_public, salt=params.digest, info=info)
    except SealedBoxError as err:
        raise SecAggError(f"a mask key agreement failed: {err}") from err


def pair_mask(
    params: SecAggParams,
    private: X25519PrivateKey,
    peer_public: bytes,
    low: int,
    high: int,
    positions: NDArray[np.int64] | None = None,
) -> NDArray[np.uint64]:
    """``PRG(s_uv)`` for the pair ``{low, high}`` (both ends, and the server, agree on it).

    With ``positions``, only the words at those positions of the same stream.

    Raises
    ------
    SecAggError
        If the peer key is not a usable X25519 public key (a low-order point).
    """
    key = pair_key(params, private, peer_public, low, high)
    return _words_at(key, positions, params.vector_length)


def add_streams(target: NDArray[np.uint64], streams: Sequence[tuple[bytes, bool]]) -> None:
    """Add ``sum ±PRG(key)`` to ``target`` in place, in ``Z_2^64`` (module docstring).

    Parameters
    ----------
    target : numpy.ndarray
        A contiguous uint64 vector of ``vector_length`` words (changed in place).
    streams : sequence of (bytes, bool)
        ``(key, subtract)``: each AES-128-CTR stream (16-byte key, zero nonce, words from 0)
        is added, or subtracted when ``subtract``.

    Raises
    ------
    SecAggError
        If ``target`` is not a contiguous uint64 vector or a key is not 16 bytes.
    """
    if target.dtype != np.uint64 or target.ndim != 1 or not target.flags.c_contiguous:
        raise SecAggError("masks are added to a contiguous uint64 vector")
    if any(not isinstance(key, bytes) or len(key) != 16 for key, _ in streams):
        raise SecAggError("a mask key must be 16 bytes")
    ciphers = [
        (Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor(), subtract)
        for key, subtract in streams
    ]
    buf = np.empty(8 * _CHUNK_WORDS + 16, dtype=np.uint8)
    for start in range(0, target.size, _CHUNK_WORDS):
        part = target[start : start + _CHUNK_WORDS]
        nbytes = 8 * part.size
        words = buf[:nbytes].view(np.uint64)
        for cipher, subtract in ciphers:
            cipher.update_into(_ZEROS[:nbytes].data, buf.data)
            if subtract:
                part -= words
            else:
                part += words


def self_mask(
    params: SecAggParams, seed: bytes, positions: NDArray[np.int64] | None = None
) -> NDArray[np.uint64]:
    """Return ``PRG(b_u)``, the self mask of seed ``b_u`` (or its words at ``positions``)."""
    # b_u keys the CTR stream as is, not through PRGStream.from_seed's PRF(seed, index || tag):
    # that would change every masked input (frozen vectors masked-input*, v1 format).
    return _words_at(seed, positions, params.vector_length)


def _limbs(secret: bytes, count: int) -> NDArray[np.uint64]:
    padded = secret + bytes(count * _LIMB - len(secret))
    raw = np.frombuffer(padded, dtype=np.uint8).reshape(count, _LIMB).astype(_U64)
    return raw[:, 0] | (raw[:, 1] << _U64(8)) | (raw[:, 2] << _U64(16))


def _unlimbs(values: NDArray[np.uint64], length: int) -> bytes:
    if np.any(values >= 1 << (8 * _LIMB)):
        raise RoundFailedError("a reconstructed secret is out of range: the shares are wrong")
    v = values.astype(_U64)
    raw = np.stack([(v >> _U64(8 * k)) & _U64(0xFF) for k in range(_LIMB)], axis=1)
    return raw.astype(np.uint8).tobytes()[:length]


@lru_cache(maxsize=16)
def _shamir_of(threshold: int, roster_size: int) -> Shamir:
    # Shamir's ``threshold`` is the polynomial degree: t shares reconstruct.
    return Shamir.for_parties(FIELD, threshold - 1, roster_size)


def _shamir(params: SecAggParams, roster_size: int) -> Shamir:
    return _shamir_of(params.threshold, roster_size)
