"""Helper server S1 through the in-process twin: SSA, PSR and U-DPF rounds end to end with the
real protocol objects, every per-client rejection (the others stay exact), every whole-call
refusal, the wire format (known answer, round trips, every malformed request) and sealing."""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.wireformat import Writer
from flwr_fsl.crypto.channel import SealedBoxError, SealingKeyPair, associated_data, seal
from flwr_fsl.crypto.identity import SigningIdentity
from flwr_fsl.crypto.sealing import RoundBinding
from flwr_fsl.families.ssa.protocol import (
    SSAParams,
    SSAServer,
    encode_update,
    held_digest,
    layout_key,
    reconstruct,
)
from flwr_fsl.families.ssa.psr import (
    PSRServer,
    decode_answers,
    decode_table,
    encode_table,
    make_query,
)
from flwr_fsl.families.ssa.sealing import (
    open_psr_answer,
    open_psr_query,
    open_ssa_upload,
    seal_psr_answer,
    seal_psr_query,
    seal_ssa_upload,
    seal_udpf_hint,
)
from flwr_fsl.helper import (
    HelperError,
    HelperLimits,
    HelperRequestError,
    HelperService,
    HelperUnavailableError,
    InProcessHelper,
    verify_helper,
    wire,
)
from flwr_fsl.helper.connection import HelperConnection
from flwr_fsl.helper.errors import WireFormatError
from flwr_fsl.helper.quota import ServiceLimits
from flwr_fsl.helper.service import Method

M, K, WIDTH = 96, 8, 2
SID = bytes(range(16))  # the session of every twin below (clients bind sealed material to it)


def fixed_ids(*ids: bytes) -> Callable[[], bytes]:
    """A deterministic session-id drawer for a test S1: ``ids`` in order, then random ones."""
    it = iter(ids)
    return lambda: next(it, None) or os.urandom(16)


def open_rounds(helper: InProcessHelper | HelperService) -> tuple[int, ...]:
    """The rounds open on an in-process S1, over all its sessions (``Health`` no longer says)."""
    service = helper.service if isinstance(helper, InProcessHelper) else helper
    with service._sessions_lock:
        sessions = list(service._sessions.values())
    return tuple(sorted(r for s in sessions for r in s.rounds))


def twin(*args: Any, **kwargs: Any) -> InProcessHelper:
    # These tests exercise round mechanics with as few as one client; S1's minimum
    # participation has its own tests (test_s1_refuses_a_round_below_its_minimum).
    # S1 draws session ids; this one draws SID first, so material bound to SID opens.
    kwargs.setdefault("limits", HelperLimits(min_clients=1))
    kwargs.setdefault("session_ids", fixed_ids(SID))
    return InProcessHelper(*args, **kwargs)


def bind(params: SSAParams | int, session: bytes = SID) -> RoundBinding:
    p = make_params(params) if isinstance(params, int) else params
    return RoundBinding.of(session, p.round_id, p.to_bytes())


def _key(n: int) -> bytes:
    return hashlib.sha256(n.to_bytes(8, "little")).digest()[:16]


def signer_of(client_id: int) -> SigningIdentity:
    """A client's fixed Ed25519 signing key (the tests' clients are enrolled by id)."""
    return SigningIdentity.from_private_bytes(
        hashlib.sha256(b"test client %d" % client_id).digest()
    )


def make_params(round_id: int, **kw: Any) -> SSAParams:
    base = dict(
        round_id=round_id,
        domain_size=M,
        num_items=K,
        value_width=WIDTH,
        hash_key=_key(1),
        stash_size=0,
        frac_bits=24,
        max_abs=1e3,
        max_summands=50,
        epoch=round_id,  # U-DPF numbering: servers keep keys (epoch-0 keys are one-shot)
        # S1's round mechanics relay with AddClients (unchecked rounds); checked rounds (the
        # default) relay digests: tests/families/ssa/test_key_check.py, test_two_server.py.
        verify=False,
    )
    base.update(kw)
    return SSAParams(**base)


@dataclass
class Client:
    cid: int
    idx: np.ndarray
    values: np.ndarray
    weight: float
    state: Any = field(default=None, repr=False)


def make_clients(n: int, seed: int = 0) -> list[Client]:
    rng = np.random.default_rng(seed)
    return [
        Client(
            cid=10 + c,
            idx=rng.choice(M, K, replace=False),
            values=rng.uniform(-1, 1, size=(K, WIDTH)),
            weight=float(c + 1),
        )
        for c in range(n)
    ]


def expected_sums(clients: list[Client]) -> tuple[np.ndarray, np.ndarray]:
    sums, counts = np.zeros((M, WIDTH)), np.zeros(M)
    for c in clients:
        sums[c.idx] += c.weight * c.values
        counts[c.idx] += c.weight
    return sums, counts


