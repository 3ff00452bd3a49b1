"""Which S1 key a party trusts, from a Flower run config (client side, Flower- and gRPC-free).

Run-config keys (the helper's; :mod:`flwr_fsl.helper.setup` reads the S0-only ones):

- ``ssa-helper-fingerprint``: S1's pinned key fingerprint (hex SHA-256, printed by
  ``flwr-fsl-helper``); what clients must get in a deployment;
- ``ssa-helper-key-file``: absolute path of S1's key file; the in-process S1 uses (and creates)
  it and simulated clients on the same machine pin its public key;
- ``ssa-helper-address``, ``ssa-helper-token-file``, ``ssa-helper-ca-file``: S0's connection
  to a running ``flwr-fsl-helper`` (address, access token, TLS CA certificate).

With none of address, fingerprint and key file set, simulation falls back to
:func:`default_key_file` (``$FLWR_HOME/fsl/helper-s1.pem``): S0 creates it, clients on the same
machine pin it. On a deployed SuperNode that file does not exist, so a client without a pin
refuses to seal anything (it never trusts the key S0 forwards on its own).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import SealingKeyPair, public_key_fingerprint

__all__ = [
    "ADDRESS_KEY",
    "CA_FILE_KEY",
    "FINGERPRINT_KEY",
    "KEY_FILE_KEY",
    "TOKEN_FILE_KEY",
    "default_key_file",
    "key_file_of",
    "pinned_fingerprint",
]

ADDRESS_KEY = "ssa-helper-address"
FINGERPRINT_KEY = "ssa-helper-fingerprint"
KEY_FILE_KEY = "ssa-helper-key-file"
TOKEN_FILE_KEY = "ssa-helper-token-file"
CA_FILE_KEY = "ssa-helper-ca-file"


def default_key_file() -> Path:
    """Return the simulation's default S1 key file, ``$FLWR_HOME/fsl/helper-s1.pem``.

    ``FLWR_HOME`` defaults to ``~/.flwr``, as in Flower.
    """
    home = Path(os.environ.get("FLWR_HOME", "~/.flwr")).expanduser()
    return (home / "fsl" / "helper-s1.pem").resolve()


def key_file_of(run_config: Mapping[str, Any]) -> Path | None:
    """Return ``ssa-helper-key-file`` as a path, or None when unset.

    Raises
    ------
    ConfigurationError
        If the path is not absolute.
    """
    value = run_config.get(KEY_FILE_KEY)
    if isinstance(value, str) and value:
        path = Path(value)
        if not path.is_absolute():
            raise ConfigurationError(
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
    ConfigurationError
        If nothing pins S1's key.
    """
    pinned = run_config.get(FINGERPRINT_KEY)
    if isinstance(pinned, str) and pinned:
        return pinned
    key_file = key_file_of(run_config)
    if key_file is None and _nothing_pinned(run_config) and default_key_file().exists():
        key_file = default_key_file()
    if key_file is not None:
        return public_key_fingerprint(SealingKeyPair.load(key_file).public_bytes)
    raise ConfigurationError(
        f"no pinned helper key: set {FINGERPRINT_KEY} (or {KEY_FILE_KEY}) in the run config"
    )
