"""The native full-domain driver (issue 26): bit-identical to the Python driver and the reference.

:mod:`flwr_fsl.kernels.dpf_eval` runs the chunk loop in one numba call and calls OpenSSL from
it. Over random batches (mixed domains, ``tau``, lengths, chunk budgets that force task
splitting and many chunks, non-temporal output stores) it must equal the Python driver word
for word, make the same AES calls, and agree with the block-by-block reference evaluator.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from flwr_fsl.crypto import dpf
from flwr_fsl.crypto.dpf import evaluate_batch, generate_keys, generate_keys_batch
from flwr_fsl.kernels import aes as aes_mod
from flwr_fsl.kernels import dpf_eval
from flwr_fsl.kernels.aes import BatchedAES, native_aes
from flwr_fsl.kernels.dpf_kernels import fd_levels
from flwr_fsl.kernels.dpf_vectors import (
    _leaf_line_nt,
    _leaf_words_nt,
    _leaf_words_nt4,
    _mmo_children,
    _mmo_children4,
    _mmo_leaf_children,
    _mmo_leaf_children4,
)

from .test_dpf import _reference_eval

U64 = np.uint64

needs_native = pytest.mark.skipif(
    native_aes(bytes(16)) is None, reason="OpenSSL's libcrypto cannot be loaded natively here"
)


def _python_driver(monkeypatch, fn):
    monkeypatch.setattr(dpf, "_NATIVE_AES", False)
    try:
        return fn()
    finally:
        monkeypatch.setattr(dpf, "_NATIVE_AES", True)


@needs_native
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(1, 40),
    tau=st.integers(1, 5),
    max_bits=st.integers(0, 13),
    budget=st.sampled_from([1, 16, 64, 1 << 10, 1 << 15]),
    cut=st.booleans(),
    nt=st.booleans(),
)
def test_native_driver_equals_python_driver(seed, m, tau, max_bits, budget, cut, nt):
    rng = np.random.default_rng(seed)
    d = rng.integers(0, max_bits + 1, m)
    alphas = (rng.integers(0, 2**40, m) % (1 << d)).astype(U64)
    betas = rng.integers(0, 2**64, (m, tau), dtype=U64)
    lengths = None
    if cut:
        lengths = np.array([rng.integers(0, (1 << int(x)) + 1) for x in d], dtype=np.int64)
    keys = generate_keys_batch(alphas, betas, d, epoch=int(rng.integers(0, 5)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpf, "_FD_BUDGET", budget)
        mp.setattr(dpf, "_NT_MIN_BYTES", 0 if nt else 1 << 62)
        for k in keys:
            log: list[int] = []
            mp.setattr(dpf, "_AES_LOG", log)
            got, off = evaluate_batch(k, lengths=lengths)
            native_calls = list(log)
            want, off_py = _python_driver(mp, lambda k=k: evaluate_batch(k, lengths=lengths))
            assert np.array_equal(off, off_py)
            assert np.array_equal(got, want)
            assert native_calls or int(off[-1]) == 0, "the native driver made no AES call"
        full0 = evaluate_batch(keys[0])[0]
        full1 = evaluate_batch(keys[1])[0]
    start = np.concatenate([[0], np.cumsum(1 << d.astype(np.int64))])
    total = full0 + full1
    for j in range(m):
        block = total[start[j] : start[j + 1]]
        assert np.array_equal(block[int(alphas[j])], betas[j])
        assert not np.delete(block, int(alphas[j]), axis=0).any()


@needs_native
@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(1, 30),
    flat=st.booleans(),
    budget=st.sampled_from([16, 64, 1 << 10]),
    parts=st.sampled_from([1, 1 | 4, 1 | 4 | 8]),
)
def test_profiling_parts_make_the_evaluations_aes_calls(seed, m, flat, budget, parts):
    """With the level passes off (``dpf._FD_PARTS``, the benchmark's AES-alone timing) the
    chunk loop logs the whole evaluation's AES calls with the same block counts: a flat chunk
    counts its nodes without the per-task loop, any other chunk with it."""
    rng = np.random.default_rng(seed)
    d = np.full(m, int(rng.integers(0, 10))) if flat else rng.integers(0, 10, m)
    alphas = (rng.integers(0, 2**40, m) % (1 << d)).astype(U64)
    keys = generate_keys_batch(alphas, np.ones(m, U64), d)[0]
    lengths = None
    if not flat:
        lengths = np.array([rng.integers(0, (1 << int(x)) + 1) for x in d], dtype=np.int64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpf, "_FD_BUDGET", budget)
        logs = []
        for run_parts in (15, parts):
            log: list[int] = []
            mp.setattr(dpf, "_AES_LOG", log)
            mp.setattr(dpf, "_FD_PARTS", run_parts)
            evaluate_batch(keys, lengths=lengths)
            logs.append(log)
    assert logs[1] == logs[0]  # (calls a part skips are still logged, with their sizes)


@needs_native
@pytest.mark.parametrize(("d", "tau"), [(0, 1), (1, 1), (6, 1), (5, 2), (4, 3), (3, 4), (5, 5)])
def test_native_driver_matches_the_block_by_block_reference(d, tau):
    rng = np.random.default_rng(100 * d + tau)
    k0, k1 = generate_keys(int(rng.integers(0, 1 << d)), rng.integers(0, 2**63, tau), d, epoch=2)
    for key in (k0, k1):
        want = np.array([_reference_eval(key, x) for x in range(1 << d)], dtype=U64)
        assert np.array_equal(evaluate_batch(key.as_batch())[0], want)


@needs_native
def test_large_outputs_use_non_temporal_stores_with_the_same_words(monkeypatch):
    rng = np.random.default_rng(7)
    m = 300
    (k0, _) = generate_keys_batch(rng.integers(0, 512, m).astype(U64), np.ones(m, U64), 9)
    want = _python_driver(monkeypatch, lambda: evaluate_batch(k0)[0])
    monkeypatch.setattr(dpf, "_NT_MIN_BYTES", 1)
    assert np.array_equal(evaluate_batch(k0)[0], want)


@needs_native
def test_native_aes_equals_cryptography():
    key = bytes(range(16))
    blocks = np.random.default_rng(1).integers(0, 2**64, (1000, 2), dtype=U64)
    nat = native_aes(key)
    assert nat is not None
    assert np.array_equal(nat.encrypt(blocks), BatchedAES(key).encrypt(blocks))
    assert nat.encrypt(blocks[:0]).shape == (0, 2)
    nat.close()
    nat.close()  # idempotent


def test_native_path_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("FLWR_FSL_NATIVE_AES", "0")
    assert aes_mod._load_libcrypto() is None
    monkeypatch.setattr(dpf, "_NATIVE_AES", False)
    assert dpf._native_mmo() is None
    k0, k1 = generate_keys(5, 9, 4)
    assert int((evaluate_batch(k0.as_batch())[0] + evaluate_batch(k1.as_batch())[0])[5, 0]) == 9


@needs_native
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), tau=st.integers(1, 3), max_h=st.integers(0, 5))
def test_native_split_equals_the_python_split(seed, tau, max_h):
    """``split_native`` (one numba call) makes the same tasks and AES calls as ``split_tasks``."""
    from flwr_fsl.crypto.dpf_keys import _group, _tree_levels

    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 30))
    d = rng.integers(0, 14, m)
    alphas = (rng.integers(0, 2**40, m) % (1 << d)).astype(U64)
    lengths = np.array([rng.integers(0, (1 << int(x)) + 1) for x in d], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    group = _group(tau)
    for keys in generate_keys_batch(alphas, rng.integers(0, 2**63, (m, tau)).astype(U64), d):
        pub = keys.public
        roots = dpf_eval.fd_tasks(_tree_levels(pub.domain_bits, tau), offsets, keys.root_seeds, 0)
        native = dpf._native_mmo()
        log_n: list[int] = []
        log_p: list[int] = []
        cws = (pub.level_offsets, pub.cw_seeds, pub.cw_bits)
        got = dpf_eval.split_native(native, roots, (max_h, group), cws, log_n)
        expand = dpf_eval.split_expander(native, dpf._mmo_ciphers, cws[1], cws[2], log_p)
        want = dpf_eval.split_tasks(*roots, max_h, group, pub.level_offsets, expand)
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype
            assert np.array_equal(a, b)
        assert log_n == log_p


@njit(cache=False)
def _vector_kernels(blocks, scalars, party):  # pragma: no cover - numba
    """Run the 128-bit per-node intrinsics of fd_levels / fd_leaves on ``blocks[0..2]``."""
    children = np.zeros((2, 2), dtype=np.uint64)
    conv = np.zeros((2, 2), dtype=np.uint64)
    bits = np.zeros(2, dtype=np.uint8)
    words = np.zeros(3, dtype=np.uint64)  # odd word offset: the output need not be aligned
    base = np.uint64(blocks.ctypes.data)
    s, lp, rp = base, base + np.uint64(16), base + np.uint64(32)
    cl0, cr0, scw1, e, c0, c1 = (
        scalars[0],
        scalars[1],
        scalars[2],
        scalars[3],
        scalars[4],
        scalars[5],
    )
    _mmo_children(s, lp, rp, cl0, cr0, scw1, np.uint64(children.ctypes.data))
    _mmo_leaf_children(
        s, lp, rp, (cl0, cr0, scw1), e, np.uint64(conv.ctypes.data), np.uint64(bits.ctypes.data)
    )
    sgn = np.uint64(0) - np.uint64(party)
    t = blocks[0, 0] & np.uint64(1)
    _leaf_words_nt(lp, rp, t, c0, c1, sgn, np.uint64(words.ctypes.data) + np.uint64(8))
    return children, conv, bits, words[1:]


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(st.integers(0, 2**64 - 1), min_size=12, max_size=12),
    party=st.integers(0, 1),
)
def test_vector_node_kernels_equal_the_scalar_formulas(words, party):
    """The 128-bit intrinsics compute the words of the scalar code they replaced."""
    blocks = np.array(words[:6], dtype=U64).reshape(3, 2)
    scalars = np.array(words[6:], dtype=U64)
    children, conv, bits, out = _vector_kernels(blocks, scalars, party)
    (s0, s1), (l0, l1), (r0, r1) = (tuple(int(x) for x in b) for b in blocks)
    cl0, cr0, scw1, e, c0, c1 = (int(x) for x in scalars)
    m = (1 << 64) - 1 if s0 & 1 else 0
    want = [
        (l0 ^ s0 ^ (cl0 & m), l1 ^ s1 ^ (scw1 & m)),
        (r0 ^ s0 ^ (cr0 & m), r1 ^ s1 ^ (scw1 & m)),
    ]
    assert children.tolist() == [list(w) for w in want]
    assert conv.tolist() == [[(w0 & ~1 & (2**64 - 1)) ^ 2, w1 ^ e] for w0, w1 in want]
    assert bits.tolist() == [want[0][0] & 1, want[1][0] & 1]
    t = (1 << 64) - 1 if s0 & 1 else 0
    y = [((l0 ^ r0) + (c0 & t)) % 2**64, ((l1 ^ r1) + (c1 & t)) % 2**64]
    assert out.tolist() == ([(-v) % 2**64 for v in y] if party else y)


@njit(cache=False)
def _four_parents(s, lr, cws, e):  # pragma: no cover - numba
    """Four parents' children and leaf blocks, by the 4-parent and the 1-parent intrinsics."""
    kids = np.zeros((2, 8, 2), dtype=np.uint64)
    conv = np.zeros((2, 8, 2), dtype=np.uint64)
    bits = np.zeros((2, 9), dtype=np.uint8)  # one spare byte: the 8-byte store stays inside
    sb = np.uint64(s.ctypes.data)
    lb, rb = np.uint64(lr[0].ctypes.data), np.uint64(lr[1].ctypes.data)
    cl0, cr0, scw1 = cws[0], cws[1], cws[2]
    _mmo_children4(sb, lb, rb, cl0, cr0, scw1, np.uint64(kids[0].ctypes.data))
    t_p = np.uint64(bits.ctypes.data)
    _mmo_leaf_children4(sb, lb, rb, (cl0, cr0, scw1), e, np.uint64(conv[0].ctypes.data), t_p)
    for i in range(4):
        off = np.uint64(16 * i)
        out = np.uint64(kids[1].ctypes.data) + np.uint64(32 * i)
        _mmo_children(sb + off, lb + off, rb + off, cl0, cr0, scw1, out)
        _mmo_leaf_children(
            sb + off, lb + off, rb + off, (cl0, cr0, scw1), e,
            np.uint64(conv[1].ctypes.data) + np.uint64(32 * i), t_p + np.uint64(9 + 2 * i),
        )  # fmt: skip
    return kids, conv, bits


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(st.integers(0, 2**64 - 1), min_size=28, max_size=28),
    set_bits=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_four_parent_kernels_equal_four_one_parent_calls(words, set_bits):
    """The 512-bit 4-parent intrinsics write the words of four 1-parent calls, in order."""
    blocks = np.array(words[:24], dtype=U64).reshape(3, 4, 2)
    blocks[0, :, 0] = (blocks[0, :, 0] & ~U64(1)) | np.array(set_bits, dtype=U64)
    s, lr = blocks[0].copy(), (blocks[1].copy(), blocks[2].copy())
    cws = np.array(words[24:27], dtype=U64)
    kids, conv, bits = _four_parents(s, lr, cws, U64(words[27]))
    assert np.array_equal(kids[0], kids[1])
    assert np.array_equal(conv[0], conv[1])
    assert bits[0, :8].tolist() == bits[1, :8].tolist()
    assert bits[0, 8] == 0  # the 8-byte store wrote eight bytes, no more


@njit(cache=False)
def _four_leaves(enc, blk, t, c0, c1, sgn):  # pragma: no cover - numba
    """Four leaves' output words, by the 4-leaf and the 1-leaf intrinsic (odd word offsets)."""
    words = np.zeros((2, 9), dtype=np.uint64)  # word 0 of each row spare: unaligned output
    eb, bb, tb = np.uint64(enc.ctypes.data), np.uint64(blk.ctypes.data), np.uint64(t.ctypes.data)
    _leaf_words_nt4(eb, bb, tb, c0, c1, sgn, np.uint64(words[0].ctypes.data) + np.uint64(8))
    for i in range(4):
        off = np.uint64(16 * i)
        out = np.uint64(words[1].ctypes.data) + np.uint64(8 + 16 * i)
        _leaf_words_nt(eb + off, bb + off, np.uint64(t[i]), c0, c1, sgn, out)
    return words


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(st.integers(0, 2**64 - 1), min_size=18, max_size=18),
    bits=st.lists(st.integers(0, 1), min_size=4, max_size=4),
    party=st.integers(0, 1),
)
def test_four_leaf_output_kernel_equals_four_one_leaf_calls(words, bits, party):
    """The 512-bit 4-leaf output intrinsic writes the words of four 1-leaf calls, in order."""
    enc = np.array(words[:8], dtype=U64).reshape(4, 2)
    blk = np.array(words[8:16], dtype=U64).reshape(4, 2)
    t = np.array(bits, dtype=np.uint8)
    sgn = ~U64(0) if party else U64(0)  # party 1 negates
    out = _four_leaves(enc, blk, t, U64(words[16]), U64(words[17]), sgn)
    assert out[0].tolist() == out[1].tolist()
    assert out[0, 0] == 0 and out[1, 0] == 0  # nothing written before the output