def hint_for(
    params: SSAParams,
    client: Client,
    helper_pub: bytes,
    rng: np.random.Generator | None = None,
    binding: RoundBinding | None = None,
) -> tuple[int, bytes, bytes]:
    """A client's U-DPF round: ``(client id, hint, binding sealed to S1)``, as the mod sends."""
    held = held_digest(client.state.keys[0])  # the keys the hint updates (before it does)
    hint = client.state.next_round(params, client.values, client.weight, rng=rng)
    sealed = seal_udpf_hint(
        helper_pub,
        binding=binding or bind(params),
        client_id=client.cid,
        hint=hint,
        held=held,
        signer=signer_of(client.cid),
    )
    return client.cid, hint, sealed


def upload_for(
    params: SSAParams, client: Client, helper_pub: bytes, epoch_seed: int = 0, session: bytes = SID
):
    upload, client.state = encode_update(
        params,
        client.idx,
        client.values,
        client.weight,
        rng=np.random.default_rng([epoch_seed, client.cid]),
        master_seeds=(_key(1000 + client.cid), _key(2000 + client.cid)),
    )
    sealed = seal_ssa_upload(
        helper_pub,
        binding=bind(params, session),
        client_id=client.cid,
        public_part=upload.public_part,
        master_seed=upload.master_seeds[1],
        signer=signer_of(client.cid),
    )
    return upload, sealed


def sealed_uploads(
    params: SSAParams, clients: list, pub: bytes, session: bytes = SID
) -> list[tuple[int, bytes, bytes]]:
    """``(client id, public part, sealed S1 material)`` of each client's fresh keys."""
    out = []
    for c in clients:
        upload, sealed = upload_for(params, c, pub, session=session)
        out.append((c.cid, upload.public_part, sealed))
    return out


def first_round(helper: InProcessHelper, params: SSAParams, clients: list, *, finish: bool = True):  # type: ignore[no-untyped-def]
    """Open ``params``' round, add the clients' fresh keys, finish it (S1 then stores them)."""
    helper.open_round(params.round_id, params.to_bytes())
    assert (
        helper.add_clients(params.round_id, sealed_uploads(params, clients, helper.public_key()))
        == {}
    )
    return helper.finish_round(params.round_id) if finish else None


def run_scenario(conn: HelperConnection) -> dict[str, Any]:
    """A fixed, deterministic S0 session against S1: PSR + SSA round, U-DPF round, errors.

    Returns a transcript of everything S0 observed; S1's shares are deterministic, sealed
    answers are compared after opening.
    """
    out: dict[str, Any] = {}
    pub = conn.public_key()
    out["health"] = conn.health()
    clients = make_clients(3)
    # ---- round 1: PSR, then SSA with fresh keys (and bad clients) -----------------------------
    p1 = make_params(1)
    conn.open_round(1, p1.to_bytes())
    sid = conn.session_id  # S1 drew it: clients bind their sealed material to it
    rows = np.random.default_rng(7).normal(size=(M, WIDTH)).astype(np.float32)
    table = encode_table(rows)
    conn.set_model(1, table)
    s0_psr = PSRServer(p1, 0, table)
    queries, keys, relay = {}, {}, []
    for c in clients:
        q = make_query(
            p1,
            c.idx[:5],
            rng=np.random.default_rng(c.cid),
            master_seeds=(_key(3000 + c.cid), _key(4000 + c.cid)),
        )
        sealed, keys[c.cid] = seal_psr_query(
            pub,
            binding=bind(1, sid),
            client_id=c.cid,
            public_part=q.upload.public_part,
            master_seed=q.upload.master_seeds[1],
        )
        queries[c.cid] = q
        relay.append((c.cid, q.upload.public_part, sealed))
    bad_q = bytearray(relay[0][2])
    bad_q[-1] ^= 1
    relay.append((99, relay[0][1], bytes(bad_q)))
    answers = conn.psr_answer(1, relay)
    out["psr_rejected"] = {k: v for k, v in answers.items() if isinstance(v, str)}
    retrieved = {}
    for c in clients:
        sealed_answer = answers[c.cid]
        assert isinstance(sealed_answer, bytes)
        a1 = open_psr_answer(keys[c.cid], sealed_answer, binding=bind(1, sid), client_id=c.cid)
        a0 = s0_psr.answer(queries[c.cid].upload.public_part, queries[c.cid].upload.master_seeds[0])
        retrieved[c.cid] = decode_table(decode_answers(queries[c.cid], a0, a1), np.float32)
    out["psr_rows"] = retrieved
    out["psr_expected"] = {c.cid: rows[c.idx[:5]] for c in clients}

    s0 = SSAServer(p1, 0)
    good, relay = [], []
    for c in clients:
        upload, sealed = upload_for(p1, c, pub, session=sid)
        good.append((c.cid, upload))
        relay.append((c.cid, upload.public_part, sealed))
    u0, s_0 = relay[0][1], relay[0][2]
    tampered = bytearray(s_0)
    tampered[60] ^= 0x80
    altered = bytearray(u0)
    altered[-20] ^= 1
    relay += [
        (50, u0, bytes(tampered)),  # sealed blob tampered by S0
        (51, bytes(altered), s_0),  # public part altered (and relabeled)
        (52, u0, s_0),  # client 10's material relabeled as client 52
    ]
    out["rejected_1"] = conn.add_clients(1, relay)
    out["replayed_1"] = conn.add_clients(1, [relay[1]])  # same client again in this round
    for cid, upload in good:
        s0.add_client(cid, upload.public_part, upload.master_seeds[0])
    res = conn.finish_round(1)
    out["share_1"] = res.share.tobytes()
    out["clients_1"] = res.client_ids
    out["result_1"] = reconstruct(p1, s0.share(), res.share)
    # ---- round 2: U-DPF hints ------------------------------------------------------------------
    p2 = make_params(2)
    conn.open_round(2, p2.to_bytes())
    s0_2 = SSAServer(p2, 0, s0.keys)
    hints = []
    for c in clients:
        c.values = c.values * -2.0
        rng = np.random.default_rng([1, c.cid])
        item = hint_for(p2, c, conn.public_key(), rng=rng, binding=bind(p2, sid))
        hints.append(item)
        s0_2.add_client_hint(c.cid, item[1])
    hints.append((77, hints[0][1], hints[0][2]))  # client 0's hint and seal, relabelled as 77
    out["rejected_2"] = conn.add_client_hints(2, hints)
    res2 = conn.finish_round(2)
    out["share_2"] = res2.share.tobytes()
    out["clients_2"] = res2.client_ids
    out["result_2"] = reconstruct(p2, s0_2.share(), res2.share)
    out["clients"] = clients
    # ---- refused calls -------------------------------------------------------------------------
    errors = {}
    for name, call in {
        "finish again": lambda: conn.finish_round(1),
        "reopen": lambda: conn.open_round(1, p1.to_bytes()),
        "unknown round": lambda: conn.add_clients(5, []),
        "round mismatch": lambda: conn.open_round(9, p1.to_bytes()),
        "bad params": lambda: conn.open_round(9, b"{}"),
        "no table": lambda: (conn.open_round(3, make_params(3).to_bytes()), conn.psr_answer(3, [])),
        "bad table": lambda: conn.set_model(3, np.zeros((M, WIDTH + 1), np.uint64)),
    }.items():
        try:
            call()
        except HelperRequestError as err:
            errors[name] = str(err)
    conn.abort_round(3)
    out["errors"] = errors
    out["health_after"] = conn.health()
    return out


