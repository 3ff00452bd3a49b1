"""DCF Gen and Eval in one numba call each, with OpenSSL's AES called from inside the kernel.

:func:`flwr_fsl.crypto.dcf.generate_keys_batch` and :func:`~flwr_fsl.crypto.dcf.evaluate_at_batch`
walk many keys' trees in chunks; per chunk and level they make one AES call over the chunk's
blocks and one fused kernel pass (:mod:`flwr_fsl.kernels.dcf_kernels`). Driven from Python,
each level costs a ``cryptography`` call, a numba dispatch with a dozen array arguments and
the loop's bookkeeping (several microseconds, against tens of microseconds of work per level
for a 4096-point Eval chunk). Here the whole chunk-and-level loop runs in one ``nogil`` kernel
and calls ``EVP_EncryptUpdate`` through its address (:func:`~flwr_fsl.kernels.aes.native_encrypt`):
the same kernels in the same order on buffers of the same layout, so keys and shares are
bit-identical to the Python driver's (here Gen at ``tau = 2`` encrypts its level blocks in
place, which ``EVP_EncryptUpdate`` allows). The Python driver stays wherever ``libcrypto``
does not load (:func:`~flwr_fsl.kernels.aes.native_aes`; ``FLWR_FSL_NATIVE_AES=0`` turns it
off).

Both calls release the GIL, so a dealer or evaluator running several batches on threads runs
them in parallel; each thread keeps its own OpenSSL context (:func:`context`).

At ``tau = 2`` (PrivHFL's ReLU) the level steps are
:func:`~flwr_fsl.kernels.dcf_kernels.gen_step_tau2` and
:func:`~flwr_fsl.kernels.dcf_kernels.eval_step_tau2`, which work on 128-bit blocks. numba's
on-disk cache of :func:`gen_run` and :func:`eval_run` holds the kernels they call compiled in,
and is invalidated only when *this* file changes: after editing
:mod:`~flwr_fsl.kernels.dcf_kernels`, clear the ``*.nbi``/``*.nbc`` files (or touch this one),
or the drivers keep running the old kernels.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import njit
from numpy.typing import NDArray

from flwr_fsl.kernels.aes import NativeAES, native_aes, native_encrypt
from flwr_fsl.kernels.dcf_kernels import (
    GEN_STATE_WORDS,
    eval_blocks,
    eval_final,
    eval_step,
    eval_step_tau2,
    gen_blocks,
    gen_final,
    gen_step,
    gen_step_tau2,
    leaf_blocks,
    pack_gen_state,
    unpack_gen_state,
)

_LOCAL = threading.local()


def context(key: bytes) -> NativeAES | None:
    """Return the calling thread's native AES context under ``key``, or ``None`` without OpenSSL.

    Parameters
    ----------
    key : bytes
        The DCF's fixed 16-byte AES key.

    Returns
    -------
    NativeAES or None
        One context per thread and key (a context must not be shared by two threads).
    """
    cache: dict[bytes, NativeAES | None] | None = getattr(_LOCAL, "ctx", None)
    if cache is None:
        cache = {}
        _LOCAL.ctx = cache
    if key not in cache:
        cache[key] = native_aes(key)
    return cache[key]


@njit(cache=True, nogil=True)
def gen_run(
    fn: int,
    ctx: int,
    chunk: int,
    alphas: np.ndarray,
    betas: np.ndarray,
    domain_bits: int,
    roots: tuple[np.ndarray, np.ndarray],
    cws: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> bool:  # pragma: no cover - numba
    """Fill the correction words of keys ``(alphas[j], betas[j])`` (the Python driver's loop).

    ``roots`` are both parties' ``(m, 2)`` root seeds, ``cws`` the ``(cw_seeds, cw_values,
    cw_bits, cw_final)`` arrays to write. Chunks of ``chunk`` keys; per level one native AES
    call and one :func:`~flwr_fsl.kernels.dcf_kernels.gen_step` pass. Returns whether every
    OpenSSL call succeeded.
    """
    cw_seeds, cw_values, cw_bits, cw_final = cws
    m, tau = betas.shape
    nq = (tau + 1) // 2
    nb = 2 + nq
    inp = np.empty((chunk * 2 * nb + 1, 2), dtype=np.uint64)  # a spare block: also a dst
    enc = np.empty((chunk * 2 * nb + 1, 2), dtype=np.uint64)
    outl = np.zeros(1, dtype=np.int32)
    seeds_all = np.empty((chunk, 2, 2), dtype=np.uint64)
    t_all = np.empty((chunk, 2), dtype=np.uint8)
    v_all = np.empty((chunk, tau), dtype=np.uint64)
    # tau = 2 encrypts the levels in place, so enc is free until the leaf pass: the keys'
    # state rows live there (a fresh 256 KiB array page-faulted on every call)
    rows = chunk * GEN_STATE_WORDS // 2 if tau == 2 else 0  # enc rows are 2-word blocks
    state_all = enc[:rows].reshape((-1, GEN_STATE_WORDS))
    for lo in range(0, m, chunk):
        hi = min(m, lo + chunk)
        c = hi - lo
        seeds = seeds_all[:c]
        t = t_all[:c]
        v_alpha = v_all[:c]
        for j in range(c):
            for w in range(2):
                seeds[j, 0, w] = roots[0][lo + j, w]
                seeds[j, 1, w] = roots[1][lo + j, w]
            t[j, 0] = 0
            t[j, 1] = 1
            for w in range(tau):
                v_alpha[j, w] = 0
        gen_blocks(seeds, nb, inp)
        pack_gen_state(seeds, t, v_alpha, state_all[:c])  # no rows unless tau = 2
        # tau = 2 encrypts in place: a key's step reads its six blocks before it writes the
        # next inputs over them, and one buffer instead of two stays in L2
        out = inp if tau == 2 else enc
        for level in range(domain_bits):
            if not native_encrypt(fn, ctx, inp, out, c * 2 * nb, outl):
                return False
            if tau == 2:
                gen_step_tau2(
                    inp, level, domain_bits, lo, (alphas, betas), state_all[:c],
                    (cw_seeds, cw_values, cw_bits), inp,
                )  # fmt: skip
            else:
                gen_step(
                    enc, nb, level, domain_bits, lo, alphas, betas, seeds, t, v_alpha, cw_seeds,
                    cw_values, cw_bits, inp,
                )  # fmt: skip
        unpack_gen_state(state_all[:c], seeds, t, v_alpha)
        leaf_blocks(seeds.reshape(2 * c, 2), nq, inp)
        if not native_encrypt(fn, ctx, inp, enc, 2 * c * nq, outl):
            return False
        gen_final(inp, enc, nq, t, v_alpha, cw_final[lo:hi])
    return True


@njit(cache=True, nogil=True)
def eval_run(  # noqa: PLR0913
    fn: int,
    ctx: int,
    chunk: int,
    key_idx: np.ndarray,
    points: np.ndarray,
    domain_bits: int,
    party: int,
    root_seeds: np.ndarray,
    cws: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    out: np.ndarray,
) -> int:  # pragma: no cover - numba
    """Add party ``party``'s share of key ``key_idx[i]`` at ``points[i]`` into ``out[i]``.

    ``out`` is ``(n, tau)`` and zero on entry; ``cws`` the public ``(cw_seeds, cw_values,
    cw_bits, cw_final)``. Chunks of ``chunk`` points; per level one native AES call and one
    :func:`~flwr_fsl.kernels.dcf_kernels.eval_step` pass. Returns -1 if an OpenSSL call
    failed, else (``tau = 2``) the :func:`~flwr_fsl.kernels.dcf_kernels.public_flags` of the
    corrections read, or 0.
    """
    cw_seeds, cw_values, cw_bits, cw_final = cws
    count, tau = out.shape
    nq = (tau + 1) // 2
    nb = 1 + nq
    inp = np.empty((chunk * nb + 1, 2), dtype=np.uint64)  # a spare block: also a dst
    enc = np.empty((chunk * nb + 1, 2), dtype=np.uint64)
    outl = np.zeros(1, dtype=np.int32)
    seeds_all = np.empty((chunk, 2), dtype=np.uint64)
    t_all = np.empty(chunk, dtype=np.uint8)
    flags = np.uint64(0)
    for lo in range(0, count, chunk):
        hi = min(count, lo + chunk)
        c = hi - lo
        kid = key_idx[lo:hi]
        p = points[lo:hi]
        seeds = seeds_all[:c]
        t = t_all[:c]
        for i in range(c):
            seeds[i, 0] = root_seeds[kid[i], 0]
            seeds[i, 1] = root_seeds[kid[i], 1]
            t[i] = party
        acc = out[lo:hi]
        eval_blocks(seeds, p, 0, domain_bits, nb, inp)
        for level in range(domain_bits):
            if not native_encrypt(fn, ctx, inp, inp if tau == 2 else enc, c * nb, outl):
                return -1
            if tau == 2:  # in place, as in gen_run
                flags |= eval_step_tau2(
                    inp, level, domain_bits, p, kid, cw_seeds, cw_values, cw_bits, party, seeds,
                    t, acc, inp,
                )  # fmt: skip
            else:
                eval_step(
                    enc, nb, level, domain_bits, p, kid, cw_seeds, cw_values, cw_bits, party,
                    seeds, t, acc, inp,
                )  # fmt: skip
        leaf_blocks(seeds, nq, inp)
        if not native_encrypt(fn, ctx, inp, enc, c * nq, outl):
            return -1
        eval_final(inp, enc, nq, kid, cw_final, party, t, acc)
    return int(flags)


def generate(
    ctx: NativeAES,
    chunk: int,
    alphas: NDArray[np.uint64],
    betas: NDArray[np.uint64],
    domain_bits: int,
    roots: tuple[NDArray[np.uint64], NDArray[np.uint64]],
    cws: tuple[NDArray[np.uint64], NDArray[np.uint64], NDArray[np.uint8], NDArray[np.uint64]],
) -> None:
    """Run :func:`gen_run` (arguments as there, ``ctx`` the DCF key's :class:`NativeAES`).

    Raises
    ------
    RuntimeError
        If OpenSSL fails.
    """
    if betas.shape[0] and not gen_run(
        ctx.fn, ctx.ctx, max(1, min(chunk, betas.shape[0])), alphas, betas, domain_bits,
        roots, cws,
    ):  # fmt: skip
        raise RuntimeError("EVP_EncryptUpdate failed in DCF Gen")


def evaluate(
    ctx: NativeAES,
    chunk: int,
    key_idx: NDArray[np.int64],
    points: NDArray[np.uint64],
    domain_bits: int,
    party: int,
    root_seeds: NDArray[np.uint64],
    cws: tuple[NDArray[np.uint64], NDArray[np.uint64], NDArray[np.uint8], NDArray[np.uint64]],
) -> tuple[NDArray[np.uint64], int]:
    """Return party ``party``'s ``(n, tau)`` shares through :func:`eval_run` and its flags.

    Arguments as there; the flags are the corrections' non-canonical bits at ``tau = 2``
    (:func:`~flwr_fsl.kernels.dcf_kernels.public_flags`), 0 otherwise.

    Raises
    ------
    RuntimeError
        If OpenSSL fails.
    """
    out = np.zeros((key_idx.shape[0], cws[3].shape[1]), dtype=np.uint64)
    if not out.shape[0]:
        return out, 0
    flags = eval_run(
        ctx.fn, ctx.ctx, max(1, min(chunk, out.shape[0])), key_idx, points, domain_bits, party,
        root_seeds, cws, out,
    )  # fmt: skip
    if flags < 0:
        raise RuntimeError("EVP_EncryptUpdate failed in DCF Eval")
    return out, int(flags)
