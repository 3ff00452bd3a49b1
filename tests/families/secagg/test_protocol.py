"""Bonawitz SecAgg (flwr_fsl.families.secagg.protocol): exact sums under dropouts, clean failures,
the server's view, every decoder fuzzed and every client check exercised."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.families.secagg.protocol import (
    SecAggClient,
    SecAggError,
    SecAggParams,
    SecAggServer,
    TooFewSurvivorsError,
    UnmaskRequest,
    decode_ids,
    encode_ids,
    pair_mask,
    self_mask,
)
from flwr_fsl.families.secagg.protocol import run_round as secagg_round

U64 = np.uint64


def _uniform_bytes(counts: np.ndarray) -> bool:
    """Chi-square of 256 byte-value counts: df 255, P(> 255 + 5 sqrt(510)) < 1e-4."""
    expected = counts.sum() / counts.size
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    return chi2 < 255 + 5 * np.sqrt(2 * 255)


def _params(t: int, m: int, round_id: int = 3) -> SecAggParams:
    return SecAggParams(round_id, os.urandom(16), t, m)


def run_round(
    n: int,
    t: int,
    m: int,
    *,
    drop: dict[str, set[int]] | None = None,
    seed: int = 0,
    nodes: list[int] | None = None,
    view: dict | None = None,
    vectors: dict[int, np.ndarray] | None = None,
):  # type: ignore[no-untyped-def]
    """One round of the library driver; ``drop[phase]`` = clients silent from that phase on
    ('share', 'mask', 'unmask'). Each client's state goes through its byte codec between
    messages, as the mod keeps it in ``Context.state``. Returns (the server's result, the
    plaintext sum of U3's vectors, the server)."""
    rng = np.random.default_rng(seed)
    nodes = nodes or [1000 + 7 * i for i in range(n)]
    params = _params(t, m)
    x = vectors or {u: rng.integers(0, 2**64, m, dtype=U64) for u in nodes}
    out = secagg_round(x, params, dropouts=drop, persist=True)
    if view is not None:
        view.update(
            params=params, clients=out.clients, x=x, y=out.masked, server=out.server,
            u3=out.survivors,
        )  # fmt: skip
    expected = np.zeros(m, dtype=U64)
    for u in out.survivors:
        expected += x[u]
    return out.total, expected, out.server


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.2, 0.3])
def test_exact_sum_under_dropouts_up_to_the_threshold(fraction: float) -> None:
    # 20 clients, t = 14: up to 6 may drop; drops spread over the three later rounds.
    n, t, m = 20, 14, 1000
    k = round(fraction * n)
    nodes = [1000 + 7 * i for i in range(n)]
    lost = nodes[3 : 3 + k]
    drop = {"share": set(lost[0::3]), "mask": set(lost[1::3]), "unmask": set(lost[2::3])}
    result, expected, server = run_round(n, t, m, drop=drop, nodes=nodes)
    assert isinstance(result, np.ndarray)
    np.testing.assert_array_equal(result, expected)
    assert len(server.survivors) == n - len(drop["share"]) - len(drop["mask"])


def test_dropouts_beyond_the_threshold_fail_cleanly() -> None:
    n, t, m = 10, 7, 50
    nodes = [1000 + i for i in range(n)]
    # Four drop after masking: U3 has 6 < t.
    with pytest.raises(TooFewSurvivorsError, match="6 masked inputs"):
        run_round(n, t, m, nodes=nodes, drop={"mask": set(nodes[:4])})
    # Enough masked inputs, but four go silent in Unmask: 6 shares of each secret < t.
    with pytest.raises(TooFewSurvivorsError, match="shares"):
        run_round(n, t, m, nodes=nodes, drop={"unmask": set(nodes[:4])})
    # Too few share their keys: the server refuses before masked inputs.
    with pytest.raises(TooFewSurvivorsError):
        run_round(n, t, m, nodes=nodes, drop={"share": set(nodes[:4])})


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(2, 9),
    m=st.integers(1, 40),
    data=st.data(),
)
def test_reconstruction_property(n: int, m: int, data: st.DataObject) -> None:
    t = data.draw(st.integers(2, n))
    nodes = sorted(data.draw(st.sets(st.integers(0, 2**64 - 1), min_size=n, max_size=n)))
    spare = n - t
    phases = data.draw(st.lists(st.sampled_from(["share", "mask", "unmask"]), max_size=spare))
    drop: dict[str, set[int]] = {"share": set(), "mask": set(), "unmask": set()}
    for node, phase in zip(nodes, phases, strict=False):
        drop[phase].add(node)
    result, expected, _ = run_round(n, t, m, nodes=nodes, drop=drop, seed=n * 100 + m)
    assert isinstance(result, np.ndarray)
    np.testing.assert_array_equal(result, expected)


