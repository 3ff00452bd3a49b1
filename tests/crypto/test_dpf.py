"""DPF correctness (whole domain, scalar and vector beta), batching, master seeds, key-share
independence from (alpha, beta), wire format and every malformed-key / bad-argument path."""

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import example, given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto import dpf
from flwr_fsl.crypto.dpf import (
    DPFKey,
    DPFKeyBatch,
    DPFKeyError,
    DPFPublicBatch,
    DPFPublicKey,
    evaluate,
    evaluate_at,
    evaluate_at_batch,
    evaluate_batch,
    generate_keys,
    generate_keys_batch,
)
from flwr_fsl.crypto.prg import MMO_KEY, MMO_KEY_LEFT, MMO_KEY_RIGHT, derive_root_seeds

U64 = np.uint64
MASK = (1 << 64) - 1


def point_function(alpha: int, beta: np.ndarray, domain_bits: int) -> np.ndarray:
    f = np.zeros((1 << domain_bits, beta.shape[0]), dtype=U64)
    f[alpha] = beta
    return f


@st.composite
def dpf_case(draw, max_bits=20, max_tau=5):
    d = draw(st.integers(0, max_bits))
    alpha = draw(st.integers(0, (1 << d) - 1))
    tau = draw(st.integers(1, max_tau))
    beta = np.array(draw(st.lists(st.integers(0, MASK), min_size=tau, max_size=tau)), dtype=U64)
    return d, alpha, beta


# ---------------------------------------------------------------- independent reference


def _mmo_one(key: bytes, x: int) -> int:
    """``AES_key(x) ^ x`` on one 128-bit little-endian block, with a fresh encryptor."""
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    ct = enc.update(x.to_bytes(16, "little")) + enc.finalize()
    return int.from_bytes(ct, "little") ^ x