@pytest.fixture(scope="module")
def transcript():
    conn = twin()
    try:
        yield run_scenario(conn), conn
    finally:
        conn.close()


# ---- end to end --------------------------------------------------------------------------------


def test_psr_retrieves_exact_rows_and_rejects_tampered_query(transcript):
    t, _ = transcript
    for cid, rows in t["psr_rows"].items():
        np.testing.assert_array_equal(rows, t["psr_expected"][cid])
    assert list(t["psr_rejected"]) == [99]
    assert "authentication" in t["psr_rejected"][99]


def test_ssa_round_reconstructs_the_good_clients_exactly(transcript):
    t, _ = transcript
    clients = t["clients"]
    assert t["clients_1"] == tuple(c.cid for c in clients)
    # Round 1 values are the values before the U-DPF round doubled and negated them.
    r1 = [replace(c, values=c.values / -2.0) for c in clients]
    sums, counts = expected_sums(r1)
    np.testing.assert_allclose(t["result_1"].sums, sums, atol=1e-5)
    np.testing.assert_allclose(t["result_1"].counts, counts, atol=1e-5)


def test_bad_clients_rejected_for_that_client_only(transcript):
    t, _ = transcript
    rej = t["rejected_1"]
    assert set(rej) == {50, 51, 52}
    assert "authentication" in rej[50]  # tampered ciphertext
    assert "authentication" in rej[51]  # relabeled: AD binds client id
    assert "authentication" in rej[52]
    assert t["replayed_1"] == {11: "client 11 already submitted in round 1 (duplicate or replay)"}


def test_udpf_round_with_stored_keys(transcript):
    t, _ = transcript
    assert t["clients_2"] == tuple(c.cid for c in t["clients"])
    # Client 0's hint relabelled as client 77: its seal binds client 0, so S1 refuses it.
    assert set(t["rejected_2"]) == {77} and "authentication" in t["rejected_2"][77]
    sums, counts = expected_sums(t["clients"])
    np.testing.assert_allclose(t["result_2"].sums, sums, atol=1e-5)
    np.testing.assert_allclose(t["result_2"].counts, counts, atol=1e-5)


def test_refused_calls(transcript):
    t, _ = transcript
    e = t["errors"]
    assert e["finish again"] == "round 1 is already finished or aborted"
    assert "already opened" in e["reopen"]
    assert e["unknown round"] == "round 5 is not open"
    assert "parameters are for round 1, not 9" in e["round mismatch"]
    assert "bad round parameters" in e["bad params"]
    assert "no PSR table" in e["no table"]
    assert "bad PSR table" in e["bad table"]
    assert t["health"] == t["health_after"]  # version and key only: nothing about rounds


