"""S1 sessions and pluggable services: one helper serves many runs, one after another and at once.

Each S0 connection is one session; everything S1 keeps (rounds, U-DPF keys, PSR tables) lives in
it, and every sealed blob is bound to it, so runs neither collide nor can replay into each other.
Also: a toy service plugged into S1 answers through the twin and over gRPC, and ``connect_helper``
validates its run-config keys once, naming the bad key.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.wireformat import Reader, Writer
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.sealing import RoundBinding
from flwr_fsl.families.ssa.protocol import reconstruct
from flwr_fsl.families.ssa.sealing import seal_ssa_upload
from flwr_fsl.helper import (
    HelperClient,
    HelperError,
    HelperRequestError,
    HelperResourceError,
    HelperService,
    HelperSessionLostError,
    InProcessHelper,
    connect_helper,
    start_server,
    wire,
)
from flwr_fsl.helper.quota import ServiceLimits
from flwr_fsl.helper.service import Method, Session
from tests.helper.test_helper import (
    WIDTH,
    M,
    expected_sums,
    fixed_ids,
    make_clients,
    make_params,
    signer_of,
    upload_for,
)

SID_A, SID_B = b"A" * 16, b"B" * 16


def _aggregate(conn: InProcessHelper, round_id: int, seed: int) -> tuple[Any, Any, Any]:
    """One SSA round of three clients through ``conn``; return (result, expected sums, counts)."""
    params = make_params(round_id)
    clients = make_clients(3, seed=seed)
    conn.open_round(round_id, params.to_bytes())
    from flwr_fsl.families.ssa.protocol import SSAServer

    s0 = SSAServer(params, 0)
    relay = []
    for c in clients:
        upload, _ = upload_for(params, c, conn.public_key())
        # upload_for seals under the test module's session: reseal for this connection's.
        sealed = seal_ssa_upload(
            conn.public_key(),
            binding=RoundBinding.of(conn.session_id, round_id, params.to_bytes()),
            client_id=c.cid,
            public_part=upload.public_part,
            master_seed=upload.master_seeds[1],
            signer=signer_of(c.cid),
        )
        s0.add_client(c.cid, upload.public_part, upload.master_seeds[0])
        relay.append((c.cid, upload.public_part, sealed))
    assert conn.add_clients(round_id, relay) == {}
    ids, share1 = conn.finish_round(round_id)
    assert ids == tuple(sorted(c.cid for c in clients))
    sums, counts = expected_sums(clients)
    return reconstruct(params, s0.share(), share1), sums, counts


def test_two_sessions_reuse_round_ids_without_interfering() -> None:
    service = HelperService(SealingKeyPair.generate())
    a = InProcessHelper(service)
    b = InProcessHelper(service)
    for round_id in (1, 2):  # the same round ids in both runs, interleaved
        for conn, seed in ((a, round_id), (b, 10 + round_id)):
            result, sums, counts = _aggregate(conn, round_id, seed)
            np.testing.assert_allclose(result.sums, sums, atol=1e-5)
            np.testing.assert_allclose(result.counts, counts, atol=1e-5)
    assert service.session_count() == 2
    closed = a.session_id
    a.close()
    assert service.session_count() == 1
    with pytest.raises(HelperSessionLostError, match="closed; session ids are single-use"):
        service.handle("FinishRound", wire.encode(wire.FinishRoundRequest(closed, 3)), a._secret)
    b.close()
    assert service.session_count() == 0


def test_sessions_run_concurrently() -> None:
    service = HelperService(SealingKeyPair.generate())
    errors: list[BaseException] = []

    def run(session: bytes, seed: int) -> None:
        try:
            conn = InProcessHelper(service)
            for round_id in range(1, 4):
                result, sums, _ = _aggregate(conn, round_id, seed + round_id)
                np.testing.assert_allclose(result.sums, sums, atol=1e-5)
            conn.close()
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(bytes([i]) * 16, 100 * i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert service.session_count() == 0


def test_a_blob_from_one_run_does_not_open_in_another() -> None:
    service = HelperService(SealingKeyPair.generate(), session_ids=fixed_ids(SID_A, SID_B))
    a = InProcessHelper(service)
    b = InProcessHelper(service)
    params = make_params(1)
    c = make_clients(1)[0]
    a.open_round(1, params.to_bytes())
    b.open_round(1, params.to_bytes())
    upload, _ = upload_for(params, c, a.public_key())
    sealed_for_a = seal_ssa_upload(
        a.public_key(),
        binding=RoundBinding.of(SID_A, 1, params.to_bytes()),
        client_id=c.cid,
        public_part=upload.public_part,
        master_seed=upload.master_seeds[1],
        signer=signer_of(c.cid),
    )
    rejected = b.add_clients(1, [(c.cid, upload.public_part, sealed_for_a)])
    assert "authentication" in rejected[c.cid]
    assert a.add_clients(1, [(c.cid, upload.public_part, sealed_for_a)]) == {}


def test_s1_rejects_material_sealed_for_other_round_parameters() -> None:
    # S0 shows the clients one parameter set and S1 another: the digest in the AD catches it.
    conn = InProcessHelper(session_ids=fixed_ids(SID_A))
    shown, opened = make_params(1), make_params(1, max_summands=49)
    conn.open_round(1, opened.to_bytes())
    c = make_clients(1)[0]
    upload, _ = upload_for(shown, c, conn.public_key())
    sealed = seal_ssa_upload(
        conn.public_key(),
        binding=RoundBinding.of(SID_A, 1, shown.to_bytes()),
        client_id=c.cid,
        public_part=upload.public_part,
        master_seed=upload.master_seeds[1],
        signer=signer_of(c.cid),
    )
    assert "authentication" in conn.add_clients(1, [(c.cid, upload.public_part, sealed)])[c.cid]


def test_udpf_keys_are_per_session() -> None:
    service = HelperService(SealingKeyPair.generate(), session_ids=fixed_ids(SID_A, SID_B))
    a = InProcessHelper(service)
    b = InProcessHelper(service)
    _aggregate(a, 1, seed=1)
    assert any(s.keys for s in service._sessions[SID_A].data["ssa"].values())  # per layout
    b.open_round(1, make_params(1).to_bytes())
    assert not any(s.keys for s in service._sessions[SID_B].data.get("ssa", {}).values())


def test_session_limits_and_idle_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A full table evicts the idlest session without an open round; one with a round stays."""
    service = HelperService(
        SealingKeyPair.generate(), quota=ServiceLimits(max_sessions=2, session_idle_s=60)
    )
    clock = [1000.0]
    monkeypatch.setattr("flwr_fsl.helper.service.time.monotonic", lambda: clock[0])
    conns = [InProcessHelper(service) for i in range(3)]
    conns[0].open_round(1, make_params(1).to_bytes())
    conns[1].open_round(1, make_params(1).to_bytes())
    with pytest.raises(HelperResourceError, match="limit 2"):  # none idle: nothing evicted
        conns[2].open_round(1, make_params(1).to_bytes())
    clock[0] += 30
    conns[1].health()  # session-less: does not refresh anything
    conns[1].abort_round(1)  # refreshes session 1, which now has no open round
    clock[0] += 45  # session 0: idle 75 s > 60 s, but keeps its open round; session 1: 45 s
    conns[2].open_round(1, make_params(1).to_bytes())  # evicts session 1 (idle >= 30 s)
    assert service.session_count() == 2
    with pytest.raises(HelperSessionLostError, match="evicted"):
        conns[1].finish_round(1)
    conns[0].abort_round(1)  # session 0 is still there
    clock[0] += 61  # now idle without a round past session_idle_s: expired by the next call
    conns[2].abort_round(1)
    clock[0] += 2
    conns[2].health()
    with pytest.raises(HelperSessionLostError, match="expired"):
        conns[0].open_round(2, make_params(2).to_bytes())


