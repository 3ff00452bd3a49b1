"""Updatable DPF (Cui §5): several epochs, old keys stay valid, stale keys do not decode,
hints are pseudorandom and validated."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.dpf import (
    DPFKey,
    DPFKeyBatch,
    DPFKeyError,
    UpdateHint,
    evaluate,
    evaluate_at,
    evaluate_batch,
    generate_keys,
    generate_keys_batch,
    next_hint,
    next_hint_batch,
    update,
    update_batch,
)

U64 = np.uint64
MASK = (1 << 64) - 1


def point_function(alpha: int, beta: np.ndarray, domain_bits: int) -> np.ndarray:
    f = np.zeros((1 << domain_bits, beta.shape[0]), dtype=U64)
    f[alpha] = beta
    return f


def words(draw, tau):
    return np.array(draw(st.lists(st.integers(0, MASK), min_size=tau, max_size=tau)), dtype=U64)


@settings(max_examples=30)
@given(st.data(), st.integers(0, 11), st.integers(1, 5))
def test_several_epochs(data, d, tau):
    alpha = data.draw(st.integers(0, (1 << d) - 1))
    beta = words(data.draw, tau)
    k0, k1 = generate_keys(alpha, beta, d)
    history = [(k0, k1, beta)]
    epoch = 0
    for _ in range(3):
        epoch += data.draw(st.integers(1, 2**40))
        new_beta = words(data.draw, tau)
        hint = next_hint(k0, k1, new_beta, epoch, alpha=alpha)
        # The hint is public: both servers apply the same bytes.
        hint = UpdateHint.from_bytes(hint.to_bytes())
        k0, k1 = update(k0, hint, epoch), update(k1, hint, epoch)
        assert k0.public.epoch == epoch and k0.public == k1.public
        assert np.array_equal(evaluate(k0) + evaluate(k1), point_function(alpha, new_beta, d))
        history.append((k0, k1, new_beta))
    # Old keys stay valid for their own epoch.
    for old0, old1, old_beta in history:
        assert np.array_equal(evaluate(old0) + evaluate(old1), point_function(alpha, old_beta, d))
    # Correction words of the tree are never touched by an update.
    assert np.array_equal(history[0][0].public.cw_seeds, k0.public.cw_seeds)


def test_stale_key_does_not_decode_newer_epoch():
    alpha, d = 37, 8
    k0, k1 = generate_keys(alpha, 5, d)
    hint = next_hint(k0, k1, 9, 1)
    n0, n1 = update(k0, hint, 1), update(k1, hint, 1)
    assert np.array_equal(evaluate(n0) + evaluate(n1), point_function(alpha, np.array([9], U64), d))
    for mixed in (evaluate(n0) + evaluate(k1), evaluate(k0) + evaluate(n1)):
        assert mixed[alpha, 0] not in (5, 9)
        # Off the point the stale share no longer cancels either: the result is garbage.
        assert np.count_nonzero(mixed) > 200
    pts = np.arange(1 << d)
    assert np.array_equal(evaluate_at(n0, pts), evaluate(n0))


@pytest.mark.parametrize("tau", [1, 2, 3])
def test_batch_update_equals_single(tau):
    rng = np.random.default_rng(tau)
    m = 40
    d = rng.integers(0, 10, m)
    alphas = rng.integers(0, 2**62, m).astype(U64) % (U64(1) << d.astype(U64))
    betas = rng.integers(0, 2**63, (m, tau)).astype(U64)
    betas[:5] = 0  # dummy bins stay dummies
    b0, b1 = generate_keys_batch(alphas, betas, d)
    new = rng.integers(0, 2**63, (m, tau)).astype(U64)
    new[:5] = 0
    hint = next_hint_batch(b0, b1, new, 7)
    c0, c1 = update_batch(b0, hint, 7), update_batch(b1, hint, 7)
    v0, off = evaluate_batch(c0)
    v1, _ = evaluate_batch(c1)
    for j in range(m):
        want = point_function(int(alphas[j]), new[j], int(d[j]))
        assert np.array_equal(v0[off[j] : off[j + 1]] + v1[off[j] : off[j + 1]], want)
        single = next_hint(b0.key(j), b1.key(j), new[j], 7)
        assert np.array_equal(single.cw_leaf[0], hint.cw_leaf[j])
        assert update(b0.key(j), single, 7) == c0.key(j)
    # A second round from the updated batch, rebuilt by a server from its master-seed form.
    again = next_hint_batch(c0, c1, betas, 8)
    e0 = update_batch(DPFKeyBatch.from_bytes(c0.to_bytes()), again, 8)
    e1 = update_batch(c1, again, 8)
    s = evaluate_batch(e0)[0] + evaluate_batch(e1)[0]
    assert np.array_equal(s, evaluate_batch(b0)[0] + evaluate_batch(b1)[0])


def test_mixed_epoch_batch_survives_the_wire_and_updates_per_key():
    """Keys updated in different rounds, stacked in one batch: per-key epochs on the wire
    (epoch mode 1) keep every key decodable; a hint then moves all of them to one epoch."""
    rng = np.random.default_rng(11)
    m, tau = 6, 3
    d = rng.integers(1, 9, m)
    alphas = rng.integers(0, 2**62, m).astype(U64) % (U64(1) << d.astype(U64))
    betas = rng.integers(1, 2**63, (m, tau)).astype(U64)
    pairs, want = [], []
    for j in range(m):
        k0, k1 = generate_keys(int(alphas[j]), betas[j], int(d[j]))
        for epoch in range(1, j % 3 + 1):  # keys end at epochs 0, 1, 2, 0, 1, 2
            hint = next_hint(k0, k1, betas[j] + U64(epoch), epoch)
            k0, k1 = update(k0, hint, epoch), update(k1, hint, epoch)
        pairs.append((k0, k1))
        want.append(point_function(int(alphas[j]), betas[j] + U64(j % 3), int(d[j])))
    b0 = DPFKeyBatch.from_keys([p[0] for p in pairs])
    b1 = DPFKeyBatch.from_keys([p[1] for p in pairs])
    assert b0.public.epochs.tolist() == [0, 1, 2, 0, 1, 2]
    blob = b0.to_bytes()
    assert blob[16 + 16 * m] == 1  # per-key epochs
    r0 = DPFKeyBatch.from_bytes(blob)
    assert r0 == b0 and r0.public.epochs.tolist() == [0, 1, 2, 0, 1, 2]
    v0, off = evaluate_batch(r0)
    v1, _ = evaluate_batch(DPFKeyBatch.from_bytes(b1.to_bytes()))
    for j in range(m):
        assert np.array_equal(v0[off[j] : off[j + 1]] + v1[off[j] : off[j + 1]], want[j])
    # One hint (fresh epoch above every key's) for the whole mixed batch: back to one epoch.
    with pytest.raises(ConfigurationError, match="not newer"):
        next_hint_batch(r0, b1, betas, 2, alphas=alphas)
    hint = next_hint_batch(r0, b1, betas, 3, alphas=alphas)
    c0, c1 = update_batch(r0, hint, 3), update_batch(b1, hint, 3)
    assert c0.public.epochs.tolist() == [3] * m
    blob = c0.to_bytes()
    assert blob[16 + 16 * m] == 0 and len(blob) == len(b0.to_bytes()) - 8 * (m - 1)
    v0, off = evaluate_batch(DPFKeyBatch.from_bytes(blob))
    v1, _ = evaluate_batch(c1)
    for j in range(m):
        want_j = point_function(int(alphas[j]), betas[j], int(d[j]))
        assert np.array_equal(v0[off[j] : off[j + 1]] + v1[off[j] : off[j + 1]], want_j)


def test_alpha_needed_only_when_beta_was_zero():
    # Odd tau: the point's last bit sits in the leaf group, recoverable only from beta != 0.
    k0, k1 = generate_keys(5, 0, 4)
    hint = next_hint(k0, k1, 0, 1)  # zero stays zero: no alpha needed
    assert not np.any(evaluate(update(k0, hint, 1)) + evaluate(update(k1, hint, 1)))
    with pytest.raises(ConfigurationError, match="pass alphas"):
        next_hint(k0, k1, 3, 1)
    hint = next_hint(k0, k1, 3, 1, alpha=5)
    y = evaluate(update(k0, hint, 1)) + evaluate(update(k1, hint, 1))
    assert np.array_equal(y, point_function(5, np.array([3], U64), 4))
    with pytest.raises(ConfigurationError, match="do not match"):
        next_hint(k0, k1, 3, 1, alpha=9)
    with pytest.raises(ConfigurationError, match="shape"):
        next_hint_batch(k0.as_batch(), k1.as_batch(), [3], 1, alphas=[5, 5])
    # Even tau: the whole point is on the tree path, beta = 0 is no problem.
    k0, k1 = generate_keys(5, [0, 0], 4)
    hint = next_hint(k0, k1, [1, 2], 1)
    y = evaluate(update(k0, hint, 1)) + evaluate(update(k1, hint, 1))
    assert np.array_equal(y, point_function(5, np.array([1, 2], U64), 4))


def test_hint_is_pseudorandom_in_beta():
    """Hint words for beta' = 0 and beta' = 2**64 - 1 have the same (uniform) bit frequencies."""
    n, d = 4000, 6
    alphas = np.arange(n, dtype=U64) % U64(1 << d)
    counts = []
    for beta, msk in ((0, b"x" * 16), (MASK, b"z" * 16)):  # independent key samples
        b0, b1 = generate_keys_batch(alphas, np.ones(n, U64), d, master_seeds=(msk, b"y" * 16))
        hint = next_hint_batch(b0, b1, np.full(n, beta, U64), 1, alphas=alphas)
        bits = np.unpackbits(hint.cw_leaf.view(np.uint8), axis=1).astype(np.int64)
        counts.append(bits.sum(axis=0))
    k = counts[0].shape[0]
    for c in counts:
        chi2 = (((c - n / 2) ** 2) / (n / 4)).sum()
        assert abs(chi2 - k) < 6 * np.sqrt(2 * k)
    p = (counts[0] + counts[1]) / (2 * n)
    z2 = ((counts[0] - counts[1]) / n) ** 2 / (p * (1 - p) * 2 / n)
    assert abs(z2.sum() - k) < 6 * np.sqrt(2 * k)


def test_next_hint_errors():
    k0, k1 = generate_keys(3, [1, 2, 3], 12, epoch=4)
    with pytest.raises(ConfigurationError, match="not newer"):
        next_hint(k0, k1, [1, 1, 1], 4)
    with pytest.raises(ConfigurationError, match="epoch"):
        next_hint(k0, k1, [1, 1, 1], -1)
    with pytest.raises(ConfigurationError, match="epoch"):
        next_hint(k0, k1, [1, 1, 1], 1 << 64)
    with pytest.raises(ConfigurationError, match="tau"):
        next_hint(k0, k1, [1, 1], 5)
    with pytest.raises(DPFKeyError, match="party 0"):
        next_hint(k1, k0, [1, 1, 1], 5)
    with pytest.raises(DPFKeyError, match="party 0"):
        next_hint(k0, k0, [1, 1, 1], 5)
    _, other1 = generate_keys(3, [1, 2, 3], 12, epoch=4)
    with pytest.raises(DPFKeyError, match="different public"):
        next_hint(k0, other1, [1, 1, 1], 5)
    # Right shape, wrong seed: the two shares do not encode one point function.
    forged = DPFKey(party=1, seed=other1.seed, public=k0.public)
    with pytest.raises(DPFKeyError, match="do not share"):
        next_hint(k0, forged, [1, 1, 1], 5)
    # Same seed for both parties: control bits never differ.
    twin = DPFKey(party=1, seed=k0.seed, public=k0.public)
    with pytest.raises(DPFKeyError, match="do not share"):
        next_hint(k0, twin, [1, 1, 1], 5)


def test_two_points_rejected():
    # A hand-made pair whose leaf correction puts values at both points of a leaf group.
    k0, k1 = generate_keys(2, 7, 3)
    pub = k0.public
    bad_leaf = pub.cw_leaf.copy()
    bad_leaf[1 - (2 & 1)] += U64(1)  # perturb the other word of alpha's leaf group
    bad_pub = type(pub)(pub.domain_bits, pub.tau, pub.epoch, pub.cw_seeds, pub.cw_bits, bad_leaf)
    b0 = DPFKey(0, k0.seed, bad_pub)
    b1 = DPFKey(1, k1.seed, bad_pub)
    with pytest.raises(DPFKeyError, match="two points"):
        next_hint(b0, b1, 1, 1)


def test_update_errors():
    k0, k1 = generate_keys(3, 1, 5)
    hint = next_hint(k0, k1, 2, 3)
    with pytest.raises(DPFKeyError, match="expected 4"):
        update(k0, hint, 4)
    with pytest.raises(DPFKeyError, match="UpdateHint"):
        update(k0, hint.cw_leaf, 3)  # type: ignore[arg-type]
    newer = update(k0, hint, 3)
    with pytest.raises(DPFKeyError, match="stale hint"):
        update(newer, hint, 3)
    wide, _ = generate_keys(3, [1, 2], 5)
    with pytest.raises(DPFKeyError, match="tau"):
        update(wide, hint, 3)
    b0, _ = generate_keys_batch([1, 2], [1, 2], 4)
    with pytest.raises(DPFKeyError, match="keys"):
        update_batch(b0, hint, 3)


def test_hint_wire_format_errors():
    k0, k1 = generate_keys(3, [1, 2, 3], 5)
    hint = next_hint(k0, k1, [4, 5, 6], 2)
    blob = hint.to_bytes()
    assert UpdateHint.from_bytes(blob) == hint and hint != blob
    for cut in (0, 10, 16, 23, len(blob) - 1):
        with pytest.raises(DPFKeyError, match=r"truncated|expected"):
            UpdateHint.from_bytes(blob[:cut])
    with pytest.raises(DPFKeyError, match="expected"):
        UpdateHint.from_bytes(blob + b"\0")
    with pytest.raises(DPFKeyError, match="kind"):
        UpdateHint.from_bytes(blob[:5] + b"\x02" + blob[6:])
    with pytest.raises(DPFKeyError, match="party"):
        UpdateHint.from_bytes(blob[:6] + b"\x00" + blob[7:])
    with pytest.raises(DPFKeyError, match="expected"):  # wrong tau: wrong length
        UpdateHint.from_bytes(blob[:8] + (2).to_bytes(4, "little") + blob[12:])
    with pytest.raises(DPFKeyError, match="tau"):
        UpdateHint.from_bytes(blob[:8] + (0).to_bytes(4, "little") + blob[12:])
    with pytest.raises(DPFKeyError, match="epoch"):
        UpdateHint(epoch=-1, tau=1, cw_leaf=np.zeros((1, 2), U64))
    with pytest.raises(DPFKeyError, match="tau"):
        UpdateHint(epoch=1, tau=0, cw_leaf=np.zeros((1, 2), U64))
    with pytest.raises(DPFKeyError, match="2-D"):
        UpdateHint(epoch=1, tau=1, cw_leaf=np.zeros(2, U64))
    with pytest.raises(DPFKeyError, match="words per key"):
        UpdateHint(epoch=1, tau=1, cw_leaf=np.zeros((1, 1), U64))