def test_public_part_altered_by_s0_is_caught_by_the_hash():
    helper = twin()
    pub = helper.public_key()
    params = make_params(1)
    helper.open_round(1, params.to_bytes())
    c = make_clients(1)[0]
    upload, sealed = upload_for(params, c, pub)
    altered = bytearray(upload.public_part)
    altered[-20] ^= 1
    rej = helper.add_clients(1, [(c.cid, bytes(altered), sealed)])
    assert rej == {
        c.cid: "SealedBoxError: public part does not match the sealed hash (altered in transit)"
    }
    # The genuine upload is then refused as a replay of the same client id in the round.
    assert (
        "already submitted" in helper.add_clients(1, [(c.cid, upload.public_part, sealed)])[c.cid]
    )
    assert helper.finish_round(1).client_ids == ()


def test_malformed_keys_with_a_matching_hash_are_rejected():
    helper = twin()
    pub = helper.public_key()
    params = make_params(1)
    helper.open_round(1, params.to_bytes())
    garbage = b"FDPF" + bytes(40)
    sealed = seal_ssa_upload(
        pub,
        binding=bind(1),
        client_id=5,
        public_part=garbage,
        master_seed=bytes(16),
        signer=signer_of(5),
    )
    rej = helper.add_clients(1, [(5, garbage, sealed)])
    assert rej[5].startswith("SSAInputError: malformed public part")


def test_replay_from_an_earlier_round_is_rejected():
    helper = twin()
    pub = helper.public_key()
    c = make_clients(1)[0]
    p1, p2 = make_params(1), make_params(2)
    helper.open_round(1, p1.to_bytes())
    upload, sealed = upload_for(p1, c, pub)
    assert helper.add_clients(1, [(c.cid, upload.public_part, sealed)]) == {}
    helper.finish_round(1)
    helper.open_round(2, p2.to_bytes())
    rej = helper.add_clients(2, [(c.cid, upload.public_part, sealed)])
    assert "authentication" in rej[c.cid]


def test_duplicate_ids_in_one_request():
    helper = twin()
    pub = helper.public_key()
    params = make_params(1)
    helper.open_round(1, params.to_bytes())
    c = make_clients(1)[0]
    upload, sealed = upload_for(params, c, pub)
    item = (c.cid, upload.public_part, sealed)
    with pytest.raises(HelperRequestError, match="duplicate client ids"):
        helper.add_clients(1, [item, item])
    # A raw request with the duplicate (S0 bypassing the facade): the second is rejected.
    body = wire.encode(wire.AddClientsRequest(SID, 1, (wire.SealedItem(*item),) * 2))
    raw = helper.service.handle("AddClients", body, helper._secret)
    resp = wire.decode(raw, wire.ClientResultsResponse)
    assert [r.ok for r in resp.results] == [True, False]
    assert "already submitted" in resp.results[1].reason
    ids, share = helper.finish_round(1)  # HelperShare is a named tuple
    assert ids == (c.cid,)
    assert share.dtype == np.uint64 and share.shape == (M, params.tau)


def test_too_many_open_rounds_and_abort():
    helper = twin(HelperService(SealingKeyPair.generate(), quota=ServiceLimits(max_open_rounds=2)))
    helper.open_round(1, make_params(1).to_bytes())
    helper.open_round(2, make_params(2).to_bytes())
    with pytest.raises(HelperRequestError, match="limit 2"):
        helper.open_round(3, make_params(3).to_bytes())
    helper.abort_round(1)
    helper.open_round(3, make_params(3).to_bytes())
    assert open_rounds(helper) == (2, 3)
    with pytest.raises(HelperRequestError, match="already finished or aborted"):
        helper.abort_round(1)
    with pytest.raises(HelperRequestError, match="already opened"):
        helper.open_round(1, make_params(1).to_bytes())
    helper.set_model(2, np.zeros((M, WIDTH), np.uint64))
    with pytest.raises(HelperRequestError, match="already has a PSR table"):
        helper.set_model(2, np.zeros((M, WIDTH), np.uint64))
    with pytest.raises(HelperRequestError, match="uint64"):
        helper.set_model(3, np.zeros((M, WIDTH), np.float64))


def test_aborted_round_keeps_no_udpf_keys_and_layout_change_drops_them():
    helper = twin()
    pub = helper.public_key()
    c = make_clients(1)[0]
    first_round(helper, make_params(1), [c], finish=False)
    helper.abort_round(1)
    helper.open_round(2, make_params(2).to_bytes())
    item = hint_for(make_params(2), c, pub)
    assert "S1 holds other keys" in helper.add_client_hints(2, [item])[c.cid]
    helper.abort_round(2)
    # Stored keys are kept per layout (a mixed round's tables each have one), at most
    # --max-open-rounds layouts per session: the least recently used is dropped first.
    first_round(helper, make_params(3), [c])
    stores = helper.service._sessions[SID].data["ssa"]
    assert [c.cid in s.keys for s in stores.values()] == [True]
    limit = helper.service.max_open_rounds
    for i in range(limit):
        first_round(helper, make_params(4 + i, hash_key=_key(2 + i)), [c])
    assert len(stores) == limit
    assert layout_key(make_params(3)) not in stores  # the oldest layout's keys are gone