def test_a_masked_input_is_uniform_and_independent_of_the_input() -> None:
    # Client u's y_u minus everything the server can strip (its self mask, which the server
    # reconstructs) is x_u plus pair masks with honest survivors: uniform whatever x_u is.
    m = 1 << 15
    words = {}
    for label, value in (("zeros", 0), ("ones", 2**64 - 1), ("big", 2**62 + 12345)):
        params = _params(3, m)
        clients = {u: SecAggClient(u, params) for u in (1, 2, 3)}
        server = SecAggServer(params)
        for u, c in clients.items():
            server.add_advertisement(u, c.advertise())
        roster = server.roster()
        for u, c in clients.items():
            server.add_shares(u, c.share_keys(roster))
        u2 = server.sharers()
        x = np.full(m, value, dtype=U64)
        y = clients[1].masked_input(u2, x)
        words[label] = y - self_mask(params, clients[1].seed)
    for label, w in words.items():
        top = (w >> U64(56)).astype(np.int64)
        low = (w & U64(0xFF)).astype(np.int64)
        for part in (top, low):
            counts = np.bincount(part, minlength=256)
            assert _uniform_bytes(counts), label
        bits = np.unpackbits(w.view(np.uint8)).mean()
        assert abs(bits - 0.5) < 0.002, label
    # Two-sample (chi-square homogeneity of the top bytes): the inputs cannot be told apart.
    a = np.bincount((words["zeros"] >> U64(56)).astype(np.int64), minlength=256)
    b = np.bincount((words["big"] >> U64(56)).astype(np.int64), minlength=256)
    chi2 = float((((a - b) ** 2) / np.maximum(a + b, 1)).sum())
    assert chi2 < 255 + 5 * np.sqrt(2 * 255)


def test_after_unmasking_a_survivors_input_stays_hidden() -> None:
    # The server's whole view after a round with one dropout: every y_u, the self-mask seeds
    # of the survivors and the dropped client's mask key (both reconstructed from shares).
    # Stripping all of them from y_u leaves x_u plus the pair mask with the other survivor:
    # uniform although every x_u is zero.
    m = 1 << 14
    nodes = [10, 20, 30]
    zeros = {u: np.zeros(m, dtype=U64) for u in nodes}
    view: dict = {}
    result, _, _ = run_round(3, 2, m, nodes=nodes, drop={"mask": {30}}, view=view, vectors=zeros)
    assert isinstance(result, np.ndarray) and not result.any()
    params, clients = view["params"], view["clients"]
    dropped = clients[30].s_key.private_key  # the server reconstructed it from shares
    for u in (10, 20):
        residue = view["y"][u] - self_mask(params, clients[u].seed)
        mask30 = pair_mask(params, dropped, clients[u].s_key.public_bytes, u, 30)
        residue += mask30  # u < 30: y_u held +PRG(s_u,30)... removed here
        residue -= mask30 + mask30
        counts = np.bincount((residue >> U64(56)).astype(np.int64), minlength=256)
        assert _uniform_bytes(counts)
        # ...and it is exactly the pair mask the server cannot compute.
        other = 20 if u == 10 else 10
        pair = pair_mask(
            params, clients[u].s_key.private_key, clients[other].s_key.public_bytes, 10, 20
        )
        np.testing.assert_array_equal(residue, pair if u == 10 else -pair)


