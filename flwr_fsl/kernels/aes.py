"""Batched AES-128 through ``cryptography``: the one block-cipher entry point of the project.

One ``update_into`` call encrypts a whole batch of 16-byte blocks (a DPF tree level, a hashing
batch, a mask stream) into a preallocated buffer; per-block calls are about 20x slower.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numpy.typing import NDArray

BLOCK_BYTES = 16


class BatchedAES:
    """AES-128 in ECB mode under one fixed key, applied to many blocks per call.

    Parameters
    ----------
    key : bytes
        The 16-byte AES key.

    Raises
    ------
    ValueError
        If ``key`` is not 16 bytes long.
    """

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) != BLOCK_BYTES:
            raise ValueError(f"AES-128 key must be {BLOCK_BYTES} bytes, got {len(key)!r}")
        self._cipher = Cipher(algorithms.AES(bytes(key)), modes.ECB())
        # update_into wants block_size - 1 spare bytes; keep one scratch buffer and reuse it.
        self._scratch = bytearray(0)

    def encrypt_into(self, blocks: NDArray[np.generic], out: NDArray[np.generic]) -> None:
        """Encrypt C-contiguous ``blocks`` into ``out`` (same byte size, may alias ``blocks``).

        Parameters
        ----------
        blocks : numpy.ndarray
            Any C-contiguous array whose byte size is a multiple of 16 (e.g. ``(n, 2)`` uint64
            or ``(n, 16)`` uint8).
        out : numpy.ndarray
            C-contiguous array with the same byte size; receives the ciphertext.

        Raises
        ------
        ValueError
            If the arrays are not contiguous or their sizes do not match or are not a multiple
            of 16 bytes.
        """
        if not (blocks.flags.c_contiguous and out.flags.c_contiguous):
            raise ValueError("blocks and out must be C-contiguous")
        nbytes = blocks.nbytes
        if nbytes % BLOCK_BYTES or out.nbytes != nbytes:
            raise ValueError(
                f"need equal byte sizes that are multiples of 16, got {nbytes} and {out.nbytes}"
            )
        if nbytes == 0:
            return
        need = nbytes + BLOCK_BYTES - 1
        if len(self._scratch) < need:
            self._scratch = bytearray(need)
        enc = self._cipher.encryptor()
        written = enc.update_into(blocks.reshape(-1).view(np.uint8), self._scratch)
        assert written == nbytes
        out.reshape(-1).view(np.uint8)[:] = np.frombuffer(self._scratch, np.uint8, nbytes)

    def encrypt(self, blocks: NDArray[np.generic]) -> NDArray[np.generic]:
        """Return the encryption of ``blocks`` as a new array of the same shape and dtype."""
        src = np.ascontiguousarray(blocks)
        out = np.empty_like(src)
        self.encrypt_into(src, out)
        return out