def test_hint_errors_are_per_client():
    helper = twin()
    pub = helper.public_key()
    c = make_clients(1)[0]
    first_round(helper, make_params(1), [c])
    p2 = make_params(2)
    helper.open_round(2, p2.to_bytes())
    cid, hint, sealed = hint_for(p2, c, pub)
    rej = helper.add_client_hints(2, [(cid, hint[:-3], sealed)])  # S0 alters the relayed hint
    assert "altered in transit" in rej[c.cid]
    assert "already submitted" in helper.add_client_hints(2, [(cid, hint, sealed)])[c.cid]


def test_psr_errors_are_per_client():
    helper = twin()
    pub = helper.public_key()
    p = make_params(1)
    helper.open_round(1, p.to_bytes())
    helper.set_model(1, np.zeros((M, WIDTH), np.uint64))
    q = make_query(p, [1, 2, 3])
    sealed, _ = seal_psr_query(
        pub,
        binding=bind(1),
        client_id=4,
        public_part=q.upload.public_part,
        master_seed=q.upload.master_seeds[1],
    )
    # An SSA-purpose blob offered as a PSR query does not open (purpose is bound).
    ssa_blob = seal_ssa_upload(
        pub,
        binding=bind(1),
        client_id=5,
        public_part=q.upload.public_part,
        master_seed=q.upload.master_seeds[1],
        signer=signer_of(5),
    )
    garbage = b"FDPF" + bytes(40)
    bad_keys, _ = seal_psr_query(
        pub, binding=bind(1), client_id=6, public_part=garbage, master_seed=bytes(16)
    )
    res = helper.psr_answer(
        1,
        [
            (4, q.upload.public_part, sealed),
            (5, q.upload.public_part, ssa_blob),
            (6, garbage, bad_keys),
        ],
    )
    assert isinstance(res[4], bytes)
    assert "authentication" in res[5]
    assert res[6].startswith("SSAInputError")
    assert "already submitted" in helper.psr_answer(1, [(4, q.upload.public_part, sealed)])[4]


# ---- connection surface ------------------------------------------------------------------------


def test_public_key_pinning():
    kp = SealingKeyPair.generate()
    helper = twin(keypair=kp)
    assert isinstance(helper, HelperConnection)
    assert helper.public_key() == kp.public_bytes
    assert helper.health().fingerprint == kp.fingerprint
    assert helper.health().protocol_version == wire.VERSION
    assert verify_helper(helper, kp.fingerprint) == kp.public_bytes
    with pytest.raises(HelperError, match="not the pinned helper"):
        verify_helper(helper, SealingKeyPair.generate().fingerprint)


def test_closed_twin_is_unavailable():
    helper = twin()
    helper.close()
    helper.close()
    with pytest.raises(HelperUnavailableError):
        helper.health()


def test_internal_error_is_a_helper_error_not_a_request_error(monkeypatch):
    helper = twin()

    def boom(*args, **kwargs):
        raise RuntimeError("kaput")

    monkeypatch.setitem(
        helper.service._methods, "Health", Method(wire.HealthRequest, boom, needs_session=False)
    )
    with pytest.raises(HelperError, match=r"INTERNAL.*RuntimeError: kaput") as info:
        helper.health()
    assert not isinstance(info.value, HelperRequestError)


def test_malformed_response_is_a_helper_error(monkeypatch):
    helper = twin()
    helper.open_session()
    monkeypatch.setattr(helper.service, "handle", lambda method, body, secret=None: _hdr(0x40))
    with pytest.raises(HelperError, match="malformed Health response"):
        helper.health()
    monkeypatch.setattr(
        helper.service,
        "handle",
        lambda method, body, secret=None: wire.encode(
            wire.ClientResultsResponse((wire.ClientResult(1, True),))
        ),
    )
    with pytest.raises(HelperError, match="other clients"):
        helper.add_clients(1, [])


def test_service_argument_validation():
    with pytest.raises(ConfigurationError):
        ServiceLimits(max_open_rounds=0)
    with pytest.raises(ConfigurationError):
        HelperService(b"key")  # type: ignore[arg-type]


# ---- malformed requests at the service boundary ------------------------------------------------


@pytest.fixture
def service():
    svc = HelperService(SealingKeyPair.generate(), session_ids=fixed_ids(SID))
    info = wire.decode(
        svc.handle("OpenSession", wire.encode(wire.OpenSessionRequest())), wire.SessionInfoResponse
    )  # only it creates one; S1 draws the id
    assert info.session == SID
    opening = wire.encode(wire.OpenRoundRequest(SID, 1, make_params(1).to_bytes()))
    svc.handle("OpenRound", opening, info.secret)
    return svc


