"""Batched AES-128 through ``cryptography``: the one block-cipher entry point of the project.

One ``update_into`` call encrypts a whole batch of 16-byte blocks (a DPF tree level, a hashing
batch, a mask stream) into a preallocated buffer; per-block calls are about 20x slower.

``cryptography``'s ``update_into`` needs ``block_size - 1`` spare bytes in its output buffer.
:meth:`BatchedAES.encrypt_into` hides that behind a reused scratch buffer (one extra copy);
hot loops that own their buffers call :meth:`BatchedAES.encrypt_prefix_into` with an output that
has at least 16 spare bytes, which writes the ciphertext in place with no copy. One ECB context
is kept for the life of the object: ECB carries no state between whole blocks, so reusing it
saves a key schedule per call.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError

BLOCK_BYTES = 16


def _byte_view(arr: NDArray[np.generic]) -> NDArray[np.uint8]:
    """Return the flat ``uint8`` view of a C-contiguous array (no copy)."""
    return arr.reshape(-1).view(np.uint8)


class BatchedAES:
    """AES-128 in ECB mode under one fixed key, applied to many blocks per call.

    Parameters
    ----------
    key : bytes
        The 16-byte AES key.

    Raises
    ------
    ConfigurationError
        If ``key`` is not 16 bytes long.
    """

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) != BLOCK_BYTES:
            raise ConfigurationError(f"AES-128 key must be {BLOCK_BYTES} bytes, got {len(key)!r}")
        self._cipher = Cipher(algorithms.AES(bytes(key)), modes.ECB())
        # ECB has no chaining state: as long as only whole blocks go in, one context serves all
        # calls (nothing is ever buffered inside it).
        self._enc = self._cipher.encryptor()
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
        ConfigurationError
            If the arrays are not contiguous or their sizes do not match or are not a multiple
            of 16 bytes.
        """
        if not (blocks.flags.c_contiguous and out.flags.c_contiguous):
            raise ConfigurationError("blocks and out must be C-contiguous")
        nbytes = blocks.nbytes
        if nbytes % BLOCK_BYTES or out.nbytes != nbytes:
            raise ConfigurationError(
                f"need equal byte sizes that are multiples of 16, got {nbytes} and {out.nbytes}"
            )
        if nbytes == 0:
            return
        need = nbytes + BLOCK_BYTES - 1
        if len(self._scratch) < need:
            self._scratch = bytearray(need)
        written = self._enc.update_into(_byte_view(blocks).data, self._scratch)
        if written != nbytes:  # pragma: no cover - guaranteed by ECB on whole blocks
            raise RuntimeError(f"AES wrote {written} of {nbytes} bytes")
        _byte_view(out)[:] = np.frombuffer(self._scratch, np.uint8, nbytes)

    def encrypt_prefix_into(self, blocks: NDArray[np.generic], out: NDArray[np.generic]) -> None:
        """Encrypt ``blocks`` into the first ``blocks.nbytes`` bytes of ``out``, with no copy.

        ``out`` must be at least 16 bytes longer than ``blocks`` (``cryptography`` needs the
        spare room) and must not overlap ``blocks``; hot loops allocate their buffers with one
        spare block and reuse them.

        Parameters
        ----------
        blocks : numpy.ndarray
            C-contiguous array whose byte size is a multiple of 16.
        out : numpy.ndarray
            C-contiguous, writable array of at least ``blocks.nbytes + 16`` bytes.

        Raises
        ------
        ConfigurationError
            If an array is not contiguous, the size is not a multiple of 16, or ``out`` is
            too small.
        """
        if not (blocks.flags.c_contiguous and out.flags.c_contiguous):
            raise ConfigurationError("blocks and out must be C-contiguous")
        nbytes = blocks.nbytes
        if nbytes % BLOCK_BYTES or out.nbytes < nbytes + BLOCK_BYTES:
            raise ConfigurationError(
                f"need a multiple of 16 bytes and an output with 16 spare bytes, got {nbytes} "
                f"and {out.nbytes}"
            )
        if nbytes == 0:
            return
        written = self._enc.update_into(_byte_view(blocks).data, _byte_view(out).data)
        if written != nbytes:  # pragma: no cover - guaranteed by ECB on whole blocks
            raise RuntimeError(f"AES wrote {written} of {nbytes} bytes")

    def encrypt_view_into(self, src: memoryview, dst: memoryview) -> None:
        """Encrypt the bytes of ``src`` into the start of ``dst``: the lowest-overhead path.

        For hot loops that call AES thousands of times on slices of buffers they own: take
        ``buf.data.cast("B")`` once, then pass slices (a slice costs ~0.1 us; the array-based
        methods spend ~3 us per call on checks and views).

        Parameters
        ----------
        src : memoryview
            Contiguous bytes, a multiple of 16 long.
        dst : memoryview
            Writable bytes at least ``len(src) + 16`` long, not overlapping ``src``.

        Raises
        ------
        ConfigurationError
            If the lengths are wrong.
        """
        n = src.nbytes
        if n % BLOCK_BYTES or dst.nbytes < n + BLOCK_BYTES:
            raise ConfigurationError(
                f"need a multiple of 16 bytes and 16 spare output bytes, got {n} and {dst.nbytes}"
            )
        if n:
            self._enc.update_into(src, dst)

    def encrypt(self, blocks: NDArray[np.generic]) -> NDArray[np.generic]:
        """Return the encryption of ``blocks`` as a new array of the same shape and dtype."""
        src = np.ascontiguousarray(blocks)
        out = np.empty_like(src)
        self.encrypt_into(src, out)
        return out