def test_client_refuses_requests_a_curious_server_could_exploit() -> None:
    params = _params(2, 8)
    a, b, c = (SecAggClient(u, params) for u in (1, 2, 3))
    server = SecAggServer(params)
    for u, cl in ((1, a), (2, b), (3, c)):
        server.add_advertisement(u, cl.advertise())
    roster = server.roster()
    for u, cl in ((1, a), (2, b), (3, c)):
        server.add_shares(u, cl.share_keys(roster))
    with pytest.raises(SecAggError, match="already made"):
        a.share_keys(roster)
    u2 = server.sharers()
    x = np.arange(8, dtype=U64)
    with pytest.raises(SecAggError, match="hold this client"):
        a.masked_input([2, 3], x)
    with pytest.raises(SecAggError, match="threshold"):
        a.masked_input([1], x)
    server.add_masked_input(1, a.masked_input(u2, x))
    # A second masked input under a smaller U2 would differ from the first by a pair mask.
    with pytest.raises(SecAggError, match="already sent"):
        a.masked_input([1, 2], x)
    server.add_masked_input(2, b.masked_input(u2, x))
    request = server.unmask_request(1)
    bad = UnmaskRequest((1, 2, 4), UnmaskRequest.from_bytes(request).sealed_shares)
    with pytest.raises(SecAggError, match="lie in U2"):
        a.unmask(bad.to_bytes())
    a.unmask(request)
    # Asking again with another U3 could collect b_v from one answer and s_v from the other.
    other = UnmaskRequest((1, 2, 3), UnmaskRequest.from_bytes(request).sealed_shares)
    with pytest.raises(SecAggError, match="already answered"):
        a.unmask(other.to_bytes())


def test_roster_checks() -> None:
    params = _params(2, 4)
    a, b = SecAggClient(1, params), SecAggClient(2, params)
    server = SecAggServer(params)
    server.add_advertisement(1, a.advertise())
    with pytest.raises(SecAggError, match="repeats"):
        server.add_advertisement(2, a.advertise())
    with pytest.raises(SecAggError, match="64 bytes"):
        server.add_advertisement(2, b"x" * 63)
    with pytest.raises(TooFewSurvivorsError):
        server.roster()
    server.add_advertisement(2, b.advertise())
    roster = server.roster()
    impostor = SecAggClient(1, params)  # same id, other keys: the roster does not hold them
    with pytest.raises(SecAggError, match="own public keys"):
        impostor.share_keys(roster)


def test_a_tampered_or_redirected_share_contributes_nothing_and_is_detected() -> None:
    # The relay alters one sealed share: its recipient skips it; with t + 1 honest holders
    # the secret still reconstructs and the sum is exact.
    t, m = 3, 16
    params = _params(t, m)
    nodes = [1, 2, 3, 4, 5]
    clients = {u: SecAggClient(u, params) for u in nodes}
    server = SecAggServer(params)
    for u, c in clients.items():
        server.add_advertisement(u, c.advertise())
    roster = server.roster()
    for u, c in clients.items():
        server.add_shares(u, c.share_keys(roster))
    u2 = server.sharers()
    x = {u: np.full(m, u, dtype=U64) for u in nodes}
    for u in nodes:
        server.add_masked_input(u, clients[u].masked_input(u2, x[u]))
    for u in nodes:
        request = UnmaskRequest.from_bytes(server.unmask_request(u))
        if u == 2:
            blob = bytearray(request.sealed_shares[1])
            blob[-1] ^= 1
            request.sealed_shares[1] = bytes(blob)
        server.add_unmask(u, clients[u].unmask(request.to_bytes()))
    np.testing.assert_array_equal(server.result(), np.full(m, sum(nodes), dtype=U64))


def test_server_rejects_out_of_protocol_messages() -> None:
    params = _params(2, 4)
    clients = {u: SecAggClient(u, params) for u in (1, 2, 3)}
    server = SecAggServer(params)
    for u, c in clients.items():
        server.add_advertisement(u, c.advertise())
    roster = server.roster()
    bundle = clients[1].share_keys(roster)
    with pytest.raises(SecAggError, match="outside the roster"):
        server.add_shares(9, bundle)
    server.add_shares(1, bundle)
    with pytest.raises(SecAggError, match="twice"):
        server.add_shares(1, bundle)
    server.add_shares(2, clients[2].share_keys(roster))
    u2 = server.sharers()
    assert u2 == (1, 2)
    with pytest.raises(SecAggError, match="shares outside"):
        server.add_shares(3, clients[3].share_keys(roster))
    with pytest.raises(SecAggError, match="outside U2"):
        server.add_masked_input(3, np.zeros(4, dtype=U64))
    with pytest.raises(SecAggError, match="4 uint64"):
        server.add_masked_input(1, np.zeros(5, dtype=U64))
    with pytest.raises(SecAggError, match="4 uint64"):
        server.add_masked_input(1, np.zeros(4, dtype=np.int64))
    server.add_masked_input(1, clients[1].masked_input(u2, np.ones(4, dtype=U64)))
    server.add_masked_input(2, clients[2].masked_input(u2, np.ones(4, dtype=U64)))
    reply = clients[1].unmask(server.unmask_request(1))
    with pytest.raises(SecAggError, match="outside U3"):
        server.add_unmask(3, reply)
    server.add_unmask(1, reply)
    with pytest.raises(SecAggError, match="twice"):
        server.add_unmask(1, reply)