def _add_request() -> bytes:
    items = (wire.SealedItem(1, b"public", b"sealed"), wire.SealedItem(2, b"p", b"s"))
    return wire.encode(wire.AddClientsRequest(SID, 1, items))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b"XXXX" + b[4:], "bad magic"),
        (lambda b: b[:4] + b"\x01" + b[5:], "unsupported wire version 1"),
        (lambda b: b[:5] + b"\x05" + b[6:], "expected a ADD_CLIENTS message, got ADD_HINTS"),
        (lambda b: b[:5] + b"\x30" + b[6:], "unknown message kind 48"),
        (lambda b: b[:6] + b"\x01\x00" + b[8:], "reserved"),
        (lambda b: b + b"\x00", "trailing bytes"),
        (lambda b: b[:3], "truncated"),
        (lambda b: b[:32] + struct.pack("<I", 2**32 - 1) + b[36:], "exceed the limit"),
        (lambda b: b[:32] + struct.pack("<I", 50_000) + b[36:], "truncated"),
        (lambda b: b[:44] + struct.pack("<I", 2**31) + b[48:], "truncated"),
        (lambda b: b[:8] + bytes(16) + b[24:], "unknown session"),
    ],
)
def test_malformed_requests_are_refused(service, mutate, message):
    with pytest.raises(HelperRequestError, match=message):
        service.handle("AddClients", mutate(_add_request()))


def test_every_truncation_is_refused(service):
    body = _add_request()
    for n in range(len(body)):
        with pytest.raises(HelperRequestError, match="malformed AddClients request"):
            service.handle("AddClients", body[:n])


def test_unknown_method_and_non_bytes(service):
    with pytest.raises(HelperRequestError, match="unknown method"):
        service.handle("Exec", b"")
    with pytest.raises(HelperRequestError, match="must be bytes"):
        service.handle("Health", "text")  # type: ignore[arg-type]


def test_oversized_message_is_refused(service, monkeypatch):
    body = _add_request()
    monkeypatch.setattr(wire, "MAX_MESSAGE_BYTES", 64)
    with pytest.raises(HelperRequestError, match="exceeds"):
        service.handle("AddClients", body)
    with pytest.raises(WireFormatError, match="exceeds the limit"):
        wire.encode(wire.OpenRoundRequest(SID, 1, bytes(100)))


def _hdr(kind: int) -> bytes:
    """A helper wire header (magic, this build's version, message kind, flags)."""
    return wire.MAGIC + bytes([wire.VERSION, kind, 0, 0])


def _set_model_body(array_bytes: bytes) -> bytes:
    return _hdr(0x08) + SID + struct.pack("<Q", 1) + array_bytes


@pytest.mark.parametrize(
    "array_bytes, message",
    [
        (b"\x09\x02" + struct.pack("<QQ", 1, 1) + bytes(8), "unknown dtype code 9"),
        (b"\x01\x05" + struct.pack("<5Q", 1, 1, 1, 1, 1) + bytes(8), "5 dimensions"),
        (b"\x01\x02" + struct.pack("<QQ", 2**40, 2**40), "truncated"),
        (b"\x01\x02" + struct.pack("<QQ", 0, 2**63), "exceeds"),
        (b"\x01\x02" + struct.pack("<QQ", 2**64 - 1, 0), "exceeds"),
        (b"\x01\x02" + struct.pack("<QQ", 2, 2) + bytes(31), "truncated"),
        (b"\x04\x02" + struct.pack("<QQ", 1, 1) + bytes(8), "must be a uint64 array"),
    ],
)
def test_malformed_arrays_are_refused(service, array_bytes, message):
    with pytest.raises(HelperRequestError, match=message):
        service.handle("SetModel", _set_model_body(array_bytes))


# ---- wire format -------------------------------------------------------------------------------


def test_wire_known_answer():
    msg = wire.AddClientsRequest(SID, 7, (wire.SealedItem(258, b"ab", b"xyz"),))
    assert wire.encode(msg) == (
        _hdr(0x04)
        + SID
        + (7).to_bytes(8, "little")
        + (1).to_bytes(4, "little")
        + (258).to_bytes(8, "little")
        + b"\x02\x00\x00\x00ab"
        + b"\x03\x00\x00\x00xyz"
    )
    arr = wire.encode(wire.ArrayMessage(np.array([[1, 2]], np.uint64)))
    assert arr == _hdr(0x45) + b"\x01\x02" + struct.pack("<QQQQ", 1, 2, 1, 2)


