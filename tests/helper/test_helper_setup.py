"""How S0 connects to S1 and how clients pin S1's key from the run config."""

from pathlib import Path

import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.helper import (
    HelperError,
    HelperUnavailableError,
    InProcessHelper,
    connect_helper,
    default_key_file,
    pinned_fingerprint,
    secure_helper,
)


@pytest.fixture(autouse=True)
def _flwr_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))


def test_pin_sources_in_order(tmp_path: Path) -> None:
    key = SealingKeyPair.generate()
    path = key.save(tmp_path / "s1.pem")
    assert pinned_fingerprint({"ssa-helper-fingerprint": "ab" * 32}) == "ab" * 32
    assert pinned_fingerprint({"ssa-helper-key-file": str(path)}) == key.fingerprint
    with pytest.raises(ConfigurationError, match="no pinned helper key"):
        pinned_fingerprint({})  # no default file yet
    with pytest.raises(ConfigurationError, match="absolute"):
        pinned_fingerprint({"ssa-helper-key-file": "s1.pem"})


def test_simulation_default_key_is_shared_by_s0_and_clients() -> None:
    connection, fingerprint = connect_helper({})
    try:
        assert isinstance(connection, InProcessHelper)
        assert default_key_file().is_file()
        assert pinned_fingerprint({}) == fingerprint  # what a client on this machine pins
        again, same = connect_helper({})  # the key is reused, not replaced
        again.close()
        assert same == fingerprint
    finally:
        connection.close()


def test_address_needs_a_pin_and_a_wrong_pin_fails() -> None:
    with pytest.raises(ConfigurationError, match="no pinned helper key"):
        connect_helper({"ssa-helper-address": "127.0.0.1:1"})
    with pytest.raises(HelperError):
        connect_helper({"ssa-helper-fingerprint": "00" * 32})


def test_a_default_file_is_not_used_once_something_is_configured(tmp_path: Path) -> None:
    connect_helper({})[0].close()
    with pytest.raises(ConfigurationError, match="no pinned helper key"):
        pinned_fingerprint({"ssa-helper-address": "10.0.0.1:9500"})


def test_describe_helper_is_honest_about_simulation() -> None:
    # Issue 8 item 5: an in-process S1 demonstrates the protocol, not the separation.
    from flwr_fsl.helper import describe_helper

    line = describe_helper({})
    assert "in-process" in line and "not the separation" in line and "ssa-helper-address" in line
    assert describe_helper({"ssa-helper-address": "10.0.0.2:9500"}) == (
        "S1: flwr-fsl-helper at 10.0.0.2:9500"
    )


def test_secure_helper_closes_what_it_opened_even_when_the_body_raises(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(RuntimeError, match="the run failed"):
        with secure_helper({}) as (connection, fingerprint):
            assert isinstance(connection, InProcessHelper)
            assert fingerprint == pinned_fingerprint({})
            connection.public_key()  # open inside the body
            raise RuntimeError("the run failed")
    with pytest.raises(HelperUnavailableError):
        connection.public_key()  # closed on the way out
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("S1: in-process helper.")
    assert out[1] == f"S1: public key fingerprint {fingerprint} (pinned, verified)"


def test_secure_helper_leaves_a_given_connection_open(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = SealingKeyPair.generate()
    path = key.save(tmp_path / "s1.pem")
    given = InProcessHelper(keypair=key)
    try:
        with secure_helper({"ssa-helper-key-file": str(path)}, given) as (connection, fp):
            assert connection is given and fp == key.fingerprint
        assert given.public_key() == key.public_bytes  # still open
        out = capsys.readouterr().out.splitlines()
        assert out == [f"S1: public key fingerprint {fp} (pinned, verified)"]  # no description
    finally:
        given.close()


def test_secure_helper_refuses_a_pin_mismatch_before_yielding(
    capsys: pytest.CaptureFixture[str],
) -> None:
    given = InProcessHelper()
    try:
        with pytest.raises(HelperError):
            with secure_helper({"ssa-helper-fingerprint": "00" * 32}, given):
                pytest.fail("the body ran with an unverified S1")
        given.public_key()  # a given connection stays open even then
        with pytest.raises(HelperError):
            with secure_helper({"ssa-helper-fingerprint": "00" * 32}):
                pytest.fail("the body ran with an unverified S1")
        assert "pinned, verified" not in capsys.readouterr().out
    finally:
        given.close()


@pytest.mark.parametrize(
    ("run_config", "key"),
    [
        ({"ssa-helper-address": "no-port"}, "ssa-helper-address"),
        ({"ssa-helper-address": 9500}, "ssa-helper-address"),
        ({"ssa-helper-token-file": "token.txt"}, "ssa-helper-token-file"),
        ({"ssa-helper-address": "127.0.0.1:1"}, "ssa-helper-fingerprint"),
    ],
)
def test_secure_helper_names_the_bad_key(run_config: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigurationError, match=key):
        with secure_helper(run_config):
            pytest.fail("the body ran with a bad run config")