def test_round_limit_is_per_session() -> None:
    service = HelperService(SealingKeyPair.generate(), quota=ServiceLimits(max_open_rounds=1))
    a = InProcessHelper(service)
    b = InProcessHelper(service)
    a.open_round(1, make_params(1).to_bytes())
    b.open_round(1, make_params(1).to_bytes())  # another run's round does not count
    with pytest.raises(HelperRequestError, match="limit 1"):
        a.open_round(2, make_params(2).to_bytes())


def test_s1_draws_session_ids_and_secrets() -> None:
    service = HelperService(SealingKeyPair.generate())
    a, b = InProcessHelper(service), InProcessHelper(service)
    assert len(a.session_id) == 16 and a.session_id != b.session_id
    assert len(a._secret) == 32 and a._secret != b._secret
    # A drawer that repeats an id (never os.urandom) is refused, not a shared session.
    repeat = HelperService(SealingKeyPair.generate(), session_ids=lambda: SID_A)
    InProcessHelper(repeat).open_session()
    with pytest.raises(HelperRequestError, match="used before"):
        InProcessHelper(repeat).open_session()
    with pytest.raises(HelperRequestError, match="malformed session id"):
        InProcessHelper(session_ids=lambda: b"short").open_session()
    with pytest.raises(ConfigurationError, match="session_ids"):
        HelperService(SealingKeyPair.generate(), session_ids=b"x")  # type: ignore[arg-type]