@pytest.mark.parametrize(
    "msg",
    [
        wire.HealthRequest(),
        wire.PublicKeyRequest(),
        wire.OpenRoundRequest(SID, 2**64 - 1, b"params"),
        wire.AddClientsRequest(SID, 3, ()),
        wire.AddClientsRequest(
            SID, 3, (wire.SealedItem(0, b"", b""), wire.SealedItem(9, b"p", b"s"))
        ),
        wire.AddHintsRequest(SID, 4, (wire.HintItem(1, b"h", b"s"),)),
        wire.FinishRoundRequest(SID, 5),
        wire.AbortRoundRequest(SID, 6),
        wire.PsrAnswerRequest(SID, 7, (wire.SealedItem(1, b"p", b"s"),)),
        wire.OkResponse(),
        wire.HealthResponse(1, bytes(32)),
        wire.OpenSessionRequest(),
        wire.SessionInfoResponse(SID, bytes(range(32))),
        wire.CloseSessionRequest(SID),
        wire.PublicKeyResponse(bytes(32)),
        wire.ClientResultsResponse(
            (wire.ClientResult(1, True, b"x"), wire.ClientResult(2, False, b"no"))
        ),
    ],
)
def test_wire_round_trip(msg):
    assert wire.decode(wire.encode(msg), type(msg)) == msg


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.uint64).reshape(3, 4),
        np.zeros((0, 3), np.uint64),
        np.array(5, np.uint64),
        np.arange(6, dtype=">u8").reshape(2, 3),  # big-endian input is normalized
        np.arange(24, dtype=np.uint64).reshape(2, 3, 2, 2)[:, ::2],  # non-contiguous
    ],
)
def test_wire_arrays_round_trip(array):
    for msg in (wire.SetModelRequest(SID, 1, array), wire.ShareResponse((1, 2), array)):
        got = wire.decode(wire.encode(msg), type(msg))
        arr = got.table if isinstance(got, wire.SetModelRequest) else got.share
        assert arr.dtype == np.uint64 and arr.flags.writeable
        np.testing.assert_array_equal(arr, array)
    for dtype in (np.int64, np.float32, np.float64, np.uint8):
        a = np.asarray(array).astype(dtype)
        got = wire.decode(wire.encode(wire.ArrayMessage(a)), wire.ArrayMessage).array
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, a)


@pytest.mark.parametrize(
    "msg, message",
    [
        (wire.FinishRoundRequest(SID, -1), "u64 field"),
        (wire.FinishRoundRequest(SID, 2**64), "u64 field"),
        (wire.FinishRoundRequest(SID, True), "u64 field"),
        (wire.OpenRoundRequest(SID, 1, "text"), "expected bytes"),  # type: ignore[arg-type]
        (wire.ArrayMessage(np.array([1 + 2j])), "unsupported array dtype"),
        (wire.ArrayMessage(np.zeros((1,) * 5)), "5 dimensions"),
        (
            wire.AddHintsRequest(SID, 1, (wire.HintItem(1, b"", b""),) * (wire.MAX_ITEMS + 1)),
            "exceed",
        ),
    ],
)
def test_wire_encode_validation(msg, message):
    with pytest.raises(WireFormatError, match=message):
        wire.encode(msg)


def test_wire_decode_rejects_bad_status_and_non_messages():
    body = wire.encode(wire.ClientResultsResponse((wire.ClientResult(1, True),)))
    bad = body[:20] + b"\x02" + body[21:]
    with pytest.raises(WireFormatError, match="bad client status 2"):
        wire.decode(bad, wire.ClientResultsResponse)
    with pytest.raises(WireFormatError, match="not a wire message"):
        wire.encode(object())  # type: ignore[arg-type]


# ---- sealing -----------------------------------------------------------------------------------


def test_sealing_round_trips_and_bindings():
    s1 = SealingKeyPair.generate()
    public, seed = b"public part", bytes(range(16))
    blob = seal_ssa_upload(
        s1.public_bytes,
        binding=bind(3),
        client_id=4,
        public_part=public,
        master_seed=seed,
        signer=signer_of(4),
    )
    assert len(blob) == 101 + 48 + 56
    opened = open_ssa_upload(s1, blob, binding=bind(3), client_id=4, public_part=public)
    assert opened.master_seed == seed and opened.signer == signer_of(4).public_bytes
    for kw in (
        dict(binding=bind(4), client_id=4, public_part=public),
        dict(binding=bind(3), client_id=5, public_part=public),
        dict(binding=bind(3), client_id=4, public_part=public + b"!"),
    ):
        with pytest.raises(SealedBoxError):
            open_ssa_upload(s1, blob, **kw)
    q, answer_key = seal_psr_query(
        s1.public_bytes, binding=bind(3), client_id=4, public_part=public, master_seed=seed
    )
    got_seed, got_key = open_psr_query(s1, q, binding=bind(3), client_id=4, public_part=public)
    assert got_seed == seed and got_key == answer_key.public_bytes
    with pytest.raises(SealedBoxError):  # purposes are not interchangeable
        open_ssa_upload(s1, q, binding=bind(3), client_id=4, public_part=public)
    answer = np.arange(6, dtype=np.uint64).reshape(3, 2)
    sealed = seal_psr_answer(got_key, answer, binding=bind(3), client_id=4)
    np.testing.assert_array_equal(
        open_psr_answer(answer_key, sealed, binding=bind(3), client_id=4), answer
    )
    with pytest.raises(SealedBoxError):  # S1 itself cannot open the answer
        open_psr_answer(s1, sealed, binding=bind(3), client_id=4)