def test_params_and_ids_round_trip_and_reject_bad_bytes() -> None:
    p = _params(5, 77, round_id=2**40)
    assert SecAggParams.from_bytes(p.to_bytes()) == p
    raw = p.to_bytes()
    for bad in (raw[:-1], raw + b"\0", b"XXXX" + raw[4:], raw[:4] + b"\x02" + raw[5:]):
        with pytest.raises(SecAggError):
            SecAggParams.from_bytes(bad)
    zero_t = raw[:29] + (1).to_bytes(4, "little") + raw[33:]
    with pytest.raises(SecAggError, match="threshold"):
        SecAggParams.from_bytes(zero_t)
    ids = [3, 1, 2**64 - 1]
    assert decode_ids(encode_ids(ids)) == ([1, 3, 2**64 - 1], 28)
    with pytest.raises(SecAggError, match="increasing"):
        decode_ids((2).to_bytes(4, "little") + (5).to_bytes(8, "little") * 2)
    with pytest.raises(SecAggError, match="exceed the limit"):
        decode_ids((10**6).to_bytes(4, "little"))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_decoders_never_crash_or_overallocate(blob: bytes) -> None:
    params = _params(2, 4)
    client = SecAggClient(1, params)
    server = SecAggServer(params)
    for call in (
        lambda: SecAggParams.from_bytes(blob),
        lambda: decode_ids(blob),
        lambda: UnmaskRequest.from_bytes(blob),
        lambda: SecAggClient.from_bytes(blob),
        lambda: client.share_keys(blob),
        lambda: server.add_advertisement(5, blob),
    ):
        try:
            call()
        except SecAggError:
            pass
        except TooFewSurvivorsError:
            pass


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_mutated_client_state_decodes_or_fails_cleanly(data: st.DataObject) -> None:
    params = _params(2, 4)
    clients = {u: SecAggClient(u, params) for u in (1, 2)}
    server = SecAggServer(params)
    for u, c in clients.items():
        server.add_advertisement(u, c.advertise())
    clients[1].share_keys(server.roster())
    raw = bytearray(clients[1].to_bytes())
    assert SecAggClient.from_bytes(bytes(raw)).to_bytes() == bytes(raw)
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        SecAggClient.from_bytes(bytes(raw[:cut]))
    except SecAggError:
        pass


# -- subset rounds (Niu Alg. 1 line 8: each position over the clients that hold it) -------------


def test_words_at_positions_are_the_ctr_stream_words() -> None:
    from flwr_fsl.crypto.prg import ctr_stream
    from flwr_fsl.families.secagg.masks import _words_at

    key = os.urandom(16)
    full = ctr_stream(key, bytes(16), 1001)
    positions = np.array([0, 1, 2, 7, 500, 999, 1000], dtype=np.int64)
    np.testing.assert_array_equal(_words_at(key, positions, 1001), full[positions])
    assert _words_at(key, np.zeros(0, np.int64), 1001).size == 0