def _reference_eval(key: DPFKey, x: int) -> list[int]:
    """Walk the BGI16 tree of one share at ``x`` block by block (the documented PRG, no batching).

    The PRG input is the whole block ``x = s | t`` (control bit ``t`` in bit 0 of the seed):
    children ``AES_{K_L}(x) ^ x`` / ``AES_{K_R}(x) ^ x``, control bit = bit 0 (then cleared);
    leaf words (seed with bit 0 clear): ``AES_K(s ^ (2 + q, e)) ^ s ^ (2 + q, e)`` under
    :data:`MMO_KEY`.
    """
    pub = key.public
    tau, d = pub.tau, pub.domain_bits
    group = 2 if tau % 2 else 1
    levels = max(d - (group - 1), 0)
    path, pos = (x >> 1, x & 1) if group == 2 and d >= 1 else (x, 0)
    s, t = int.from_bytes(key.seed, "little"), key.party
    for i in range(levels):
        bit = (path >> (levels - 1 - i)) & 1
        h = _mmo_one(MMO_KEY_RIGHT if bit else MMO_KEY_LEFT, s | t)
        tc, h = h & 1, h & ~1
        if t:
            h ^= int(pub.cw_seeds[i, 0]) | int(pub.cw_seeds[i, 1]) << 64
            tc ^= (int(pub.cw_bits[i]) >> bit) & 1
        s, t = h, tc
    words = []
    for q in range(group * tau // 2):
        h = _mmo_one(MMO_KEY, s ^ ((2 + q) | pub.epoch << 64))
        words += [h & MASK, h >> 64]
    y = [(w + t * int(c)) & MASK for w, c in zip(words, pub.cw_leaf, strict=True)]
    if key.party:
        y = [(-v) & MASK for v in y]
    return y[pos * tau : (pos + 1) * tau]


@pytest.mark.parametrize(("d", "tau"), [(0, 1), (1, 1), (5, 1), (6, 2), (4, 3), (3, 4), (7, 5)])
def test_engine_matches_block_by_block_reference(d, tau):
    rng = np.random.default_rng(d * 10 + tau)
    alpha = int(rng.integers(0, 1 << d))
    beta = rng.integers(0, 2**63, tau).astype(U64)
    k0, k1 = generate_keys(alpha, beta, d, epoch=3)
    for key in (k0, k1):
        want = np.array([_reference_eval(key, x) for x in range(1 << d)], dtype=U64)
        assert np.array_equal(evaluate(key), want)
        assert np.array_equal(evaluate_at(key, np.arange(1 << d)), want)
    assert np.array_equal(evaluate(k0) + evaluate(k1), point_function(alpha, beta, d))


# ---------------------------------------------------------------- correctness


@settings(max_examples=30)
@given(st.integers(0, 20), st.data())
@example(1, None)
@example(20, None)
def test_full_domain_scalar_beta(d, data):
    if data is None:
        alpha, beta = (1 << d) - 1, MASK
    else:
        alpha = data.draw(st.integers(0, (1 << d) - 1))
        beta = data.draw(st.integers(0, MASK))
    k0, k1 = generate_keys(alpha, beta, d)
    y = evaluate(k0) + evaluate(k1)
    assert y.shape == (1 << d, 1)
    assert np.array_equal(y, point_function(alpha, np.array([beta], dtype=U64), d))


@settings(max_examples=40)
@given(dpf_case(max_bits=12, max_tau=7))
def test_full_domain_vector_beta(case):
    d, alpha, beta = case
    k0, k1 = generate_keys(alpha, beta, d)
    assert k0.public.tau == beta.shape[0]
    y = evaluate(k0) + evaluate(k1)
    assert np.array_equal(y, point_function(alpha, beta, d))


@settings(max_examples=40)
@given(dpf_case(max_bits=20, max_tau=4), st.lists(st.integers(0, MASK), max_size=20))
def test_evaluate_at_matches_function(case, raw_points):
    d, alpha, beta = case
    points = np.array([p % (1 << d) for p in raw_points] + [alpha], dtype=U64)
    k0, k1 = generate_keys(alpha, beta, d)
    y = evaluate_at(k0, points) + evaluate_at(k1, points)
    want = np.where((points == alpha)[:, None], beta[None, :], U64(0))
    assert np.array_equal(y, want)


def test_shares_individually_look_random_and_sign():
    k0, k1 = generate_keys(5, 7, 6)
    y0, y1 = evaluate(k0), evaluate(k1)
    # Off the point the shares cancel but are not zero themselves.
    assert np.count_nonzero(y0) > 50
    assert np.array_equal(y0[:5] + y1[:5], np.zeros((5, 1), U64))


def test_wraparound_and_negative_beta():
    k0, k1 = generate_keys(3, -1, 4)
    assert (evaluate(k0) + evaluate(k1))[3, 0] == U64(MASK)
    k0, k1 = generate_keys(0, [1 << 64, -5, 2**63], 2)
    assert np.array_equal((evaluate(k0) + evaluate(k1))[0], np.array([0, MASK - 4, 2**63], U64))


def test_dummy_keys_are_zero_everywhere():
    k0, k1 = generate_keys(0, 0, 7)
    assert not np.any(evaluate(k0) + evaluate(k1))
    k0, k1 = generate_keys(0, [0, 0, 0], 0)
    assert not np.any(evaluate(k0) + evaluate(k1))


def test_scalar_equals_vector_of_one():
    seeds = (derive_root_seeds(b"a" * 16, 1).tobytes(), derive_root_seeds(b"b" * 16, 1).tobytes())
    a = generate_keys(9, 42, 5, root_seeds=seeds)
    b = generate_keys(9, np.array([42], U64), 5, root_seeds=seeds)
    assert a[0] == b[0] and a[1] == b[1]


def test_public_part_size():
    # tau odd: early termination, domain_bits - 1 levels; tau even: domain_bits levels.
    for tau, d, levels, words in ((1, 9, 8, 2), (3, 9, 8, 6), (2, 9, 9, 2), (1, 0, 0, 2)):
        k0, _ = generate_keys(0, [1] * tau, d)
        assert k0.public.cw_seeds.shape == (levels, 2)
        assert k0.public.cw_leaf.shape == (words,)
        # header, epoch_mode + domain byte padded to 8, one shared epoch, leaf, seed CWs,
        # control bits packed 4 levels per byte.
        assert len(k0.public.to_bytes()) == 16 + 8 + 8 + 8 * words + 16 * levels + (levels + 3) // 4


# ---------------------------------------------------------------- batching


def _mixed_batch(seed: int, m: int, tau: int, max_bits: int = 10):
    rng = np.random.default_rng(seed)
    d = rng.integers(0, max_bits + 1, m)
    d[:3] = [0, 1, max_bits]
    alphas = rng.integers(0, 2**63, m, dtype=np.int64).astype(U64) % (U64(1) << d.astype(U64))
    betas = rng.integers(0, 2**63, (m, tau), dtype=np.int64).astype(U64)
    betas[1] = 0  # a dummy key inside the batch
    return alphas, betas, d


@pytest.mark.parametrize("tau", [1, 2, 3, 6])
def test_batch_equals_one_by_one(tau):
    alphas, betas, d = _mixed_batch(tau, 60, tau)
    b0, b1 = generate_keys_batch(alphas, betas, d, master_seeds=(b"0" * 16, b"1" * 16))
    v0, off = evaluate_batch(b0)
    v1, off1 = evaluate_batch(b1)
    assert np.array_equal(off, off1)
    assert off[-1] == int((np.int64(1) << d.astype(np.int64)).sum())
    for j in range(60):
        k0, k1 = b0.key(j), b1.key(j)
        assert np.array_equal(v0[off[j] : off[j + 1]], evaluate(k0))
        assert np.array_equal(v1[off[j] : off[j + 1]], evaluate(k1))
        want = point_function(int(alphas[j]), betas[j], int(d[j]))
        assert np.array_equal(v0[off[j] : off[j + 1]] + v1[off[j] : off[j + 1]], want)
    # Point evaluation, batched (shuffled keys, repeated keys) and one by one.
    rng = np.random.default_rng(99)
    idx = rng.integers(0, 60, 300)
    pts = (rng.integers(0, 2**62, 300).astype(U64)) % (U64(1) << d[idx].astype(U64))
    p0 = evaluate_at_batch(b0, idx, pts)
    for i in range(0, 300, 37):
        assert np.array_equal(p0[i : i + 1], evaluate_at(b0.key(int(idx[i])), [pts[i]]))
    assert np.array_equal(p0, v0[off[idx] + pts.astype(np.int64)])


def test_batch_with_deep_keys_splits_into_tasks(monkeypatch):
    # Small chunk budget: forces subtree tasks, several chunks and mixed heights per chunk.
    monkeypatch.setattr(dpf, "_FD_BUDGET", 64)
    alphas, betas, d = _mixed_batch(5, 40, 1, max_bits=12)
    b0, b1 = generate_keys_batch(alphas, betas, d)
    v0, off = evaluate_batch(b0)
    v1, _ = evaluate_batch(b1)
    for j in range(40):
        want = point_function(int(alphas[j]), betas[j], int(d[j]))
        assert np.array_equal(v0[off[j] : off[j + 1]] + v1[off[j] : off[j + 1]], want)


def test_wide_tau_leaf_larger_than_budget(monkeypatch):
    monkeypatch.setattr(dpf, "_FD_BUDGET", 16)
    beta = np.arange(1, 41, dtype=U64)
    k0, k1 = generate_keys(13, beta, 5)
    assert np.array_equal(evaluate(k0) + evaluate(k1), point_function(13, beta, 5))


def test_deep_key_default_budget():
    k0, k1 = generate_keys(70_000, 3, 17)
    y = evaluate(k0) + evaluate(k1)
    assert np.flatnonzero(y[:, 0]).tolist() == [70_000] and y[70_000, 0] == 3


def test_lengths_truncation_and_out_buffer():
    alphas, betas, d = _mixed_batch(3, 30, 3)
    b0, _ = generate_keys_batch(alphas, betas, d)
    full, off = evaluate_batch(b0)
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, (np.int64(1) << d.astype(np.int64)) + 1)
    part, poff = evaluate_batch(b0, lengths=lengths)
    assert np.array_equal(np.diff(poff), lengths)
    for j in range(30):
        assert np.array_equal(part[poff[j] : poff[j + 1]], full[off[j] : off[j] + lengths[j]])
    out = np.full_like(full, 7)
    got, _ = evaluate_batch(b0, out=out)
    assert got is out and np.array_equal(out, full)
    empty, eoff = evaluate_batch(b0, lengths=np.zeros(30, np.int64))
    assert empty.shape == (0, 3) and not eoff.any()


