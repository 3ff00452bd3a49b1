"""Verifiable DPF keys (issue 21): proof words, per-point proofs, format v3, forgeries caught.

The proof hash is checked against a reference written here with ``cryptography``'s AES
directly; honest keys' proofs are equal at both parties for every size, ``tau`` and evaluated
length, and after U-DPF updates; a key pair that is nonzero at two or more points, or whose
proof word was changed, gives proofs that differ at some point.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.dpf import (
    PROOF_WORDS,
    DPFKeyBatch,
    DPFKeyError,
    DPFPublicBatch,
    evaluate_batch,
    generate_keys_batch,
    next_hint_batch,
    update_batch,
)
from flwr_fsl.crypto.prg import MMO_KEY_PROOF
from flwr_fsl.kernels import vdpf_kernels as vk

M64 = (1 << 64) - 1


def _dbl(x: int) -> int:
    return ((x << 1) & M64) ^ (0x1B if x >> 63 else 0)


def reference_h(x: int, block: tuple[int, int]) -> list[int]:
    """``H(x, blk)``: four MMO blocks of ``(lo ^ (q << 1), hi ^ alpha^q x)`` (module docstring)."""
    enc = Cipher(algorithms.AES(MMO_KEY_PROOF), modes.ECB()).encryptor()
    out, tweak = [], x
    for q in range(4):
        lo, hi = block[0] ^ (q << 1), block[1] ^ tweak
        data = lo.to_bytes(8, "little") + hi.to_bytes(8, "little")
        c = enc.update(data)
        out += [
            int.from_bytes(c[:8], "little") ^ lo,
            int.from_bytes(c[8:], "little") ^ hi,
        ]
        tweak = _dbl(tweak)
    return out


def test_proof_hash_matches_the_reference() -> None:
    rng = np.random.default_rng(1)
    seeds = rng.integers(0, 2**63, (2, 2), dtype=np.uint64) * np.uint64(2)
    seeds[1, 0] |= np.uint64(1)  # the second party's control bit
    for x in (0, 1, 7, 2**62 + 5):
        inputs = np.empty((8, 2), np.uint64)
        vk.gen_proof_inputs(1, seeds, np.zeros(1, np.int64), 0, np.array([x], np.uint64), inputs)
        enc = np.frombuffer(
            Cipher(algorithms.AES(MMO_KEY_PROOF), modes.ECB())
            .encryptor()
            .update(inputs.astype("<u8").tobytes()),
            "<u8",
        ).reshape(8, 2)
        cs = np.empty((1, PROOF_WORDS), np.uint64)
        vk.gen_proof_words(enc, inputs, 1, np.zeros(1, np.int64), 0, cs)
        h0 = reference_h(x, (int(seeds[0, 0]), int(seeds[0, 1])))
        h1 = reference_h(x, (int(seeds[1, 0]), int(seeds[1, 1])))
        assert [int(v) for v in cs[0]] == [a ^ b for a, b in zip(h0, h1, strict=True)]


def _proofs(keys: DPFKeyBatch, lengths: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    total = int(keys.public.num_points.sum() if lengths is None else lengths.sum())
    proofs = np.empty((total, PROOF_WORDS), np.uint64)
    values, _ = evaluate_batch(keys, lengths=lengths, proofs=proofs)
    return values, proofs


@settings(max_examples=30, deadline=None)
@given(
    bits=st.lists(st.integers(0, 9), min_size=1, max_size=6),
    half_tau=st.integers(1, 3),
    seed=st.integers(0, 2**32),
    cut=st.booleans(),
)
def test_honest_keys_have_equal_proofs(
    bits: list[int], half_tau: int, seed: int, cut: bool
) -> None:
    rng = np.random.default_rng(seed)
    d = np.array(bits)
    alphas = np.array([rng.integers(0, 1 << b) for b in bits], np.uint64)
    betas = rng.integers(0, 2**63, (len(bits), 2 * half_tau), dtype=np.uint64)
    k0, k1 = generate_keys_batch(alphas, betas, d, verifiable=True)
    lengths = None
    if cut:  # evaluate a prefix that still holds alpha (as SSA's bins and dummy slots do)
        lengths = np.array(
            [rng.integers(int(a) + 1, (1 << b) + 1) for a, b in zip(alphas, bits, strict=True)]
        )
    (v0, p0), (v1, p1) = _proofs(k0, lengths), _proofs(k1, lengths)
    np.testing.assert_array_equal(p0, p1)
    assert np.count_nonzero((v0 + v1).any(axis=1)) <= len(bits)
    # U-DPF: a new leaf word (new values, new epoch) keeps the proofs valid.
    hint = next_hint_batch(k0, k1, betas + np.uint64(3), 1, alphas=alphas)
    u0, u1 = update_batch(k0, hint, 1), update_batch(k1, hint, 1)
    np.testing.assert_array_equal(_proofs(u0, lengths)[1], _proofs(u1, lengths)[1])
    np.testing.assert_array_equal(_proofs(u0, lengths)[1], p0)  # epoch-free


@settings(max_examples=30, deadline=None)
@given(bits=st.integers(1, 8), seed=st.integers(0, 2**32), level=st.integers(0, 7))
def test_keys_nonzero_at_two_points_are_caught(bits: int, seed: int, level: int) -> None:
    rng = np.random.default_rng(seed)
    alpha = int(rng.integers(0, 1 << bits))
    k0, k1 = generate_keys_batch([alpha], [[5, 1]], bits, verifiable=True)
    cw = k0.public.cw_seeds.copy()
    cw[min(level, bits - 1), int(rng.integers(0, 2))] ^= np.uint64(rng.integers(1, 2**62) * 2)
    pub = dataclasses.replace(k0.public, cw_seeds=cw)
    f0, f1 = DPFKeyBatch(0, k0.root_seeds, pub), DPFKeyBatch(1, k1.root_seeds, pub)
    (v0, p0), (v1, p1) = _proofs(f0), _proofs(f1)
    nonzero = np.count_nonzero((v0 + v1).any(axis=1))
    assert nonzero >= 2
    assert (p0 != p1).any()


def test_a_changed_proof_word_is_caught_and_equal_seeds_need_it() -> None:
    k0, k1 = generate_keys_batch([3], [[5, 1]], 4, verifiable=True)
    assert k0.public.cw_proof is not None
    cs = k0.public.cw_proof.copy()
    cs[0, 5] ^= np.uint64(1)
    pub = dataclasses.replace(k0.public, cw_proof=cs)
    p0 = _proofs(DPFKeyBatch(0, k0.root_seeds, pub))[1]
    p1 = _proofs(DPFKeyBatch(1, k1.root_seeds, pub))[1]
    assert np.flatnonzero((p0 != p1).any(axis=1)).tolist() == [3]
    # Equal root seeds (both master seeds alike) with zero corrections and flipped control bits
    # make every leaf nonzero; the control bit is hashed, so cs = 0 does not hide it.
    same = k0.root_seeds
    levels = pub.cw_seeds.shape[0]
    forged = dataclasses.replace(
        pub,
        cw_seeds=np.zeros_like(pub.cw_seeds),
        cw_bits=np.full(levels, 3, np.uint8),
        cw_proof=np.zeros_like(cs),
    )
    (v0, p0), (v1, p1) = (
        _proofs(DPFKeyBatch(0, same, forged)),
        _proofs(DPFKeyBatch(1, same, forged)),
    )
    assert np.count_nonzero((v0 + v1).any(axis=1)) == 16
    assert (p0 != p1).all(axis=1).all()


def test_format_version_3_round_trips_and_plain_keys_keep_version_2() -> None:
    plain, _ = generate_keys_batch([1, 2], [[1, 2], [3, 4]], 3)
    checked, _ = generate_keys_batch([1, 2], [[1, 2], [3, 4]], 3, verifiable=True)
    assert plain.to_bytes()[4] == 2 and checked.to_bytes()[4] == 3
    assert len(checked.public.to_bytes()) == len(plain.public.to_bytes()) + 2 * 64
    assert DPFPublicBatch.from_bytes(checked.public.to_bytes()) == checked.public
    assert DPFKeyBatch.from_bytes(checked.to_bytes()) == checked
    assert DPFKeyBatch.from_bytes(checked.to_bytes()).key(1).public.cw_proof is not None
    with pytest.raises(DPFKeyError):
        DPFPublicBatch.from_bytes(checked.public.to_bytes()[:-8])
    with pytest.raises(DPFKeyError, match="mix"):
        DPFPublicBatch.concatenate([plain.public, checked.public])
    with pytest.raises(ConfigurationError, match="even tau"):
        generate_keys_batch([1], [[1, 2, 3]], 3, verifiable=True)
    with pytest.raises(ConfigurationError, match="verifiable"):
        evaluate_batch(plain, proofs=np.empty((16, PROOF_WORDS), np.uint64))
