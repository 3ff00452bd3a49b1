"""The native checked driver (issue 26): values and leaf proofs bit-identical to the Python driver.

:mod:`flwr_fsl.kernels.vdpf_eval` runs the checked full-domain evaluation (tree levels, leaf
conversion, proof-hash inputs, the proof AES call, the feed-forward) in one numba call that
calls OpenSSL. Over random verifiable batches (mixed domains, lengths, chunk budgets that split
tasks and make many chunks, proof batches of any size) its output words and proofs must equal
the Python driver's (the fallback when ``libcrypto`` does not load, ``FLWR_FSL_NATIVE_AES=0``),
and the proof hash's AES blocks (4 per evaluated point) must be in the AES log the benchmarks
replay.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.crypto import dpf
from flwr_fsl.crypto.dpf import PROOF_WORDS, evaluate_batch, generate_keys_batch
from flwr_fsl.crypto.prg import MMO_KEY_PROOF
from flwr_fsl.kernels import aes as aes_mod
from flwr_fsl.kernels import vdpf_eval
from flwr_fsl.kernels import vdpf_kernels as vk
from flwr_fsl.kernels.aes import native_aes, native_replay

U64 = np.uint64

needs_native = pytest.mark.skipif(
    native_aes(bytes(16)) is None, reason="OpenSSL's libcrypto cannot be loaded natively here"
)


def _eval(keys, lengths, proofs: bool):  # type: ignore[no-untyped-def]
    total = int(lengths.sum())
    p = np.zeros((total, PROOF_WORDS), U64) if proofs else None
    out = evaluate_batch(keys, lengths=lengths, proofs=p)[0]
    return out, p


@needs_native
@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(1, 40),
    tau=st.sampled_from([2, 4, 6]),
    max_bits=st.integers(0, 12),
    budget=st.sampled_from([1, 16, 64, 1 << 10, 1 << 15]),
    nt=st.booleans(),
    sub=st.sampled_from([1, 3, 64, vdpf_eval.SUB_LEAVES]),
)
def test_native_checked_driver_equals_python_driver(seed, m, tau, max_bits, budget, nt, sub):
    rng = np.random.default_rng(seed)
    d = rng.integers(0, max_bits + 1, m)
    alphas = (rng.integers(0, 2**40, m) % (1 << d)).astype(U64)
    betas = rng.integers(0, 2**64, (m, tau), dtype=U64)
    lengths = np.array([rng.integers(0, (1 << int(x)) + 1) for x in d], dtype=np.int64)
    keys = generate_keys_batch(alphas, betas, d, epoch=int(rng.integers(0, 5)), verifiable=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpf, "_FD_BUDGET", budget)
        mp.setattr(dpf, "_NT_MIN_BYTES", 0 if nt else 1 << 62)
        mp.setattr(vdpf_eval, "SUB_LEAVES", sub)  # proof batches inside a chunk
        for k in keys:
            log: list[int] = []
            plain: list[int] = []
            mp.setattr(dpf, "_AES_LOG", log)
            got, proofs = _eval(k, lengths, True)
            mp.setattr(dpf, "_AES_LOG", plain)
            unchecked, _ = _eval(k, lengths, False)
            mp.setattr(dpf, "_AES_LOG", None)
            mp.setattr(dpf, "_NATIVE_AES", False)
            want, want_proofs = _eval(k, lengths, True)
            mp.setattr(dpf, "_NATIVE_AES", True)
            assert np.array_equal(got, want) and np.array_equal(got, unchecked)
            assert np.array_equal(proofs, want_proofs)
            assert sum(log) - sum(plain) == 4 * int(lengths.sum())  # the proof hash's blocks


@needs_native
def test_honest_proofs_agree_and_a_forged_pair_differs():
    rng = np.random.default_rng(5)
    m, d, tau = 30, 7, 2
    alphas = rng.integers(0, 1 << d, m).astype(U64)
    keys = generate_keys_batch(alphas, np.ones((m, tau), U64), d, verifiable=True)
    lengths = np.full(m, 1 << d, np.int64)
    (_, p0), (_, p1) = (_eval(k, lengths, True) for k in keys)
    assert np.array_equal(p0, p1)
    keys[1].root_seeds[3, 1] ^= U64(1 << 40)  # a key pair nonzero at many points
    _, bad = _eval(keys[1], lengths, True)
    rows = slice(3 << d, 4 << d)
    assert not np.array_equal(p0[rows], bad[rows]) and np.array_equal(p0[: 3 << d], bad[: 3 << d])


def test_checked_evaluation_falls_back_without_native_aes(monkeypatch):
    monkeypatch.setenv("FLWR_FSL_NATIVE_AES", "0")
    monkeypatch.setattr(aes_mod, "_LIB", [])  # look libcrypto up again, under the variable
    monkeypatch.setattr(dpf, "_NATIVE", type(dpf._NATIVE)())  # no cached contexts
    assert native_aes(bytes(16)) is None
    assert dpf._native_vmmo() is None
    m, d = 5, 4
    alphas = np.arange(m, dtype=U64)
    keys = generate_keys_batch(alphas, np.full((m, 2), 7, U64), d, verifiable=True)
    lengths = np.full(m, 1 << d, np.int64)
    (v0, p0), (v1, p1) = (_eval(k, lengths, True) for k in keys)
    assert np.array_equal(p0, p1)
    total = (v0 + v1).reshape(m, 1 << d, 2)
    assert (total[np.arange(m), alphas.astype(np.int64)] == 7).all()


@needs_native
@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    heights=st.lists(st.integers(0, 5), min_size=1, max_size=12),
    half_w=st.integers(1, 3),
    sub=st.sampled_from([1, 2, 5, 64]),
)
def test_proof_pass_equals_the_three_pass_kernels(seed, heights, half_w, sub):
    """``proof_pass`` (128-bit intrinsics, batches of ``sub`` leaves) writes the same proofs as
    ``fd_proof_inputs``, one AES call and ``fd_proof_finish`` over the chunk, on tasks cut
    below ``2**h`` leaves (none kept included) and sharing keys."""
    rng = np.random.default_rng(seed)
    n = len(heights)
    tasks = np.zeros((n, 5), np.int64)
    tasks[:, 0] = rng.integers(0, 3, n)  # three keys, each task one of them
    tasks[:, 2] = heights
    kept = [int(rng.integers(0, (1 << h) + 1)) for h in heights]
    tasks[:, 3] = 5 + np.concatenate(([0], np.cumsum(kept)[:-1]))
    tasks[:, 4] = tasks[:, 3] + kept
    cnt = sum(kept)
    conv = rng.integers(0, 2**63, (cnt * half_w + 1, 2)).astype(U64)
    t_in = rng.integers(0, 2, cnt + 1).astype(np.uint8)
    key_first = np.array([0, 2, 5], np.int64)
    epochs = rng.integers(0, 2**63, 3).astype(U64)
    cw_proof = rng.integers(0, 2**63, (3, PROOF_WORDS)).astype(U64)
    cipher = native_aes(MMO_KEY_PROOF)
    assert cipher is not None
    want = np.zeros((int(tasks[-1, 4]), PROOF_WORDS), U64)
    inputs = np.zeros((vk.BLOCKS * cnt + 1, 2), U64)
    vk.fd_proof_inputs(conv, t_in, tasks, key_first, epochs, half_w, inputs)
    enc = np.zeros_like(inputs)
    native_replay(cipher.fn, cipher.ctx, inputs, enc, np.array([vk.BLOCKS * cnt], np.int64))
    vk.fd_proof_finish(enc, inputs, t_in, tasks, cw_proof, want)
    got = np.zeros_like(want)
    bufs = (
        np.empty((vk.BLOCKS * sub, 2), U64),
        np.empty((vk.BLOCKS * sub + 1, 2), U64),
    )
    leaves = (conv, t_in, tasks)
    calls = vk.proof_pass(
        cipher.fn, cipher.ctx, leaves, (key_first, epochs, cw_proof), half_w, bufs, got
    )
    assert calls == -(-cnt // sub)
    assert np.array_equal(got, want)