@njit(cache=False)
def _leaf_lines(enc, blk, t, c0, c1, sgn):  # pragma: no cover - numba
    """Four leaves' words by the cache-line intrinsic (64-byte aligned) and the 4-leaf one."""
    buf = np.zeros(24, dtype=np.uint64)
    start = (-(buf.ctypes.data & 63) & 63) // 8  # the first word on a line boundary
    line = np.uint64(buf.ctypes.data) + np.uint64(8 * start)
    eb, bb, tb = np.uint64(enc.ctypes.data), np.uint64(blk.ctypes.data), np.uint64(t.ctypes.data)
    _leaf_line_nt(eb, bb, tb, c0, c1, sgn, line)
    words = np.zeros(8, dtype=np.uint64)
    _leaf_words_nt4(eb, bb, tb, c0, c1, sgn, np.uint64(words.ctypes.data))
    return buf, start, words


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(st.integers(0, 2**64 - 1), min_size=18, max_size=18),
    bits=st.lists(st.integers(0, 1), min_size=4, max_size=4),
    party=st.integers(0, 1),
)
def test_cache_line_output_kernel_equals_the_four_leaf_kernel(words, bits, party):
    """The aligned 64-byte store writes the 4-leaf intrinsic's eight words, on its line only."""
    enc = np.array(words[:8], dtype=U64).reshape(4, 2)
    blk = np.array(words[8:16], dtype=U64).reshape(4, 2)
    t = np.array(bits, dtype=np.uint8)
    sgn = ~U64(0) if party else U64(0)
    buf, start, want = _leaf_lines(enc, blk, t, U64(words[16]), U64(words[17]), sgn)
    assert buf[start : start + 8].tolist() == want.tolist()
    assert not buf[:start].any() and not buf[start + 8 :].any()


