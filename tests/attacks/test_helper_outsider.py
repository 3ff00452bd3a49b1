"""Issue 21: outsiders and other runs against a real ``flwr-fsl-helper`` process.

The attacks (issue 21, "The session id is a password"): every client of a run receives the
session id in its train config, and S1 used to start without a token; anyone naming the id could
add a garbage item under a victim's client id (S1 then refused the real upload and the round
finished without the victim), finish or abort the round, close the session (every stored U-DPF
key forgotten), replace S1's stored keys for a client, or set a PSR table. With a token, another
run's S0 on the same helper could do the same. ``Health`` listed every session's open rounds.

Here the attacker speaks raw wire bytes over gRPC (:func:`raw_call`), as anyone on the network
can, to a real S1 process started with its defaults (a generated access token); the victim is an
honest S0 (:class:`~flwr_fsl.helper.HelperClient`) in the middle of an SSA round. The stated
baseline: whatever the attacker sends, every call naming the victim's session is refused
(``UNAUTHENTICATED`` without the token; without the session's secret, ``NOT_FOUND`` with the very
answer an id S1 never issued gets, so the id does not even tell whether the session is live), and
the victim's round then aggregates exactly its clients, all of them. Also: ``--insecure`` is
what it takes to serve without a token, a token over plain gRPC on a non-loopback address is
refused at start, and ``Health`` answers the same bytes whatever sessions and rounds exist.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.psu import PSUParams
from flwr_fsl.families.ssa.protocol import SSAServer, reconstruct
from flwr_fsl.families.ssa.union import psu_params_to_bytes
from flwr_fsl.helper import HelperClient, HelperSessionLostError, wire
from flwr_fsl.helper.connection import SECRET_METADATA_KEY, TOKEN_METADATA_KEY
from flwr_fsl.helper.service import SERVICE_NAME
from flwr_fsl.helper.services.psu import PsuSumRequest, SeedItem
from flwr_fsl.testing.helper_process import HelperProcess
from tests.helper.test_helper import expected_sums, make_clients, make_params, upload_for

CLIENTS = 3

PSU_PARAMS = psu_params_to_bytes(PSUParams.exact(96))


def raw_call(
    address: str,
    method: str,
    message: wire.Message,
    *,
    token: str | None = None,
    secret: bytes | None = None,
) -> tuple[grpc.StatusCode, bytes | str]:
    """Call S1 with hand-made wire bytes and metadata; return (status, response or details)."""
    metadata = []
    if token is not None:
        metadata.append((TOKEN_METADATA_KEY, token))
    if secret is not None:
        metadata.append((SECRET_METADATA_KEY, secret.hex()))
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(f"/{SERVICE_NAME}/{method}")
        try:
            return grpc.StatusCode.OK, call(wire.encode(message), timeout=30, metadata=metadata)
        except grpc.RpcError as err:
            assert isinstance(err, grpc.Call)
            return err.code(), err.details() or ""


def forged_calls(session: bytes, cid: int) -> dict[str, wire.Message]:
    """Every session-scoped call an attacker may try on the victim's session and round 1."""
    table = np.zeros((96, 2), np.uint64)
    return {
        "AddClients": wire.AddClientsRequest(session, 1, (wire.SealedItem(cid, b"junk", b"x"),)),
        "AddClientHints": wire.AddHintsRequest(session, 1, (wire.HintItem(cid, b"h", b"s"),)),
        "FinishRound": wire.FinishRoundRequest(session, 1),
        "AbortRound": wire.AbortRoundRequest(session, 1),
        "SetModel": wire.SetModelRequest(session, 1, table),
        "PsrAnswer": wire.PsrAnswerRequest(session, 1, (wire.SealedItem(cid, b"p", b"s"),)),
        "PsuSum": PsuSumRequest(session, 1, PSU_PARAMS, (SeedItem(cid, b"s" * 72),)),
        "OpenRound": wire.OpenRoundRequest(session, 2, make_params(2).to_bytes()),
        "OpenCheckedRound": wire.OpenCheckedRoundRequest(
            session, 2, make_params(2).to_bytes(), bytes(range(1, 17))
        ),
        "CloseSession": wire.CloseSessionRequest(session),
    }


