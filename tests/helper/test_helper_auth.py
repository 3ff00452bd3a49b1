"""Issue 21 unit tests: session secrets, S1-drawn ids, the access token file, S0's warnings.

The attacks themselves run against real ``flwr-fsl-helper`` processes in
``tests/attacks/test_helper_outsider.py`` and ``tests/attacks/test_helper_replay.py``; here the
mechanism is pinned down on the in-process service (the same ``HelperService.handle`` the gRPC
server calls), the CLI's token handling and the wire decoders of the new messages (fuzzed).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.psu import PSUParams
from flwr_fsl.families.ssa.union import psu_params_to_bytes
from flwr_fsl.helper import (
    HelperClient,
    HelperService,
    HelperSessionLostError,
    InProcessHelper,
    wire,
)
from flwr_fsl.helper.cli import TOKEN_FILE_NAME, _access_token, _parser
from flwr_fsl.helper.connection import is_loopback
from flwr_fsl.helper.errors import WireFormatError
from flwr_fsl.helper.quota import ServiceLimits
from flwr_fsl.helper.service import RETIRED_SESSIONS
from flwr_fsl.helper.services.psu import PsuSumRequest, SeedItem
from tests.helper.test_helper import SID, fixed_ids, make_clients, make_params, sealed_uploads

PSU_PARAMS = psu_params_to_bytes(PSUParams.exact(96))


def _requests(session: bytes, cid: int) -> dict[str, wire.Message]:
    return {
        "OpenRound": wire.OpenRoundRequest(session, 2, make_params(2).to_bytes()),
        "OpenCheckedRound": wire.OpenCheckedRoundRequest(
            session, 2, make_params(2).to_bytes(), bytes(range(1, 17))
        ),
        "AddClients": wire.AddClientsRequest(session, 1, (wire.SealedItem(cid, b"p", b"s"),)),
        "AddClientHints": wire.AddHintsRequest(session, 1, (wire.HintItem(cid, b"h", b"s"),)),
        "FinishRound": wire.FinishRoundRequest(session, 1),
        "AbortRound": wire.AbortRoundRequest(session, 1),
        "SetModel": wire.SetModelRequest(session, 1, np.zeros((96, 2), np.uint64)),
        "PsrAnswer": wire.PsrAnswerRequest(session, 1, (wire.SealedItem(cid, b"p", b"s"),)),
        "PsuSum": PsuSumRequest(session, 1, PSU_PARAMS, (SeedItem(cid, b"s" * 72),)),
        "CloseSession": wire.CloseSessionRequest(session),
    }


@pytest.mark.parametrize(
    "secret",
    [None, b"", bytes(32), os.urandom(32), os.urandom(31)],
    # Named, not shown: random bytes in an id differ between pytest-xdist workers.
    ids=["none", "empty", "zeros", "random-32", "random-31"],
)
def test_a_wrong_secret_is_refused_and_leaves_the_session_untouched(
    monkeypatch: pytest.MonkeyPatch, secret: bytes | None
) -> None:
    clock = [100.0]
    monkeypatch.setattr("flwr_fsl.helper.service.time.monotonic", lambda: clock[0])
    helper = InProcessHelper(session_ids=fixed_ids(SID))
    params = make_params(1)
    clients = make_clients(2)
    helper.open_round(1, params.to_bytes())
    session = helper.service._sessions[SID]
    before = (dict(session.rounds), set(session.closed), session.last_used)
    clock[0] += 50
    for method, message in _requests(SID, clients[0].cid).items():
        with pytest.raises(HelperSessionLostError, match=r"unknown session \(closed, expired"):
            helper.service.handle(method, wire.encode(message), secret)
    assert (dict(session.rounds), set(session.closed), session.last_used) == before
    # The owner's round goes on with every client, the victim's id included.
    assert helper.add_clients(1, sealed_uploads(params, clients, helper.public_key())) == {}
    ids, _ = helper.finish_round(1)
    assert ids == tuple(c.cid for c in clients)


def test_clients_get_the_id_never_the_secret() -> None:
    helper = InProcessHelper()
    sid, secret = helper.session_id, helper._secret
    assert len(sid) == wire.SESSION_BYTES and len(secret) == wire.SECRET_BYTES
    assert secret not in wire.encode(wire.OpenRoundRequest(sid, 1, b"p"))
    assert "secret" not in repr(helper.service._sessions[sid])  # not even in S1's logs


def test_closed_and_expired_ids_are_remembered_boundedly(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr("flwr_fsl.helper.service.time.monotonic", lambda: clock[0])
    service = HelperService(SealingKeyPair.generate(), quota=ServiceLimits(session_idle_s=10))
    a, b = InProcessHelper(service), InProcessHelper(service)
    a.open_session()
    b.open_session()
    a.close_session()
    clock[0] += 11
    InProcessHelper(service).open_session()  # expires b
    with pytest.raises(HelperSessionLostError, match="closed; session ids are single-use"):
        a.abort_round(1)
    with pytest.raises(HelperSessionLostError, match="expired"):
        b.abort_round(1)
    for _ in range(RETIRED_SESSIONS + 1):
        service._retire(os.urandom(16), "closed")
    assert len(service._retired) == RETIRED_SESSIONS and a.session_id not in service._retired


def test_the_token_file_is_generated_once_0600_and_reused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    args = _parser().parse_args(["--key-file", "k"])
    token, path = _access_token(args, state)
    assert path == state / TOKEN_FILE_NAME and path is not None
    assert path.stat().st_mode & 0o777 == 0o600 and len(token or "") >= 40
    assert "created access token file" in capsys.readouterr().out
    assert _access_token(args, state) == (token, path)  # a restart keeps it
    assert "created" not in capsys.readouterr().out
    insecure = _parser().parse_args(["--key-file", "k", "--insecure"])
    assert _access_token(insecure, tmp_path / "other") == (None, None)
    assert not (tmp_path / "other").exists()
    given_file = tmp_path / "mine"
    given_file.write_text(" s3cret \n")
    given_file.chmod(0o600)
    mine = _parser().parse_args(["--key-file", "k", "--insecure", "--token-file", str(given_file)])
    assert _access_token(mine, state) == ("s3cret", given_file)


def test_help_says_how_to_serve_without_a_token(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--insecure" in text and "<state-dir>/token" in text
    assert "ssa-helper-token-file" in text


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.2", False),
        ("s1.example.org", False),
    ],
)
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_s0_warns_when_the_token_would_travel_in_clear(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="flwr_fsl.helper"):
        HelperClient("10.0.0.2:9500", token="t").close()
    assert "travel in clear" in caplog.text and "access token" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flwr_fsl.helper"):
        HelperClient("127.0.0.1:9500", token="t").close()
        HelperClient("[::1]:9500", token="t").close()
        HelperClient("10.0.0.2:9500", token="t", root_certificates=b"pem").close()
    assert "travel in clear" not in caplog.text


# ---- the new wire messages, fuzzed -------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_session_and_health_decoders_take_any_bytes(data: bytes) -> None:
    for cls in (wire.OpenSessionRequest, wire.SessionInfoResponse, wire.HealthResponse):
        for body in (data, wire.MAGIC + bytes([wire.VERSION, int(cls.KIND), 0, 0]) + data):
            try:
                wire.decode(body, cls)
            except WireFormatError:
                pass


@settings(max_examples=200, deadline=None)
@given(
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=32, max_size=32),
    st.integers(0, 2**32 - 1),
    st.binary(max_size=40),
)
def test_session_and_health_messages_round_trip(
    session: bytes, secret: bytes, version: int, key: bytes
) -> None:
    info = wire.SessionInfoResponse(session, secret)
    assert wire.decode(wire.encode(info), wire.SessionInfoResponse) == info
    health = wire.HealthResponse(version, key)
    assert wire.decode(wire.encode(health), wire.HealthResponse) == health
    body = wire.encode(info)
    for n in range(len(body)):
        with pytest.raises(WireFormatError):
            wire.decode(body[:n], wire.SessionInfoResponse)
    with pytest.raises(WireFormatError, match="trailing"):
        wire.decode(body + b"\x00", wire.SessionInfoResponse)


@pytest.mark.parametrize("session, secret", [(bytes(15), bytes(32)), (bytes(16), bytes(31))])
def test_session_info_fields_have_exact_lengths(session: bytes, secret: bytes) -> None:
    with pytest.raises(WireFormatError, match="exactly"):
        wire.encode(wire.SessionInfoResponse(session, secret))
