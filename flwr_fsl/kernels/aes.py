"""Batched AES-128 through ``cryptography``: the one block-cipher entry point of the project.

One ``update_into`` call encrypts a whole batch of 16-byte blocks (a DPF tree level, a hashing
batch, a mask stream) into a preallocated buffer; per-block calls are about 20x slower.

``cryptography``'s ``update_into`` needs ``block_size - 1`` spare bytes in its output buffer.
:meth:`BatchedAES.encrypt_into` hides that behind a reused scratch buffer (one extra copy);
hot loops that own their buffers call :meth:`BatchedAES.encrypt_prefix_into` with an output that
has at least 16 spare bytes, which writes the ciphertext in place with no copy. One ECB context
is kept for the life of the object: ECB carries no state between whole blocks, so reusing it
saves a key schedule per call.

The native path (:class:`NativeAES`, :func:`native_encrypt`) calls the same AES-128-ECB of
OpenSSL's ``libcrypto`` from inside numba kernels, through ``EVP_EncryptUpdate``'s address: a
kernel that loops over many AES calls (the DPF full-domain driver,
:mod:`flwr_fsl.kernels.dpf_eval`) pays no Python call per batch. It is used only where
``libcrypto`` loads on Linux and agrees with ``cryptography`` on a known-answer check
(``FLWR_FSL_NATIVE_AES=0`` turns it off); callers fall back to :class:`BatchedAES`.
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic
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


# ------------------------------------------------------------------------------------------------
# Native AES: the same OpenSSL AES-128-ECB, called from numba kernels with no Python in between.
# ------------------------------------------------------------------------------------------------

_NATIVE_ENV = "FLWR_FSL_NATIVE_AES"
_LIBCRYPTO_NAMES = ("libcrypto.so.3", "libcrypto.so", "libcrypto.so.1.1")


@njit(cache=True, nogil=True)
def log_blocks(log: np.ndarray, n_log: int, blocks: int) -> int:  # pragma: no cover - numba
    """Record one native AES call's block count when ``log`` has room (benchmarks, tests)."""
    if n_log < log.shape[0]:
        log[n_log] = blocks
    return n_log + 1


@intrinsic
def _evp_update(typingctx, fn, ptrs, inl):  # type: ignore[no-untyped-def]
    """Call ``EVP_EncryptUpdate(ctx, out, outl, inp, inl)`` through its address ``fn``.

    ``ptrs`` is the tuple of addresses ``(ctx, out, outl, inp)``. Every pointer travels as a
    ``uint64``, so the compiled kernel holds no process address (``cache=True`` stays valid
    across processes).
    """
    sig = types.int32(types.uint64, types.UniTuple(types.uint64, 4), inl)

    def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(i32, [i8p, i8p, i32.as_pointer(), i8p, i32])
        f = builder.inttoptr(args[0], fnty.as_pointer())
        ctx, out, outl, inp = (builder.extract_value(args[1], i) for i in range(4))
        n = builder.trunc(args[2], i32) if args[2].type.width > 32 else args[2]
        return builder.call(
            f,
            [
                builder.inttoptr(ctx, i8p),
                builder.inttoptr(out, i8p),
                builder.inttoptr(outl, i32.as_pointer()),
                builder.inttoptr(inp, i8p),
                n,
            ],
        )

    return sig, codegen


@njit(cache=True, nogil=True)
def native_encrypt(
    fn: int, ctx: int, src: np.ndarray, dst: np.ndarray, nblocks: int, outl: np.ndarray
) -> bool:  # pragma: no cover - numba
    """Encrypt the first ``nblocks`` 16-byte blocks of ``src`` into the start of ``dst``.

    ``fn`` is ``EVP_EncryptUpdate``'s address and ``ctx`` an AES-128-ECB context without
    padding (:class:`NativeAES`); ``dst`` must have one spare block, ``outl`` is a one-element
    ``int32`` scratch array. Returns whether OpenSSL wrote every byte. A call of more than
    ``2**27 - 1`` blocks is split (``inl`` is a C ``int``).
    """
    addrs = (np.uint64(src.ctypes.data), np.uint64(dst.ctypes.data))
    return native_encrypt_at(fn, ctx, addrs, nblocks, outl)


@njit(cache=True, nogil=True)
def native_encrypt_at(
    fn: int, ctx: int, addrs: tuple[np.uint64, np.uint64], nblocks: int, outl: np.ndarray
) -> bool:  # pragma: no cover - numba
    """:func:`native_encrypt` from the address ``addrs[0]`` to ``addrs[1]`` (``uint64``).

    For a loop of many small calls over one buffer: it takes no array view per call (numba
    counts references on every view it makes).
    """
    src, dst = addrs
    done = 0
    while done < nblocks:
        n = min(nblocks - done, (1 << 27) - 1)
        off = np.uint64(16 * done)
        ptrs = (np.uint64(ctx), dst + off, np.uint64(outl.ctypes.data), src + off)
        ok: int = _evp_update(np.uint64(fn), ptrs, np.int64(16 * n))  # type: ignore[call-arg]
        if ok != 1 or outl[0] != 16 * n:
            return False
        done += n
    return True


