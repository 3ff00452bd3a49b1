"""DCF (Boyle et al. EUROCRYPT'21) correctness: exhaustive on small domains, hypothesis up to
64-bit domains and vector payloads, the batched engine against a block-by-block reference of the
documented PRG, master seeds, key-share independence from (alpha, beta), and the strict wire
format (truncation, trailing bytes, every header field, non-canonical bits, fuzzing)."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.crypto import dcf
from flwr_fsl.crypto.dcf import (
    MMO_KEY_DCF,
    DCFKeyBatch,
    DCFKeyError,
    DCFPublicBatch,
    evaluate_at,
    evaluate_at_batch,
    evaluate_paired,
    generate_keys,
    generate_keys_batch,
    public_size,
)

U64 = np.uint64
MASK = (1 << 64) - 1


def comparison(alpha: int, beta: np.ndarray, points: np.ndarray) -> np.ndarray:
    return np.where((points.astype(object) < alpha)[:, None], beta[None, :], U64(0)).astype(U64)


def reconstruct(k0: DCFKeyBatch, k1: DCFKeyBatch, points: np.ndarray) -> np.ndarray:
    return evaluate_at(k0, points) + evaluate_at(k1, points)


# ---------------------------------------------------------------- correctness


@pytest.mark.parametrize("tau", [1, 2, 3])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_exhaustive_small_domains(n: int, tau: int) -> None:
    points = np.arange(1 << n, dtype=U64)
    beta = np.array([7, MASK, 1 << 63][:tau], dtype=U64)
    for alpha in range(1 << n):
        k0, k1 = generate_keys(alpha, beta, n)
        assert np.array_equal(reconstruct(k0, k1, points), comparison(alpha, beta, points))


def test_exhaustive_batch_of_every_alpha() -> None:
    """One batch holding a key for every alpha of an 8-bit domain, each at every point."""
    n = 8
    alphas = np.arange(1 << n, dtype=U64)
    betas = np.arange(1, (1 << n) + 1, dtype=U64)
    k0, k1 = generate_keys_batch(alphas, betas, n)
    idx = np.repeat(np.arange(1 << n), 1 << n)
    pts = np.tile(np.arange(1 << n, dtype=U64), 1 << n)
    y = (evaluate_at_batch(k0, idx, pts) + evaluate_at_batch(k1, idx, pts))[:, 0]
    expected = np.where(pts < alphas[idx], betas[idx], U64(0))
    assert np.array_equal(y, expected)


@st.composite
def dcf_case(draw, max_bits: int = 64, max_tau: int = 4):  # type: ignore[no-untyped-def]
    n = draw(st.integers(1, max_bits))
    alpha = draw(st.integers(0, (1 << n) - 1))
    tau = draw(st.integers(1, max_tau))
    beta = np.array(draw(st.lists(st.integers(0, MASK), min_size=tau, max_size=tau)), dtype=U64)
    near = [alpha - 1, alpha, alpha + 1, 0, (1 << n) - 1]
    extra = draw(st.lists(st.integers(0, (1 << n) - 1), max_size=6))
    points = np.array([p for p in near + extra if 0 <= p < 1 << n], dtype=U64)
    return n, alpha, beta, points


@given(dcf_case())
def test_comparison_function_at_random_points(case) -> None:  # type: ignore[no-untyped-def]
    n, alpha, beta, points = case
    k0, k1 = generate_keys(alpha, beta, n)
    assert np.array_equal(reconstruct(k0, k1, points), comparison(alpha, beta, points))


def test_negative_beta_wraps_and_shares_look_random() -> None:
    k0, k1 = generate_keys(100, [-1, -5], 16)
    y0 = evaluate_at(k0, [5, 200])
    assert np.array_equal(y0 + evaluate_at(k1, [5, 200]), [[MASK, MASK - 4], [0, 0]])
    assert np.all(y0 != 0)  # a single share is a pseudorandom word, not the value


@given(st.integers(1, 40), st.integers(1, 200), st.integers(0, 2**32))
@settings(max_examples=20)
def test_paired_batch_equals_one_by_one(n: int, m: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    alphas = rng.integers(0, 1 << n, m, dtype=U64)
    betas = rng.integers(0, 1 << 63, (m, 2), dtype=U64)
    points = rng.integers(0, 1 << n, m, dtype=U64)
    msk = (rng.bytes(16), rng.bytes(16))
    k0, k1 = generate_keys_batch(alphas, betas, n, master_seeds=msk)
    got = evaluate_paired(k0, points) + evaluate_paired(k1, points)
    assert np.array_equal(got, np.where((points < alphas)[:, None], betas, U64(0)))
    # Rebuilt from the master seeds and the public part alone, the shares are the same keys.
    assert DCFKeyBatch.from_master_seed(0, msk[0], k0.public) == k0
    assert DCFKeyBatch.from_master_seed(1, msk[1], k1.public) == k1


def test_chunking_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    alphas = rng.integers(0, 1 << 20, 77, dtype=U64)
    points = rng.integers(0, 1 << 20, 77, dtype=U64)
    msk = (b"a" * 16, b"b" * 16)
    ref = generate_keys_batch(alphas, alphas, 20, master_seeds=msk)
    ref_y = evaluate_paired(ref[0], points)
    monkeypatch.setattr(dcf, "_CHUNK", 8)
    monkeypatch.setattr(dcf, "_GEN_CHUNK", 8)
    small = generate_keys_batch(alphas, alphas, 20, master_seeds=msk)
    assert small[0] == ref[0] and small[1] == ref[1]
    assert np.array_equal(evaluate_paired(small[0], points), ref_y)


def test_empty_batch() -> None:
    k0, k1 = generate_keys_batch(np.zeros(0, U64), np.zeros((0, 3), U64), 9)
    assert k0.num_keys == 0 and k0.public.tau == 3
    assert evaluate_at_batch(k0, [], []).shape == (0, 3)
    assert DCFKeyBatch.from_bytes(k1.to_bytes()) == k1


# ---------------------------------------------------------------- independent reference


def _h(block: int) -> int:
    enc = Cipher(algorithms.AES(MMO_KEY_DCF), modes.ECB()).encryptor()
    ct = enc.update(block.to_bytes(16, "little")) + enc.finalize()
    return int.from_bytes(ct, "little") ^ block


def _reference_eval(keys: DCFKeyBatch, j: int, x: int) -> list[int]:
    """Walk key ``j`` at ``x`` block by block with the documented tweaked MMO PRG (version 2)."""
    pub = keys.public
    n, tau = pub.domain_bits, pub.tau
    nq = (tau + 1) // 2
    s = int(keys.root_seeds[j, 0]) | int(keys.root_seeds[j, 1]) << 64
    t = keys.party
    acc = [0] * tau
    sign = -1 if keys.party else 1
    for i in range(n):
        c = (x >> (n - 1 - i)) & 1
        child = _h(s ^ (((1 << 32) | c) << 64))
        tc, child = child & 1, child & ~1
        blocks = [_h(s ^ (((2 << 32) | q) << 64)) for q in range(nq)]  # the node's own value
        values = [(blocks[w // 2] >> (64 * (w % 2))) & MASK for w in range(tau)]
        for w in range(tau):
            v = values[w] + (int(pub.cw_values[i, j, w]) if t else 0)
            acc[w] = (acc[w] + sign * v) & MASK
        if t:
            child ^= int(pub.cw_seeds[i, j, 0]) | int(pub.cw_seeds[i, j, 1]) << 64
            tc ^= (int(pub.cw_bits[i, j]) >> c) & 1
        s, t = child, tc
    leaf = [_h(s ^ (((3 << 32) | q) << 64)) for q in range(nq)]
    for w in range(tau):
        v = (leaf[w // 2] >> (64 * (w % 2))) & MASK
        v += int(pub.cw_final[j, w]) if t else 0
        acc[w] = (acc[w] + sign * v) & MASK
    return acc


def _reference_gen(alpha: int, beta: list[int], n: int, roots: list[int]) -> tuple:
    """Gen of one key block by block from the module docstring (version 2): its public part."""
    tau = len(beta)
    nq = (tau + 1) // 2
    s, t = list(roots), [0, 1]
    v_alpha = [0] * tau
    seeds, values, bits = [], [], []

    def value(seed: int, tweak: int) -> list[int]:
        blocks = [_h(seed ^ ((tweak | q) << 64)) for q in range(nq)]
        return [(blocks[w // 2] >> (64 * (w % 2))) & MASK for w in range(tau)]

    def neg_if(flag: int, v: int) -> int:
        return (-v) & MASK if flag else v

    for i in range(n):
        a = (alpha >> (n - 1 - i)) & 1
        child = [[_h(s[b] ^ (((1 << 32) | c) << 64)) for c in (0, 1)] for b in (0, 1)]
        v = [value(s[b], 2 << 32) for b in (0, 1)]
        lose, keep = 1 - a, a
        s_cw = (child[0][lose] ^ child[1][lose]) & ~1
        t_l = (child[0][0] ^ child[1][0] ^ a ^ 1) & 1
        t_r = (child[0][1] ^ child[1][1] ^ a) & 1
        v_cw = [
            neg_if(t[1], (v[1][w] - v[0][w] - v_alpha[w] + beta[w] * a) & MASK) for w in range(tau)
        ]
        v_alpha = [beta[w] * a & MASK for w in range(tau)]
        seeds.append(s_cw)
        values.append(v_cw)
        bits.append(t_l | t_r << 1)
        t_keep = (t_l, t_r)[keep]
        nxt = [(child[b][keep] & ~1) ^ (s_cw if t[b] else 0) for b in (0, 1)]
        t = [(child[b][keep] & 1) ^ (t_keep & t[b]) for b in (0, 1)]
        s = nxt
    leaf = [value(s[b], 3 << 32) for b in (0, 1)]
    final = [neg_if(t[1], (leaf[1][w] - leaf[0][w] - v_alpha[w]) & MASK) for w in range(tau)]
    return seeds, values, bits, final


@pytest.mark.parametrize(("n", "tau"), [(1, 1), (5, 2), (9, 3), (64, 2)])
def test_gen_matches_block_by_block_reference(n: int, tau: int) -> None:
    rng = np.random.default_rng(100 + n)
    alphas = rng.integers(0, 1 << min(n, 63), 4, dtype=U64)
    betas = rng.integers(0, 2**63, (4, tau), dtype=U64) * U64(2) + U64(1)
    k0, k1 = generate_keys_batch(alphas, betas, n)
    pub = k0.public
    for j in range(4):
        roots = [int(k.root_seeds[j, 0]) | int(k.root_seeds[j, 1]) << 64 for k in (k0, k1)]
        seeds, values, bits, final = _reference_gen(
            int(alphas[j]), [int(b) for b in betas[j]], n, roots
        )
        got_seeds = [
            int(pub.cw_seeds[i, j, 0]) | int(pub.cw_seeds[i, j, 1]) << 64 for i in range(n)
        ]
        assert got_seeds == seeds
        assert [[int(w) for w in pub.cw_values[i, j]] for i in range(n)] == values
        assert [int(b) for b in pub.cw_bits[:, j]] == bits
        assert [int(w) for w in pub.cw_final[j]] == final


@pytest.mark.parametrize(("n", "tau"), [(1, 1), (7, 2), (13, 3), (64, 1)])
def test_engine_matches_block_by_block_reference(n: int, tau: int) -> None:
    rng = np.random.default_rng(n)
    alphas = rng.integers(0, 1 << min(n, 63), 3, dtype=U64)
    k0, k1 = generate_keys_batch(alphas, rng.integers(0, 1 << 62, (3, tau), dtype=U64), n)
    for keys in (k0, k1):
        for j in range(3):
            for x in (0, int(alphas[j]), int(rng.integers(0, 1 << min(n, 63)))):
                got = evaluate_at_batch(keys, [j], np.array([x], dtype=U64))[0]
                assert [int(v) for v in got] == _reference_eval(keys, j, x)


# ---------------------------------------------------------------- privacy of one share


def _bits(blobs: list[bytes]) -> np.ndarray:
    arr = np.frombuffer(b"".join(blobs), dtype=np.uint8).reshape(len(blobs), -1)
    return np.unpackbits(arr, axis=1).astype(np.int64)


def _party0_view(alpha: int, beta: int, msk: bytes, n_keys: int = 2000) -> np.ndarray:
    b0, _ = generate_keys_batch(
        np.full(n_keys, alpha, U64), np.full(n_keys, beta, U64), 10, master_seeds=(msk, b"C" * 16)
    )
    p = b0.public
    rows = [
        p.cw_seeds[:, j].tobytes()
        + p.cw_values[:, j].tobytes()
        + p.cw_bits[:, j].tobytes()
        + p.cw_final[j].tobytes()
        + b0.root_seeds[j].tobytes()
        for j in range(n_keys)
    ]
    return _bits(rows)


def _assert_same_fair_coins(a: np.ndarray, b: np.ndarray) -> None:
    n = a.shape[0]
    ca, cb = a.sum(axis=0), b.sum(axis=0)
    constant = ((ca == 0) | (ca == n)) & ((cb == 0) | (cb == n))
    assert np.array_equal(ca[constant], cb[constant])  # structural zeros (bit 0, cw_bits pad)
    ca, cb = ca[~constant], cb[~constant]
    k = ca.shape[0]
    assert k > 1000
    for c in (ca, cb):
        chi2 = (((c - n / 2) ** 2) / (n / 4)).sum()
        assert abs(chi2 - k) < 5 * np.sqrt(2 * k), chi2
    p = (ca + cb) / (2 * n)
    z2 = ((ca - cb) / n) ** 2 / (p * (1 - p) * 2 / n)
    assert abs(z2.sum() - k) < 5 * np.sqrt(2 * k), z2.sum()
    assert z2.max() < 36


def test_key_share_independent_of_alpha_and_beta() -> None:
    """Bit frequencies of party-0 key shares for (alpha, beta) = (3, 1) vs (1000, 2**64 - 1)."""
    _assert_same_fair_coins(_party0_view(3, 1, b"A" * 16), _party0_view(1000, MASK, b"B" * 16))


def test_independence_check_detects_a_small_leak() -> None:
    a = _party0_view(3, 1, b"A" * 16)
    b = _party0_view(1000, MASK, b"B" * 16)
    rng = np.random.default_rng(0)
    a[:, -1] = rng.random(a.shape[0]) < 0.5
    b[:, -1] = rng.random(b.shape[0]) < 0.6
    with pytest.raises(AssertionError):
        _assert_same_fair_coins(a, b)


# ---------------------------------------------------------------- wire format


def _batch(m: int = 3, n: int = 6, tau: int = 2) -> tuple[DCFKeyBatch, DCFKeyBatch]:
    rng = np.random.default_rng(m * 100 + n)
    return generate_keys_batch(
        rng.integers(0, 1 << n, m, dtype=U64), rng.integers(0, 1 << 62, (m, tau), dtype=U64), n
    )


def test_round_trips_and_sizes() -> None:
    k0, k1 = _batch()
    for keys in (k0, k1):
        blob = keys.to_bytes()
        assert len(blob) == public_size(6, 2, 3) + 3 * 16
        back = DCFKeyBatch.from_bytes(blob)
        assert back == keys and back.party == keys.party
    pub = k0.public.to_bytes()
    assert len(pub) == public_size(6, 2, 3) == 24 + 3 * (6 * (17 + 16) + 16)
    assert DCFPublicBatch.from_bytes(pub) == k0.public
    assert DCFPublicBatch.from_bytes(bytearray(pub)) == k0.public
    assert k0 != k1 and k0 != "x" and k0.public != "x"


def test_truncated_and_trailing() -> None:
    k0, _ = _batch()
    for cls, blob in ((DCFKeyBatch, k0.to_bytes()), (DCFPublicBatch, k0.public.to_bytes())):
        for cut in sorted({0, 3, 4, 23, 24, 25, 40, len(blob) // 2, len(blob) - 1}):
            with pytest.raises(DCFKeyError, match=r"too short|must be \d+ bytes"):
                cls.from_bytes(blob[:cut])
        with pytest.raises(DCFKeyError, match=r"must be \d+ bytes"):
            cls.from_bytes(blob + b"\0")
        with pytest.raises(DCFKeyError, match="must be bytes"):
            cls.from_bytes("text")


def _patched(blob: bytes, at: int, new: bytes) -> bytes:
    return blob[:at] + new + blob[at + len(new) :]


def test_bad_header_fields() -> None:
    k0, _ = _batch()
    blob = k0.to_bytes()
    cases = {
        "bad magic": _patched(blob, 0, b"XDCF"),
        "version 1": _patched(blob, 4, b"\x01"),  # issue 26 retired version 1 (per-child values)
        "version 3": _patched(blob, 4, b"\x03"),
        "kind": _patched(blob, 5, b"\x01"),
        "party": _patched(blob, 6, b"\x02"),
        "domain_bits": _patched(blob, 7, b"\x00"),
        "tau": _patched(blob, 8, (65).to_bytes(4, "little")),
        "padding": _patched(blob, 16, b"\x01"),
        r"must be \d+ bytes": _patched(blob, 12, (4).to_bytes(4, "little")),
    }
    for what, bad in cases.items():
        with pytest.raises(DCFKeyError, match=what):
            DCFKeyBatch.from_bytes(bad)
    pub = k0.public.to_bytes()
    with pytest.raises(DCFKeyError, match="names no party"):
        DCFPublicBatch.from_bytes(_patched(pub, 6, b"\x00"))
    with pytest.raises(DCFKeyError, match="kind"):
        DCFPublicBatch.from_bytes(blob)


def test_non_canonical_bits_refused() -> None:
    k0, _ = _batch(m=2, n=5, tau=1)
    blob = k0.to_bytes()
    seeds_at = 24
    body_at = seeds_at + 2 * 16
    bits_at = body_at + 2 * 5 * 16 + 2 * 5 * 8
    with pytest.raises(DCFKeyError, match="root seeds"):
        DCFKeyBatch.from_bytes(_patched(blob, seeds_at, bytes([blob[seeds_at] | 1])))
    with pytest.raises(DCFKeyError, match="seed corrections"):
        DCFKeyBatch.from_bytes(_patched(blob, body_at, bytes([blob[body_at] | 1])))
    with pytest.raises(DCFKeyError, match="cw_bits"):
        DCFKeyBatch.from_bytes(_patched(blob, bits_at, b"\x04"))


@given(st.data())
@settings(max_examples=200)
def test_fuzzed_blobs_parse_or_raise_key_error(data) -> None:  # type: ignore[no-untyped-def]
    k0, _ = _batch(m=2, n=4, tau=1)
    blob = bytearray(k0.to_bytes() if data.draw(st.booleans()) else k0.public.to_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    for cls in (DCFKeyBatch, DCFPublicBatch):
        try:
            parsed = cls.from_bytes(bytes(blob))
        except DCFKeyError as err:
            assert isinstance(err, ClientInputError)
        else:
            assert parsed.to_bytes() == bytes(blob)  # canonical: what parses re-serializes


@given(st.binary(max_size=200))
def test_random_bytes_never_crash(raw: bytes) -> None:
    for cls in (DCFKeyBatch, DCFPublicBatch):
        with pytest.raises(DCFKeyError):
            cls.from_bytes(raw)


def test_dataclass_validation() -> None:
    k0, _ = _batch(m=2, n=4, tau=1)
    p = k0.public
    with pytest.raises(DCFKeyError, match="domain_bits"):
        DCFPublicBatch(0, 1, p.cw_seeds, p.cw_values, p.cw_bits, p.cw_final)
    with pytest.raises(DCFKeyError, match="cw_final"):
        DCFPublicBatch(4, 1, p.cw_seeds, p.cw_values, p.cw_bits, p.cw_final.reshape(-1))
    with pytest.raises(DCFKeyError, match="cw_seeds"):
        DCFPublicBatch(4, 1, p.cw_seeds[:3], p.cw_values, p.cw_bits, p.cw_final)
    with pytest.raises(DCFKeyError, match="cw_values"):
        DCFPublicBatch(4, 1, p.cw_seeds, p.cw_values.astype(np.int64), p.cw_bits, p.cw_final)
    with pytest.raises(DCFKeyError, match="cw_bits"):
        DCFPublicBatch(4, 1, p.cw_seeds, p.cw_values, p.cw_bits.astype(U64), p.cw_final)
    with pytest.raises(DCFKeyError, match="party"):
        DCFKeyBatch(2, k0.root_seeds, p)
    with pytest.raises(DCFKeyError, match="public"):
        DCFKeyBatch(0, k0.root_seeds, "p")  # type: ignore[arg-type]
    with pytest.raises(DCFKeyError, match="root_seeds"):
        DCFKeyBatch(0, k0.root_seeds[:1], p)


def test_argument_errors() -> None:
    with pytest.raises(ConfigurationError, match="domain_bits"):
        generate_keys(0, 1, 0)
    with pytest.raises(ConfigurationError, match="domain_bits"):
        generate_keys(0, 1, 65)
    with pytest.raises(ConfigurationError, match="below 2"):
        generate_keys(16, 1, 4)
    with pytest.raises(ConfigurationError, match="non-negative"):
        generate_keys(-1, 1, 4)
    with pytest.raises(ConfigurationError, match="alpha must be an integer"):
        generate_keys(1.5, 1, 4)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="beta"):
        generate_keys(1, [], 4)
    with pytest.raises(ConfigurationError, match="integers"):
        generate_keys(1, [0.5], 4)
    with pytest.raises(ConfigurationError, match="betas"):
        generate_keys_batch([1, 2], [1, 2, 3], 4)
    with pytest.raises(ConfigurationError, match="1-D"):
        generate_keys_batch([[1]], [1], 4)
    with pytest.raises(ConfigurationError, match="master_seeds"):
        generate_keys_batch([1], [1], 4, master_seeds=(b"x" * 16,))  # type: ignore[arg-type]
    k0, _ = generate_keys(3, 1, 4)
    with pytest.raises(ConfigurationError, match="below 2"):
        evaluate_at(k0, [16])
    with pytest.raises(ConfigurationError, match="exactly one key"):
        evaluate_at(_batch()[0], [1])
    with pytest.raises(ConfigurationError, match="key index"):
        evaluate_at_batch(k0, [1], [0])
    with pytest.raises(ConfigurationError, match="non-negative"):
        evaluate_at_batch(k0, [-1], [0])
    with pytest.raises(ConfigurationError, match="one length"):
        evaluate_at_batch(k0, [0, 0], [0])
    with pytest.raises(ConfigurationError, match="one point per key"):
        evaluate_paired(k0, [0, 1])
    with pytest.raises(ConfigurationError, match="DCFKeyBatch"):
        evaluate_at_batch("k", [0], [0])  # type: ignore[arg-type]
    # Large Python ints in a 64-bit domain are taken exactly.
    k0, k1 = generate_keys(MASK, 9, 64)
    assert reconstruct(k0, k1, np.array([MASK - 1, MASK], dtype=U64))[:, 0].tolist() == [9, 0]


@pytest.mark.parametrize("native", [True, False])
def test_keys_generated_in_place_are_the_serialized_public_part(
    native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dealer writes the public part straight into the message that carries it (issue 26):
    # the buffer then holds exactly DCFPublicBatch.to_bytes(), at any (unaligned) offset.
    monkeypatch.setattr(dcf, "_NATIVE_AES", native)
    rng = np.random.default_rng(9)
    seeds = (b"r" * 16, b"s" * 16)
    for n, tau, m, offset in [(40, 2, 300, 3), (7, 1, 50, 0), (13, 3, 65, 5), (64, 2, 1, 1)]:
        a = rng.integers(0, 1 << min(n, 63), m, dtype=np.uint64)
        b = rng.integers(0, 2**63, (m, tau), dtype=np.uint64)
        fresh = generate_keys_batch(a, b, n, master_seeds=seeds)
        buf = np.full(public_size(n, tau, m) + offset, 0xA5, dtype=np.uint8)
        k0, k1 = generate_keys_batch(a, b, n, master_seeds=seeds, out=buf[offset:])
        assert buf[offset:].tobytes() == fresh[0].public.to_bytes()
        assert (buf[:offset] == 0xA5).all()
        assert k1.to_bytes() == fresh[1].to_bytes()
        x = rng.integers(0, 1 << min(n, 63), m, dtype=np.uint64)
        assert np.array_equal(evaluate_paired(k0, x), evaluate_paired(fresh[0], x))
    with pytest.raises(ConfigurationError, match="writable 1-D uint8 buffer of 132"):
        generate_keys_batch([1], [1], 4, out=np.zeros(131, dtype=np.uint8))
    with pytest.raises(ConfigurationError, match="writable"):
        generate_keys_batch([1], [1], 4, out=np.zeros(132, dtype=np.uint64))  # type: ignore[arg-type]
