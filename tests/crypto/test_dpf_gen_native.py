"""Native key generation (issue 26): one numba call per batch, bit-identical to the Python driver.

:func:`~flwr_fsl.kernels.dpf_gen_kernels.gen_run` runs Gen's chunk loop with OpenSSL called from
numba. Over random batches (mixed domains, ``tau``, verifiable keys, epochs, chunk sizes that
force many chunks) its wire bytes must equal the Python driver's (``cryptography`` from Python,
the fallback where ``libcrypto`` does not load), with the same AES calls in the same order.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto import dpf, dpf_gen
from flwr_fsl.crypto.dpf import evaluate_batch, generate_keys, generate_keys_batch
from flwr_fsl.crypto.prg import MMOCiphers, _mmo_ciphers
from flwr_fsl.kernels import dpf_gen_kernels as _gk
from flwr_fsl.kernels.aes import native_aes

U64 = np.uint64
SEEDS = (bytes(range(16)), bytes(range(16, 32)))

needs_native = pytest.mark.skipif(
    native_aes(bytes(16)) is None, reason="OpenSSL's libcrypto cannot be loaded natively here"
)


class _Counting:
    """A cipher that records the block count of each call (the Python driver's AES calls)."""

    def __init__(self, inner, sizes):
        self.inner, self.sizes = inner, sizes

    def encrypt_prefix_into(self, blocks, out):
        self.sizes.append(blocks.nbytes // 16)
        self.inner.encrypt_prefix_into(blocks, out)


def _batch(seed, m, tau, max_bits):
    rng = np.random.default_rng(seed)
    d = rng.integers(0, max_bits + 1, m)
    alphas = (rng.integers(0, 2**40, m) % (1 << d)).astype(U64)
    betas = rng.integers(0, 2**64, (m, tau), dtype=U64)
    return alphas, betas, d, int(rng.integers(0, 5))


def _python_gen(monkeypatch, sizes, *args, **kwargs):
    aes = _mmo_ciphers()
    counting = MMOCiphers(*(_Counting(c, sizes) for c in aes))
    with monkeypatch.context() as mp:
        mp.setattr(dpf, "_NATIVE_AES", False)
        mp.setattr(dpf, "_mmo_ciphers", lambda: counting)
        return generate_keys_batch(*args, **kwargs)


@needs_native
@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(0, 60),
    tau=st.integers(1, 5),
    max_bits=st.integers(0, 14),
    chunk=st.sampled_from([1, 3, 16, 1 << 13]),
    verifiable=st.booleans(),
)
def test_native_gen_equals_python_driver(seed, m, tau, max_bits, chunk, verifiable):
    alphas, betas, d, epoch = _batch(seed, m, tau, max_bits)
    verifiable = verifiable and tau % 2 == 0
    kw = {"master_seeds": SEEDS, "epoch": epoch, "verifiable": verifiable}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dpf_gen, "GEN_CHUNK", chunk)
        mp.setattr(dpf_gen, "NATIVE_GEN_CHUNK", chunk)
        log: list[int] = []
        mp.setattr(dpf, "_AES_LOG", log)
        native = generate_keys_batch(alphas, betas, d, **kw)
        mp.setattr(dpf, "_AES_LOG", None)
        sizes: list[int] = []
        python = _python_gen(mp, sizes, alphas, betas, d, **kw)
    assert native[0].public.to_bytes() == python[0].public.to_bytes()
    assert np.array_equal(native[1].root_seeds, python[1].root_seeds)
    assert log == sizes
    if verifiable:
        assert np.array_equal(native[0].public.cw_proof, python[0].public.cw_proof)


@needs_native
def test_native_keys_evaluate_to_the_point_function():
    alphas, betas, d, _ = _batch(5, 200, 2, 10)
    k0, k1 = generate_keys_batch(alphas, betas, d, master_seeds=SEEDS)
    share0, start = evaluate_batch(k0)
    total = share0 + evaluate_batch(k1)[0]
    for j in range(200):
        block = total[start[j] : start[j + 1]]
        assert np.array_equal(block[int(alphas[j])], betas[j])
        assert not np.delete(block, int(alphas[j]), axis=0).any()


def test_gen_falls_back_to_cryptography_without_libcrypto(monkeypatch):
    """Where OpenSSL cannot be loaded natively (or FLWR_FSL_NATIVE_AES=0), Gen runs from Python."""
    alphas, betas, d, epoch = _batch(9, 40, 2, 9)
    kw = {"master_seeds": SEEDS, "epoch": epoch, "verifiable": True}
    want = generate_keys_batch(alphas, betas, d, **kw)[0].public.to_bytes()
    monkeypatch.setattr(dpf_gen, "_NATIVE", type(dpf_gen._NATIVE)())  # a fresh thread-local
    monkeypatch.setattr(dpf_gen, "native_aes", lambda key: None)
    assert dpf_gen._native_contexts() is None
    log: list[int] = []
    monkeypatch.setattr(dpf, "_AES_LOG", log)
    got = generate_keys_batch(alphas, betas, d, **kw)[0].public.to_bytes()
    assert got == want
    assert not log  # no native call was made
    k0, k1 = generate_keys(5, 9, 4, epoch=1)
    assert int((evaluate_batch(k0.as_batch())[0] + evaluate_batch(k1.as_batch())[0])[5, 0]) == 9


