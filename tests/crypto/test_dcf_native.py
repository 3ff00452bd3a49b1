"""The native DCF drivers (issue 26 item 6): bit-identical to the Python drivers.

:mod:`flwr_fsl.kernels.dcf_native` runs Gen's and Eval's chunk-and-level loops in one numba
call each, with OpenSSL called from inside. Over random batches (every ``tau`` path, several
chunks, keys parsed from read-only bytes) the public parts and the shares must equal the
Python driver's word for word, and ``FLWR_FSL_NATIVE_AES=0`` / ``_NATIVE_AES = False`` must give
the same keys through ``cryptography``.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.crypto import dcf
from flwr_fsl.kernels import aes as aes_mod
from flwr_fsl.kernels import dcf_native
from flwr_fsl.kernels.aes import native_aes

U64 = np.uint64
MSK = (bytes(range(16)), bytes(range(16, 32)))

needs_native = pytest.mark.skipif(
    native_aes(bytes(16)) is None, reason="OpenSSL's libcrypto cannot be loaded natively here"
)


def _run(native: bool, fn):  # type: ignore[no-untyped-def]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dcf, "_NATIVE_AES", native)
        return fn()


def _case(seed: int, m: int, n: int, tau: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    mask = U64((1 << n) - 1) if n < 64 else ~U64(0)
    alphas = rng.integers(0, 2**64, m, dtype=U64) & mask
    betas = rng.integers(0, 2**64, (m, tau), dtype=U64)
    count = 3 * m
    idx = rng.integers(0, max(m, 1), count) if m else np.zeros(0, dtype=np.int64)
    points = rng.integers(0, 2**64, count, dtype=U64) & mask
    return alphas, betas, idx, points


@needs_native
@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    m=st.integers(0, 40),
    n=st.sampled_from([1, 2, 5, 17, 33, 63, 64]),
    tau=st.integers(1, 5),
    chunk=st.sampled_from([1, 3, 8, 1 << 12]),
)
def test_native_equals_python_driver(seed: int, m: int, n: int, tau: int, chunk: int) -> None:
    alphas, betas, idx, points = _case(seed, m, n, tau)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dcf, "_CHUNK", chunk)
        mp.setattr(dcf, "_GEN_CHUNK", chunk)
        keys = {
            nat: _run(nat, lambda: dcf.generate_keys_batch(alphas, betas, n, master_seeds=MSK))
            for nat in (True, False)
        }
        assert keys[True][0].to_bytes() == keys[False][0].to_bytes()
        assert keys[True][1].to_bytes() == keys[False][1].to_bytes()
        for party in (0, 1):
            parsed = dcf.DCFKeyBatch.from_bytes(keys[True][party].to_bytes())  # read-only views
            native = _run(True, lambda k=parsed: dcf.evaluate_at_batch(k, idx, points))
            python = _run(False, lambda k=parsed: dcf.evaluate_at_batch(k, idx, points))
            assert native.dtype == U64 and native.shape == (idx.shape[0], tau)
            assert np.array_equal(native, python)
    total = dcf.evaluate_at_batch(keys[True][0], idx, points)
    total += dcf.evaluate_at_batch(keys[True][1], idx, points)
    expected = np.where((points < alphas[idx])[:, None], betas[idx], U64(0)) if m else total
    assert np.array_equal(total, expected)


@needs_native
def test_native_paths_are_taken_and_use_one_context_per_thread() -> None:
    calls: list[str] = []
    gen, ev = dcf_native.generate, dcf_native.evaluate
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dcf_native, "generate", lambda *a: calls.append("gen") or gen(*a))
        mp.setattr(dcf_native, "evaluate", lambda *a: calls.append("eval") or ev(*a))
        k0, _ = dcf.generate_keys(5, [1, 2], 8, master_seeds=MSK)
        dcf.evaluate_at(k0, [3, 9])
    assert calls == ["gen", "eval"]
    mine = dcf_native.context(dcf.MMO_KEY_DCF)
    assert mine is dcf_native.context(dcf.MMO_KEY_DCF)
    other: list[object] = []
    th = threading.Thread(target=lambda: other.append(dcf_native.context(dcf.MMO_KEY_DCF)))
    th.start()
    th.join()
    assert other[0] is not None and other[0] is not mine


@needs_native
def test_threads_evaluate_at_once_and_agree() -> None:
    alphas, betas, idx, points = _case(7, 3000, 32, 2)
    k0, _ = dcf.generate_keys_batch(alphas, betas, 32, master_seeds=MSK)
    want = _run(False, lambda: dcf.evaluate_at_batch(k0, idx, points))
    got: list[np.ndarray] = []
    threads = [
        threading.Thread(target=lambda: got.append(dcf.evaluate_at_batch(k0, idx, points)))
        for _ in range(3)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(got) == 3 and all(np.array_equal(g, want) for g in got)


def test_fallback_when_native_aes_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLWR_FSL_NATIVE_AES", "0")
    assert aes_mod._load_libcrypto() is None
    alphas, betas, idx, points = _case(11, 50, 20, 2)
    native = dcf.generate_keys_batch(alphas, betas, 20, master_seeds=MSK)
    monkeypatch.setattr(dcf, "_NATIVE_AES", False)
    calls: list[int] = []
    monkeypatch.setattr(dcf_native, "generate", lambda *a: calls.append(1))
    monkeypatch.setattr(dcf_native, "evaluate", lambda *a: calls.append(1))
    k0, k1 = dcf.generate_keys_batch(alphas, betas, 20, master_seeds=MSK)
    assert k0.to_bytes() == native[0].to_bytes()
    total = dcf.evaluate_at_batch(k0, idx, points) + dcf.evaluate_at_batch(k1, idx, points)
    assert calls == []
    assert np.array_equal(total, np.where((points < alphas[idx])[:, None], betas[idx], U64(0)))


def test_context_is_none_without_libcrypto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aes_mod, "_LIB", [None])
    monkeypatch.setattr(dcf_native, "_LOCAL", threading.local())
    assert dcf_native.context(dcf.MMO_KEY_DCF) is None
    k0, k1 = dcf.generate_keys(9, 4, 6, master_seeds=MSK)  # falls back to the Python driver
    assert (dcf.evaluate_at(k0, [8]) + dcf.evaluate_at(k1, [8]))[0, 0] == 4
