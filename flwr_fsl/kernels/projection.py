"""Random {-1, 0, +1} projections in Z_2^64, read straight from an AES-CTR keystream.

:func:`flwr_fsl.families.ssa.projected_check.project` draws the projection matrix ``Z``
(``r`` rows, one column per value word) from an AES-CTR stream: column ``n``, row ``k`` is
``b0 - b1`` with ``b0, b1`` the stream's bits ``2 r n + 2 k`` and ``2 r n + 2 k + 1`` (bit ``i``
of the stream is bit ``i mod 64`` of little-endian word ``i // 64``), and returns ``Z a``
modulo ``2**64``. It unpacks every bit to an int64 and multiplies an int64 matrix (no BLAS for
integers): at ``m = 2**20``, ``k/m = 10%`` about 90 ms of one server's time per client.

:func:`project_range` computes the same sums for any range of columns ``[lo, hi)``: it positions
the stream at the 16-byte block holding bit ``2 r lo`` (CTR's counter is the block index:
the stream's initial counter block is zero) and adds each word under the mask of its two bits
in one numba loop (``nogil``; with ``r`` a multiple of 32, the default 64, a vectorized loop
over whole words: about 4 ms instead of 90 at the size above), so disjoint column ranges run
on several threads and their partial sums add up to ``Z a`` (addition modulo ``2**64`` is
associative and commutative): the same words, bit for bit
(``tests/families/ssa/test_server_check.py``).
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numba import njit
from numpy.typing import NDArray

__all__ = ["keystream_words", "project_range", "project_words", "project_words_aligned"]

_BLOCK_BITS = 128


@njit(cache=True, nogil=True)
def project_words(
    stream: NDArray[np.uint64], first_bit: int, words: NDArray[np.int64], y: NDArray[np.int64]
) -> None:  # pragma: no cover - numba
    """``y[k] += sum_n (b0 - b1) words[n]`` (wrapping), ``b0, b1`` column ``n``'s bits of row ``k``.

    Column ``n``'s row ``k`` reads bits ``first_bit + 2 r n + 2 k`` and the next one of
    ``stream`` (``r = y.shape[0]``); ``first_bit`` is even, so a pair never straddles two words.
    """
    r = y.shape[0]
    bit = first_bit
    for n in range(words.shape[0]):
        v = words[n]
        for k in range(r):
            i = bit + 2 * k
            w = stream[i >> 6]
            s = i & 63
            b0 = np.int64((w >> np.uint64(s)) & np.uint64(1))
            b1 = np.int64((w >> np.uint64(s + 1)) & np.uint64(1))
            y[k] += (v & -b0) - (v & -b1)
        bit += 2 * r


@njit(cache=True, nogil=True)
def project_words_aligned(
    stream: NDArray[np.uint64], first_word: int, words: NDArray[np.int64], y: NDArray[np.int64]
) -> None:  # pragma: no cover - numba
    """:func:`project_words` for ``r`` a multiple of 32 and a column starting a word.

    Each column is ``r / 32`` whole words, 32 rows each: the inner loop has a fixed trip count
    and fixed shifts, which LLVM vectorizes (about 10x the general loop).
    """
    r = y.shape[0]
    per = r // 32
    acc = np.zeros(r, np.int64)
    wi = first_word
    for n in range(words.shape[0]):
        v = words[n]
        for q in range(per):
            w = stream[wi + q]
            base = 32 * q
            for kk in range(32):
                b0 = np.int64((w >> np.uint64(2 * kk)) & np.uint64(1))
                b1 = np.int64((w >> np.uint64(2 * kk + 1)) & np.uint64(1))
                acc[base + kk] += (v & -b0) - (v & -b1)
        wi += per
    for k in range(r):
        y[k] += acc[k]


def keystream_words(seed: bytes, first_block: int, blocks: int) -> NDArray[np.uint64]:
    """Return ``blocks`` 16-byte blocks of the AES-128-CTR stream of ``seed`` from ``first_block``.

    The stream is :class:`~flwr_fsl.crypto.prg.PRGStream`'s (initial counter block zero, the
    128-bit counter big-endian), as little-endian uint64 words.
    """
    iv = int(first_block).to_bytes(16, "big")
    enc = Cipher(algorithms.AES(seed), modes.CTR(iv)).encryptor()
    data = enc.update(bytes(16 * blocks))
    return np.frombuffer(data, "<u8").astype(np.uint64, copy=False)


def project_range(
    seed: bytes, r: int, words: NDArray[np.uint64], lo: int, hi: int
) -> NDArray[np.uint64]:
    """Return columns ``[lo, hi)``'s part of ``Z words`` (``(r,)`` uint64, mod ``2**64``).

    ``words`` is the whole flat uint64 vector (its words ``lo..hi-1`` are read); ``Z`` is the
    projection matrix of ``seed`` (module docstring). The parts of disjoint ranges covering
    ``[0, len(words))`` sum to :func:`~flwr_fsl.families.ssa.projected_check.project`'s result.
    """
    y = np.zeros(r, np.int64)
    if hi <= lo:
        return y.view(np.uint64)
    start, stop = 2 * r * lo, 2 * r * hi
    first = start // _BLOCK_BITS
    last = -(-stop // _BLOCK_BITS)
    stream = keystream_words(seed, first, last - first)
    a = np.ascontiguousarray(words[lo:hi]).view(np.int64)
    if r % 32 == 0:  # every column starts a word (2 r lo is a multiple of 64)
        project_words_aligned(stream, (start - first * _BLOCK_BITS) // 64, a, y)
    else:
        project_words(stream, start - first * _BLOCK_BITS, a, y)
    return y.view(np.uint64)
