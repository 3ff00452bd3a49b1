"""Key-check digest version 3 (issue 26): a GMAC per segment under a per-round secret key.

S0 draws the round's digest key when it opens a checked round and sends it to S1 only, in
``OpenCheckedRound``. Pinned here: honest clients' digests are equal at both servers on any
thread count; forged keys are still caught; the key reaches S1 and nothing any client receives
(a real strategy round through Flower); a bad, missing or misplaced key is refused cleanly and
opens nothing; a checked round opened the old way (``OpenRound``) still runs, on version 2.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa import two_server, verify
from flwr_fsl.families.ssa.protocol import SSAInputError, SSAParams, SSAServer, encode_update
from flwr_fsl.families.ssa.two_server import LeadServer
from flwr_fsl.families.ssa.verify import DIGEST_KEY_BYTES, new_digest_key, same_digest
from flwr_fsl.helper import HelperLimits, HelperRequestError, InProcessHelper, wire
from flwr_fsl.helper.errors import WireFormatError
from tests.families.ssa import forge
from tests.families.ssa.test_key_check import FORGERIES, _forgery, _s1_seed, unit_params
from tests.families.ssa.test_two_server import assert_matches, fresh_uploads
from tests.helper.test_helper import SID, WIDTH, K, M, bind, fixed_ids, make_clients, twin

KEY = bytes(range(1, 17))


@pytest.fixture
def small_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many segments per client (a few dozen points each), so every thread count splits."""
    monkeypatch.setattr(verify, "_SEGMENT_POINTS", 40)
    monkeypatch.setattr(verify, "_KEYED_SEGMENT_POINTS", 40)


def _uploads(params: SSAParams, n: int) -> list[Any]:
    rng = np.random.default_rng(11)
    out = []
    for c in range(n):
        idx = rng.choice(M, K, replace=False)
        seeds = (bytes([c + 1] * 16), bytes([c + 101] * 16))
        upload, _ = encode_update(params, idx, rng.normal(size=(K, WIDTH)), 1.0, master_seeds=seeds)
        out.append(upload)
    return out


@pytest.mark.usefixtures("small_segments")
def test_honest_digests_are_equal_at_both_servers_on_any_thread_count() -> None:
    params = unit_params(
        stash_size=1, value_check="off"
    )  # the digest alone: the value check adds a fresh query seed
    uploads = _uploads(params, 3)
    seen = {}
    for threads in (1, 2, 3):
        servers = [SSAServer(params, p, threads=threads, digest_key=KEY) for p in (0, 1)]
        assert len(servers[0]._check.segments) > 2  # type: ignore[union-attr]
        digests = []
        for c, up in enumerate(uploads):
            d0 = servers[0].add_client(c, up.public_part, up.master_seeds[0])
            d1 = servers[1].add_client(c, up.public_part, up.master_seeds[1], expect=d0)
            assert d0 is not None and same_digest(d0, d1)
            digests.append(d0)
        seen[threads] = (digests, servers[0].share().tobytes(), servers[1].share().tobytes())
    assert seen[1] == seen[2] == seen[3]
    # Version 3 is not version 2, and depends on the key and on the client (the nonces).
    up = uploads[0]
    v2 = SSAServer(params, 0).add_client(0, up.public_part, up.master_seeds[0])
    other = SSAServer(params, 0, digest_key=bytes(range(2, 18)))
    assert v2 != seen[1][0][0] != other.add_client(0, up.public_part, up.master_seeds[0])
    assert SSAServer(params, 0, digest_key=KEY).add_client(9, up.public_part, up.master_seeds[0])
    assert seen[1][0][0] != SSAServer(params, 0, digest_key=KEY).add_client(
        9, up.public_part, up.master_seeds[0]
    )


@pytest.mark.usefixtures("small_segments")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", FORGERIES)
def test_forged_keys_are_caught_under_a_digest_key(name: str, threads: int) -> None:
    params = unit_params(stash_size=1 if "stash" in name else 0)
    plan, tamper = _forgery(params, name)
    upload, public = forge.forged_upload(params, plan, 5, twin().public_key(), bind(params), tamper)
    s0, s1 = (SSAServer(params, p, threads=threads, digest_key=KEY) for p in (0, 1))
    digest0 = s0.add_client(5, public, upload.master_seed)
    with pytest.raises(SSAInputError, match="key check failed"):
        s1.add_client(5, public, _s1_seed(plan, params, tamper), expect=digest0)
    assert s1.num_clients == 0 and not s1.share().any()