@pytest.fixture(scope="module")
def s1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HelperProcess]:
    """A real S1 with its defaults: it generates an access token in its state directory."""
    tmp = tmp_path_factory.mktemp("s1-outsider")
    key_file = tmp / "s1.pem"
    SealingKeyPair.generate().save(key_file)
    # These rounds are unchecked (make_params): S1 must allow them (its default floor refuses).
    flags = ("--min-value-check", "off")
    with HelperProcess(key_file, tmp / "s1.log", flags, state_dir=tmp / "state") as proc:
        assert proc.token and proc.token_file == tmp / "state" / "token"
        assert proc.token_file.stat().st_mode & 0o777 == 0o600
        yield proc


def _victim_round(s1: HelperProcess) -> tuple[HelperClient, list, list]:
    """An honest S0 with round 1 open and its clients' uploads sealed to its session."""
    victim = s1.client(timeout=60)
    params = make_params(1)
    victim.open_round(1, params.to_bytes())
    pub = victim.public_key()
    clients = make_clients(CLIENTS, seed=21)
    uploads = [upload_for(params, c, pub, session=victim.session_id) for c in clients]
    return victim, clients, uploads


def _finish_exactly(victim: HelperClient, clients: list, uploads: list) -> None:
    """The victim's round takes all its clients and reconstructs their exact sums."""
    params = make_params(1)
    relay = [
        (c.cid, u.public_part, sealed) for c, (u, sealed) in zip(clients, uploads, strict=True)
    ]
    assert victim.add_clients(1, relay) == {}
    s0 = SSAServer(params, 0)
    for c, (u, _) in zip(clients, uploads, strict=True):
        s0.add_client(c.cid, u.public_part, u.master_seeds[0])
    ids, share = victim.finish_round(1)
    assert ids == tuple(c.cid for c in clients)  # nobody was dropped or added
    result = reconstruct(params, s0.share(), share)
    sums, counts = expected_sums(clients)
    np.testing.assert_allclose(result.sums, sums, atol=1e-5)
    np.testing.assert_allclose(result.counts, counts, atol=1e-5)