def test_reopening_replaces_the_session_and_closes_the_old_one() -> None:
    service = HelperService(SealingKeyPair.generate())
    conn = InProcessHelper(service)
    first = conn.session_id
    conn.open_session()
    assert conn.session_id != first and service.session_count() == 1
    with pytest.raises(HelperSessionLostError, match="closed"):
        conn._transport("CloseSession", wire.encode(wire.CloseSessionRequest(first)))


# ---- a plugged-in service ----------------------------------------------------------------------


@dataclass(frozen=True)
class EchoRequest(wire.Message):
    """A toy request of a toy service (kind 200), session-scoped."""

    KIND: ClassVar[int] = 200
    session: bytes
    value: int

    def _write(self, w: Writer) -> None:
        w.fixed(self.session, 16)
        w.u64(self.value)

    @classmethod
    def _read(cls, r: Reader) -> wire.Message:
        return cls(r.fixed(16, "session"), r.u64("value"))


@dataclass(frozen=True)
class EchoResponse(wire.Message):
    """The toy reply: the running total of the session's values."""

    KIND: ClassVar[int] = 201
    total: int

    def _write(self, w: Writer) -> None:
        w.u64(self.total)

    @classmethod
    def _read(cls, r: Reader) -> wire.Message:
        return cls(r.u64("total"))


wire.register_message(EchoRequest)
wire.register_message(EchoResponse)


class EchoService:
    """Sums values per session: state that must not leak between sessions."""

    name = "echo"

    def methods(self) -> Mapping[str, Method]:
        return {"Echo": Method(EchoRequest, self._echo)}

    @staticmethod
    def _echo(session: Session | None, message: EchoRequest) -> wire.Message:
        assert session is not None
        session.data["echo"] = session.data.get("echo", 0) + message.value
        return EchoResponse(session.data["echo"])


def _echo(conn: InProcessHelper | HelperClient, value: int) -> int:
    reply = conn._call("Echo", EchoRequest(conn.session_id, value), EchoResponse)
    return reply.total


def test_a_plugged_in_service_answers_through_both_transports() -> None:
    service = HelperService(SealingKeyPair.generate())
    service.register(EchoService())
    twin_a = InProcessHelper(service)
    assert _echo(twin_a, 5) == 5 and _echo(twin_a, 2) == 7
    server, port = start_server(service, "127.0.0.1", 0, token="t")
    try:
        remote_b = HelperClient(f"127.0.0.1:{port}", timeout=30, token="t")
        remote_a = HelperClient(f"127.0.0.1:{port}", timeout=30, token="t")
        assert _echo(remote_b, 1) == 1  # its own session
        # The twin's session id alone opens nothing over gRPC either ...
        remote_a._session_id = twin_a.session_id
        with pytest.raises(HelperSessionLostError, match="unknown session"):
            _echo(remote_a, 1)
        # ... with its secret it is the same state.
        remote_a._secret, remote_a._session_live = twin_a._secret, True
        assert _echo(remote_a, 1) == 8
        remote_a.close()
        remote_b.close()
    finally:
        server.stop(None).wait()
    with pytest.raises(ConfigurationError, match="already registered"):
        service.register(EchoService())


def test_message_kinds_cannot_be_taken_twice() -> None:
    @dataclass(frozen=True)
    class Clash(wire.Message):
        KIND: ClassVar[int] = 200

    with pytest.raises(ConfigurationError, match="taken by EchoRequest"):
        wire.register_message(Clash)


# ---- connect_helper's run-config keys ----------------------------------------------------------


