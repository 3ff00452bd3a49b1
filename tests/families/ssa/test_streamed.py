"""SSA servers stream a chunk of clients (issue 26): exactly as one client at a time.

Where :attr:`~flwr_fsl.families.ssa.protocol.SSAServer.streams` (a checked round on two or more
threads), :meth:`~flwr_fsl.families.ssa.protocol.SSAServer.add_clients` queues client ``i + 1``'s
evaluation before it settles client ``i`` (:func:`flwr_fsl.core.threads.streamed`): two clients'
segments add into the running sum at once and a refused client is taken back out while the next
one is still being evaluated. These tests hold it to :meth:`add_client` called client after client
on one thread: the same shares, key-check digests, clients and errors, for any mix of good,
malformed, duplicate and failing clients (Hypothesis), an error that is not the client's, and
U-DPF hints.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.ssa import protocol, server_eval, verify
from flwr_fsl.families.ssa.protocol import ClientKeys, SSAInputError, SSAServer, encode_update
from flwr_fsl.families.ssa.sealing import seal_ssa_upload
from flwr_fsl.families.ssa.verify import new_digest_key
from tests.families.ssa.test_pipelined import _one_at_a_time, _same
from tests.families.ssa.test_threads import _uploads
from tests.families.ssa.test_two_server import assert_matches
from tests.helper.test_helper import bind, make_clients, make_params, signer_of, twin, upload_for

_KINDS = ("good", "good", "good", "truncated", "short seed", "flipped", "again", "wrong expect")


@pytest.fixture(autouse=True)
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many small segments: two clients' segments overlap on the threads."""
    monkeypatch.setattr(verify, "_KEYED_SEGMENT_POINTS", 40)


def _params() -> protocol.SSAParams:
    return make_params(1, weighted=False, epoch=0, verify=True)


_UPLOADS = _uploads(_params(), 6)


def _items(kinds: list[str], party: int) -> list[ClientKeys]:
    """Client ``i`` of kind ``kinds[i]`` (``again``: client 0's id once more)."""
    out = []
    for i, kind in enumerate(kinds):
        up = _UPLOADS[i % len(_UPLOADS)]
        body, seed = up.public_part, up.master_seeds[party]
        cid = 0 if kind == "again" else i
        if kind == "truncated":
            body = body[:-9]
        elif kind == "short seed":
            seed = b"short"
        elif kind == "flipped":
            flipped = bytearray(body)
            flipped[40] ^= 0xFF
            body = bytes(flipped)
        out.append(ClientKeys(cid, body, seed))
    return out


def _digests(got: list[bytes | SSAInputError | None]) -> list[bytes | SSAInputError | None]:
    """The key-check digests (S0's whole check also holds its fresh query seed)."""
    return [d[:32] if isinstance(d, bytes) else d for d in got]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kinds=st.lists(st.sampled_from(_KINDS), min_size=1, max_size=6), threads=st.sampled_from([2, 3])
)
def test_a_streamed_chunk_is_one_client_at_a_time(kinds: list[str], threads: int) -> None:
    params, key = _params(), new_digest_key()
    s0 = SSAServer(params, 0, threads=threads, digest_key=key)
    assert s0.streams
    items0 = _items(kinds, 0)
    got0 = s0.add_clients(items0)
    ref0 = SSAServer(params, 0, threads=1, digest_key=key)
    assert not ref0.streams
    _same(_digests(got0), _digests(_one_at_a_time(ref0, items0)))
    assert s0.clients == ref0.clients
    # S1 checks against S0's digests; a "wrong expect" client gets a digest with one bit off.
    expect = []
    for kind, d in zip(kinds, got0, strict=True):
        if isinstance(d, bytes) and kind == "wrong expect":
            d = bytes([d[0] ^ 1]) + d[1:]
        expect.append(d if isinstance(d, bytes) else None)
    items1 = [replace(i, expect=e) for i, e in zip(_items(kinds, 1), expect, strict=True)]
    s1 = SSAServer(params, 1, threads=threads, digest_key=key)
    got1 = s1.add_clients(items1)
    ref1 = SSAServer(params, 1, threads=1, digest_key=key)
    _same(_digests(got1), _digests(_one_at_a_time(ref1, items1)))  # (no expect: a fresh seed)
    assert s1.clients == ref1.clients
    for c in set(s0.clients) - set(s1.clients):
        s0.discard(c)
        ref0.discard(c)
    assert np.array_equal(s0.share(), ref0.share())
    assert np.array_equal(s1.share(), ref1.share())
    # Nothing of a refused client stays: the accepted ones alone give the same share.
    alone = SSAServer(params, 1, threads=1, digest_key=key)
    for item, d in zip(items1, got1, strict=True):
        if isinstance(d, bytes):  # accepted
            assert item.master_seed is not None
            alone.add_client(item.client_id, item.body, item.master_seed, item.expect)
    assert alone.clients == s1.clients
    assert np.array_equal(alone.share(), s1.share())