@needs_native
@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(1, 12),
    d=st.integers(0, 9),
    shift=st.integers(0, 7),
    short=st.booleans(),
)
def test_nt_output_lines_at_every_alignment(seed, m, d, shift, short):
    """Outputs starting ``8 * shift`` bytes past a line boundary: the same words as cached stores.

    Leaves before the first line boundary and after the last whole line take one-leaf stores,
    the rest whole-line stores; an output at an odd word offset keeps the 8-byte stores.
    """
    rng = np.random.default_rng(seed)
    alphas = rng.integers(0, 1 << d, m).astype(U64)
    keys, _ = generate_keys_batch(alphas, rng.integers(0, 2**63, m).astype(U64), d)
    lengths = rng.integers(0, (1 << d) + 1, m) if short else np.full(m, 1 << d)
    total = int(lengths.sum())
    buf = np.zeros(total + 16, dtype=U64)
    start = (-(buf.ctypes.data & 63) & 63) // 8 + shift
    out = buf[start : start + total].reshape(total, 1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpf, "_NT_MIN_BYTES", 0)
        evaluate_batch(keys, lengths=lengths, out=out)
        mp.setattr(dpf, "_NT_MIN_BYTES", 1 << 62)
        want, _ = evaluate_batch(keys, lengths=lengths)
    assert np.array_equal(out, want)
    assert not buf[:start].any() and not buf[start + total :].any()