@pytest.fixture
def flwr_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    return tmp_path


@pytest.mark.parametrize(
    "config, key",
    [
        ({"ssa-helper-token-file": "token.txt", "ssa-helper-address": "h:1"}, "token-file"),
        ({"ssa-helper-token-file": "/no/such/file", "ssa-helper-address": "h:1"}, "token-file"),
        ({"ssa-helper-ca-file": "/no/such/ca.pem", "ssa-helper-address": "h:1"}, "ca-file"),
        ({"ssa-helper-address": 9500}, "ssa-helper-address"),
        ({"ssa-helper-address": "nohostport", "ssa-helper-fingerprint": "ab"}, "address"),
        ({"ssa-helper-address": "127.0.0.1:1"}, "no pinned helper key"),
        ({"ssa-helper-key-file": "relative.pem"}, "ssa-helper-key-file"),
    ],
)
def test_bad_helper_settings_name_the_key(
    flwr_home: Path, config: dict[str, Any], key: str
) -> None:
    with pytest.raises(ConfigurationError, match=key):
        connect_helper(config)


def test_token_and_ca_files_are_checked(flwr_home: Path) -> None:
    empty = flwr_home / "empty"
    empty.write_text("  \n")
    not_pem = flwr_home / "ca.pem"
    not_pem.write_text("hello")
    with pytest.raises(ConfigurationError, match="token must be printable"):
        connect_helper({"ssa-helper-address": "h:1", "ssa-helper-token-file": str(empty)})
    with pytest.raises(ConfigurationError, match="not a PEM certificate"):
        connect_helper({"ssa-helper-address": "h:1", "ssa-helper-ca-file": str(not_pem)})
    token = flwr_home / "token"
    token.write_text("s3cret\n")
    with pytest.raises(ConfigurationError, match="in-process S1"):
        connect_helper({"ssa-helper-token-file": str(token)})


def test_connect_helper_reaches_a_token_protected_s1(flwr_home: Path) -> None:
    keypair = SealingKeyPair.generate()
    server, port = start_server(HelperService(keypair), "127.0.0.1", 0, token="s3cret")
    token = flwr_home / "token"
    token.write_text("s3cret\n")
    config = {
        "ssa-helper-address": f"127.0.0.1:{port}",
        "ssa-helper-fingerprint": keypair.fingerprint,
    }
    try:
        with pytest.raises(HelperError, match=r"requires an access token.*ssa-helper-token-file"):
            connect_helper(config)
        conn, fingerprint = connect_helper({**config, "ssa-helper-token-file": str(token)})
        assert fingerprint == keypair.fingerprint
        conn.open_round(1, make_params(1).to_bytes())
        conn.abort_round(1)
        conn.close()
    finally:
        server.stop(None).wait()


def test_shapes_stay_consistent() -> None:
    # The module's round constants agree with the shared SSA test fixtures.
    assert make_params(1).domain_size == M and make_params(1).value_width == WIDTH


def test_a_session_id_alone_tells_nothing_about_the_session() -> None:
    # Issue 21's liveness oracle: without the secret, a live id, a closed id and an id S1 never
    # issued get one answer; why a session ended is said only to the caller holding its secret.
    service = HelperService(SealingKeyPair.generate())
    live, closed = InProcessHelper(service), InProcessHelper(service)
    live.open_round(1, make_params(1).to_bytes())
    closed.open_round(1, make_params(1).to_bytes())
    closed_id, closed_secret = closed.session_id, closed._secret
    closed.close()
    answers = set()
    for sid in (live.session_id, closed_id, os.urandom(16)):
        for secret in (None, b"", os.urandom(32), closed_secret if sid != closed_id else None):
            request = wire.encode(wire.FinishRoundRequest(sid, 1))
            with pytest.raises(HelperSessionLostError) as err:
                service.handle("FinishRound", request, secret)
            answers.add((type(err.value), str(err.value)))
    unknown = "unknown session (closed, expired, or S1 restarted)"
    assert answers == {(HelperSessionLostError, unknown)}
    request = wire.encode(wire.FinishRoundRequest(closed_id, 1))
    with pytest.raises(HelperSessionLostError, match="single-use"):
        service.handle("FinishRound", request, closed_secret)
    ids, _ = live.finish_round(1)  # the live session was not touched by any of it
    assert ids == ()
    live.close()