def test_an_error_that_is_not_the_clients_undoes_the_client_started_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Client 1's value check fails unexpectedly (not a refusal) while client 2 is being
    evaluated: the error propagates, client 0 stays, and nothing of clients 1 and 2 is left in
    the share."""
    params, key = _params(), new_digest_key()
    real = server_eval.server_projected

    def failing(params: object, keys: object, *args: object, **kw: object) -> bytes:
        if keys is failing.keys_of_1:  # type: ignore[attr-defined]
            raise MemoryError("not the client's fault")
        return real(params, keys, *args, **kw)  # type: ignore[arg-type]

    server = SSAServer(params, 0, threads=2, digest_key=key)
    items = _items(["good", "good", "good", "good"], 0)
    prepare = server.prepare

    def spy(item: ClientKeys) -> protocol.PreparedKeys:
        prepared = prepare(item)
        if item.client_id == 1:
            failing.keys_of_1 = prepared.keys  # type: ignore[attr-defined]
        return prepared

    monkeypatch.setattr(server, "prepare", spy)
    monkeypatch.setattr(server_eval, "server_projected", failing)
    with pytest.raises(MemoryError):
        server.add_clients(items)
    assert server.clients == (0,)
    monkeypatch.setattr(server_eval, "server_projected", real)
    ref = SSAServer(params, 0, threads=1, digest_key=key)
    ref.add_client(0, items[0].body, items[0].master_seed or b"")
    # The server goes on: the same clients added again give the reference's share.
    assert all(isinstance(d, bytes) for d in server.add_clients(items[2:]))
    for item in items[2:]:
        ref.add_client(item.client_id, item.body, item.master_seed or b"")
    assert np.array_equal(server.share(), ref.share())


def test_hints_stream_as_one_at_a_time() -> None:
    first = replace(_params(), epoch=1)
    key = new_digest_key()
    rng = np.random.default_rng(5)
    states, ups = [], []
    for _ in range(4):
        idx = rng.choice(first.domain_size, first.num_items, replace=False)
        up, state = encode_update(
            first, idx, rng.normal(size=(idx.size, first.value_width)), 1.0, rng=rng
        )
        ups.append(up)
        states.append(state)
    servers = [SSAServer(first, p, threads=1, digest_key=key) for p in (0, 1)]
    for c, up in enumerate(ups):
        d = servers[0].add_client(c, up.public_part, up.master_seeds[0])
        servers[1].add_client(c, up.public_part, up.master_seeds[1], d)
    nxt = replace(first, round_id=2, epoch=2)
    hints = [
        s.next_round(nxt, rng.normal(size=(s.indices.size, nxt.value_width)), 1.0) for s in states
    ]
    hints[2] = hints[2][:-5]  # a malformed hint between good ones
    items = [ClientKeys(c, h) for c, h in enumerate(hints)] + [ClientKeys(9, hints[0])]
    streamed = SSAServer(
        nxt, 0, {c: servers[0].keys[c] for c in range(4)}, threads=2, digest_key=key
    )
    ref = SSAServer(nxt, 0, {c: servers[0].keys[c] for c in range(4)}, threads=1, digest_key=key)
    assert streamed.streams
    got = streamed.add_clients(items)
    _same(_digests(got), _digests(_one_at_a_time(ref, items)))
    assert streamed.clients == ref.clients == (0, 1, 3)
    assert set(streamed.keys) == {0, 1, 3}
    assert np.array_equal(streamed.share(), ref.share())


def test_start_and_settle_are_refused_where_they_do_not_apply() -> None:
    params, key = _params(), new_digest_key()
    item = _items(["good"], 0)[0]
    unchecked = SSAServer(replace(params, verify=False), 0, threads=2)
    plain = ClientKeys(0, _uploads(replace(params, verify=False), 1)[0].public_part, b"\x01" * 16)
    with pytest.raises(ConfigurationError, match="checked round"):
        unchecked.start(plain, unchecked.prepare(plain))
    one = SSAServer(params, 0, threads=1, digest_key=key)  # one thread: no stream, the same path
    assert not one.streams
    assert one.settle(item, one.start(item, one.prepare(item))) is not None
    server = SSAServer(params, 0, threads=2, digest_key=key)
    started = server.start(item, server.prepare(item))
    with pytest.raises(ConfigurationError, match="not settled"):
        server.add_prepared(item, server.prepare(item))
    assert server.settle(item, started) is not None
    assert server.clients == (0,)


def test_s1_streams_a_checked_chunk_and_undoes_clients_refused_before_settling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """S1's helper evaluates the next upload while it claims and checks this one: a client
    refused after its keys were started (a second signature by one signer) leaves nothing in
    S1's share, a client already submitted is refused before anything is evaluated, and the
    round is exact."""
    monkeypatch.setenv(verify.THREADS_ENV, "2")  # S1's round streams on any machine
    params = make_params(1, weighted=False, epoch=0, verify=True)
    clients = [replace(c, weight=1.0) for c in make_clients(4)]  # unit weights: counts are 1
    helper = twin()
    helper.open_round(1, params.to_bytes())
    pub = helper.public_key()
    s0 = SSAServer(params, 0)
    uploads, digests = {}, {}
    for c in clients:
        upload, sealed = upload_for(params, c, pub)
        uploads[c.cid] = (upload, sealed)
        digests[c.cid] = s0.add_client(c.cid, upload.public_part, upload.master_seeds[0])
    c = [client.cid for client in clients]
    sybil, _ = uploads[c[1]]
    sybil_sealed = seal_ssa_upload(  # client 1's keys, signed with client 0's key
        pub,
        binding=bind(params),
        client_id=c[1],
        public_part=sybil.public_part,
        master_seed=sybil.master_seeds[1],
        signer=signer_of(c[0]),
    )
    items = [
        (c[0], uploads[c[0]][0].public_part, uploads[c[0]][1], digests[c[0]]),
        (c[1], sybil.public_part, sybil_sealed, digests[c[1]]),  # signer refused
        (c[2], uploads[c[2]][0].public_part, uploads[c[2]][1], digests[c[2]]),
        (c[3], uploads[c[3]][0].public_part, uploads[c[3]][1], digests[c[3]]),
    ]
    got = helper.add_checked(1, items, hints=False)  # type: ignore[arg-type]
    assert "already signed for client" in str(got[c[1]])
    again = helper.add_checked(1, [items[0]], hints=False)  # type: ignore[list-item]
    assert "already submitted" in str(again[c[0]])
    for cid in (c[0], c[2], c[3]):
        assert isinstance(got[cid], bytes)
    s0.discard(c[1])
    s1 = helper.finish_round(1)
    assert sorted(s1.client_ids) == [c[0], c[2], c[3]]
    result = protocol.reconstruct(params, s0.share(), s1.share)
    assert_matches(params, result, [clients[0], clients[2], clients[3]])