@needs_native
@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(1, 30),
    d=st.integers(1, 11),
    tau=st.integers(1, 4),
    budget=st.sampled_from([1, 64, 1 << 14]),
)
def test_flat_level_passes_equal_the_per_task_passes(seed, m, d, tau, budget):
    """Whole tasks of one height (flat passes) give the words of the per-task passes.

    A batch of equal depths runs its levels through the flat loop (dpf_vectors._flat_level);
    the same keys with a shallower key after them share chunks of mixed heights, which take
    the per-task loop of fd_levels. Both drivers (native, Python) and both must agree.
    """
    rng = np.random.default_rng(seed)
    alphas = rng.integers(0, 1 << d, m).astype(U64)
    betas = rng.integers(0, 2**63, (m, tau)).astype(U64)
    depths = np.array([d] * m + [d - 1])
    pts = np.append(alphas, U64(0))
    seeds = (rng.bytes(16), rng.bytes(16))  # the same root seeds for keys 0..m-1 of both
    both = generate_keys_batch(pts, np.vstack([betas, betas[:1]]), depths, master_seeds=seeds)
    alone = generate_keys_batch(alphas, betas, d, master_seeds=seeds)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpf, "_FD_BUDGET", budget)
        for keys, keys_alone in zip(both, alone, strict=True):
            mixed, off = evaluate_batch(keys)
            flat, _ = evaluate_batch(keys_alone)
            flat_py, _ = _python_driver(mp, lambda k=keys_alone: evaluate_batch(k))
            assert np.array_equal(flat, mixed[: off[m]])
            assert np.array_equal(flat_py, flat)