def test_sealing_rejects_bad_inputs():
    s1 = SealingKeyPair.generate()
    with pytest.raises(SealedBoxError, match="master seed"):
        seal_ssa_upload(
            s1.public_bytes,
            binding=bind(1),
            client_id=1,
            public_part=b"",
            master_seed=b"x",
            signer=signer_of(1),
        )
    with pytest.raises(SealedBoxError, match="public part must be bytes"):
        seal_ssa_upload(
            s1.public_bytes,
            binding=bind(1),
            client_id=1,
            public_part="p",  # type: ignore[arg-type]
            master_seed=bytes(16),
            signer=signer_of(1),
        )
    ad = associated_data(purpose="ssa", sender="client:1", recipient="S1", **bind(1).fields())
    short = seal(s1.public_bytes, bytes(47), associated_data=ad)
    with pytest.raises(SealedBoxError, match="not a signed layout"):
        open_ssa_upload(s1, short, binding=bind(1), client_id=1, public_part=b"")
    unsigned = seal(s1.public_bytes, bytes(48), associated_data=ad)  # v1: the bare body
    with pytest.raises(SealedBoxError, match="unsigned"):
        open_ssa_upload(s1, unsigned, binding=bind(1), client_id=1, public_part=b"")
    key = SealingKeyPair.generate()
    ad = associated_data(
        purpose="psr-answer", sender="S1", recipient="client:1", **bind(1).fields()
    )
    with pytest.raises(SealedBoxError, match="not an encoded array"):
        open_psr_answer(
            key, seal(key.public_bytes, b"junk", associated_data=ad), binding=bind(1), client_id=1
        )
    writer = Writer()
    writer.array(np.zeros(2, np.float64))
    floats = b"FSPA\x01" + writer.payload()
    with pytest.raises(SealedBoxError, match="must be uint64"):
        open_psr_answer(
            key, seal(key.public_bytes, floats, associated_data=ad), binding=bind(1), client_id=1
        )
    with pytest.raises(SealedBoxError, match="cannot seal"):
        seal_psr_answer(bytes(32), np.zeros(2, np.uint64), binding=bind(1), client_id=1)


def test_health_answers_while_a_call_holds_the_lock():
    helper = twin()
    helper.open_round(1, make_params(1).to_bytes())
    with helper.service._sessions[SID].lock:  # as during a long AddClients
        assert open_rounds(helper) == (1,)
        assert helper.public_key() == helper.service.public_key
        # Another run's session is not blocked by this one's long call.
        other = InProcessHelper(helper.service)
        other.open_round(1, make_params(1).to_bytes())
        other.abort_round(1)


def test_random_corruptions_only_raise_wire_errors():
    rng = np.random.default_rng(0)
    samples = [
        wire.AddClientsRequest(SID, 1, (wire.SealedItem(1, b"public", b"sealed"),)),
        wire.AddHintsRequest(SID, 2, (wire.HintItem(3, b"hint", b"sealed"),)),
        wire.SetModelRequest(SID, 1, np.arange(6, dtype=np.uint64).reshape(3, 2)),
        wire.ShareResponse((1, 2), np.arange(4, dtype=np.uint64).reshape(2, 2)),
        wire.HealthResponse(1, bytes(32)),
        wire.SessionInfoResponse(SID, bytes(32)),
        wire.ClientResultsResponse((wire.ClientResult(1, False, b"why"),)),
        wire.ArrayMessage(np.arange(3, dtype=np.float32)),
    ]
    for msg in samples:
        body = bytearray(wire.encode(msg))
        for _ in range(300):
            bad = bytearray(body)
            for pos in rng.integers(8, len(bad), size=rng.integers(1, 4)):
                bad[pos] = int(rng.integers(0, 256))
            cut = bytes(bad[: rng.integers(8, len(bad) + 1)]) if rng.random() < 0.3 else bytes(bad)
            try:
                wire.decode(cut, type(msg))
            except WireFormatError:
                pass


def test_s1_refuses_a_round_below_its_minimum() -> None:
    # Issue 8 item 2: S1 is the party that must refuse to help isolate a client, whatever S0
    # asks. With one client in the round S1 returns no share and keeps nothing of the round.
    helper = twin(limits=HelperLimits(min_clients=2))
    params = make_params(1)
    with pytest.raises(HelperRequestError, match="minimum participation 2"):
        first_round(helper, params, make_clients(1))
    assert open_rounds(helper) == ()
    with pytest.raises(HelperRequestError):
        helper.open_round(1, params.to_bytes())  # the round can never be reopened
    # Two clients: the round finishes.
    pair = make_clients(2)
    ids, _ = first_round(helper, make_params(2), pair)
    assert sorted(ids) == sorted(c.cid for c in pair)


def test_s1_applies_a_hint_only_to_the_keys_it_was_sealed_for() -> None:
    # Issue 8 item 3: the hint's seal names the keys it updates; S1 compares them with its
    # own, so a hint made against other keys (a desynchronized client, or S0 announcing
    # something S1 does not hold) is refused instead of writing garbage into the model.
    helper = twin()
    pub = helper.public_key()
    c = make_clients(1)[0]
    p2 = make_params(2)
    first_round(helper, make_params(1), [c])
    helper.open_round(2, p2.to_bytes())
    hint = c.state.next_round(p2, c.values, c.weight)
    wrong = seal_udpf_hint(
        pub,
        binding=bind(p2),
        client_id=c.cid,
        hint=hint,
        held=bytes(32),
        signer=signer_of(c.cid),
    )
    assert "S1 holds other keys" in helper.add_client_hints(2, [(c.cid, hint, wrong)])[c.cid]
