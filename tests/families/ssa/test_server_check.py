"""The servers' fused checked evaluation (session 29): the same digests, blobs and shares.

:func:`flwr_fsl.families.ssa.server_eval.evaluate_checked` sums the value words inside the key
check's segments, hashes the public part beside them and projects in column ranges on the
server's threads (:func:`flwr_fsl.kernels.projection.project_range`). These tests hold it to
the path before it, computed here step by step: :meth:`KeyCheck.evaluate` then
:func:`value_round_check` (a second pass, one thread, :func:`projected_check.project`).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.dpf import DPFKeyBatch
from flwr_fsl.families.ssa import projected_check, protocol, range_check, server_eval, verify
from flwr_fsl.families.ssa.projected_check import project, project_shares, value_round_check
from flwr_fsl.families.ssa.protocol import (
    SSAInputError,
    SSAServer,
    encode_update,
    parse_public_part,
    split_value_trailer,
)
from flwr_fsl.families.ssa.verify import KeyCheck, new_digest_key, same_digest
from flwr_fsl.kernels.projection import project_range
from tests.helper.test_helper import WIDTH, K, M, make_params


@pytest.mark.parametrize("r", [1, 3, 17, 32, 64, 96])
@pytest.mark.parametrize("n", [0, 1, 7, 16384, 16385, 40_001])
def test_column_ranges_sum_to_the_projection(r: int, n: int) -> None:
    rng = np.random.default_rng(r * 100_003 + n)
    words = rng.integers(0, 2**64, n, dtype=np.uint64)
    seed = rng.bytes(16)
    cuts = sorted({0, n, *rng.integers(0, n + 1, 4).tolist()})
    total = np.zeros(r, np.uint64)
    for lo, hi in itertools.pairwise(cuts):
        total += project_range(seed, r, words, lo, hi)
    assert np.array_equal(total, project(seed, r, words))
    for threads in (1, 2, 3):
        assert np.array_equal(project_shares(seed, r, words, threads), total)


def test_public_digest_is_the_bytes_of_each_field() -> None:
    params = make_params(1, weighted=False, epoch=0, verify=True)
    up = encode_update(params, np.arange(K), np.ones((K, WIDTH)), 1.0)[0]
    public = parse_public_part(params, up.public_part)
    h = projected_check.hashlib.sha256(
        projected_check._TAG + b"public" + int(public.tau).to_bytes(8, "little")
    )
    for arr in (public.domain_bits, public.epochs, public.cw_seeds, public.cw_bits, public.cw_leaf):
        h.update(np.ascontiguousarray(arr).tobytes())
    h.update(np.ascontiguousarray(public.cw_proof).tobytes())
    assert projected_check.public_digest(public) == h.digest()


def _reference(
    params: object, party: int, public_part: bytes, seed: bytes, key: bytes, client: int,
    expect: bytes | None,
) -> tuple[np.ndarray, bytes]:  # fmt: skip
    """The checked evaluation as before session 29: key check, then the value check."""
    _, trailer = split_value_trailer(params, public_part)  # type: ignore[arg-type]
    public = parse_public_part(params, public_part)  # type: ignore[arg-type]
    keys = DPFKeyBatch.from_master_seed(party, public, seed)
    server = SSAServer(params, party, threads=1, digest_key=key)  # type: ignore[arg-type]
    check = KeyCheck(params, party, server._lengths, 1, key)  # type: ignore[arg-type]
    values, digest = check.evaluate(keys, client=client)
    assert trailer is not None
    digest += value_round_check(
        params,  # type: ignore[arg-type]
        keys,
        values,
        server._row_offsets,
        trailer,
        expect,
    )
    return values, digest


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_checks_and_shares_equal_the_two_pass_path(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verify, "_KEYED_SEGMENT_POINTS", 40)  # many segments, every thread busy
    monkeypatch.setattr(range_check.os, "urandom", lambda n: bytes(range(n)))  # S0's query seed
    params = make_params(1, weighted=False, epoch=0, verify=True)
    assert params.value_check_mode == "projected"
    key = new_digest_key()
    rng = np.random.default_rng(5)
    servers = [SSAServer(params, p, threads=threads, digest_key=key) for p in (0, 1)]
    sums = [np.zeros((M, params.tau), np.uint64) for _ in (0, 1)]
    for c in range(3):
        idx = rng.choice(M, K, replace=False)
        up = encode_update(params, idx, rng.normal(0, 0.1, (K, WIDTH)), 1.0, rng=rng)[0]
        d0 = servers[0].add_client(c, up.public_part, up.master_seeds[0])
        d1 = servers[1].add_client(c, up.public_part, up.master_seeds[1], expect=d0)
        r0 = _reference(params, 0, up.public_part, up.master_seeds[0], key, c, None)
        r1 = _reference(params, 1, up.public_part, up.master_seeds[1], key, c, d0)
        assert d0 == r0[1] and d1 == r1[1] and same_digest(d0, d1)
        for p, ref in ((0, r0), (1, r1)):
            sums[p] += _scatter(params, servers[p], ref[0])
    for p in (0, 1):
        assert np.array_equal(servers[p].share(), sums[p])


def _scatter(params: object, server: SSAServer, values: np.ndarray) -> np.ndarray:
    """A client's evaluated shares scattered alone into a fresh share (the reference)."""
    alone = SSAServer(params, server.party, threads=1)  # type: ignore[arg-type]
    alone._scatter(values)
    return alone._share[:M].copy()