@pytest.mark.parametrize("cap", [1, 2, 63, 1 << 14])
def test_scratch_buffers_start_on_cache_lines(cap):
    """Every level buffer and control-bit buffer of fd_scratch starts on a 64-byte line."""
    bufs, tbufs, _ = dpf_eval.fd_scratch(cap, None, 0)
    assert bufs.shape[0] == 4 and bufs.shape[1] >= cap + 1 and bufs.flags.c_contiguous
    assert tbufs.shape[0] == 2 and tbufs.shape[1] >= cap and tbufs.flags.c_contiguous
    assert all(b.ctypes.data % 64 == 0 for b in (*bufs, *tbufs))


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(1, 12),
    d=st.integers(2, 8),
    words=st.integers(0, 2**64 - 1),
)
def test_corrections_table_too_small_falls_back_to_the_same_words(seed, m, d, words):
    """fd_levels' flat passes (a corrections table of every level) equal its per-task passes.

    The chunk's whole tree in one call with no AES (``fn = 0``: fixed ciphertext buffers), once
    with a table of one row per task and level, once with too few rows (the per-task loop).
    """
    rng = np.random.default_rng(seed)
    keys = generate_keys_batch(rng.integers(0, 1 << d, m).astype(U64), np.ones(m, U64), d)[0]
    pub = keys.public
    group = 2  # tau = 1
    status, _, tasks_i, seeds, _, _, cap = dpf_eval.fd_plan(
        pub.domain_bits, pub.num_points, keys.root_seeds, keys.party, (group, 1, 1 << 20)
    )
    assert status == 0
    h = int(tasks_i[0, 2])
    pub4 = (pub.level_offsets, pub.cw_seeds, pub.cw_bits, pub.epochs)
    no_aes = (0, np.zeros(0, U64), np.zeros(1, np.int32), np.zeros(0, np.int64), 0, 2)
    results = []
    for rows in (m * h, m * h - 1):
        bufs, tbufs, _ = dpf_eval.fd_scratch(cap + 2, None, 0)
        bufs[...] = words
        bufs[2:] ^= np.arange(bufs[2:].size, dtype=U64).reshape(bufs[2:].shape)
        tbufs[...] = 0
        cwt = np.zeros((rows, 4), U64)
        chunk = (0, m, -1, h, h, 0)
        scratch = (bufs, tbufs, cwt)
        n, _ = fd_levels(no_aes, scratch, chunk, (tasks_i, seeds), pub4, 1, group)
        results.append((n, bufs[h & 1, :n].copy(), tbufs[h & 1, :n].copy()))
    (n_a, b_a, t_a), (n_b, b_b, t_b) = results
    assert n_a == n_b == m << h
    assert np.array_equal(b_a, b_b) and np.array_equal(t_a, t_b)