def test_master_seed_keys_equal_explicitly_seeded():
    alphas, betas, d = _mixed_batch(8, 25, 3)
    msk = (bytes(range(16)), bytes(range(1, 17)))
    b0, b1 = generate_keys_batch(alphas, betas, d, master_seeds=msk)
    r0, r1 = derive_root_seeds(msk[0], 25), derive_root_seeds(msk[1], 25)
    for j in range(25):
        k0, k1 = generate_keys(
            int(alphas[j]), betas[j], int(d[j]), root_seeds=(r0[j].tobytes(), r1[j].tobytes())
        )
        assert b0.key(j) == k0 and b1.key(j) == k1
    # A server rebuilds its shares from the public part and its master seed only.
    pub = DPFPublicBatch.from_bytes(b0.public.to_bytes())
    assert DPFKeyBatch.from_master_seed(1, pub, msk[1]) == b1
    assert DPFKeyBatch.from_keys([b0.key(j) for j in range(25)]) == b0
    # Same master seeds, same inputs: deterministic.
    assert generate_keys_batch(alphas, betas, d, master_seeds=msk)[0] == b0


def test_empty_batch():
    b0, _ = generate_keys_batch(np.zeros(0, U64), np.zeros((0, 2), U64), np.zeros(0, np.int64))
    v, off = evaluate_batch(b0)
    assert v.shape == (0, 2) and off.tolist() == [0]
    assert evaluate_at_batch(b0, [], []).shape == (0, 2)
    assert DPFKeyBatch.from_bytes(b0.to_bytes()) == b0


# ---------------------------------------------------------------- privacy of one share


def _bit_matrix(blobs: list[bytes]) -> np.ndarray:
    arr = np.frombuffer(b"".join(blobs), dtype=np.uint8).reshape(len(blobs), -1)
    return np.unpackbits(arr, axis=1).astype(np.int64)


def _assert_independent(a: np.ndarray, b: np.ndarray) -> None:
    """Fail unless two (n, bits) samples look like the same distribution of fair coins."""
    n = a.shape[0]
    ca, cb = a.sum(axis=0), b.sum(axis=0)
    constant = ((ca == 0) | (ca == n)) & ((cb == 0) | (cb == n))
    # Structural bits (header, sizes, the reserved control-bit position) are the same constants.
    assert np.array_equal(ca[constant], cb[constant])
    ca, cb = ca[~constant], cb[~constant]
    k = ca.shape[0]
    assert k > 1000  # seeds, correction words and leaf word really vary
    # Each varying bit is a fair coin in both populations ...
    for c in (ca, cb):
        chi2 = (((c - n / 2) ** 2) / (n / 4)).sum()
        assert abs(chi2 - k) < 5 * np.sqrt(2 * k), chi2
    # ... and the two populations agree position by position (two-proportion chi-square).
    p = (ca + cb) / (2 * n)
    z2 = ((ca - cb) / n) ** 2 / (p * (1 - p) * 2 / n)
    assert abs(z2.sum() - k) < 5 * np.sqrt(2 * k), z2.sum()
    assert z2.max() < 36  # no single bit position deviates by 6 sigma