@pytest.mark.parametrize(
    "who, token, secret, refused",
    [
        ("anyone, no token", None, None, grpc.StatusCode.UNAUTHENTICATED),
        (
            "anyone, no token, a guessed secret",
            None,
            os.urandom(32),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
        ("another run's S0 (token)", "TOKEN", None, grpc.StatusCode.NOT_FOUND),
        ("token and a wrong secret", "TOKEN", os.urandom(32), grpc.StatusCode.NOT_FOUND),
        ("token and a malformed secret", "TOKEN", b"\x01", grpc.StatusCode.NOT_FOUND),
    ],
    # Random bytes by length: their values in an id would differ between pytest-xdist workers.
    ids=lambda value: f"{len(value)}-bytes" if isinstance(value, bytes) else None,
)
def test_an_outsider_knowing_the_session_id_is_refused_everything(
    s1: HelperProcess, who: str, token: str | None, secret: bytes | None, refused: grpc.StatusCode
) -> None:
    victim, clients, uploads = _victim_round(s1)
    token = s1.token if token == "TOKEN" else token
    try:
        # The attacker knows the session id (every client does: fsl.ssa.session).
        for method, message in forged_calls(victim.session_id, clients[0].cid).items():
            code, details = raw_call(s1.address, method, message, token=token, secret=secret)
            assert code == refused, (who, method, code, details)
            # Liveness oracle: the live id answers exactly as an id S1 never issued.
            other = forged_calls(os.urandom(16), clients[0].cid)[method]
            assert raw_call(s1.address, method, other, token=token, secret=secret) == (
                code,
                details,
            ), (who, method)
        # Its own session is all a token holder gets; it cannot reach the victim's from it.
        if token is not None:
            code, body = raw_call(s1.address, "OpenSession", wire.OpenSessionRequest(), token=token)
            assert code == grpc.StatusCode.OK
            own = wire.decode(bytes(body), wire.SessionInfoResponse)  # type: ignore[arg-type]
            assert own.session != victim.session_id
            forged = forged_calls(victim.session_id, clients[0].cid)["FinishRound"]
            code, _ = raw_call(s1.address, "FinishRound", forged, token=token, secret=own.secret)
            assert code == grpc.StatusCode.NOT_FOUND
        # The victim's round is untouched: every client's real upload is taken, sums exact.
        _finish_exactly(victim, clients, uploads)
    finally:
        victim.close()


def test_no_token_no_session_no_round_and_the_victim_unharmed_by_close(s1: HelperProcess) -> None:
    # Regression of the old attack in its plainest form: CloseSession by id with no token.
    victim, clients, uploads = _victim_round(s1)
    try:
        code, _ = raw_call(s1.address, "CloseSession", wire.CloseSessionRequest(victim.session_id))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code, _ = raw_call(s1.address, "OpenSession", wire.OpenSessionRequest())
        assert code == grpc.StatusCode.UNAUTHENTICATED
        _finish_exactly(victim, clients, uploads)
        # The honest S0's own close does end the session (with its secret).
        victim.close_session()
        with pytest.raises(HelperSessionLostError, match="closed"):
            victim.open_round(3, make_params(3).to_bytes())
    finally:
        victim.close()


def test_health_reveals_nothing_about_sessions_or_rounds(s1: HelperProcess) -> None:
    pub = SealingKeyPair.load(Path(s1.proc.args[s1.proc.args.index("--key-file") + 1]))
    expected = wire.encode(wire.HealthResponse(wire.VERSION, pub.public_bytes))
    before = raw_call(s1.address, "Health", wire.HealthRequest())
    victims = [s1.client(timeout=60) for _ in range(2)]
    try:
        for i, v in enumerate(victims):
            for rid in range(1, 3 + i):
                v.open_round(rid, make_params(rid).to_bytes())
        during = raw_call(s1.address, "Health", wire.HealthRequest())
    finally:
        for v in victims:
            v.close()
    after = raw_call(s1.address, "Health", wire.HealthRequest())
    # No token needed, and the same bytes whatever runs: version and key, nothing else.
    assert before == during == after == (grpc.StatusCode.OK, expected)
    code, key = raw_call(s1.address, "PublicKey", wire.PublicKeyRequest())
    assert code == grpc.StatusCode.OK
    assert wire.decode(bytes(key), wire.PublicKeyResponse).public_key == pub.public_bytes  # type: ignore[arg-type]


def test_serving_without_a_token_takes_insecure(tmp_path: Path) -> None:
    key_file = tmp_path / "s1.pem"
    SealingKeyPair.generate().save(key_file)
    # These rounds are unchecked (make_params): S1 must allow them (its default floor refuses).
    flags = ("--insecure", "--min-value-check", "off")
    with HelperProcess(key_file, tmp_path / "s1.log", flags) as proc:
        assert proc.token is None
        assert any("--insecure: no access token" in line for line in proc.stdout)
        conn = HelperClient(proc.address, timeout=60)
        victim, clients, uploads = _victim_round(proc)
        try:
            conn.open_session()  # anyone may open a session of its own ...
            # ... but still not touch another's: the session secret guards it.
            for method, message in forged_calls(victim.session_id, clients[0].cid).items():
                code, _ = raw_call(proc.address, method, message)
                assert code == grpc.StatusCode.NOT_FOUND, method
            _finish_exactly(victim, clients, uploads)
        finally:
            conn.close()
            victim.close()


def _start_refused(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    key_file = tmp_path / "s1.pem"
    if not key_file.exists():
        SealingKeyPair.generate().save(key_file)
    cmd = [sys.executable, "-m", "flwr_fsl.helper", "--key-file", str(key_file), "--port", "0"]
    cmd += ["--state-dir", str(tmp_path / "state"), "--open-enrollment", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_a_token_in_clear_to_a_non_loopback_address_is_refused_at_start(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "10.1.2.3", "::"):
        done = _start_refused(tmp_path, "--host", host)
        assert done.returncode == 2, (host, done.stdout, done.stderr)
        assert "not loopback" in done.stderr and "--insecure" in done.stderr
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    done = _start_refused(tmp_path, "--host", "0.0.0.0", "--token-file", str(token))
    assert done.returncode == 2 and "travel in clear" in done.stderr
    assert not (tmp_path / "state" / "token").exists()  # refused before any token was made


def test_insecure_allows_a_non_loopback_address(tmp_path: Path) -> None:
    key_file = tmp_path / "s1.pem"
    SealingKeyPair.generate().save(key_file)
    # These rounds are unchecked (make_params): S1 must allow them (its default floor refuses).
    flags = ("--host", "0.0.0.0", "--insecure", "--min-value-check", "off")
    with HelperProcess(key_file, tmp_path / "s1.log", flags) as p:
        assert p.address.startswith("0.0.0.0:") and p.token is None
