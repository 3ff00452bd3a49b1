"""How S0 reaches S1 and how everyone pins S1's key, from a Flower run config.

Run-config keys (read by :func:`connect_helper` on S0 and by the client mods):

- ``ssa-helper-address``: ``host:port`` of a running ``flwr-fsl-helper``; empty means S1 runs
  inside the ServerApp (:class:`~flwr_fsl.helper.InProcessHelper`, simulation);
- ``ssa-helper-fingerprint``: S1's pinned key fingerprint (hex SHA-256, printed by
  ``flwr-fsl-helper``); what clients must get in a deployment;
- ``ssa-helper-key-file``: absolute path of S1's key file; the in-process S1 uses (and creates)
  it and simulated clients on the same machine pin its public key.

With none of them set, simulation falls back to :func:`default_key_file`
(``$FLWR_HOME/fsl/helper-s1.pem``): S0 creates it, clients on the same machine pin it. On a
deployed SuperNode that file does not exist, so a client without a pin refuses to seal
anything (it never trusts the key S0 forwards on its own).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr_fsl.crypto.channel import SealedBoxError, SealingKeyPair, public_key_fingerprint
from flwr_fsl.helper.connection import (
    HelperClient,
    HelperConnection,
    InProcessHelper,
    verify_helper,
)

ADDRESS_KEY = "ssa-helper-address"
FINGERPRINT_KEY = "ssa-helper-fingerprint"
KEY_FILE_KEY = "ssa-helper-key-file"


def default_key_file() -> Path:
    """Return the simulation's default S1 key file, ``$FLWR_HOME/fsl/helper-s1.pem``.

    ``FLWR_HOME`` defaults to ``~/.flwr``, as in Flower.
    """
    home = Path(os.environ.get("FLWR_HOME", "~/.flwr")).expanduser()
    return (home / "fsl" / "helper-s1.pem").resolve()


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


def _key_file(run_config: Mapping[str, Any]) -> Path | None:
    value = run_config.get(KEY_FILE_KEY)
    if isinstance(value, str) and value:
        path = Path(value)
        if not path.is_absolute():
            raise ValueError(
                f"{KEY_FILE_KEY} must be an absolute path (clients may run in another "
                f"directory), got {value!r}"
            )
        return path
    return None


def _nothing_pinned(run_config: Mapping[str, Any]) -> bool:
    return not any(run_config.get(k) for k in (ADDRESS_KEY, FINGERPRINT_KEY, KEY_FILE_KEY))


def pinned_fingerprint(run_config: Mapping[str, Any]) -> str:
    """Return the fingerprint a client pins S1's key to.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The node's run config.

    Returns
    -------
    str
        ``ssa-helper-fingerprint``, else the public key of ``ssa-helper-key-file``, else (with
        nothing configured) the public key of :func:`default_key_file` if it exists.

    Raises
    ------
    ValueError
        If nothing pins S1's key.
    """
    pinned = run_config.get(FINGERPRINT_KEY)
    if isinstance(pinned, str) and pinned:
        return pinned
    key_file = _key_file(run_config)
    if key_file is None and _nothing_pinned(run_config) and default_key_file().exists():
        key_file = default_key_file()
    if key_file is not None:
        return public_key_fingerprint(SealingKeyPair.load(key_file).public_bytes)
    raise ValueError(
        f"no pinned helper key: set {FINGERPRINT_KEY} (or {KEY_FILE_KEY}) in the run config"
    )


def connect_helper(run_config: Mapping[str, Any]) -> tuple[HelperConnection, str]:
    """S0: connect to S1 as the run config says and verify its key against the pin.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        The run config (keys in the module docstring).

    Returns
    -------
    tuple[HelperConnection, str]
        The connection (close it when done) and S1's verified fingerprint.

    Raises
    ------
    ValueError
        If an address is set without a pinned key, or a key file path is relative.
    HelperError
        If S1 is unreachable or its key does not match the pinned fingerprint.
    """
    address = run_config.get(ADDRESS_KEY)
    key_file = _key_file(run_config)
    connection: HelperConnection
    if isinstance(address, str) and address:
        fingerprint = pinned_fingerprint(run_config)
        connection = HelperClient(address)
    else:
        if key_file is None:
            key_file = default_key_file()
        key_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        keypair, _ = load_or_create_key(key_file, generate=True)
        fingerprint = str(run_config.get(FINGERPRINT_KEY) or keypair.fingerprint)
        connection = InProcessHelper(keypair=keypair)
    try:
        verify_helper(connection, fingerprint)
    except Exception:
        connection.close()
        raise
    return connection, fingerprint
