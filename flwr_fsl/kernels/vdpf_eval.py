"""Checked full-domain DPF evaluation in one numba call: the chunk loop, leaf proofs and native AES.

:func:`flwr_fsl.crypto.dpf.evaluate_batch` with ``proofs`` (the SSA servers' key check,
:mod:`flwr_fsl.families.ssa.verify`) runs, per chunk, the tree levels and the leaf conversion
(as :func:`flwr_fsl.kernels.dpf_eval.fd_run`), then the proof-hash inputs
(:func:`~flwr_fsl.kernels.vdpf_kernels.fd_proof_inputs`), one AES call under
:data:`~flwr_fsl.crypto.prg.MMO_KEY_PROOF` and the feed-forward
(:func:`~flwr_fsl.kernels.vdpf_kernels.fd_proof_finish`). Driven from Python, the interpreter
holds the GIL between those calls, so two threads evaluating two segments mostly take turns.
:func:`fd_run_checked` runs the same kernels inside one ``nogil`` call, calling
``EVP_EncryptUpdate`` through its address (:func:`~flwr_fsl.kernels.aes.native_encrypt`), and
hashes a chunk's leaf proofs in batches of :data:`SUB_LEAVES` leaves (:func:`proof_pass`: the
same words as the three passes over the whole chunk, whose 4 MiB of AES inputs and ciphertexts
at ``tau = 2`` left the L2 cache between passes; 25% less CPU for the checked evaluation of a
client at ``m = 2**20``, ``k/m = 10%``, measured on one core). Outputs and proofs are
bit-identical to the Python driver's, which stays wherever ``libcrypto`` does not load
(``FLWR_FSL_NATIVE_AES=0``, :func:`~flwr_fsl.kernels.aes.native_aes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit
from numpy.typing import NDArray

from flwr_fsl.kernels.aes import NativeAES, log_blocks, native_aes, native_encrypt
from flwr_fsl.kernels.dpf_eval import NativeMMO
from flwr_fsl.kernels.dpf_kernels import fd_leaves, fd_level, store_fence
from flwr_fsl.kernels.vdpf_kernels import BLOCKS, CLEAR, TWO, ZERO, _dbl

SUB_LEAVES = 2048
"""Leaves per proof-hash batch inside a chunk: their AES inputs and ciphertexts (2 x 128 KiB)
stay in a core's L2 cache between the three passes, where a whole chunk's (2 x 2 MiB at
``tau = 2``) would not."""


@njit(cache=True, nogil=True)
def _flush(
    fn: int,
    ctx: int,
    fill: int,
    bufs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    cw_proof: np.ndarray,
    proofs: np.ndarray,
) -> bool:  # pragma: no cover - numba
    """Encrypt ``fill`` leaves' proof inputs and write ``H(x, blk) ^ t * cs`` to their rows."""
    p_in, p_enc, rows, keys, tmask = bufs
    outl = np.zeros(1, dtype=np.int32)
    if not native_encrypt(fn, ctx, p_in, p_enc, BLOCKS * fill, outl):
        return False
    for f in range(fill):
        d = rows[f]
        key = keys[f]
        m = tmask[f]
        r = BLOCKS * f
        for q in range(BLOCKS):
            proofs[d, 2 * q] = p_enc[r + q, 0] ^ p_in[r + q, 0] ^ (cw_proof[key, 2 * q] & m)
            proofs[d, 2 * q + 1] = p_enc[r + q, 1] ^ p_in[r + q, 1] ^ (cw_proof[key, 2 * q + 1] & m)
    return True


