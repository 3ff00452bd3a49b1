"""The masks of a SecAgg round: ``PRG(s_uv)`` of a pair and ``PRG(b_u)`` of a client.

Both are AES-128-CTR streams with the zero nonce (:func:`flwr_fsl.crypto.prg.ctr_stream`, or
:func:`~flwr_fsl.crypto.prg.ctr_words` at given positions). The pair key is HKDF-SHA256 of
``X25519(s_u, s_v)`` with the round's parameter digest as salt and the pair and session in
its info (:func:`flwr_fsl.crypto.channel.agree_key`): bound to the run, the round and the
vector, so a masked input of another round never cancels. ``b_u`` is fresh every round.
Re-exported by :mod:`flwr_fsl.families.secagg.protocol`.
"""

from __future__ import annotations

import struct

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from numpy.typing import NDArray

from flwr_fsl.crypto.channel import SealedBoxError, agree_key
from flwr_fsl.crypto.prg import ctr_stream, ctr_words
from flwr_fsl.families.secagg.messages import SecAggError, SecAggParams

__all__ = ["pair_mask", "self_mask"]

_MASK_INFO = b"flwr_fsl/secagg/pair-mask/v1\x00"


def _words_at(key: bytes, positions: NDArray[np.int64] | None, length: int) -> NDArray[np.uint64]:
    """Return AES-128-CTR stream words (zero nonce): all ``length``, or those at ``positions``."""
    return ctr_stream(key, bytes(16), length) if positions is None else ctr_words(key, positions)


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
    info = _MASK_INFO + struct.pack("<QQ", low, high) + params.session
    try:
        key = agree_key(private, peer_public, salt=params.digest, info=info)
    except SealedBoxError as err:
        raise SecAggError(f"a mask key agreement failed: {err}") from err
    return _words_at(key, positions, params.vector_length)


def self_mask(
    params: SecAggParams, seed: bytes, positions: NDArray[np.int64] | None = None
) -> NDArray[np.uint64]:
    """Return ``PRG(b_u)``, the self mask of seed ``b_u`` (or its words at ``positions``)."""
    # b_u keys the CTR stream as is, not through PRGStream.from_seed's PRF(seed, index || tag):
    # that would change every masked input (frozen vectors masked-input*, v1 format).
    return _words_at(seed, positions, params.vector_length)
