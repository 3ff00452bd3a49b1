"""The client encode's fast paths (issue 26 item 2) give the bytes of the plain ones.

- Gen on several threads (key ranges on a pool) writes the same blob as on one, with the same
  AES blocks.
- The value-check trailer that Gen writes in place after the public part is
  ``public.to_bytes() + value_trailer(...)``, and the batch still serializes to its own bytes.
- :func:`~flwr_fsl.families.ssa.projected_check.project` (read from the stream's words) is the
  product with :func:`~flwr_fsl.families.ssa.projected_check.projection_matrix` in Z_2^64.
- :func:`~flwr_fsl.families.ssa.placement.place_indices`' cuckoo table is
  :func:`~flwr_fsl.crypto.hashing.cuckoo_hash`'s for the same seed.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.crypto import dpf, dpf_gen
from flwr_fsl.crypto.dpf import generate_keys_batch
from flwr_fsl.crypto.hashing import EMPTY, cuckoo_hash
from flwr_fsl.families.ssa import projected_check as pc
from flwr_fsl.families.ssa.messages import SSAParams
from flwr_fsl.families.ssa.placement import place_indices, simple_table_for
from flwr_fsl.families.ssa.protocol import encode_update
from flwr_fsl.families.ssa.upload import key_betas
from flwr_fsl.families.ssa.verify import checks_counts, one_word
from flwr_fsl.kernels.aes import native_aes

SEEDS = (bytes(range(16)), bytes(range(16, 32)))


def _params(value_check: str = "projected", **kw: object) -> SSAParams:
    return SSAParams(
        2, 1 << 12, 300, 1, bytes(range(16)), verify=True, value_check=value_check, **kw
    )


def _inputs(params: SSAParams, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    idx = rng.choice(params.domain_size, params.num_items, replace=False)
    return idx, rng.normal(0.0, 0.01, idx.size)


@pytest.mark.skipif(native_aes(bytes(16)) is None, reason="no native libcrypto here")
@pytest.mark.parametrize("threads", [2, 3, 5])
def test_gen_on_key_ranges_writes_the_same_blob(monkeypatch, threads):
    monkeypatch.setattr(dpf_gen, "NATIVE_GEN_CHUNK", 16)
    monkeypatch.setattr(dpf_gen, "_MIN_KEYS_PER_THREAD", 32)
    rng = np.random.default_rng(threads)
    m = 400
    d = rng.integers(0, 12, m)
    alphas = (rng.integers(0, 2**40, m) % (1 << d)).astype(np.uint64)
    betas = rng.integers(0, 2**64, (m, 2), dtype=np.uint64)
    logs: list[list[int]] = [[], []]
    blobs = []
    for log, t in zip(logs, (1, threads), strict=True):
        monkeypatch.setattr(dpf, "_AES_LOG", log)
        keys = generate_keys_batch(
            alphas, betas, d, master_seeds=SEEDS, epoch=3, verifiable=True, threads=t
        )
        blobs.append(keys[0].public.to_bytes())
    assert blobs[0] == blobs[1]
    assert sorted(logs[0]) != [] and sum(logs[0]) == sum(logs[1])
    assert dpf_gen._split(np.full(m, 4), threads)[-1][1] == m  # the ranges cover every key


def test_gen_threads_are_validated():
    with pytest.raises(dpf.ConfigurationError, match="threads"):
        generate_keys_batch(np.zeros(1, np.uint64), np.zeros(1, np.uint64), 1, threads=0)


@pytest.mark.parametrize("value_check", ["projected", "exact", "off"])
def test_the_trailer_written_in_place_is_the_appended_one(value_check):
    params = _params(value_check)
    idx, vals = _inputs(params)
    upload, state = encode_update(
        params, idx, vals, rng=np.random.default_rng(4), master_seeds=SEEDS, threads=1
    )
    public = state.keys[0].public
    assert public.blob() is upload.public_part  # one blob: public part, then trailer
    view = bytes(public.wire_view())
    head = public.to_bytes()  # copies the public part out once, and keeps only that
    assert view == head and upload.public_part[: len(head)] == head
    assert public.blob() == head and public.to_bytes() is head
    assert dpf.DPFPublicBatch.from_bytes(head) == public
    # the trailer is the one value_trailer makes from the finished keys (unit weights: the
    # payload rows are (value, 1), rounded with the rng's first draws)
    plc = state.placement
    rows = params.fixed_point.encode(
        np.stack([vals, np.ones_like(vals)], 1), np.random.default_rng(4)
    )
    betas = key_betas(params, rows, plc.slots)
    want = head + pc.value_trailer(params, state.keys, betas)
    assert upload.public_part == want
    assert hashlib.sha256(public.wire_view()).digest() == hashlib.sha256(head).digest()


@pytest.mark.parametrize("r", [1, 3, 32, 33, 64, 100])
def test_project_is_the_product_with_the_projection_matrix(r):
    rng = np.random.default_rng(r)
    for n in (0, 1, 37, pc._CHUNK, pc._CHUNK + 1):  # the matrix draws the stream per block
        words = rng.integers(0, 2**64, n, dtype=np.uint64)
        seed = rng.bytes(16)
        z = pc.projection_matrix(seed, r, n)
        with np.errstate(over="ignore"):
            want = (z @ words.view(np.int64)).view(np.uint64)
        assert np.array_equal(pc.project(seed, r, words), want)


@pytest.mark.parametrize("stash", [0, 3])
def test_placement_keeps_cuckoo_hash_table(stash):
    params = _params(stash_size=stash)
    idx, _ = _inputs(params, 7)
    placement = place_indices(params, idx, simple_table_for(params), np.random.default_rng(9))
    table = cuckoo_hash(idx, params.hash_params, seed=np.random.default_rng(9))
    got = placement.cuckoo_table
    assert got is not None
    for name in ("items", "hash_ids", "stash"):
        assert np.array_equal(getattr(got, name), getattr(table, name))


@pytest.mark.parametrize("count", [0, 1, 4095, 4097])
def test_native_root_seeds_are_the_prf_ones(monkeypatch, count):
    from flwr_fsl.crypto.prg import derive_root_seeds

    want = derive_root_seeds(SEEDS[1], count)
    assert np.array_equal(dpf_gen.gen_roots(SEEDS[1], count), want)
    monkeypatch.setattr(dpf_gen, "native_aes", lambda key: None)  # no libcrypto: the Python PRF
    assert np.array_equal(dpf_gen.gen_roots(SEEDS[1], count), want)


@pytest.mark.parametrize("digest", [1, 2])
@pytest.mark.parametrize("threads", [2, 3])
def test_encode_threads_reach_the_trailer_and_keep_its_bytes(monkeypatch, digest, threads):
    params = _params(projected_digest=digest)
    idx, vals = _inputs(params, 5)
    seen: list[int | None] = []
    trailer = pc.value_trailer

    def spy(p, keys, betas, t=None):  # type: ignore[no-untyped-def]
        seen.append(t)
        return trailer(p, keys, betas, t)

    monkeypatch.setattr("flwr_fsl.families.ssa.protocol.value_trailer", spy)
    blobs = [
        encode_update(
            params, idx, vals, rng=np.random.default_rng(2), master_seeds=SEEDS, threads=t
        )[0].public_part
        for t in (1, threads)
    ]
    assert seen == [1, threads]  # the encode's threads, not default_threads()
    assert blobs[0] == blobs[1]


@pytest.mark.parametrize("digest", [1, 2])
def test_client_trailer_is_the_same_on_any_thread_count(digest):
    params = _params(projected_digest=digest)
    idx, vals = _inputs(params, 6)
    _, state = encode_update(
        params, idx, vals, rng=np.random.default_rng(3), master_seeds=SEEDS, threads=1
    )
    betas = np.random.default_rng(8).integers(-50, 50, (params.num_keys, params.key_tau))
    betas = betas.astype(np.int64).view(np.uint64)
    one = pc.client_trailer(params, state.keys, betas, 1)
    assert all(pc.client_trailer(params, state.keys, betas, t) == one for t in (2, 4))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_failing_or_misfit_trailer_fails_the_encode_on_any_thread_count(monkeypatch, threads):
    params = _params()
    idx, vals = _inputs(params, 10)

    def refuse(*_a: object) -> bytes:
        raise pc.ConfigurationError("no projection salt passes")

    for make, err in ((refuse, pc.ConfigurationError), (lambda *_a: b"short", RuntimeError)):
        monkeypatch.setattr("flwr_fsl.families.ssa.protocol.value_trailer", make)
        with pytest.raises(err):
            encode_update(params, idx, vals, rng=np.random.default_rng(1), threads=threads)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(0, 40),
    keys=st.integers(0, 60),
    seed=st.integers(0, 2**32 - 1),
    verify=st.booleans(),
    weighted=st.booleans(),
)
def test_key_betas_gather_equals_the_masked_gather(n, keys, seed, verify, weighted):
    """``slots - EMPTY`` reads the dummy row for EMPTY, as the masked index did."""
    params = SSAParams(2, 1 << 12, 300, 2, bytes(range(16)), verify=verify, weighted=weighted)
    rng = np.random.default_rng(seed)
    payload = rng.integers(0, 2**64, (n, params.tau), dtype=np.uint64)
    slots = rng.integers(EMPTY, n, keys) if n else np.full(keys, EMPTY, np.int64)
    rows = np.zeros((n + 1, params.key_tau), np.uint64)
    rows[1:, : params.tau] = payload
    if checks_counts(params):
        rows[0, params.tau - 1] = one_word(params)
    want = rows.take(np.where(slots == EMPTY, 0, slots + 1), axis=0)
    got = key_betas(params, payload, slots)
    assert got.dtype == np.uint64 and np.array_equal(got, want)
