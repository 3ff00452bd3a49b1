"""How S0 reaches S1 from a Flower run config: address, pinned key, access token, TLS.

Run-config keys (names in :mod:`flwr_fsl.pinning`, which clients use to pin S1's key without
loading any of this package's gRPC code):

- ``ssa-helper-address``: ``host:port`` of a running ``flwr-fsl-helper``; empty means S1 runs
  inside the ServerApp (:class:`~flwr_fsl.helper.InProcessHelper`, simulation);
- ``ssa-helper-fingerprint``: S1's pinned key fingerprint (hex SHA-256, printed by
  ``flwr-fsl-helper``); required with an address;
- ``ssa-helper-key-file``: absolute path of S1's key file (simulation: the in-process S1 uses
  and creates it, simulated clients pin its public key);
- ``ssa-helper-token-file``: absolute path of a file holding S1's access token (a copy of the
  file ``flwr-fsl-helper`` prints: ``--token-file``, or the ``<state-dir>/token`` it generated);
  sent as gRPC metadata on every call. Required unless S1 runs with ``--insecure``;
- ``ssa-helper-ca-file``: absolute path of the PEM CA certificate that signed S1's TLS
  certificate (``flwr-fsl-helper --tls-cert/--tls-key``); set means TLS, unset plain gRPC.

:func:`connect_helper` validates all of them once, before round 1, and raises
:class:`~flwr_fsl.core.errors.ConfigurationError` naming the bad key; then it connects and checks
S1's key against the pin. Each connection is one session on S1 (a 16-byte id and a 32-byte
secret S1 draws; the secret stays in S0), so one long-running helper serves many runs, one after
another or at once. A token sent without TLS to a non-loopback address is logged as a warning
(:class:`~flwr_fsl.helper.connection.HelperClient`). :func:`secure_helper` is a
ServerApp's whole S1 wiring: connect (or take a given connection), verify, say so, and close what
it opened.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import SealedBoxError, SealingKeyPair
from flwr_fsl.helper.connection import (
    HelperClient,
    HelperConnection,
    InProcessHelper,
    verify_helper,
)
from flwr_fsl.pinning import (
    ADDRESS_KEY,
    CA_FILE_KEY,
    FINGERPRINT_KEY,
    TOKEN_FILE_KEY,
    default_key_file,
    key_file_of,
    pinned_fingerprint,
)

__all__ = [
    "HelperSettings",
    "connect_helper",
    "describe_helper",
    "helper_settings",
    "load_or_create_key",
    "note_in_process",
    "secure_helper",
]

SIMULATION_CAVEAT = (
    "S1 runs in-process: this demonstrates the protocol, not the separation of the two servers"
    " -- S1 shares S0's process and reads its key from a file S0 can read, so here S0 could see"
    " everything S1 sees, and S1 accepts any client signing key (open enrollment), so it cannot"
    " tell invented clients from real ones. For two real parties run flwr-fsl-helper elsewhere"
    " with --enrollment and set ssa-helper-address."
)

_MAX_SECRET_FILE_BYTES = 64 * 1024


def load_or_create_key(path: Path, *, generate: bool) -> tuple[SealingKeyPair, bool]:
    """Load S1's key pair, creating the file first when allowed.

    Parameters
    ----------
    path : Path
        Key file (PKCS#8 PEM, mode 0600).
    generate : bool
        Create a new key pair when the file does not exist.

    Returns
    -------
    tuple[SealingKeyPair, bool]
        The key pair and whether it was just created.

    Raises
    ------
    SealedBoxError
        If the file is missing (and ``generate`` is false), unreadable, too permissive or not
        an X25519 key.
    """
    if not path.exists():
        if not generate:
            raise SealedBoxError(
                f"key file {str(path)!r} does not exist (pass --generate-key to create it)"
            )
        keypair = SealingKeyPair.generate()
        keypair.save(path)
        return keypair, True
    return SealingKeyPair.load(path), False


@dataclass(frozen=True)
class HelperSettings:
    """S0's validated helper settings (see the module docstring for the run-config keys).

    Attributes
    ----------
    address : str
        ``host:port`` of a running helper, or ``""`` for the in-process S1.
    fingerprint : str
        Pinned fingerprint (``""`` in simulation without one: the key file's is used).
    key_file : Path or None
        S1's key file for the in-process helper.
    token : str or None
        The access token read from ``ssa-helper-token-file``.
    root_certificates : bytes or None
        The PEM CA certificate read from ``ssa-helper-ca-file`` (TLS when set).
    """

    address: str
    fingerprint: str
    key_file: Path | None
    token: str | None
    root_certificates: bytes | None


def _string(run_config: Mapping[str, Any], key: str) -> str:
    value = run_config.get(key, "")
    if not isinstance(value, str):
        raise ConfigurationError(f"{key} must be a string, got {type(value).__name__}")
    return value


def _secret_file(run_config: Mapping[str, Any], key: str) -> bytes | None:
    value = _string(run_config, key)
    if not value:
        return None
    path = Path(value)
    if not path.is_absolute():
        raise ConfigurationError(f"{key} must be an absolute path, got {value!r}")
    try:
        if path.stat().st_size > _MAX_SECRET_FILE_BYTES:
            raise ConfigurationError(f"{key}: {value!r} is larger than 64 KiB")
        return path.read_bytes()
    except OSError as err:
        raise ConfigurationError(f"{key}: cannot read {value!r}: {err.strerror}") from None


def helper_settings(run_config: Mapping[str, Any]) -> HelperSettings:
    """Validate the helper keys of a run config (once, before round 1).

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The run config.

    Returns
    -------
    HelperSettings
        The settings, with the token and CA certificate read from their files.

    Raises
    ------
    ConfigurationError
        Naming the key: a value of the wrong type, a relative or unreadable path, an empty or
        non-printable token, a CA file that is not PEM, an address without a pinned key, or a
        token or CA file without an address (the in-process S1 has neither).
    """
    address = _string(run_config, ADDRESS_KEY).strip()
    fingerprint = _string(run_config, FINGERPRINT_KEY).strip()
    key_file = key_file_of(run_config)
    raw_token = _secret_file(run_config, TOKEN_FILE_KEY)
    ca = _secret_file(run_config, CA_FILE_KEY)
    token = None
    if raw_token is not None:
        token = raw_token.decode("utf-8", errors="replace").strip()
        if not token or not token.isprintable():
            raise ConfigurationError(f"{TOKEN_FILE_KEY}: the token must be printable, non-empty")
    if ca is not None and b"-----BEGIN CERTIFICATE-----" not in ca:
        raise ConfigurationError(f"{CA_FILE_KEY}: not a PEM certificate")
    if address:
        if ":" not in address:
            raise ConfigurationError(f"{ADDRESS_KEY} must be 'host:port', got {address!r}")
        fingerprint = pinned_fingerprint(run_config)
    elif token is not None or ca is not None:
        key = TOKEN_FILE_KEY if token is not None else CA_FILE_KEY
        raise ConfigurationError(f"{key} is set but {ADDRESS_KEY} is not (in-process S1)")
    return HelperSettings(address, fingerprint, key_file, token, ca)


def describe_helper(run_config: Mapping[str, Any]) -> str:
    """Return one line saying where S1 runs, with the simulation caveat when it is in-process.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The run config (``ssa-helper-address`` decides).

    Returns
    -------
    str
        ``"S1: flwr-fsl-helper at host:port"`` or the in-process line and its caveat.
    """
    address = _string(run_config, ADDRESS_KEY).strip()
    if address:
        return f"S1: flwr-fsl-helper at {address}"
    return f"S1: in-process helper. {SIMULATION_CAVEAT}"


def connect_helper(run_config: Mapping[str, Any]) -> tuple[HelperConnection, str]:
    """S0: connect to S1 as the run config says and verify its key against the pin.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The run config (keys in the module docstring).

    Returns
    -------
    tuple[HelperConnection, str]
        The connection — a new session on S1; close it when the run ends — and S1's verified
        fingerprint.

    Raises
    ------
    ConfigurationError
        If a helper key is invalid (:func:`helper_settings`).
    HelperError
        If S1 is unreachable, refuses the call (e.g. it requires an access token and
        ``ssa-helper-token-file`` is unset or wrong) or its key does not match the pin.
    """
    settings = helper_settings(run_config)
    connection: HelperConnection
    fingerprint = settings.fingerprint
    if settings.address:
        connection = HelperClient(
            settings.address, token=settings.token, root_certificates=settings.root_certificates
        )
    else:
        key_file = settings.key_file or default_key_file()
        key_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        keypair, _ = load_or_create_key(key_file, generate=True)
        fingerprint = fingerprint or keypair.fingerprint
        connection = InProcessHelper(keypair=keypair)
    try:
        verify_helper(connection, fingerprint)
        if isinstance(connection, HelperClient | InProcessHelper):
            connection.open_session()  # the session spans the run, not just its rounds
    except Exception:
        connection.close()
        raise
    return connection, fingerprint


@contextmanager
def secure_helper(
    run_config: Mapping[str, Any], helper: HelperConnection | None = None
) -> Iterator[tuple[HelperConnection, str]]:
    """S0's S1 for one run: connect or take ``helper``, verify the pin, close what it opened.

    Without ``helper`` it connects as the run config says (:func:`connect_helper`) and prints
    where S1 runs (:func:`describe_helper`); with one it checks that connection's key against
    the run config's pin (:func:`~flwr_fsl.pinning.pinned_fingerprint`). Either way it then
    prints ``S1: public key fingerprint <fp> (pinned, verified)`` and yields. On leaving (also
    when the body raises) it closes the connection it opened, never the one it was given.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The run config (keys in the module docstring).
    helper : HelperConnection, optional
        S1 to use instead of the one the run config names; not closed here.

    Yields
    ------
    tuple[HelperConnection, str]
        The connection and S1's verified fingerprint (for the secure strategies'
        ``helper`` / ``helper_fingerprint``).

    Raises
    ------
    ConfigurationError
        If a helper key is invalid, naming it (before anything is yielded).
    HelperError
        If S1 is unreachable or its key does not match the pin (before anything is yielded).
    """
    if helper is None:
        connection, fingerprint = connect_helper(run_config)
    else:
        connection, fingerprint = helper, pinned_fingerprint(run_config)
        verify_helper(connection, fingerprint)
    try:
        if helper is None:
            print(describe_helper(run_config), flush=True)
            if isinstance(connection, InProcessHelper):
                _CAVEAT_SHOWN.add(SIMULATION_CAVEAT)  # said: the strategy need not repeat it
        print(f"S1: public key fingerprint {fingerprint} (pinned, verified)", flush=True)
        yield connection, fingerprint
    finally:
        if helper is None:
            connection.close()


_CAVEAT_SHOWN: set[str] = set()


def note_in_process(helper: object) -> bool:
    """Log the in-process caveat once per process when ``helper`` is an in-process S1.

    An app that builds ``SecureFedSubAvg(helper=InProcessHelper(), ...)`` itself (rather
    than through :func:`secure_helper`, which prints it) is told once that S1 here is no
    separate party (:data:`SIMULATION_CAVEAT`). The SSA strategies call it.

    Parameters
    ----------
    helper : object
        The strategy's S1 connection.

    Returns
    -------
    bool
        Whether the caveat was logged now.
    """
    if not isinstance(helper, InProcessHelper) or SIMULATION_CAVEAT in _CAVEAT_SHOWN:
        return False
    _CAVEAT_SHOWN.add(SIMULATION_CAVEAT)
    logging.getLogger(__name__).warning("%s", SIMULATION_CAVEAT)
    return True
