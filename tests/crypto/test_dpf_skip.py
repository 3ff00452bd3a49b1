"""Full-domain evaluation skips subtrees past each key's length (issue 26): same outputs and
proofs as the whole domain cut to length, fewer AES blocks; key ranges are views."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.crypto import dpf
from flwr_fsl.crypto.dpf import PROOF_WORDS, DPFKeyError, evaluate_batch, generate_keys_batch
from flwr_fsl.crypto.prg import MMOCiphers

U64 = np.uint64


def _keys(seed: int, m: int, tau: int, verifiable: bool, max_bits: int = 11):
    rng = np.random.default_rng(seed)
    d = rng.integers(0, max_bits + 1, m)
    alphas = (rng.integers(0, 2**40, m) % (1 << d)).astype(U64)
    betas = rng.integers(0, 2**63, (m, tau)).astype(U64)
    lengths = np.array([rng.integers(0, (1 << int(x)) + 1) for x in d], dtype=np.int64)
    return generate_keys_batch(alphas, betas, d, verifiable=verifiable), lengths


class _Counter:
    def __init__(self, inner, box):
        self.inner, self.box = inner, box

    def encrypt_view_into(self, src, dst):
        self.box[0] += src.nbytes // 16
        self.inner.encrypt_view_into(src, dst)

    def encrypt_prefix_into(self, blocks, out):
        self.box[0] += blocks.nbytes // 16
        self.inner.encrypt_prefix_into(blocks, out)


@pytest.mark.parametrize("budget", [16, 64, 1 << 15])
@pytest.mark.parametrize(("tau", "verifiable"), [(1, False), (3, False), (2, True), (4, True)])
def test_lengths_equal_the_whole_domain_cut(monkeypatch, budget, tau, verifiable):
    monkeypatch.setattr(dpf, "_FD_BUDGET", budget)
    (k0, k1), lengths = _keys(budget + tau, 37, tau, verifiable)
    for k in (k0, k1):
        full, off = evaluate_batch(k)
        n = int(lengths.sum())
        proofs = np.empty((n, PROOF_WORDS), U64) if verifiable else None
        all_proofs = np.empty((int(off[-1]), PROOF_WORDS), U64) if verifiable else None
        part, poff = evaluate_batch(k, lengths=lengths, proofs=proofs)
        if verifiable:
            evaluate_batch(k, proofs=all_proofs)
        for j in range(37):
            rows = slice(int(off[j]), int(off[j]) + int(lengths[j]))
            assert np.array_equal(part[poff[j] : poff[j + 1]], full[rows])
            if verifiable:
                assert np.array_equal(proofs[poff[j] : poff[j + 1]], all_proofs[rows])


@pytest.mark.parametrize("native", [True, False])
def test_padded_bins_cost_aes_blocks_for_their_points_only(monkeypatch, native):
    box = [0]
    c = dpf._mmo_ciphers()
    counting = MMOCiphers(*(_Counter(a, box) for a in c))
    monkeypatch.setattr(dpf, "_mmo_ciphers", lambda: counting)
    monkeypatch.setattr(dpf, "_NATIVE_AES", native)
    log: list[int] = []
    monkeypatch.setattr(dpf, "_AES_LOG", log)  # the native driver's AES calls
    m = 200
    d = np.full(m, 5)
    (k0, _) = generate_keys_batch(np.zeros(m, U64), np.ones((m, 2), U64), d)
    box[0] = 0
    log.clear()
    evaluate_batch(k0)
    full = box[0] + sum(log)
    box[0] = 0
    log.clear()
    evaluate_batch(k0, lengths=np.full(m, 17))  # 17 of 32 points: half the tree plus a path
    assert 0 < box[0] + sum(log) < 0.62 * full


def test_key_range_is_a_view_that_evaluates_like_its_keys():
    (k0, _), _ = _keys(1, 20, 2, True)
    whole, off = evaluate_batch(k0)
    sub = dpf.key_range(k0, 5, 12)
    part = sub.public
    assert part.num_keys == 7 and np.shares_memory(part.cw_seeds, k0.public.cw_seeds)
    vals, _ = evaluate_batch(sub)
    assert np.array_equal(vals, whole[off[5] : off[12]])
    assert dpf.key_range(k0, 0, 20) is k0
    with pytest.raises(DPFKeyError):
        dpf.key_range(k0, 3, 21)
    # Built without the constructor's checks: the same batch a checked one would be.
    checked = dpf.DPFKeyBatch(party=sub.party, root_seeds=k0.root_seeds[5:12], public=part)
    assert sub.party == checked.party and sub.to_bytes() == checked.to_bytes()
    assert sub.root_seeds.flags.c_contiguous and np.shares_memory(sub.root_seeds, k0.root_seeds)
