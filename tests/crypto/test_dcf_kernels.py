"""The ``tau = 2`` DCF steps on 128-bit blocks against the general scalar steps.

:func:`~flwr_fsl.kernels.dcf_kernels.gen_step_tau2` and
:func:`~flwr_fsl.kernels.dcf_kernels.eval_step_tau2` run each key's (point's) step through an
LLVM vector intrinsic; :func:`~flwr_fsl.kernels.dcf_kernels.gen_step` and
:func:`~flwr_fsl.kernels.dcf_kernels.eval_step` are the scalar formulas for every ``tau``. On
random ciphertexts, seeds, control bits, chunks at any offset and every level (the last one
included) both must write the same words: corrections, seeds, control bits, ``V_alpha``,
outputs and the next level's AES inputs (which the vector steps also write at the last level),
also where the public part is an unaligned view of a message.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.crypto import dcf
from flwr_fsl.kernels import dcf_kernels as k

U64 = np.uint64


def _words(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 2**64, shape, dtype=U64)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(1, 20),
    n=st.sampled_from([1, 2, 7, 40, 64]),
    data=st.data(),
)
def test_gen_step_tau2_equals_gen_step(seed: int, m: int, n: int, data: st.DataObject) -> None:
    rng = np.random.default_rng(seed)
    level = data.draw(st.integers(0, n - 1))
    total = m + data.draw(st.integers(0, 5))
    lo = data.draw(st.integers(0, total - m))
    mask = U64((1 << n) - 1) if n < 64 else ~U64(0)
    alphas = _words(rng, (total,)) & mask
    betas = _words(rng, (total, 2))
    enc = _words(rng, (m * 6 + 1, 2))
    seeds = _words(rng, (m, 2, 2)) & ~U64(1)
    t = rng.integers(0, 2, (m, 2), dtype=np.uint8)
    v_alpha = _words(rng, (m, 2))
    cws = (_words(rng, (n, total, 2)), _words(rng, (n, total, 2)))
    bits = rng.integers(0, 4, (n, total), dtype=np.uint8)
    inp = _words(rng, (m * 6, 2))
    outs = []
    for vector in (False, True):
        state = [a.copy() for a in (seeds, t, v_alpha, *cws, bits, inp)]
        if vector:  # the vector step keeps seeds, control bits and V_alpha in one row per key
            rows = np.empty((m, k.GEN_STATE_WORDS), dtype=U64)
            k.pack_gen_state(*state[:3], rows)
            k.gen_step_tau2(enc, level, n, lo, (alphas, betas), rows, tuple(state[3:6]), state[6])
            k.unpack_gen_state(rows, *state[:3])
        else:
            k.gen_step(enc, 3, level, n, lo, alphas, betas, *state)
        outs.append(state)
    old, new = outs
    for a, b in zip(old[:-1], new[:-1], strict=True):
        assert np.array_equal(a, b)
    if level + 1 < n:  # at the last level the scalar step leaves the inputs alone
        assert np.array_equal(old[-1], new[-1])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 20), n=st.sampled_from([1, 2, 40, 64]))
def test_gen_step_tau2_in_place(seed: int, m: int, n: int) -> None:
    """Native Gen encrypts in place: the step reading and writing one buffer writes the same."""
    rng = np.random.default_rng(seed)
    level = int(rng.integers(0, n))
    mask = U64((1 << n) - 1) if n < 64 else ~U64(0)
    keys = (_words(rng, (m,)) & mask, _words(rng, (m, 2)))
    enc = _words(rng, (m * 6 + 1, 2))
    rows = _words(rng, (m, k.GEN_STATE_WORDS))
    rows[:, 0:4] &= ~U64(1)
    rows[:, 6:8] &= U64(1)
    outs = []
    for in_place in (False, True):
        state = (rows.copy(), np.zeros((n, m, 2), U64), np.zeros((n, m, 2), U64))
        bits = np.zeros((n, m), np.uint8)
        buf = enc.copy()
        inp = buf if in_place else np.zeros_like(enc)
        k.gen_step_tau2(buf, level, n, 0, keys, state[0], (*state[1:], bits), inp)
        outs.append((*state, bits, inp[: m * 6]))
    for a, b in zip(*outs, strict=True):
        assert np.array_equal(a, b)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    count=st.integers(1, 20),
    m=st.integers(1, 6),
    n=st.sampled_from([1, 2, 7, 40, 64]),
    party=st.integers(0, 1),
    data=st.data(),
)
def test_eval_step_tau2_equals_eval_step(
    seed: int, count: int, m: int, n: int, party: int, data: st.DataObject
) -> None:
    rng = np.random.default_rng(seed)
    level = data.draw(st.integers(0, n - 1))
    mask = U64((1 << n) - 1) if n < 64 else ~U64(0)
    points = _words(rng, (count,)) & mask
    key_idx = rng.integers(0, m, count).astype(np.int64)
    enc = _words(rng, (count * 2 + 1, 2))
    cw_seeds = _words(rng, (n, m, 2)) & ~U64(1)
    cw_values = _words(rng, (n, m, 2))
    cw_bits = rng.integers(0, 4, (n, m), dtype=np.uint8)
    seeds = _words(rng, (count, 2)) & ~U64(1)
    t = rng.integers(0, 2, count, dtype=np.uint8)
    # acc as a row range of a larger array, as the drivers pass it
    offset = data.draw(st.integers(0, 3))
    acc_all = _words(rng, (count + offset, 2))
    inp = _words(rng, (count * 2, 2))
    outs = []
    for vector in (False, True):
        s, tt, acc_full, ip = seeds.copy(), t.copy(), acc_all.copy(), inp.copy()
        acc = acc_full[offset:]
        args = (points, key_idx, cw_seeds, cw_values, cw_bits, party, s, tt, acc, ip)
        if vector:
            k.eval_step_tau2(enc, level, n, *args)
        else:
            k.eval_step(enc, 2, level, n, *args)
        outs.append((s, tt, acc_full, ip))
    old, new = outs
    for a, b in zip(old[:-1], new[:-1], strict=True):
        assert np.array_equal(a, b)
    if level + 1 < n:
        assert np.array_equal(old[-1], new[-1])


@pytest.mark.parametrize("offset", [0, 1, 3, 8])
def test_unaligned_public_part(offset: int) -> None:
    """Gen into (and Eval from) a public part at an unaligned offset: the same words."""
    rng = np.random.default_rng(offset)
    m, n = 37, 40
    alphas = _words(rng, (m,)) & U64((1 << n) - 1)
    betas = _words(rng, (m, 2))
    points = _words(rng, (m,)) & U64((1 << n) - 1)
    msk = (bytes(range(16)), bytes(range(16, 32)))
    k0, k1 = dcf.generate_keys_batch(alphas, betas, n, master_seeds=msk)
    raw = np.zeros(dcf.public_size(n, 2, m) + offset, dtype=np.uint8)
    u0, u1 = dcf.generate_keys_batch(alphas, betas, n, master_seeds=msk, out=raw[offset:])
    assert u0.to_bytes() == k0.to_bytes() and u1.to_bytes() == k1.to_bytes()
    total = dcf.evaluate_paired(u0, points) + dcf.evaluate_paired(u1, points)
    assert np.array_equal(total, np.where((points < alphas)[:, None], betas, U64(0)))
    assert np.array_equal(dcf.evaluate_paired(u0, points), dcf.evaluate_paired(k0, points))