def subset_round(rows: dict[int, np.ndarray], m: int, t: int, *, drop_after_mask=()):  # type: ignore[no-untyped-def]
    """A subset round of the library driver (the shared rows through their strict codec)."""
    rng = np.random.default_rng(5)
    params = _params(t, m)
    x = {u: rng.integers(0, 2**64, rows[u].size, dtype=U64) for u in sorted(rows)}
    out = secagg_round(x, params, rows=rows, dropouts={"mask": set(drop_after_mask)}, persist=True)
    expected = np.zeros(m, dtype=U64)
    for u in out.survivors:
        expected[rows[u]] += x[u]
    return out.server, expected


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_subset_rounds_sum_each_position_over_its_holders(data: st.DataObject) -> None:
    n = data.draw(st.integers(3, 7))
    m = data.draw(st.integers(1, 60))
    nodes = list(range(1, n + 1))
    rows = {
        u: np.array(sorted(data.draw(st.sets(st.integers(0, m - 1), max_size=m))), np.int64)
        for u in nodes
    }
    t = data.draw(st.integers(2, n - 1))
    dropped = data.draw(st.sets(st.sampled_from(nodes), max_size=n - t))
    server, expected = subset_round(rows, m, t, drop_after_mask=dropped)
    np.testing.assert_array_equal(server.result(), expected)
    counts = np.zeros(m, np.int64)
    for u in server.survivors:
        counts[rows[u]] += 1
    np.testing.assert_array_equal(server.participants(), counts)


def test_a_subset_masked_input_is_uniform_where_another_client_shares_the_row() -> None:
    # Client 1 holds rows 0..m-1, client 2 rows 0..m/2-1, client 3 rows m/2..m-1: every row of
    # client 1 is shared with an honest peer, so y_1 minus its self mask is uniform.
    m = 1 << 14
    rows = {1: np.arange(m), 2: np.arange(m // 2), 3: np.arange(m // 2, m)}
    params = _params(2, m)
    clients = {u: SecAggClient(u, params) for u in rows}
    server = SecAggServer(params)
    for u, c in clients.items():
        server.add_advertisement(u, c.advertise())
    roster = server.roster()
    for u, c in clients.items():
        server.add_shares(u, c.share_keys(roster))
    u2 = server.sharers()
    shared = server.assign_rows(rows)
    assert set(shared[2]) == {1} and set(shared[1]) == {2, 3}  # 2 and 3 share no row
    y = clients[1].masked_input(u2, np.zeros(m, U64), rows=rows[1], shared_rows=shared[1])
    residue = y - self_mask(params, clients[1].seed, rows[1])
    counts = np.bincount((residue >> U64(56)).astype(np.int64), minlength=256)
    assert _uniform_bytes(counts)


def test_a_row_held_by_one_client_alone_is_revealed_by_its_aggregate() -> None:
    # The leakage Alg. 1 line 8 adds: a position whose participant set is one client is that
    # client's value in the clear once unmasked (Theorem 2's Event 1). The server knows it
    # happened: participants() == 1 there.
    m = 8
    rows = {1: np.array([0, 1, 2]), 2: np.array([0, 1]), 3: np.array([1])}
    server, expected = subset_round(rows, m, 2)
    total = server.result()
    assert server.participants()[2] == 1 and total[2] == expected[2]


def test_subset_row_checks() -> None:
    params = _params(2, 10)
    clients = {u: SecAggClient(u, params) for u in (1, 2)}
    server = SecAggServer(params)
    for u, c in clients.items():
        server.add_advertisement(u, c.advertise())
    roster = server.roster()
    for u, c in clients.items():
        server.add_shares(u, c.share_keys(roster))
    u2 = server.sharers()
    with pytest.raises(SecAggError, match="exactly the clients of U2"):
        server.assign_rows({1: np.arange(3)})
    with pytest.raises(SecAggError, match="strictly increasing"):
        server.assign_rows({1: np.array([2, 1]), 2: np.arange(3)})
    shared = server.assign_rows({1: np.arange(3), 2: np.arange(2, 5)})
    with pytest.raises(SecAggError, match="subset"):
        clients[1].masked_input(
            u2, np.zeros(3, U64), rows=np.arange(3), shared_rows={2: np.array([4])}
        )
    with pytest.raises(SecAggError, match="3 uint64"):
        clients[2].masked_input(u2, np.zeros(4, U64), rows=np.arange(2, 5), shared_rows=shared[2])
    with pytest.raises(SecAggError, match="3 uint64"):
        server.add_masked_input(1, np.zeros(10, U64))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=300), st.integers(1, 50))
def test_row_decoder_fuzz(blob: bytes, m: int) -> None:
    from flwr_fsl.families.secagg.protocol import decode_rows

    try:
        decode_rows(blob, m)
    except SecAggError:
        pass
