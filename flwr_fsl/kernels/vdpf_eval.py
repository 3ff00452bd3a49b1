"""Checked full-domain DPF evaluation in one numba call: the chunk loop, leaf proofs and native AES.

:func:`flwr_fsl.crypto.dpf.evaluate_batch` with ``proofs`` (the SSA servers' key check,
:mod:`flwr_fsl.families.ssa.verify`) runs, per chunk, the tree levels and the leaf conversion
(as :func:`flwr_fsl.kernels.dpf_eval.fd_run`), then the proof-hash inputs
(:func:`~flwr_fsl.kernels.vdpf_kernels.fd_proof_inputs`), one AES call under
:data:`~flwr_fsl.crypto.prg.MMO_KEY_PROOF` and the feed-forward
(:func:`~flwr_fsl.kernels.vdpf_kernels.fd_proof_finish`). Driven from Python, the interpreter
holds the GIL between those calls, so two threads evaluating two segments mostly take turns.
:func:`fd_run_checked` runs the same kernels inside one ``nogil`` call (the chunk loop of
``fd_run``, :func:`~flwr_fsl.kernels.dpf_eval.fd_core`), calling ``EVP_EncryptUpdate`` through
its address (:func:`~flwr_fsl.kernels.aes.native_encrypt`), and hashes a chunk's leaf proofs
in batches of :data:`SUB_LEAVES` leaves (:func:`~flwr_fsl.kernels.vdpf_kernels.proof_pass`: the
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

from flwr_fsl.kernels.aes import NativeAES, native_aes
from flwr_fsl.kernels.dpf_eval import PROOFS, NativeMMO, fd_core, fd_scratch
from flwr_fsl.kernels.vdpf_kernels import BLOCKS, proof_pass

__all__ = ["SUB_LEAVES", "NativeVMMO", "fd_run_checked", "native_vmmo", "proof_pass"]

SUB_LEAVES = 2048
"""Leaves per proof-hash batch inside a chunk: their AES inputs and ciphertexts (2 x 128 KiB)
stay in a core's L2 cache between the three passes, where a whole chunk's (2 x 2 MiB at
``tau = 2``) would not."""


@njit(cache=True, nogil=True)
def fd_run_checked(
    fn: int,
    ctxs: np.ndarray,
    tasks: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    key: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    shape: np.ndarray,
    scratch: tuple[np.ndarray, np.ndarray, np.ndarray],
    proof: tuple[
        tuple[np.ndarray, np.ndarray],
        np.ndarray,
        np.ndarray,
        np.ndarray,
    ],
    out: np.ndarray,
) -> int:  # pragma: no cover - numba
    """:func:`~flwr_fsl.kernels.dpf_eval.fd_run` plus every evaluated point's leaf proof.

    The same chunk loop (:func:`~flwr_fsl.kernels.dpf_eval.fd_core`), with each chunk's
    leaves hashed right after its output words (:func:`proof_pass`). ``ctxs`` holds the left,
    right, value and proof AES contexts; ``tasks``, ``key``, ``shape`` and ``scratch`` are as
    in ``fd_run``; ``proof`` is ``(bufs, key_first, cw_proof, proofs)``: :func:`proof_pass`'s
    batch buffers, each key's first output row, the keys' proof correction words and the
    ``(P, PROOF_WORDS)`` output. Returns the number of AES calls made (``log`` receives their
    block counts), or ``-1`` if OpenSSL failed.
    """
    checked = shape.copy()
    checked[5] |= PROOFS
    return fd_core(fn, ctxs, tasks, key, checked, scratch, out, proof)


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
    shape: tuple[int, int, int, int, int, int],
    sizes: tuple[int, int],
    proof: tuple[NDArray[np.int64], NDArray[np.uint64], NDArray[np.uint64]],
    out: NDArray[np.uint64],
    log: list[int] | None,
) -> None:
    """Run :func:`fd_run_checked` with fresh level and proof buffers of ``sizes``.

    ``sizes`` and ``shape`` are as in :func:`~flwr_fsl.kernels.dpf_eval.run_native`;
    ``proof`` is ``(key_first, cw_proof, proofs)``; the block counts of the AES calls are
    appended to ``log`` when it is a list.

    Raises
    ------
    RuntimeError
        If OpenSSL fails.
    """
    sub = SUB_LEAVES
    batch = (
        np.empty((BLOCKS * sub, 2), dtype=np.uint64),
        np.empty((BLOCKS * sub + 1, 2), dtype=np.uint64),
    )
    key_first, cw_proof, proofs = proof
    pbufs = (batch, key_first, cw_proof, proofs)
    cap, max_h = sizes
    calls_max = (tasks[0].shape[0] - 1) * (2 * max_h + 2 + cap // sub)
    scratch = fd_scratch(cap, log, calls_max)
    arr = np.array(shape, np.int64)
    calls = fd_run_checked(native.fn, native.ctxs, tasks, key, arr, scratch, pbufs, out)
    if calls < 0:
        raise RuntimeError("OpenSSL AES failed")
    if log is not None:
        log.extend(scratch[2][:calls].tolist())