@needs_native
def test_gen_on_several_threads_at_once_writes_the_same_bytes():
    """Each thread keeps its own OpenSSL contexts and blob buffer; Gen releases the GIL."""
    from concurrent.futures import ThreadPoolExecutor

    batches = [_batch(s, 3000, 2, 9) for s in range(6)]

    def gen(i):
        alphas, betas, d, epoch = batches[i]
        kw = {"master_seeds": SEEDS, "epoch": epoch, "verifiable": True}
        return generate_keys_batch(alphas, betas, d, **kw)[0].public.to_bytes()

    want = [gen(i) for i in range(6)]
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(gen, [i % 6 for i in range(18)]))
    assert got == [want[i % 6] for i in range(18)]


def _reference_level(enc, seeds, level, path, depth, rows, cw_seeds, cw_bits):
    """One Gen level word by word in Python integers (the scalar form of the vector kernel)."""
    mask, clear = (1 << 64) - 1, ((1 << 64) - 1) ^ 1
    for i in range(path.shape[0]):
        a, b = [int(w) for w in seeds[2 * i]], [int(w) for w in seeds[2 * i + 1]]
        lft = [[int(enc[0, 2 * i + p, w]) ^ s[w] for w in range(2)] for p, s in ((0, a), (1, b))]
        rgt = [[int(enc[1, 2 * i + p, w]) ^ s[w] for w in range(2)] for p, s in ((0, a), (1, b))]
        bit = (int(path[i]) >> (int(depth[i]) - 1 - level)) & 1
        kept, lost = (rgt, lft) if bit else (lft, rgt)
        scw = [(lost[0][0] ^ lost[1][0]) & clear, lost[0][1] ^ lost[1][1]]
        tcw_l = (lft[0][0] ^ lft[1][0] ^ bit ^ 1) & 1
        tcw_r = (rgt[0][0] ^ rgt[1][0] ^ bit) & 1
        row = int(rows[i]) + level
        cw_seeds[row] = scw
        cw_bits[row] = tcw_l | tcw_r << 1
        corr = [scw[0] | (tcw_r if bit else tcw_l), scw[1]]
        for p, s in ((0, a), (1, b)):
            t = s[0] & 1
            seeds[2 * i + p] = [(kept[p][w] ^ (corr[w] if t else 0)) & mask for w in range(2)]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 40), level=st.integers(0, 5))
def test_gen_level_vector_kernel_equals_the_scalar_words(seed, n, level):
    """:func:`gen_level` (128-bit vectors) writes the words of the plain BGI16 level."""
    rng = np.random.default_rng(seed)
    depth = np.sort(rng.integers(level + 1, level + 4, n))[::-1].astype(np.int64)
    path = rng.integers(0, 2**63, n, dtype=U64)
    rows = rng.permutation(np.arange(n, dtype=np.int64) * 8)
    enc = rng.integers(0, 2**64, (2, 2 * n + 1, 2), dtype=U64)
    seeds = rng.integers(0, 2**64, (2 * n, 2), dtype=U64)
    out = (np.zeros((8 * n + 8, 2), U64), np.zeros(8 * n + 8, np.uint8))
    want = (out[0].copy(), out[1].copy())
    expect = seeds.copy()
    _gk.gen_level(enc, seeds, level, path, depth, rows, *out)
    _reference_level(enc, expect, level, path, depth, rows, *want)
    assert np.array_equal(seeds, expect)
    assert np.array_equal(out[0], want[0]) and np.array_equal(out[1], want[1])


def test_gen_level_refuses_arrays_it_cannot_address():
    """:func:`gen_level` reads its blocks by address: a strided view is refused, not misread."""
    enc = np.zeros((2, 3, 2), U64)
    seeds = np.zeros((4, 2), U64)
    out = (np.zeros((8, 2), U64), np.zeros(8, np.uint8))
    args = (np.ones(1, U64), np.ones(1, np.int64), np.zeros(1, np.int64))
    with pytest.raises(ConfigurationError, match="C-contiguous"):
        _gk.gen_level(enc, seeds[::2], 0, *args, *out)
    with pytest.raises(ConfigurationError, match="C-contiguous"):
        _gk.gen_level(enc, seeds[:2], 0, *args, out[0][::2], out[1])