class KeySpy(InProcessHelper):
    """The in-process S1, recording every digest key S0 opens a round with."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keys: list[bytes | None] = []

    def open_round(self, round_id: int, params: bytes, digest_key: bytes | None = None) -> None:
        self.keys.append(digest_key)
        super().open_round(round_id, params, digest_key)


def test_lead_server_draws_a_fresh_key_per_checked_round_and_s1_uses_it() -> None:
    helper = KeySpy(limits=HelperLimits(min_clients=1), session_ids=fixed_ids(SID))
    lead = LeadServer(helper, min_clients=1)
    honest = make_clients(3)
    for c in honest:
        c.weight = 1.0
    for rid in (1, 2):
        params = unit_params(rid)
        lead.open(params)
        key = helper.keys[-1]
        assert key is not None and len(key) == DIGEST_KEY_BYTES
        (session,) = helper.service._sessions.values()
        assert session.rounds[rid].ssa._check.digest_key == key  # type: ignore[union-attr]
        outcome = lead.aggregate(params, fresh_uploads(params, honest, lead.helper_key()))
        assert outcome.rejected == {} and not lead._open  # the key ends with the round
        assert_matches(params, outcome.result, honest)
    assert helper.keys[0] != helper.keys[1]
    lead.open(unit_params(3, verify=False))  # an unchecked round is opened without a key
    assert helper.keys[-1] is None


def test_lead_server_keeps_a_digest_key_only_while_its_round_is_open() -> None:
    """No spare key: a round that never aggregates drops its key when it ends (16 B each)."""
    from flwr_fsl.core.errors import RoundFailedError

    helper = KeySpy(limits=HelperLimits(min_clients=1), session_ids=fixed_ids(SID))
    lead = LeadServer(helper, min_clients=1)
    lead.open(unit_params(1))
    assert lead._open == {1: helper.keys[-1]}
    lead.open(unit_params(1))  # already open: the same key, none drawn
    assert len(helper.keys) == 1
    assert lead.abort(1) is None and lead._open == {}  # aborted: the key is gone
    lead.open(unit_params(2, verify=False))
    assert lead._open == {2: None}  # an unchecked round draws no key
    assert lead.abort(2) is None and lead._open == {}
    refusing = KeySpy(limits=HelperLimits(max_domain_size=8), session_ids=fixed_ids(SID))
    lead = LeadServer(refusing, min_clients=1)
    with pytest.raises(RoundFailedError, match="domain_size"):
        lead.open(unit_params(3))  # S1 refuses: the round never opened, no key is kept
    assert refusing.keys[-1] is not None and lead._open == {}


def _message_bytes(msg: Message) -> bytes:
    """Every byte and string a client receives in one message (content and metadata)."""
    parts = [repr(msg.metadata).encode()]

    def add(value: Any) -> None:
        if isinstance(value, bytes):
            parts.append(value)
        elif isinstance(value, str):
            parts.append(value.encode())
        elif isinstance(value, list):
            for v in value:
                add(v)
        else:
            parts.append(repr(value).encode())

    content: RecordDict = msg.content
    for record in content.values():
        if isinstance(record, ArrayRecord):
            for name, array in record.items():
                parts += [name.encode(), array.data]
        elif isinstance(record, ConfigRecord | MetricRecord):
            for name, value in record.items():
                add(name)
                add(value)
    return b"\x00".join(parts)


def test_no_client_ever_receives_the_digest_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.families.ssa.test_strategy import _secure_run

    drawn: list[bytes] = []

    def draw() -> bytes:
        drawn.append(new_digest_key())
        return drawn[-1]

    monkeypatch.setattr(two_server, "new_digest_key", draw)
    received: list[bytes] = []

    def spy(msg, context, call_next):  # type: ignore[no-untyped-def]
        received.append(_message_bytes(msg))
        return call_next(msg, context)

    key = SealingKeyPair.generate()
    helper = KeySpy(keypair=key)
    strategy, _, _ = _secure_run(key, rounds=2, mods=(spy,), helper=helper)
    assert strategy.failed_rounds == {}
    assert len(drawn) >= 2 and helper.keys and set(helper.keys) <= set(drawn)  # S1 got them
    assert received
    for k in drawn:
        for form in (k, k.hex().encode(), k.hex().upper().encode()):
            assert not any(form in blob for blob in received)


def test_a_bad_or_missing_key_is_refused_cleanly_and_opens_nothing() -> None:
    helper = twin()
    checked, plain = unit_params(1), unit_params(2, verify=False)
    for bad in (bytes(16), bytes(15), b"", bytes(17)):  # all zeros, short, missing, long
        with pytest.raises(HelperRequestError, match=r"digest key|16 bytes"):
            helper.open_round(1, checked.to_bytes(), bad)
    with pytest.raises(HelperRequestError, match="does not check keys"):
        helper.open_round(2, plain.to_bytes(), KEY)  # a key for an unchecked round
    with pytest.raises(HelperRequestError, match=r"unknown round|not open"):
        helper.add_checked(1, [(1, b"", b"", bytes(32))], hints=False)
    (session,) = helper.service._sessions.values()
    assert not session.rounds
    # S1 itself refuses a request whose key field is short or missing (raw bytes on the wire).
    sid = helper.session_id
    full = wire.encode(wire.OpenCheckedRoundRequest(sid, 1, checked.to_bytes(), KEY))
    for body in (full[:-1], full[:-DIGEST_KEY_BYTES]):
        with pytest.raises(HelperRequestError, match=r"truncated|digest key"):
            helper._transport("OpenCheckedRound", body)
    assert not session.rounds
    # The wire refuses a short key too: truncated bytes decode to nothing.
    good = wire.encode(wire.OpenCheckedRoundRequest(bytes(16), 1, b"p", KEY))
    with pytest.raises(WireFormatError, match=r"truncated|digest key"):
        wire.decode(good[:-1], wire.OpenCheckedRoundRequest)
    with pytest.raises(WireFormatError):
        wire.encode(wire.OpenCheckedRoundRequest(bytes(16), 1, b"p", KEY[:8]))
    assert "digest_key" not in repr(wire.decode(good, wire.OpenCheckedRoundRequest))
    helper.open_round(1, checked.to_bytes(), KEY)  # the refusals left the round id unused


@pytest.mark.parametrize("bad", [bytes(16), b"short", "x" * 16, 7])
def test_servers_refuse_a_bad_digest_key(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="digest_key"):
        SSAServer(unit_params(), 0, digest_key=bad)  # type: ignore[arg-type]


def test_a_checked_round_opened_without_a_key_runs_digest_version_2() -> None:
    """An S0 that sends the old ``OpenRound``: S1 checks with SHA-256 digests, as before."""
    helper = twin()
    params = unit_params(value_check="off")  # the digests alone
    helper.open_round(params.round_id, params.to_bytes())
    honest = make_clients(2)
    for c in honest:
        c.weight = 1.0
    uploads = fresh_uploads(params, honest, helper.public_key())
    s0 = SSAServer(params, 0)  # version 2 at S0 as well
    items = []
    for cid, up in uploads.items():
        digest = s0.add_client(cid, up.public_part, up.master_seed)
        items.append((cid, up.public_part, up.sealed, digest or b""))
    answers = helper.add_checked(params.round_id, items, hints=False)
    for cid, *_, digest in items:
        answer = answers[cid]
        assert isinstance(answer, bytes) and same_digest(answer, digest)
    # A version-3 digest does not match a version-2 S1.
    s0v3 = SSAServer(dataclasses.replace(params, round_id=9), 0, digest_key=KEY)
    up = next(iter(uploads.values()))
    assert s0v3.add_client(1, up.public_part, up.master_seed) != items[0][3]


def test_a_segment_too_long_for_one_gmac_call_is_streamed_to_the_same_tag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stash key past ``m = 2**24`` has more proof bytes than one AES-GCM call takes."""
    params = unit_params(stash_size=1, value_check="off")  # the digests alone
    up = _uploads(params, 1)[0]
    one_shot = SSAServer(params, 0, digest_key=KEY).add_client(
        3, up.public_part, up.master_seeds[0]
    )
    monkeypatch.setattr(verify, "_ONE_SHOT_BYTES", 1000)
    monkeypatch.setattr(verify, "_PIECE_BYTES", 320)
    streamed = SSAServer(params, 0, digest_key=KEY).add_client(
        3, up.public_part, up.master_seeds[0]
    )
    assert streamed == one_shot
