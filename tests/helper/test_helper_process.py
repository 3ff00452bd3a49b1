"""The real ``python -m flwr_fsl.helper`` process over gRPC: the same session as the in-process
twin gives byte-identical shares and identical per-client results and refusals; unreachable
helpers fail fast with HelperUnavailableError; CLI exit codes and key handling."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.helper import (
    HelperAuthError,
    HelperClient,
    HelperError,
    HelperRequestError,
    HelperUnavailableError,
    InProcessHelper,
    verify_helper,
)
from flwr_fsl.helper.cli import main
from flwr_fsl.testing.helper_process import HelperProcess
from tests.flwr_cli import refused_port
from tests.helper.test_helper import make_params, run_scenario


@pytest.fixture(scope="module")
def key_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("s1") / "s1.pem"
    SealingKeyPair.generate().save(path)
    return path


@pytest.fixture(scope="module")
def helper_process(key_file, tmp_path_factory):
    # Unchecked rounds (round mechanics): S1 must allow them (its default floor refuses them).
    log = tmp_path_factory.mktemp("log") / "helper.log"
    proc = HelperProcess(key_file, log, ("--min-value-check", "off"))
    try:
        yield proc
    finally:
        proc.stop()


def test_process_matches_the_in_process_twin(helper_process, key_file):
    client = helper_process.client(timeout=120)
    twin = InProcessHelper(keypair=SealingKeyPair.load(key_file))
    try:
        assert helper_process.fingerprint == SealingKeyPair.load(key_file).fingerprint
        assert verify_helper(client, helper_process.fingerprint) == twin.public_key()
        remote, local = run_scenario(client), run_scenario(twin)
    finally:
        client.close()
        twin.close()
    for key in (
        "share_1",
        "share_2",
        "clients_1",
        "clients_2",
        "rejected_1",
        "replayed_1",
        "rejected_2",
        "psr_rejected",
        "errors",
        "health",
        "health_after",
    ):
        assert remote[key] == local[key], key
    assert len(remote["errors"]) == 7
    for cid, rows in local["psr_rows"].items():
        np.testing.assert_array_equal(remote["psr_rows"][cid], rows)
        np.testing.assert_array_equal(rows, local["psr_expected"][cid])
    for key in ("result_1", "result_2"):
        np.testing.assert_array_equal(remote[key].sums, local[key].sums)
        np.testing.assert_array_equal(remote[key].counts, local[key].counts)


def test_large_messages_pass_the_grpc_limit(helper_process):
    client = helper_process.client(timeout=120)
    try:
        # 8 MiB (over gRPC's 4 MiB default): delivered, then refused by S1's parameter parser.
        with pytest.raises(HelperRequestError, match="bad round parameters"):
            client.open_round(100, b"{" + bytes(8 << 20))
    finally:
        client.close()


def test_refused_call_over_grpc_is_a_request_error(helper_process):
    client = helper_process.client(timeout=60)
    try:
        with pytest.raises(HelperRequestError, match="unknown session"):
            client.finish_round(12345)
        client.open_round(1, make_params(1).to_bytes())  # creates the session
        with pytest.raises(HelperRequestError, match="round 12345 is not open"):
            client.finish_round(12345)
    finally:
        client.close()
    with pytest.raises(HelperUnavailableError, match="closed"):
        client.health()


def test_sigterm_stops_cleanly(key_file, tmp_path):
    proc = HelperProcess(key_file, tmp_path / "helper.log")
    assert proc.stop() == 0
    assert proc.stdout[-1] == "flwr-fsl-helper: stopped"


def test_unreachable_helper_fails_fast():
    with refused_port() as port:  # held, never listening: no other process can answer on it
        client = HelperClient(f"127.0.0.1:{port}", timeout=10)
        try:
            with pytest.raises(HelperUnavailableError, match="UNAVAILABLE"):
                client.health()
            with pytest.raises(HelperUnavailableError):
                client.open_round(1, b"")
        finally:
            client.close()


def test_silent_peer_hits_the_deadline():
    with socket.socket() as sock:  # accepts TCP, never speaks HTTP/2
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        client = HelperClient(f"127.0.0.1:{sock.getsockname()[1]}", timeout=0.5)
        try:
            with pytest.raises(HelperUnavailableError, match=r"DEADLINE_EXCEEDED|UNAVAILABLE"):
                client.health()
        finally:
            client.close()


def test_client_argument_validation():
    with pytest.raises(ConfigurationError):
        HelperClient("")
    with pytest.raises(ConfigurationError):
        HelperClient("127.0.0.1:1", timeout=0)
    assert issubclass(HelperUnavailableError, HelperError)


# ---- CLI (in process, no server started) --------------------------------------------------------


def test_cli_missing_key_file_needs_generate_flag(tmp_path, capsys):
    path = tmp_path / "k.pem"
    assert main(["--key-file", str(path), "--print-fingerprint"]) == 2
    assert "--generate-key" in capsys.readouterr().err
    assert main(["--key-file", str(path), "--generate-key", "--print-fingerprint"]) == 0
    out = capsys.readouterr().out
    fingerprint = SealingKeyPair.load(path).fingerprint
    assert f"created key file {path}" in out and fingerprint in out
    assert (path.stat().st_mode & 0o777) == 0o600
    # An existing key is reused, never replaced.
    assert main(["--key-file", str(path), "--generate-key", "--print-fingerprint"]) == 0
    assert fingerprint in capsys.readouterr().out
    assert SealingKeyPair.load(path).fingerprint == fingerprint


def test_cli_refuses_loose_key_file(tmp_path, capsys):
    path = SealingKeyPair.generate().save(tmp_path / "k.pem")
    path.chmod(0o644)
    assert main(["--key-file", str(path), "--print-fingerprint"]) == 2
    assert "chmod 600" in capsys.readouterr().err


def test_cli_port_in_use(tmp_path, capsys):
    path = SealingKeyPair.generate().save(tmp_path / "k.pem")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert main(["--key-file", str(path), "--open-enrollment", "--port", str(port)]) == 1
    assert "cannot bind" in capsys.readouterr().err


def test_cli_bad_arguments(tmp_path):
    path = SealingKeyPair.generate().save(tmp_path / "k.pem")
    with pytest.raises(SystemExit) as info:
        main(["--key-file", str(path), "--max-message-mib", "0"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:  # refused by the parser, naming the flag
        main(["--key-file", str(path), "--open-enrollment", "--max-open-rounds", "0"])
    assert info.value.code == 2
    assert main(["--key-file", str(path), "--open-enrollment", "--port", "70000"]) == 2


# ---- TLS and access token (in-process gRPC server) ----------------------------------------------


def _self_signed() -> tuple[bytes, bytes]:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flwr-fsl-helper test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def test_tls_and_token():
    from flwr_fsl.helper import HelperService, start_server

    key_pem, cert_pem = _self_signed()
    kp = SealingKeyPair.generate()
    server, port = start_server(
        HelperService(kp), "127.0.0.1", 0, tls=(key_pem, cert_pem), token="s3cret"
    )
    address = f"127.0.0.1:{port}"
    clients = {
        "good": HelperClient(address, timeout=30, root_certificates=cert_pem, token="s3cret"),
        "no token": HelperClient(address, timeout=30, root_certificates=cert_pem),
        "wrong token": HelperClient(address, timeout=30, root_certificates=cert_pem, token="x"),
        "plain": HelperClient(address, timeout=5, token="s3cret"),
    }
    try:
        assert clients["good"].health().fingerprint == kp.fingerprint
        with pytest.raises(HelperRequestError, match="unknown session"):
            clients["good"].finish_round(3)
        for name, said in (("no token", "got no token"), ("wrong token", "got a wrong token")):
            # Health and PublicKey need no token (health checks, key pinning) ...
            assert clients[name].public_key() == kp.public_bytes
            # ... every other call does.
            with pytest.raises(
                HelperAuthError, match=f"requires an access token and {said}"
            ) as info:
                clients[name].open_session()
            assert "ssa-helper-token-file" in str(info.value)
        with pytest.raises(HelperUnavailableError):
            clients["plain"].health()
    finally:
        for c in clients.values():
            c.close()
        server.stop(None).wait()


def test_start_server_validation():
    from flwr_fsl.helper import HelperService, start_server

    service = HelperService(SealingKeyPair.generate())
    for kw in (dict(port=-1), dict(max_workers=0), dict(max_message_bytes=0), dict(token="")):
        with pytest.raises(ConfigurationError):
            start_server(service, insecure=True, **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="needs an access token"):
        start_server(service)
    with pytest.raises(ConfigurationError, match=r"travel in clear to 0\.0\.0\.0"):
        start_server(service, "0.0.0.0", 0, token="t")


def test_cli_tls_and_token_arguments(tmp_path, capsys):
    path = SealingKeyPair.generate().save(tmp_path / "k.pem")
    with pytest.raises(SystemExit) as info:
        main(["--key-file", str(path), "--tls-cert", str(tmp_path / "c.pem")])
    assert info.value.code == 2
    empty = tmp_path / "token"
    empty.write_text("\n")
    empty.chmod(0o600)
    assert main(["--key-file", str(path), "--open-enrollment", "--token-file", str(empty)]) == 2
    assert "empty" in capsys.readouterr().err
    readable = tmp_path / "readable-token"
    readable.write_text("s3cret\n")
    readable.chmod(0o644)
    assert main(["--key-file", str(path), "--open-enrollment", "--token-file", str(readable)]) == 2
    assert "chmod 600" in capsys.readouterr().err
    # A token (the default) over plain gRPC on a non-loopback address is refused at start.
    state = ["--state-dir", str(tmp_path / "state")]
    assert main(["--key-file", str(path), "--open-enrollment", "--host", "0.0.0.0", *state]) == 2
    assert "not loopback" in capsys.readouterr().err
    assert not (tmp_path / "state" / "token").exists()  # refused before generating one
    missing = ["--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k2.pem")]
    assert main(["--key-file", str(path), "--open-enrollment", *missing]) == 2