def test_a_bad_value_trailer_is_still_refused() -> None:
    params = make_params(1, weighted=False, epoch=0, verify=True)
    up = encode_update(params, np.arange(K), np.ones((K, WIDTH)), 1.0)[0]
    bad = bytearray(up.public_part)
    bad[-200] ^= 1  # S0's encrypted bit shares: its check fails, or S1's differs
    s0, s1 = SSAServer(params, 0, threads=2), SSAServer(params, 1, threads=2)
    d0 = s0.add_client(0, bytes(bad), up.master_seeds[0])
    with pytest.raises(SSAInputError):
        s1.add_client(0, bytes(bad), up.master_seeds[1], expect=d0)
    part = bytearray(up.public_part)
    head = len(part) - projected_check.trailer_bytes(params)
    part[head + 20] ^= 1  # part_a: S0 refuses
    with pytest.raises(SSAInputError, match="part_a"):
        SSAServer(params, 0, threads=2).add_client(0, bytes(part), up.master_seeds[0])


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("stash", [0, 1])
def test_scatter_windows_add_what_one_scatter_adds(
    checked: bool, stash: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_eval, "WINDOW_ROWS", 8)  # several windows even at M rows
    monkeypatch.setattr(server_eval, "SCATTER_SPLIT_BYTES", 1)
    params = make_params(1, weighted=False, epoch=0, verify=checked, stash_size=stash)
    server = SSAServer(params, 0, threads=1)
    rows = int(server._lengths.sum())
    values = np.random.default_rng(9).integers(0, 2**64, (rows, params.key_tau), np.uint64)
    table = server._table
    want = np.zeros_like(server._share)
    n_bin = int(table.bin_offsets[-1])
    for b in range(table.num_bins):  # the reference: one point at a time
        for j in range(int(table.bin_offsets[b]), int(table.bin_offsets[b + 1])):
            p = j + b if checked else j
            want[table.bin_items[j]] += values[p, : params.tau]
    start = n_bin + (table.num_bins if checked else 0)
    for s in range(stash):
        size = rows - start
        block = values[start + s * size // stash : start + (s + 1) * size // stash]
        want[: block.shape[0]] += block[:, : params.tau]
    for threads in (1, 2, 3, 5):
        got = np.zeros_like(server._share)
        server_eval.scatter_share(got, table, values, params, threads)
        assert np.array_equal(got, want), threads


@pytest.mark.parametrize("checked", [False, True])
def test_a_failed_evaluation_leaves_nothing_in_the_running_sum(
    checked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verify, "_KEYED_SEGMENT_POINTS", 40)
    monkeypatch.setattr(protocol, "_RANGE_POINTS", 40)
    params = make_params(1, weighted=False, epoch=0, verify=checked)
    rng = np.random.default_rng(2)
    ups = [
        encode_update(params, rng.choice(M, K, replace=False), np.ones((K, WIDTH)), 1.0)[0]
        for _ in range(2)
    ]
    key = new_digest_key() if checked else None
    ref = SSAServer(params, 1, threads=2, digest_key=key)
    ref.add_client(0, ups[0].public_part, ups[0].master_seeds[1])
    server = SSAServer(params, 1, threads=2, digest_key=key)
    server.add_client(0, ups[0].public_part, ups[0].master_seeds[1])
    calls = {"n": 0}
    real = server_eval.evaluate_batch if not checked else verify.evaluate_batch

    def flaky(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("OpenSSL AES failed")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(server_eval if not checked else verify, "evaluate_batch", flaky)
    with pytest.raises(RuntimeError):
        server.add_client(1, ups[1].public_part, ups[1].master_seeds[1])
    assert calls["n"] > 3  # other ranges ran (and added) before the error was raised
    if checked:  # S1 rejects a client on S0's digest: nothing of it stays either
        with pytest.raises(SSAInputError):
            server.add_client(1, ups[1].public_part, ups[1].master_seeds[1], expect=bytes(32))
        monkeypatch.setattr(verify, "evaluate_batch", real)
        with pytest.raises(SSAInputError):
            server.add_client(1, ups[1].public_part, ups[1].master_seeds[1], expect=bytes(32))
    assert server.clients == (0,)
    assert np.array_equal(server.share(), ref.share())


def _bad_buffers(rows: int, tau: int) -> list[object]:
    """Running sums the compiled add must never get: wrong shape, dtype, order or type."""
    good = np.zeros((rows, tau), np.uint64)
    return [
        np.zeros((rows - 1, tau), np.uint64),  # too short: the add wrote past its end
        np.zeros((rows, tau + 1), np.uint64),
        np.zeros(rows * tau, np.uint64),
        np.zeros((rows, tau), np.int64),
        np.zeros((tau, rows), np.uint64).T,  # not C-contiguous
        np.zeros((rows, 2 * tau), np.uint64)[:, :tau],
        good.copy().tolist(),
    ]


def test_evaluate_with_refuses_a_running_sum_or_value_sums_of_the_wrong_layout() -> None:
    params = make_params(1, weighted=False, epoch=0, verify=True)
    key = new_digest_key()
    up = encode_update(params, np.arange(K), np.ones((K, WIDTH)), 1.0)[0]
    keys = DPFKeyBatch.from_master_seed(
        0, parse_public_part(params, up.public_part), up.master_seeds[0]
    )
    server = SSAServer(params, 0, threads=2, digest_key=key)
    check = KeyCheck(params, 0, server._lengths, 2, key)
    rows, tau, n_keys = int(server._lengths.sum()), keys.public.tau, keys.public.num_keys
    want, digest = check.evaluate(keys, client=3)
    for bad in _bad_buffers(rows, tau):
        before = bad.copy() if isinstance(bad, np.ndarray) else None
        with pytest.raises(ConfigurationError, match="add_into"):
            check.evaluate_with(keys, client=3, add_into=bad)  # type: ignore[arg-type]
        if before is not None:
            assert np.array_equal(bad, before)  # refused before anything was added
    frozen = np.zeros((rows, tau), np.uint64)
    frozen.flags.writeable = False
    with pytest.raises(ConfigurationError, match="add_into"):
        check.evaluate_with(keys, client=3, add_into=frozen)
    for bad in (
        np.zeros((n_keys - 1, 1), np.uint64),
        np.zeros((n_keys, 0), np.uint64),
        np.zeros((n_keys, tau + 1), np.uint64),
        np.zeros(n_keys, np.uint64),
        np.zeros((n_keys, 1), np.float64),
    ):
        with pytest.raises(ConfigurationError, match="value_sums"):
            check.evaluate_with(keys, client=3, value_sums=bad)
    into = np.ones((rows, tau), np.uint64)  # a good one still works, and adds exactly
    sums = np.empty((n_keys, params.value_width), np.uint64)
    values, again, _ = check.evaluate_with(keys, client=3, add_into=into, value_sums=sums)
    assert again == digest and np.array_equal(values, want)
    assert np.array_equal(into, want + np.uint64(1))