@needs_native
@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(1, 12),
    d=st.integers(0, 9),
    tau=st.sampled_from([1, 2]),
    shift=st.integers(0, 7),
    budget=st.sampled_from([4, 16, 64, 1 << 10]),
)
def test_paced_value_calls_write_the_same_words_at_every_offset(seed, m, d, tau, shift, budget):
    """Large outputs of equal-depth batches go out between 32-block value-key calls
    (``dpf_leaves.paced_leaves``): the same words as the Python driver wherever ``out`` starts
    in a cache line (16-byte offsets take the paced path with 0-3 head leaves a task, 8-byte
    ones the single call), for both parties and chunks that cut pieces mid-line."""
    rng = np.random.default_rng(seed)
    alphas = rng.integers(0, 1 << d, m).astype(U64)
    betas = rng.integers(0, 2**64, (m, tau), dtype=U64)
    keys = generate_keys_batch(alphas, betas, np.full(m, d), epoch=int(rng.integers(0, 3)))
    total = m << d
    raw = np.full(total * tau + 16, 7, dtype=U64)
    skip = (-raw.ctypes.data % 64) // 8 + shift  # ``shift`` words past a line boundary
    out = raw[skip : skip + total * tau].reshape(total, tau)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpf, "_FD_BUDGET", budget)
        mp.setattr(dpf, "_NT_MIN_BYTES", 1)
        for k in keys:
            want = _python_driver(mp, lambda k=k: evaluate_batch(k)[0])
            evaluate_batch(k, out=out)
            assert np.array_equal(out, want)
    assert (raw[:skip] == 7).all() and (raw[skip + total * tau :] == 7).all()


@needs_native
def test_uniform_head_takes_only_chunks_of_equal_whole_tasks():
    """``dpf_leaves.uniform_head``: ``(leaves, head)`` for equal tasks with outputs at one
    16-byte offset; ``(-1, 0)`` for mixed heights, a cut leaf, 8-byte offsets or two words a
    leaf (``half_w == 2``)."""
    from flwr_fsl.kernels.dpf_leaves import uniform_head

    out = dpf_eval._aligned((1024,), np.uint64)
    # tasks_i columns: key, root level, height, first point, point limit
    tasks = np.array([[k, 0, 5, 64 * k, 64 * (k + 1)] for k in range(4)], dtype=np.int64)
    assert uniform_head(tasks, (0, 4), (1, 1, 2), out) == (32, 0)  # tau 1: two points a leaf
    assert uniform_head(tasks, (0, 4), (1, 1, 2), out[2:]) == (32, 3)
    assert uniform_head(tasks, (0, 4), (1, 1, 2), out[4:]) == (32, 2)
    assert uniform_head(tasks, (0, 4), (1, 1, 2), out[1:]) == (-1, 0)  # 8-byte offset
    assert uniform_head(tasks, (0, 4), (2, 1, 2), out) == (-1, 0)
    cut = tasks.copy()
    cut[2, 4] -= 1  # the last leaf of task 2 holds one point
    assert uniform_head(cut, (0, 4), (1, 1, 2), out) == (-1, 0)
    mixed = tasks.copy()
    mixed[3, 2] = 4
    assert uniform_head(mixed, (0, 4), (1, 1, 2), out) == (-1, 0)