@njit(cache=True, nogil=True)
def proof_pass(
    fn: int,
    ctx: int,
    leaves: tuple[np.ndarray, np.ndarray, np.ndarray],
    key: tuple[np.ndarray, np.ndarray, np.ndarray],
    half_w: int,
    bufs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    proofs: np.ndarray,
) -> int:  # pragma: no cover - numba
    """Every leaf proof of a chunk, in batches of ``SUB_LEAVES`` leaves.

    The same words as :func:`~flwr_fsl.kernels.vdpf_kernels.fd_proof_inputs`, one AES call
    and :func:`~flwr_fsl.kernels.vdpf_kernels.fd_proof_finish` over the whole chunk.

    ``leaves`` is ``(conv, t_in, tasks_i)`` as ``fd_proof_inputs`` reads them (the chunk's
    tasks only), ``key`` is ``(key_first, epochs, cw_proof)``, ``bufs`` the ``(BLOCKS *
    SUB_LEAVES (+ 1), 2)`` inputs and ciphertexts and the ``(SUB_LEAVES,)`` rows, keys and
    control-bit masks of a batch. Returns the number of AES calls, or ``-1`` if OpenSSL
    failed.
    """
    conv, t_in, tasks_i = leaves
    key_first, epochs, cw_proof = key
    p_in, _, rows, keys, tmask = bufs
    sub = rows.shape[0]
    fill = 0
    calls = 0
    pos = 0
    for k in range(tasks_i.shape[0]):
        j = tasks_i[k, 0]
        e = epochs[j]
        nl = min(1 << tasks_i[k, 2], tasks_i[k, 4] - tasks_i[k, 3])  # leaves kept (one point each)
        x = np.uint64(tasks_i[k, 3] - key_first[j])
        for i in range(nl):
            leaf = pos + i
            c = leaf * half_w
            t = t_in[leaf]
            lo_word = ((conv[c, 0] ^ TWO) & CLEAR) | np.uint64(t)
            hi_word = conv[c, 1] ^ e
            r = BLOCKS * fill
            tweak = x
            for q in range(BLOCKS):  # H(x, blk): lo ^ (q << 1), hi ^ alpha^q x
                p_in[r + q, 0] = lo_word ^ np.uint64(2 * q)
                p_in[r + q, 1] = hi_word ^ tweak
                tweak = _dbl(tweak)
            rows[fill] = tasks_i[k, 3] + i
            keys[fill] = j
            tmask[fill] = ZERO - np.uint64(t)
            fill += 1
            x += np.uint64(1)
            if fill == sub:
                if not _flush(fn, ctx, fill, bufs, cw_proof, proofs):
                    return -1
                calls += 1
                fill = 0
        pos += nl
    if fill:
        if not _flush(fn, ctx, fill, bufs, cw_proof, proofs):
            return -1
        calls += 1
    return calls


