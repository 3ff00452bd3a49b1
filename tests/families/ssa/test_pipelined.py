"""SSA servers add a chunk of clients pipelined (session 30): exactly as one at a time.

:meth:`~flwr_fsl.families.ssa.protocol.SSAServer.add_clients` decodes client ``i + 1`` on the
server's threads while it evaluates client ``i`` (:func:`flwr_fsl.core.threads.pipelined`).
These tests hold it to :meth:`add_client` called client after client: the same shares, digests,
order of clients and errors, and a malformed or failing client dropped alone (the clients right
before and right after it are exact); S1's helper service opens and decodes the next upload of
a chunk while it evaluates this one, with the same answers as one request per client.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from flwr_fsl.families.ssa import protocol, verify
from flwr_fsl.families.ssa.protocol import ClientKeys, SSAInputError, SSAServer
from flwr_fsl.families.ssa.verify import new_digest_key, same_digest
from tests.families.ssa.test_threads import _uploads
from tests.families.ssa.test_two_server import assert_matches, fresh_uploads
from tests.helper.test_helper import make_clients, make_params, twin


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "_RANGE_POINTS", 40)
    monkeypatch.setattr(verify, "_KEYED_SEGMENT_POINTS", 40)


def _chunk(params: protocol.SSAParams, party: int) -> list[ClientKeys]:
    """Good clients around bad ones."""
    ups = _uploads(params, 5)
    seed = [u.master_seeds[party] for u in ups]
    truncated = ups[2].public_part[:-9]
    flipped = bytearray(ups[3].public_part)
    flipped[40] ^= 0xFF  # a header/body byte: malformed or failing keys
    items = [
        ClientKeys(0, ups[0].public_part, seed[0]),
        ClientKeys(1, ups[1].public_part, seed[1]),  # right before a malformed one
        ClientKeys(2, truncated, seed[2]),  # malformed public part
        ClientKeys(4, ups[4].public_part, seed[4]),  # right after it
        ClientKeys(1, ups[4].public_part, seed[4]),  # already added
        ClientKeys(5, ups[3].public_part, b"short"),  # bad master seed
        ClientKeys(3, bytes(flipped), seed[3]),  # flipped byte (fails the key check)
        ClientKeys(6, ups[3].public_part, seed[3]),  # right after it
    ]
    return items


def _one_at_a_time(
    server: SSAServer, items: list[ClientKeys]
) -> list[bytes | SSAInputError | None]:
    out: list[bytes | SSAInputError | None] = []
    for item in items:
        try:
            if item.master_seed is None:
                out.append(server.add_client_hint(item.client_id, item.body, item.expect))
            else:
                out.append(
                    server.add_client(item.client_id, item.body, item.master_seed, item.expect)
                )
        except SSAInputError as err:
            out.append(err)
    return out


def _same(a: list[bytes | SSAInputError | None], b: list[bytes | SSAInputError | None]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, SSAInputError) or isinstance(y, SSAInputError):
            assert type(x) is type(y) and str(x) == str(y)
        else:
            assert x == y


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_pipelined_chunk_is_one_client_at_a_time(checked: bool, threads: int) -> None:
    params = make_params(1, weighted=False, epoch=0, verify=checked)
    key = new_digest_key() if checked else None
    items0 = _chunk(params, 0)
    s0 = SSAServer(params, 0, threads=threads, digest_key=key)
    got0 = s0.add_clients(items0)
    ref0 = SSAServer(params, 0, threads=threads, digest_key=key)
    want0 = _one_at_a_time(ref0, items0)
    # S0's checks draw a query seed: compare the key-check digests, S1 answers the same checks.
    _same([d[:32] if isinstance(d, bytes) else d for d in got0], [  # type: ignore[misc]
        d[:32] if isinstance(d, bytes) else d for d in want0
    ])  # fmt: skip
    assert s0.clients == ref0.clients
    assert {0, 1, 4, 6} <= set(s0.clients) and not {2, 5} & set(s0.clients)
    assert 3 not in s0.clients or not checked
    accepted = [i for i, d in enumerate(want0) if not isinstance(d, SSAInputError)]
    assert np.array_equal(s0.share(), ref0.share())
    expect = [d if isinstance(d, bytes) else None for d in got0]
    items1 = [
        ClientKeys(i.client_id, i.body, i.master_seed, e)
        for i, e in zip(_chunk(params, 1), expect, strict=True)
    ]
    s1 = SSAServer(params, 1, threads=threads, digest_key=key)
    got1 = s1.add_clients(items1)
    ref1 = SSAServer(params, 1, threads=threads, digest_key=key)
    _same(got1, _one_at_a_time(ref1, items1))
    assert s1.clients == ref1.clients == s0.clients
    if checked:
        for d0, d1 in zip(got0, got1, strict=True):
            assert isinstance(d0, SSAInputError) or same_digest(d0, d1)  # type: ignore[arg-type]
    # The good clients alone, one at a time, give the same shares: nothing of a bad one stays.
    alone = [SSAServer(params, p, threads=1, digest_key=key) for p in (0, 1)]
    for p, chunk in ((0, items0), (1, items1)):
        for item in (chunk[i] for i in accepted):
            assert item.master_seed is not None
            alone[p].add_client(item.client_id, item.body, item.master_seed, item.expect)
    assert np.array_equal(alone[0].share(), ref0.share())
    assert np.array_equal(alone[1].share(), s1.share())


@pytest.mark.parametrize("threads", [1, 2])
def test_s1_rejects_a_client_in_the_middle_alone(threads: int) -> None:
    params = make_params(1, weighted=False, epoch=0, verify=True)
    key = new_digest_key()
    ups = _uploads(params, 3)
    s0 = SSAServer(params, 0, threads=threads, digest_key=key)
    d0 = s0.add_clients(
        [ClientKeys(c, u.public_part, u.master_seeds[0]) for c, u in enumerate(ups)]
    )
    wrong = bytearray(d0[1])  # type: ignore[arg-type]
    wrong[0] ^= 1
    expect = [d0[0], bytes(wrong), d0[2]]
    items = [
        ClientKeys(c, u.public_part, u.master_seeds[1], e)  # type: ignore[arg-type]
        for (c, u), e in zip(enumerate(ups), expect, strict=True)
    ]
    s1 = SSAServer(params, 1, threads=threads, digest_key=key)
    got = s1.add_clients(items)
    assert isinstance(got[1], SSAInputError) and "key check failed" in str(got[1])
    assert same_digest(got[0], d0[0]) and same_digest(got[2], d0[2])  # type: ignore[arg-type]
    assert s1.clients == (0, 2)
    s0.discard(1)
    ref = [SSAServer(params, p, threads=1, digest_key=key) for p in (0, 1)]
    for c in (0, 2):
        e = ref[0].add_client(c, ups[c].public_part, ups[c].master_seeds[0])
        ref[1].add_client(c, ups[c].public_part, ups[c].master_seeds[1], expect=d0[c])
        assert e is not None
    assert np.array_equal(s0.share(), ref[0].share())
    assert np.array_equal(s1.share(), ref[1].share())


def test_an_unexpected_error_propagates_after_the_clients_before_it() -> None:
    params = make_params(1, weighted=False, epoch=0, verify=False)
    ups = _uploads(params, 3)
    server = SSAServer(params, 0, threads=2)
    items = [ClientKeys(c, u.public_part, u.master_seeds[0]) for c, u in enumerate(ups)]
    items[1] = ClientKeys(1, None, ups[1].master_seeds[0])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        server.add_clients(items)
    assert server.clients == (0,)
    with pytest.raises(TypeError):  # the same error one at a time
        SSAServer(params, 0, threads=2).add_client(1, None, ups[1].master_seeds[0])  # type: ignore[arg-type]


def test_s1_pipelines_a_checked_chunk_and_refuses_bad_clients_alone() -> None:
    params = make_params(1, weighted=False, epoch=0, verify=True)
    clients = [replace(c, weight=1.0) for c in make_clients(5)]  # unit weights: counts are 1
    helper = twin()
    helper.open_round(1, params.to_bytes())
    ups = fresh_uploads(params, clients, helper.public_key())
    s0 = SSAServer(params, 0)
    digests = {
        c.cid: s0.add_client(c.cid, ups[c.cid].public_part, ups[c.cid].master_seed) for c in clients
    }
    c = [client.cid for client in clients]
    items = [
        (c[0], ups[c[0]].public_part, ups[c[0]].sealed, digests[c[0]]),
        (c[1], ups[c[1]].public_part[:-9], ups[c[1]].sealed, digests[c[1]]),  # seal refuses
        (c[2], ups[c[2]].public_part, ups[c[2]].sealed, digests[c[2]]),
        (c[3], ups[c[3]].public_part, ups[c[3]].sealed, bytes(len(digests[c[3]] or b""))),
        (c[4], ups[c[4]].public_part, ups[c[4]].sealed, digests[c[4]]),
    ]
    got = helper.add_checked(1, items, hints=False)  # type: ignore[arg-type]
    assert got[c[1]] == (
        "SealedBoxError: public part does not match the sealed hash (altered in transit)"
    )
    assert str(got[c[3]]).startswith("SSAInputError: key check failed")
    for cid in (c[0], c[2], c[4]):
        assert same_digest(got[cid], digests[cid])  # type: ignore[arg-type]
    again = helper.add_checked(1, [items[0]], hints=False)  # type: ignore[list-item]
    assert "already submitted" in str(again[c[0]])
    s0.discard(c[1])
    s0.discard(c[3])
    s1 = helper.finish_round(1)
    assert sorted(s1.client_ids) == [c[0], c[2], c[4]]
    result = protocol.reconstruct(params, s0.share(), s1.share)
    assert_matches(params, result, [clients[0], clients[2], clients[4]])