@njit(cache=True, nogil=True)
def native_replay(
    fn: int, ctx: int, src: np.ndarray, dst: np.ndarray, sizes: np.ndarray
) -> bool:  # pragma: no cover - numba
    """Encrypt ``sizes[i]`` blocks of ``src`` into ``dst`` for every ``i``: a benchmark floor."""
    outl = np.zeros(1, dtype=np.int32)
    for i in range(sizes.shape[0]):
        if not native_encrypt(fn, ctx, src, dst, sizes[i], outl):
            return False
    return True


class _LibCrypto:
    """The process's ``libcrypto`` handle and the EVP functions the native path needs."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.EVP_CIPHER_CTX_new.restype = ctypes.c_void_p
        lib.EVP_CIPHER_CTX_new.argtypes = []
        lib.EVP_CIPHER_CTX_free.restype = None
        lib.EVP_CIPHER_CTX_free.argtypes = [ctypes.c_void_p]
        lib.EVP_aes_128_ecb.restype = ctypes.c_void_p
        lib.EVP_aes_128_ecb.argtypes = []
        lib.EVP_EncryptInit_ex.restype = ctypes.c_int
        lib.EVP_EncryptInit_ex.argtypes = [ctypes.c_void_p] * 5
        lib.EVP_CIPHER_CTX_set_padding.restype = ctypes.c_int
        lib.EVP_CIPHER_CTX_set_padding.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.update = int(ctypes.cast(lib.EVP_EncryptUpdate, ctypes.c_void_p).value or 0)


_LIB: list[_LibCrypto | None] = []  # [] = not looked up yet; [None] = unavailable


def _load_libcrypto() -> _LibCrypto | None:
    """Load OpenSSL's ``libcrypto`` (Linux only), or return ``None`` when it is not usable.

    macOS ships an unversioned ``libcrypto`` that aborts the process when loaded, and
    Windows names it differently, so only Linux is tried; ``FLWR_FSL_NATIVE_AES=0`` turns
    the native path off.
    """
    if os.environ.get(_NATIVE_ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return None
    for name in _LIBCRYPTO_NAMES:
        try:
            return _LibCrypto(ctypes.CDLL(name))
        except (OSError, AttributeError):
            continue
    return None


class NativeAES:
    """One OpenSSL AES-128-ECB context (no padding) for :func:`native_encrypt` in numba kernels.

    A context must not be used by two threads at once: keep one per thread. Create it with
    :func:`native_aes`, which returns ``None`` where OpenSSL cannot be loaded.

    Attributes
    ----------
    fn : int
        The address of ``EVP_EncryptUpdate``.
    ctx : int
        The address of the cipher context.
    """

    def __init__(self, lib: _LibCrypto, key: bytes) -> None:
        if not isinstance(key, bytes | bytearray) or len(key) != BLOCK_BYTES:
            raise ConfigurationError(f"AES-128 key must be {BLOCK_BYTES} bytes")
        self._lib = lib
        ctx = lib.lib.EVP_CIPHER_CTX_new()
        if not ctx:
            raise RuntimeError("EVP_CIPHER_CTX_new failed")
        self.ctx = int(ctx)
        self.fn = lib.update
        ok = lib.lib.EVP_EncryptInit_ex(ctx, lib.lib.EVP_aes_128_ecb(), None, bytes(key), None)
        if ok != 1 or lib.lib.EVP_CIPHER_CTX_set_padding(ctx, 0) != 1:
            self.close()
            raise RuntimeError("EVP_EncryptInit_ex failed")

    def close(self) -> None:
        """Free the OpenSSL context (idempotent)."""
        ctx, self.ctx = getattr(self, "ctx", 0), 0
        if ctx:
            self._lib.lib.EVP_CIPHER_CTX_free(ctx)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # nothing to report while the interpreter exits
            pass

    def encrypt(self, blocks: NDArray[np.generic]) -> NDArray[np.generic]:
        """Return the encryption of C-contiguous ``blocks`` (a new array of the same shape)."""
        src = np.ascontiguousarray(blocks)
        if src.nbytes % BLOCK_BYTES:
            raise ConfigurationError("blocks must be a multiple of 16 bytes")
        n = src.nbytes // BLOCK_BYTES
        dst = np.empty(n + 1, dtype=np.dtype((np.uint8, 16)))
        if not native_encrypt(self.fn, self.ctx, src, dst, n, np.zeros(1, np.int32)):
            raise RuntimeError("EVP_EncryptUpdate failed")
        return dst[:n].reshape(-1).view(src.dtype).reshape(src.shape)


def native_aes(key: bytes) -> NativeAES | None:
    """Return a :class:`NativeAES` context under ``key``, or ``None`` if OpenSSL is unusable.

    The first call loads ``libcrypto`` and checks it against ``cryptography`` on random blocks
    (a library that disagrees is never used).

    Raises
    ------
    ConfigurationError
        If ``key`` is not 16 bytes long.
    """
    if not _LIB:
        lib = _load_libcrypto()
        if lib is not None:
            try:
                probe = np.random.default_rng().integers(0, 2**63, (64, 2)).astype(np.uint64)
                got = NativeAES(lib, bytes(16)).encrypt(probe)
                if not np.array_equal(got, BatchedAES(bytes(16)).encrypt(probe)):
                    lib = None
            except (RuntimeError, OSError):  # pragma: no cover - a broken libcrypto
                lib = None
        _LIB.append(lib)
    lib = _LIB[0]
    return None if lib is None else NativeAES(lib, key)
