"""The client encode (issue 26's fast path) writes exactly the bytes of a block-by-block reference.

:func:`~flwr_fsl.families.ssa.protocol.encode_update` places the indices with one packed sort
and a linear rank pass, generates all keys in chunks with the level kernels writing into the
final blob, and caches the blob. The reference here shares none of that: placement through
:func:`~flwr_fsl.crypto.hashing.cuckoo_hash` and
:func:`~flwr_fsl.crypto.hashing.positions_in_bins`, slots from a dict, betas from a loop, BGI16
Gen one key and one AES block at a time with ``cryptography``, and the wire format packed with
:mod:`struct` from the format's description in :mod:`flwr_fsl.crypto.dpf_keys`.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.crypto import dpf
from flwr_fsl.crypto.hashing import EMPTY, cuckoo_hash, positions_in_bins
from flwr_fsl.crypto.prg import (
    MMO_KEY,
    MMO_KEY_LEFT,
    MMO_KEY_PROOF,
    MMO_KEY_RIGHT,
    derive_root_seeds,
)
from flwr_fsl.families.ssa.payload import payload_words
from flwr_fsl.families.ssa.placement import key_domain_bits, simple_table_for
from flwr_fsl.families.ssa.protocol import SSAParams, encode_update
from flwr_fsl.families.ssa.verify import checks_counts, dummy_alphas, one_word

M64 = (1 << 64) - 1
SEEDS = (bytes(range(16)), bytes(range(16, 32)))


class _Block:
    """``x -> AES_key(x) ^ x`` on one 128-bit block given as two little-endian words."""

    def __init__(self, key: bytes) -> None:
        self._enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()

    def __call__(self, lo: int, hi: int) -> tuple[int, int]:
        c = self._enc.update(struct.pack("<QQ", lo, hi))
        a, b = struct.unpack("<QQ", c)
        return a ^ lo, b ^ hi


LEFT, RIGHT, VALUE, PROOF = (
    _Block(k) for k in (MMO_KEY_LEFT, MMO_KEY_RIGHT, MMO_KEY, MMO_KEY_PROOF)
)


def _proof_hash(x: int, lo: int, hi: int) -> list[int]:
    """``H(x, blk)``: 4 MMO blocks of ``(lo ^ (q << 1), hi ^ alpha^q x)`` under the proof key."""
    out, tweak = [], x
    for q in range(4):
        out += PROOF(lo ^ (q << 1), hi ^ tweak)
        tweak = ((tweak << 1) & M64) ^ (0x1B if tweak >> 63 else 0)
    return out


def _gen_one(
    alpha: int, beta: list[int], bits: int, roots: tuple[int, ...], epoch: int, proof: bool
):
    """BGI16 Gen of one key, block by block; returns (cw seeds, cw bits, cw leaf, cw proof)."""
    tau = len(beta)
    group = 2 if tau % 2 else 1
    levels = max(bits - (group - 1), 0)
    path = alpha >> 1 if group == 2 and bits >= 1 else alpha
    gpos = alpha & 1 if group == 2 and bits >= 1 else 0
    x = [(roots[0] & ~1, roots[1]), ((roots[2] & ~1) | 1, roots[3])]  # blocks with t in bit 0
    seeds, cw_bits = [], []
    for level in range(levels):
        a = (path >> (levels - 1 - level)) & 1
        kids = [(LEFT(*xb), RIGHT(*xb)) for xb in x]
        lose = 1 - a
        scw = ((kids[0][lose][0] ^ kids[1][lose][0]) & ~1, kids[0][lose][1] ^ kids[1][lose][1])
        tcw = [(kids[0][c][0] ^ kids[1][c][0]) & 1 ^ (a if c else a ^ 1) for c in (0, 1)]
        seeds.append(scw)
        cw_bits.append(tcw[0] | tcw[1] << 1)
        new = []
        for b in (0, 1):
            s0, s1 = kids[b][a]
            if x[b][0] & 1:
                s0, s1 = s0 ^ scw[0] ^ tcw[a], s1 ^ scw[1]
            new.append((s0, s1))
        x = new
    cs = None
    if proof:
        h0, h1 = (_proof_hash(alpha, *xb) for xb in x)
        cs = [u ^ v for u, v in zip(h0, h1, strict=True)]
    width = group * tau
    conv = [
        [w for q in range(width // 2) for w in VALUE((xb[0] & ~1) ^ (2 + q), xb[1] ^ epoch)]
        for xb in x
    ]
    leaf = []
    for w in range(width):
        u = beta[w - gpos * tau] if gpos * tau <= w < (gpos + 1) * tau else 0
        v = (u - conv[0][w] + conv[1][w]) & M64
        leaf.append((-v) & M64 if x[1][0] & 1 else v)
    return seeds, cw_bits, leaf, cs


def reference_public(alphas, betas, bits, master_seeds, epoch: int, proof: bool) -> bytes:
    """The public part's bytes, Gen key by key and the format packed field by field."""
    m, tau = betas.shape
    r0, r1 = (derive_root_seeds(s, m) for s in master_seeds)
    seeds, cw_bits, leaves, proofs = [], [], [], []
    for j in range(m):
        roots = (int(r0[j, 0]), int(r0[j, 1]), int(r1[j, 0]), int(r1[j, 1]))
        s, b, leaf, cs = _gen_one(
            int(alphas[j]), [int(v) for v in betas[j]], int(bits[j]), roots, epoch, proof
        )
        seeds += s
        cw_bits += b
        leaves += leaf
        proofs += cs or []
    head = b"FDPF" + bytes([3 if proof else 2, 1, 255, 0]) + struct.pack("<II", tau, m)
    shared = m >= 1
    body = bytes([0 if shared else 1]) + bytes(int(b) for b in bits) + bytes((-(1 + m)) % 8)
    body += struct.pack(f"<{1 if shared else m}Q", *([epoch] * (1 if shared else m)))
    body += struct.pack(f"<{len(leaves)}Q", *leaves)
    body += b"".join(struct.pack("<QQ", *s) for s in seeds)
    packed = bytearray((len(cw_bits) + 3) // 4)
    for i, b in enumerate(cw_bits):
        packed[i // 4] |= b << (2 * (i % 4))
    body += bytes(packed) + struct.pack(f"<{len(proofs)}Q", *proofs)
    return head + body


def reference_encode(params: SSAParams, indices, values, weights, rng) -> bytes:
    """SSA's client encode the straightforward way (same randomness, same order of draws)."""
    idx = np.asarray(indices, np.int64)
    payload = payload_words(params, values, weights, rng)
    table = simple_table_for(params)
    cuckoo = cuckoo_hash(idx, params.hash_params, seed=rng)
    row_of = {int(v): i for i, v in enumerate(idx)}
    num_bins = params.hash_params.num_bins
    alphas = [0] * params.num_keys
    slots = [EMPTY] * params.num_keys
    for b in range(num_bins):
        item = int(cuckoo.items[b])
        if item != EMPTY:
            alphas[b] = int(positions_in_bins(table, [b], [item])[0])
            slots[b] = row_of[item]
    for s, item in enumerate(cuckoo.stash.tolist()):
        if item != EMPTY:
            alphas[num_bins + s] = item
            slots[num_bins + s] = row_of[item]
    dummies = dummy_alphas(params, table)
    betas = np.zeros((params.num_keys, params.key_tau), np.uint64)
    for j, slot in enumerate(slots):
        if slot != EMPTY:
            betas[j, : params.tau] = payload[slot]
        else:
            if params.verify:
                alphas[j] = int(dummies[j])
            if checks_counts(params):
                betas[j, params.tau - 1] = one_word(params)
    bits = key_domain_bits(params, table)
    return reference_public(
        np.array(alphas, np.uint64), betas, bits, SEEDS, params.epoch, params.verify
    )


@settings(max_examples=12, deadline=None)
@given(
    log_m=st.integers(4, 11),
    rate=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    width=st.integers(1, 3),
    verify=st.booleans(),
    weighted=st.booleans(),
    stash=st.sampled_from([0, 2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_encode_matches_the_reference(log_m, rate, width, verify, weighted, stash, seed):
    m = 1 << log_m
    k = max(1, int(m * rate) // 4)
    # The reference covers the keys; the value check's trailer has its own tests
    # (test_projected_check.py, test_range_check.py).
    params = SSAParams(
        3,
        m,
        k,
        width,
        bytes(range(7, 23)),
        verify=verify,
        weighted=weighted,
        stash_size=stash,
        value_check="off",
    )
    rng = np.random.default_rng(seed)
    idx = rng.choice(m, size=int(rng.integers(0, k + 1)), replace=False)
    values = rng.normal(0.0, 0.1, (idx.size, width))
    weights = rng.integers(1, 9, idx.size).astype(float)
    upload, state = encode_update(
        params, idx, values, weights, rng=np.random.default_rng(seed), master_seeds=SEEDS
    )
    want = reference_encode(params, idx, values, weights, np.random.default_rng(seed))
    assert upload.public_part == want
    assert state.keys[0].public.to_bytes() == want  # the cached blob is the batch's bytes
    # and it decodes to the same batch, field by field
    assert dpf.DPFPublicBatch.from_bytes(want) == state.keys[0].public


@pytest.mark.parametrize("tau", [1, 2, 3, 4])
def test_generate_keys_batch_matches_the_reference(tau):
    rng = np.random.default_rng(tau)
    n = 150
    bits = rng.integers(0, 10, n)
    alphas = rng.integers(0, 2**62, n).astype(np.uint64) % (np.uint64(1) << bits.astype(np.uint64))
    betas = rng.integers(0, 2**63, (n, tau)).astype(np.uint64)
    proof = tau % 2 == 0
    k0, k1 = dpf.generate_keys_batch(
        alphas, betas, bits, master_seeds=SEEDS, epoch=5, verifiable=proof
    )
    want = reference_public(alphas, betas, bits, SEEDS, 5, proof)
    assert k0.public.to_bytes() == want
    assert k1.public is k0.public
    # key shares: header, root seeds, then the same body
    blob = k1.to_bytes()
    assert blob[16 + 16 * n :] == want[16:] and blob[:4] == b"FDPF" and blob[6] == 1
    assert dpf.DPFKeyBatch.from_bytes(blob) == k1
    assert not k0.public.cw_seeds.flags.writeable  # the cached blob cannot go stale


def test_cuckoo_rows_are_the_sorted_rows_of_each_bins_index():
    params = SSAParams(1, 1 << 10, 200, 1, bytes(16), stash_size=2)
    idx = np.sort(np.random.default_rng(2).choice(1 << 10, 200, replace=False))
    rows = np.empty(params.hash_params.num_bins, np.int64)
    table = cuckoo_hash(idx, params.hash_params, seed=3, rows=rows)
    assert np.array_equal(table.items, np.where(rows == EMPTY, EMPTY, idx[rows]))