def _party0_views(n: int = 3000, d: int = 8) -> list[np.ndarray]:
    views = []
    for alpha, beta, msk in ((3, 1, b"A" * 16), (200, MASK, b"B" * 16)):
        b0, _ = generate_keys_batch(
            np.full(n, alpha, U64), np.full(n, beta, U64), d, master_seeds=(msk, b"C" * 16)
        )
        views.append(_bit_matrix([b0.key(j).to_bytes() for j in range(n)]))
    return views


def test_key_share_independent_of_alpha_and_beta():
    """Bit frequencies of party-0 shares for (alpha, beta) = (3, 1) vs (200, 2**64 - 1)."""
    a, b = _party0_views()
    _assert_independent(a, b)


def test_independence_check_detects_a_small_leak():
    a, b = _party0_views(n=3000)
    # Leak one bit of alpha (3 vs 200 differ in bit 0) through one biased position.
    rng = np.random.default_rng(0)
    leak_a, leak_b = a.copy(), b.copy()
    leak_a[:, -1] = rng.random(a.shape[0]) < 0.5
    leak_b[:, -1] = rng.random(a.shape[0]) < 0.6
    with pytest.raises(AssertionError):
        _assert_independent(leak_a, leak_b)


# ---------------------------------------------------------------- wire format


def _key_blob(tau: int = 1, d: int = 5) -> tuple[DPFKey, bytes]:
    k0, _ = generate_keys(3, [7] * tau, d)
    return k0, k0.to_bytes()


def test_round_trips():
    k0, blob = _key_blob(3, 6)
    assert DPFKey.from_bytes(blob) == k0
    assert DPFPublicKey.from_bytes(k0.public.to_bytes()) == k0.public
    alphas, betas, d = _mixed_batch(1, 17, 2)
    b0, _ = generate_keys_batch(alphas, betas, d)
    assert DPFKeyBatch.from_bytes(b0.to_bytes()) == b0
    assert DPFPublicBatch.from_bytes(b0.public.to_bytes()) == b0.public
    assert DPFKeyBatch.from_bytes(bytearray(b0.to_bytes())) == b0
    assert k0 != b0 and k0.public != k0 and b0.public != b0


def _patched(blob: bytes, offset: int, value: bytes) -> bytes:
    return blob[:offset] + value + blob[offset + len(value) :]


def _body_offsets(m: int, tau: int, n_levels: int, seeds: bool = True, shared: bool = True):
    """Field offsets inside a v2 blob (key shares, or a public part with ``seeds=False``)."""
    w = (2 if tau % 2 else 1) * tau
    mode = 16 + (16 * m if seeds else 0)
    dbits = mode + 1
    pad = dbits + m
    epochs = pad + (-(1 + m)) % 8
    leaf = epochs + 8 * (1 if shared else m)
    cw_seeds = leaf + 8 * m * w
    cw_bits = cw_seeds + 16 * n_levels
    end = cw_bits + (n_levels + 3) // 4
    return {
        "mode": mode,
        "dbits": dbits,
        "pad": pad,
        "epochs": epochs,
        "leaf": leaf,
        "cw_seeds": cw_seeds,
        "cw_bits": cw_bits,
        "end": end,
    }