@njit(cache=True, nogil=True)
def fd_run_checked(
    fn: int,
    ctxs: np.ndarray,
    tasks: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    key: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    shape: np.ndarray,
    scratch: tuple[np.ndarray, np.ndarray, np.ndarray],
    proof: tuple[
        tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        np.ndarray,
        np.ndarray,
        np.ndarray,
    ],
    out: np.ndarray,
) -> int:  # pragma: no cover - numba
    """:func:`~flwr_fsl.kernels.dpf_eval.fd_run` plus every evaluated point's leaf proof.

    ``ctxs`` holds the left, right, value and proof AES contexts; ``tasks``, ``key``,
    ``shape`` and ``scratch`` are as in ``fd_run``; ``proof`` is ``(bufs, key_first,
    cw_proof, proofs)``: :func:`proof_pass`'s batch buffers, each key's first output row, the
    keys' proof correction words and the ``(P, PROOF_WORDS)`` output. Returns the number of
    AES calls made (``log`` receives their block counts), or ``-1`` if OpenSSL failed.
    """
    bounds, tasks_i, task_seed, task_t = tasks
    level_off, cw_seeds, cw_bits, epochs, cw_leaf = key
    bufs, tbufs, log = scratch
    pbufs, key_first, cw_proof, proofs = proof
    sub = pbufs[2].shape[0]
    half_w, tau, group, party = shape[0], shape[1], shape[2], shape[3]
    nt = shape[4] != 0
    outl = np.zeros(1, dtype=np.int32)
    enc_l = bufs[2]
    enc_r = bufs[3]
    n_log = 0
    for c in range(bounds.shape[0] - 1):
        lo = bounds[c]
        hi = bounds[c + 1]
        h = tasks_i[lo, 2]
        src = bufs[0]
        dst = bufs[1]
        t_src = tbufs[0]
        t_dst = tbufs[1]
        n = fd_level(
            enc_l, enc_r, src, t_src, src, t_src, lo, hi, -1, h, tasks_i, task_seed, task_t,
            level_off, cw_seeds, cw_bits, epochs, half_w, group,
        )  # fmt: skip
        for level in range(h):
            if not native_encrypt(fn, ctxs[0], src, enc_l, n, outl):
                return -1
            if not native_encrypt(fn, ctxs[1], src, enc_r, n, outl):
                return -1
            n_log = log_blocks(log, log_blocks(log, n_log, n), n)
            n = fd_level(
                enc_l, enc_r, src, t_src, dst, t_dst, lo, hi, level, h, tasks_i, task_seed,
                task_t, level_off, cw_seeds, cw_bits, epochs, half_w, group,
            )  # fmt: skip
            src, dst = dst, src
            t_src, t_dst = t_dst, t_src
        if not native_encrypt(fn, ctxs[2], src, enc_l, n * half_w, outl):
            return -1
        n_log = log_blocks(log, n_log, n * half_w)
        fd_leaves(enc_l, src, t_src, lo, hi, tasks_i, cw_leaf, half_w, tau, group, party, out, nt)
        leaves = (src, t_src, tasks_i[lo:hi])
        pkey = (key_first, epochs, cw_proof)
        if proof_pass(fn, ctxs[3], leaves, pkey, half_w, pbufs, proofs) < 0:
            return -1
        for _ in range(n // sub):  # n: the chunk's leaves, in batches of ``sub``
            n_log = log_blocks(log, n_log, BLOCKS * sub)
        if n % sub:
            n_log = log_blocks(log, n_log, BLOCKS * (n % sub))
    if nt:
        store_fence()
    return n_log


class NativeVMMO(NativeMMO):
    """OpenSSL contexts (one thread's) of the tree's left, right, value and proof keys.

    Parameters
    ----------
    left, right, value, proof : NativeAES
        Contexts under the MMO PRG's three fixed keys and the proof-hash key.

    Attributes
    ----------
    ctxs : numpy.ndarray
        ``(4,)`` uint64 context addresses: left, right, value, proof (the first three as
        :class:`~flwr_fsl.kernels.dpf_eval.NativeMMO`'s, so it also drives ``fd_run``).
    """

    def __init__(self, left: NativeAES, right: NativeAES, value: NativeAES, proof: NativeAES):
        super().__init__(left, right, value)
        self._keep_proof = proof
        self.ctxs = np.array([left.ctx, right.ctx, value.ctx, proof.ctx], dtype=np.uint64)


def native_vmmo(keys: tuple[bytes, bytes, bytes, bytes]) -> NativeVMMO | None:
    """Return contexts under ``(left, right, value, proof)`` keys, or ``None`` without OpenSSL."""
    ciphers = [native_aes(k) for k in keys]
    if any(c is None for c in ciphers):
        return None
    left, right, value, proof = ciphers
    assert left is not None and right is not None and value is not None and proof is not None
    return NativeVMMO(left, right, value, proof)


def run_native_checked(
    native: NativeVMMO,
    tasks: tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.uint64], NDArray[np.uint8]],
    key: tuple[NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any]],
    shape: tuple[int, int, int, int, int],
    sizes: tuple[int, int],
    proof: tuple[NDArray[np.int64], NDArray[np.uint64], NDArray[np.uint64]],
    out: NDArray[np.uint64],
    log: list[int] | None,
) -> None:
    """Run :func:`fd_run_checked` with fresh level and proof buffers of ``sizes = (cap, max_h)``.

    ``proof`` is ``(key_first, cw_proof, proofs)``; ``shape`` is ``(half_w, tau, group, party,
    nt)``; the block counts of the AES calls are appended to ``log`` when it is a list.

    Raises
    ------
    RuntimeError
        If OpenSSL fails.
    """
    cap, max_h = sizes
    bufs = np.empty((4, cap + 1, 2), dtype=np.uint64)
    sub = SUB_LEAVES
    n_log = 0 if log is None else (tasks[0].shape[0] - 1) * (2 * max_h + 2 + cap // sub)
    scratch = (bufs, np.empty((2, cap), np.uint8), np.zeros(n_log, np.int64))
    batch = (
        np.empty((BLOCKS * sub, 2), dtype=np.uint64),
        np.empty((BLOCKS * sub + 1, 2), dtype=np.uint64),
        np.empty(sub, dtype=np.int64),
        np.empty(sub, dtype=np.int64),
        np.empty(sub, dtype=np.uint64),
    )
    key_first, cw_proof, proofs = proof
    pbufs = (batch, key_first, cw_proof, proofs)
    calls = fd_run_checked(
        native.fn, native.ctxs, tasks, key, np.array(shape, np.int64), scratch, pbufs, out
    )
    if calls < 0:
        raise RuntimeError("OpenSSL AES failed")
    if log is not None:
        log.extend(scratch[2][:calls].tolist())