def test_layout_offsets_match_the_fields():
    """The documented v2 layout, field by field, for a mixed-domain batch of both kinds."""
    alphas, betas, d = _mixed_batch(3, 11, 3)
    b0, _ = generate_keys_batch(alphas, betas, d)
    pub = b0.public
    n_levels = int(pub.level_offsets[-1])
    for blob, seeds in ((b0.to_bytes(), True), (pub.to_bytes(), False)):
        o = _body_offsets(11, 3, n_levels, seeds=seeds)
        assert len(blob) == o["end"]
        assert blob[o["mode"]] == 0
        assert blob[o["dbits"] : o["pad"]] == pub.domain_bits.tobytes()
        assert not any(blob[o["pad"] : o["epochs"]]) and (o["epochs"] - o["mode"]) % 8 == 0
        assert blob[o["epochs"] : o["leaf"]] == bytes(8)
        assert blob[o["leaf"] : o["cw_seeds"]] == pub.cw_leaf.astype("<u8").tobytes()
        assert blob[o["cw_seeds"] : o["cw_bits"]] == pub.cw_seeds.astype("<u8").tobytes()
        packed = np.frombuffer(blob[o["cw_bits"] :], np.uint8)
        for i in range(n_levels):
            assert (int(packed[i // 4]) >> (2 * (i % 4))) & 3 == pub.cw_bits[i]
        if seeds:
            assert blob[16 : o["mode"]] == b0.root_seeds.astype("<u8").tobytes()


def _mixed_epoch_batch() -> DPFKeyBatch:
    """Five keys at epochs 0, 9, 0, 2**64 - 1, 9 (one-key batches updated to those epochs)."""
    keys = []
    for j, epoch in enumerate((0, 9, 0, 2**64 - 1, 9)):
        k0, _ = generate_keys(j, [j + 1, 2], j + 2, epoch=epoch)
        keys.append(k0)
    return DPFKeyBatch.from_keys(keys)


def test_round_trip_uniform_and_mixed_epochs():
    # Uniform, at a non-zero epoch: mode 0 and one u64.
    alphas, betas, d = _mixed_batch(4, 9, 2)
    u0, _ = generate_keys_batch(alphas, betas, d, epoch=2**63 + 5)
    pub = u0.public
    n_levels = int(pub.level_offsets[-1])
    blob = u0.to_bytes()
    o = _body_offsets(9, 2, n_levels)
    assert len(blob) == o["end"] and blob[o["mode"]] == 0
    assert blob[o["epochs"] : o["leaf"]] == (2**63 + 5).to_bytes(8, "little")
    back = DPFKeyBatch.from_bytes(blob)
    assert back == u0 and back.public.epochs.tolist() == [2**63 + 5] * 9
    assert back.public.epochs.dtype == U64 and back.to_bytes() == blob
    # Mixed: mode 1 and one u64 per key; every key keeps its own epoch.
    mixed = _mixed_epoch_batch()
    pub = mixed.public
    n_levels = int(pub.level_offsets[-1])
    blob = mixed.to_bytes()
    o = _body_offsets(5, 2, n_levels, shared=False)
    assert len(blob) == o["end"] and blob[o["mode"]] == 1
    assert blob[o["epochs"] : o["leaf"]] == pub.epochs.astype("<u8").tobytes()
    back = DPFKeyBatch.from_bytes(blob)
    assert back == mixed and back.to_bytes() == blob
    assert back.public.epochs.tolist() == [0, 9, 0, 2**64 - 1, 9]
    for j in range(5):
        assert back.key(j) == mixed.key(j)
        assert back.key(j).public.epoch == int(pub.epochs[j])
    assert DPFPublicBatch.from_bytes(pub.to_bytes()) == pub
    # A one-key batch is always mode 0; the empty batch is mode 1 with no epochs.
    k0, _ = generate_keys(1, [2, 3], 4, epoch=7)
    assert k0.to_bytes()[32] == 0 and DPFKey.from_bytes(k0.to_bytes()).public.epoch == 7
    e0, _ = generate_keys_batch(np.zeros(0, U64), np.zeros((0, 1), U64), np.zeros(0, np.int64))
    assert e0.public.to_bytes()[16:] == b"\x01" + bytes(7)
    assert DPFPublicBatch.from_bytes(e0.public.to_bytes()) == e0.public


def test_epoch_mode_must_be_canonical():
    mixed = _mixed_epoch_batch()
    blob = mixed.public.to_bytes()
    o = _body_offsets(5, 2, 0, seeds=False)
    for mode in (2, 0x80, 0xFF):
        with pytest.raises(DPFKeyError, match="epoch_mode"):
            DPFPublicBatch.from_bytes(_patched(blob, o["mode"], bytes([mode])))
    # Mixed epochs claimed as shared: the blob is then 32 bytes too long.
    with pytest.raises(DPFKeyError, match="trailing"):
        DPFPublicBatch.from_bytes(_patched(blob, o["mode"], b"\x00"))
    # Per-key mode whose epochs are all equal is a second encoding of a mode-0 key set.
    same = _patched(blob, o["epochs"], bytes(40))
    with pytest.raises(DPFKeyError, match="share one epoch"):
        DPFPublicBatch.from_bytes(same)
    uniform = generate_keys_batch([1, 2], [3, 4], 5)[0].public
    ublob = uniform.to_bytes()
    uo = _body_offsets(2, 1, 0, seeds=False)
    as_per_key = b"".join(
        [ublob[: uo["mode"]], b"\x01", ublob[uo["dbits"] : uo["leaf"]], ublob[uo["epochs"] :]]
    )
    with pytest.raises(DPFKeyError, match="share one epoch"):
        DPFPublicBatch.from_bytes(as_per_key)
    # The empty batch has one encoding too: mode 0 would need an epoch for no keys.
    e0, _ = generate_keys_batch(np.zeros(0, U64), np.zeros((0, 1), U64), np.zeros(0, np.int64))
    eblob = e0.public.to_bytes()
    with pytest.raises(DPFKeyError, match="at least one key"):
        DPFPublicBatch.from_bytes(_patched(eblob, 16, b"\x00") + bytes(8))
    with pytest.raises(DPFKeyError, match="truncated"):
        DPFPublicBatch.from_bytes(_patched(eblob, 16, b"\x00"))


def test_truncated_at_every_field_boundary():
    """Cut a blob at each field boundary (and one byte either side): always DPFKeyError."""
    cases = []
    mixed = _mixed_epoch_batch()
    alphas, betas, d = _mixed_batch(5, 13, 1)
    u0, _ = generate_keys_batch(alphas, betas, d)
    for batch, shared in ((mixed, False), (u0, True)):
        m, tau = batch.public.num_keys, batch.public.tau
        n_levels = int(batch.public.level_offsets[-1])
        cases.append((batch.to_bytes(), DPFKeyBatch, _body_offsets(m, tau, n_levels, True, shared)))
        o = _body_offsets(m, tau, n_levels, False, shared)
        cases.append((batch.public.to_bytes(), DPFPublicBatch, o))
    for blob, cls, o in cases:
        assert len(blob) == o["end"]
        cuts = {0, 4, 8, 15, 16, 17} | {c + e for c in o.values() for e in (-1, 0, 1)}
        for cut in sorted(c for c in cuts if 0 <= c < len(blob)):
            with pytest.raises(DPFKeyError, match=r"truncated|trailing"):
                cls.from_bytes(blob[:cut])
        assert cls.from_bytes(blob).to_bytes() == blob
        with pytest.raises(DPFKeyError, match="trailing"):
            cls.from_bytes(blob + b"\0")


def test_truncated_and_trailing():
    _, blob = _key_blob()
    for cut in (0, 5, 15, 16, 20, 40, len(blob) - 17, len(blob) - 1):
        with pytest.raises(DPFKeyError, match=r"truncated|trailing"):
            DPFKey.from_bytes(blob[:cut])
    with pytest.raises(DPFKeyError, match="trailing"):
        DPFKey.from_bytes(blob + b"\0")
    with pytest.raises(DPFKeyError, match="expected bytes"):
        DPFKey.from_bytes("text")  # type: ignore[arg-type]


def test_bad_header_fields():
    _, blob = _key_blob()
    assert blob[4] == 2
    cases = {
        "magic": _patched(blob, 0, b"XDPF"),
        "version": _patched(blob, 4, b"\x01"),  # v1 (byte per control-bit level) is not read
        "kind": _patched(blob, 5, b"\x01"),
        "party": _patched(blob, 6, b"\x02"),
        "reserved": _patched(blob, 7, b"\x01"),
    }
    for what, bad in cases.items():
        with pytest.raises(DPFKeyError, match=what if what != "reserved" else "reserved"):
            DPFKey.from_bytes(bad)
    pub = DPFPublicKey.from_bytes(_key_blob()[0].public.to_bytes())
    with pytest.raises(DPFKeyError, match="party"):
        DPFPublicKey.from_bytes(_patched(pub.to_bytes(), 6, b"\x00"))
    with pytest.raises(DPFKeyError, match="kind"):
        DPFPublicKey.from_bytes(blob)


def test_wrong_domain():
    _, blob = _key_blob(1, 5)
    o = _body_offsets(1, 1, 4)
    with pytest.raises(DPFKeyError, match="wrong domain"):
        DPFKey.from_bytes(_patched(blob, o["dbits"], bytes([64])))
    for d in (4, 6, 0):  # changes the number of levels: the length no longer matches
        with pytest.raises(DPFKeyError, match=r"truncated|trailing"):
            DPFKey.from_bytes(_patched(blob, o["dbits"], bytes([d])))
    with pytest.raises(DPFKeyError, match="padding"):
        DPFKey.from_bytes(_patched(blob, o["pad"], b"\x01"))


def test_wrong_tau():
    _, blob = _key_blob(1, 5)
    with pytest.raises(DPFKeyError, match="tau"):
        DPFKey.from_bytes(_patched(blob, 8, (0).to_bytes(4, "little")))
    with pytest.raises(DPFKeyError, match="tau"):
        DPFKey.from_bytes(_patched(blob, 8, (dpf.MAX_TAU + 1).to_bytes(4, "little")))
    for tau in (2, 3, 4):  # changes the leaf and level sizes: caught by the length check
        with pytest.raises(DPFKeyError, match=r"truncated|trailing"):
            DPFKey.from_bytes(_patched(blob, 8, tau.to_bytes(4, "little")))


def test_wrong_key_count():
    alphas, betas, d = _mixed_batch(2, 4, 1)
    b0, _ = generate_keys_batch(alphas, betas, d)
    with pytest.raises(DPFKeyError, match="one key"):
        DPFKey.from_bytes(b0.to_bytes())
    with pytest.raises(DPFKeyError, match="one key"):
        DPFPublicKey.from_bytes(b0.public.to_bytes())
    for m in (3, 5, 2**32 - 1):  # shifts every field after the seeds
        shifted = r"truncated|trailing|wrong domain|epoch_mode|padding"
        with pytest.raises(DPFKeyError, match=shifted):
            DPFKeyBatch.from_bytes(_patched(b0.to_bytes(), 12, m.to_bytes(4, "little")))


def test_bad_control_bits():
    # Every 2-bit pattern is a valid correction, so the only invalid packed encodings are
    # non-zero padding bits in the last byte (here: 3 levels, bits 6-7 are padding).
    _, blob = _key_blob(1, 4)
    o = _body_offsets(1, 1, 3)
    assert len(blob) == o["end"] == o["cw_bits"] + 1
    last = blob[o["cw_bits"]]
    assert last < 0x40
    for value in (last | 0x40, last | 0x80, last | 0xC0):
        with pytest.raises(DPFKeyError, match="bad control bits: non-zero padding"):
            DPFKey.from_bytes(_patched(blob, o["cw_bits"], bytes([value])))
    for n_levels, pad_bits in ((1, 0xFC), (2, 0xF0), (3, 0xC0)):
        k0, _ = generate_keys(0, [1], n_levels + 1)
        kb = k0.to_bytes()
        at = _body_offsets(1, 1, n_levels)["cw_bits"]
        for bit in range(8):
            flipped = _patched(kb, at, bytes([kb[at] ^ (1 << bit)]))
            if pad_bits >> bit & 1:
                with pytest.raises(DPFKeyError, match="padding"):
                    DPFKey.from_bytes(flipped)
            else:  # a control-bit position: still well-formed, just another key
                assert (
                    DPFKey.from_bytes(flipped).public.cw_bits[bit // 2]
                    != k0.public.cw_bits[bit // 2]
                )
    # Four levels fill the byte: no padding, all 256 values decode.
    k0, _ = generate_keys(0, [1], 5)
    kb = k0.to_bytes()
    at = _body_offsets(1, 1, 4)["cw_bits"]
    assert len(kb) == at + 1
    for value in range(256):
        got = DPFKey.from_bytes(_patched(kb, at, bytes([value]))).public.cw_bits
        assert got.tolist() == [(value >> (2 * i)) & 3 for i in range(4)]
    seed_lo = blob[o["cw_seeds"] + 16]
    with pytest.raises(DPFKeyError, match="bad control bits"):
        DPFKey.from_bytes(_patched(blob, o["cw_seeds"] + 16, bytes([seed_lo | 1])))
    root_lo = blob[16]
    with pytest.raises(DPFKeyError, match="bad control bits"):
        DPFKey.from_bytes(_patched(blob, 16, bytes([root_lo | 1])))


def test_dataclass_validation():
    k0, _ = _key_blob(1, 5)
    pub = k0.public
    good = {
        "tau": 1,
        "domain_bits": np.array([5], np.uint8),
        "epochs": np.zeros(1, U64),
        "cw_seeds": pub.cw_seeds,
        "cw_bits": pub.cw_bits,
        "cw_leaf": pub.cw_leaf.reshape(1, -1),
    }
    DPFPublicBatch(**good)
    bad_cases = [
        ({"tau": 0}, "tau"),
        ({"tau": True}, "tau"),
        ({"domain_bits": np.array([[5]], np.uint8)}, "domain_bits"),
        ({"domain_bits": np.array([64], np.int64)}, "domain_bits"),
        ({"epochs": np.zeros(2, U64)}, "epochs"),
        ({"cw_seeds": pub.cw_seeds.astype(np.int64)}, "cw_seeds"),
        ({"cw_seeds": pub.cw_seeds[:3]}, "cw_seeds"),
        ({"cw_bits": [0, 1, 2, 3]}, "cw_bits"),
        ({"cw_bits": np.array([0, 1, 2, 7], np.uint8)}, "bad control bits"),
        ({"cw_leaf": pub.cw_leaf}, "cw_leaf"),
    ]
    for change, msg in bad_cases:
        with pytest.raises(DPFKeyError, match=msg):
            DPFPublicBatch(**{**good, **change})
    with pytest.raises(DPFKeyError, match="party"):
        DPFKey(party=2, seed=k0.seed, public=pub)
    with pytest.raises(DPFKeyError, match="seed"):
        DPFKey(party=0, seed=b"short", public=pub)
    with pytest.raises(DPFKeyError, match="public"):
        DPFKey(party=0, seed=k0.seed, public=pub.as_batch())  # type: ignore[arg-type]
    with pytest.raises(DPFKeyError, match="domain_bits"):
        DPFPublicKey(64, 1, 0, pub.cw_seeds, pub.cw_bits, pub.cw_leaf)
    with pytest.raises(DPFKeyError, match="domain_bits"):
        DPFPublicKey(5.0, 1, 0, pub.cw_seeds, pub.cw_bits, pub.cw_leaf)  # type: ignore[arg-type]
    with pytest.raises(DPFKeyError, match="epoch"):
        DPFPublicKey(5, 1, -1, pub.cw_seeds, pub.cw_bits, pub.cw_leaf)
    with pytest.raises(DPFKeyError, match="cw_leaf"):
        DPFPublicKey(5, 1, 0, pub.cw_seeds, pub.cw_bits, pub.cw_leaf.tolist())  # type: ignore[arg-type]
    batch = k0.as_batch()
    with pytest.raises(DPFKeyError, match="root_seeds"):
        DPFKeyBatch(party=0, root_seeds=np.zeros((2, 2), U64), public=batch.public)
    with pytest.raises(DPFKeyError, match="public"):
        DPFKeyBatch(party=0, root_seeds=batch.root_seeds, public=pub)  # type: ignore[arg-type]
    with pytest.raises(DPFKeyError, match="master seed"):
        DPFKeyBatch.from_master_seed(0, batch.public, b"short")
    k0b, k1b = generate_keys(1, [1, 2], 3)
    with pytest.raises(DPFKeyError, match="no keys"):
        DPFKeyBatch.from_keys([])
    with pytest.raises(DPFKeyError, match="parties"):
        DPFKeyBatch.from_keys([k0b, k1b])
    with pytest.raises(DPFKeyError, match="tau"):
        DPFKeyBatch.from_keys([k0, k0b])
    with pytest.raises(DPFKeyError, match="nothing"):
        DPFPublicBatch.concatenate([])


# ---------------------------------------------------------------- bad arguments


def test_generate_argument_errors():
    with pytest.raises(ConfigurationError, match="outside"):
        generate_keys(8, 1, 3)
    with pytest.raises(ConfigurationError, match="outside"):
        generate_keys(-1, 1, 3)
    with pytest.raises(ConfigurationError, match="domain_bits"):
        generate_keys(0, 1, 64)
    with pytest.raises(ConfigurationError, match="domain_bits"):
        generate_keys(0, 1, 2.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="alpha"):
        generate_keys(1.0, 1, 2)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="Z_2"):
        generate_keys(0, 1.5, 2)
    with pytest.raises(ConfigurationError, match="beta"):
        generate_keys(0, [[1, 2]], 2)
    with pytest.raises(ConfigurationError, match="beta"):
        generate_keys(0, [], 2)
    with pytest.raises(ConfigurationError, match="integers"):
        generate_keys(0, ["a"], 2)
    with pytest.raises(ConfigurationError, match="root_seeds"):
        generate_keys(0, 1, 2, root_seeds=(bytes(16),))  # type: ignore[arg-type]
    with pytest.raises(DPFKeyError, match="bad control bits"):
        generate_keys(0, 1, 2, root_seeds=(b"\x01" + bytes(15), bytes(16)))
    with pytest.raises(ConfigurationError, match="epoch"):
        generate_keys(0, 1, 2, epoch=-1)
    with pytest.raises(ConfigurationError, match="below 2"):
        generate_keys_batch([4], [1], [2])
    with pytest.raises(ConfigurationError, match="1-D"):
        generate_keys_batch([[1]], [1], [2])
    with pytest.raises(ConfigurationError, match="betas"):
        generate_keys_batch([1, 2], [1, 2, 3], 3)
    with pytest.raises(ConfigurationError, match="domain_bits"):
        generate_keys_batch([1, 2], [1, 2], [3])
    with pytest.raises(ConfigurationError, match="domain_bits"):
        generate_keys_batch([1, 2], [1, 2], [3, 70])
    with pytest.raises(ConfigurationError, match="domain_bits"):
        generate_keys_batch([1], [1], [3.0])
    with pytest.raises(ConfigurationError, match="non-negative"):
        generate_keys_batch([-1], [1], 3)
    with pytest.raises(ConfigurationError, match="master_seeds"):
        generate_keys_batch([1], [1], 3, master_seeds=(bytes(16),))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="16 bytes"):
        generate_keys_batch([1], [1], 3, master_seeds=(bytes(16), b"x"))


def test_evaluate_argument_errors():
    k0, _ = generate_keys(1, 1, 3)
    with pytest.raises(ConfigurationError, match="below 2"):
        evaluate_at(k0, [8])
    with pytest.raises(ConfigurationError, match="non-negative"):
        evaluate_at(k0, [-1])
    with pytest.raises(ConfigurationError, match="integers"):
        evaluate_at(k0, [1.0])
    b = k0.as_batch()
    with pytest.raises(ConfigurationError, match="out of range"):
        evaluate_at_batch(b, [1], [0])
    with pytest.raises(ConfigurationError, match="one length"):
        evaluate_at_batch(b, [0, 0], [0])
    with pytest.raises(ConfigurationError, match="lengths"):
        evaluate_batch(b, lengths=[9])
    with pytest.raises(ConfigurationError, match="lengths"):
        evaluate_batch(b, lengths=[1, 2])
    with pytest.raises(ConfigurationError, match="out"):
        evaluate_batch(b, out=np.empty((8, 2), U64))
    with pytest.raises(ConfigurationError, match="out"):
        evaluate_batch(b, out=np.empty((8, 1), np.int64))  # type: ignore[arg-type]
    good = evaluate_batch(b)[0]
    frozen = np.empty_like(good)
    frozen.flags.writeable = False
    with pytest.raises(ConfigurationError, match=r"out must be a writeable.*\(read-only\)"):
        evaluate_batch(b, out=frozen)
    strided = np.empty((good.shape[0], 2 * good.shape[1]), U64)[:, ::2]
    with pytest.raises(ConfigurationError, match="not C-contiguous"):
        evaluate_batch(b, out=strided)
