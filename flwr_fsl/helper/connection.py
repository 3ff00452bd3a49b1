"""S0's side of the helper server S1: one interface, two transports (gRPC and in-process).

:class:`HelperConnection` is what a strategy codes against. :class:`HelperClient` reaches a
running ``flwr-fsl-helper`` process over gRPC; :class:`InProcessHelper` wraps a
:class:`~flwr_fsl.helper.service.HelperService` in the same process (simulation, tests). Both
encode every request with :mod:`flwr_fsl.helper.wire`, hand the *bytes* to
:meth:`HelperService.handle <flwr_fsl.helper.service.HelperService.handle>` (directly, or
through gRPC) and decode the response bytes, so simulation exercises the deployment path
(the shared request layer, :class:`~flwr_fsl.helper.facade.HelperFacade`, is in
:mod:`flwr_fsl.helper.facade`; :class:`HelperConnection`, :class:`HelperHealth` and
:class:`HelperShare` are importable from here as before).

Errors (all :class:`~flwr_fsl.helper.errors.HelperError`):
:class:`~flwr_fsl.helper.errors.HelperUnavailableError` when S1 cannot be reached (connection
refused, deadline, closed connection) — fail the round and keep the global model;
:class:`~flwr_fsl.helper.errors.HelperRequestError` when S1 refused the call (same message
from both transports), :class:`~flwr_fsl.helper.errors.HelperSessionLostError` when it refused
it because it does not hold the connection's session (S1 restarted, or the session expired),
:class:`~flwr_fsl.helper.errors.HelperBudgetExhaustedError` when it refused a round past the
run's privacy budget;
plain :class:`~flwr_fsl.helper.errors.HelperError` for an S1 internal error, a malformed
response or a pinned-key mismatch (:func:`verify_helper`).

**Sessions.** ``OpenSession`` returns the session id S1 drew and the session's secret; the
connection keeps both and sends the secret with every later call (gRPC metadata
``x-flwr-fsl-session-secret``; the in-process twin passes it to
:meth:`HelperService.handle <flwr_fsl.helper.service.HelperService.handle>`, the same check).
:attr:`~flwr_fsl.helper.facade.HelperFacade.session_id` is what S0 sends clients; the secret
never leaves S0.

**Restarts of S1.** A connection opens its session before its first round (or when
:func:`~flwr_fsl.helper.setup.connect_helper` creates it) and never re-creates it silently: after
S1 restarts, its calls raise :class:`~flwr_fsl.helper.errors.HelperSessionLostError` until S0
calls :meth:`~flwr_fsl.helper.facade.HelperFacade.open_session` again — a new session, with a
new id (what :meth:`LeadServer.open <flwr_fsl.families.ssa.two_server.LeadServer.open>` does,
after forgetting its stored U-DPF keys). :class:`HelperClient` replaces its gRPC channel after a
call finds S1 unreachable, so the first call after S1 is back connects at once instead of
waiting out gRPC's reconnect backoff (up to two minutes).

**Threat model.** As :mod:`flwr_fsl.helper.service`: S0 relays clients' sealed material it
cannot read or alter; what S0 receives from S1 is S1's additive share (random on its own) and
answers sealed to clients. S0 authenticates S1 by its pinned public-key fingerprint; S1
authenticates S0 by the access token and each session by its secret.
:class:`HelperClient` logs a warning when it would send the token or session secrets in clear
(no TLS) to a non-loopback address.
"""

from __future__ import annotations

import ipaddress
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path

import grpc

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import SealedBoxError, SealingKeyPair, verify_fingerprint
from flwr_fsl.crypto.identity import Enrollment
from flwr_fsl.helper import wire
from flwr_fsl.helper.errors import (
    HelperAuthError,
    HelperBudgetExhaustedError,
    HelperError,
    HelperRequestError,
    HelperResourceError,
    HelperSessionLostError,
    HelperUnavailableError,
)
from flwr_fsl.helper.facade import HelperConnection, HelperFacade, HelperHealth, HelperShare
from flwr_fsl.helper.service import SERVICE_NAME, HelperLimits, HelperService
from flwr_fsl.pinning import TOKEN_FILE_KEY

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "SECRET_METADATA_KEY",
    "TOKEN_METADATA_KEY",
    "HelperClient",
    "HelperConnection",
    "HelperHealth",
    "HelperShare",
    "InProcessHelper",
    "is_loopback",
    "verify_helper",
]

DEFAULT_TIMEOUT_S = 300.0
"""Default per-call deadline of :class:`HelperClient` (seconds)."""
TOKEN_METADATA_KEY = "x-flwr-fsl-token"
"""gRPC metadata key carrying the shared access token."""
SECRET_METADATA_KEY = "x-flwr-fsl-session-secret"
"""gRPC metadata key carrying the session's secret (hex)."""

log = logging.getLogger("flwr_fsl.helper")

# ------------------------------------------------------------------------------------------------
# Transports
# ------------------------------------------------------------------------------------------------


_REFUSALS: dict[grpc.StatusCode, type[HelperRequestError]] = {
    grpc.StatusCode.PERMISSION_DENIED: HelperAuthError,
    grpc.StatusCode.NOT_FOUND: HelperSessionLostError,
    grpc.StatusCode.FAILED_PRECONDITION: HelperBudgetExhaustedError,
    grpc.StatusCode.INVALID_ARGUMENT: HelperRequestError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: HelperResourceError,
}
"""gRPC status of a refused call -> the error S0 raises (the in-process twin raises the same)."""


class InProcessHelper(HelperFacade):
    """S1 in this process, reached through exactly the bytes the gRPC server would get.

    Parameters
    ----------
    service : HelperService, optional
        The service to call; a new one with ``keypair`` (or a fresh key) by default.
    keypair : SealingKeyPair, optional
        Key pair of a new service (ignored when ``service`` is given).
    session_ids : callable, optional
        How a new service draws session ids (``HelperService(session_ids=...)``; random by
        default; ignored when ``service`` is given). Tests pass a deterministic one.
    limits : HelperLimits, optional
        What one round may cost a new service (:mod:`flwr_fsl.helper.limits`; the defaults by
        default; ignored when ``service`` is given).
    state_dir : Path, optional
        Where a new service keeps its per-run privacy accounts
        (:mod:`flwr_fsl.helper.accounts`); a temporary directory of this object by default
        (ignored when ``service`` is given). Give the same path to a new twin to resume the
        accounts, as a restarted ``flwr-fsl-helper --state-dir`` does.

    A new service has **open enrollment** (any client signing key is accepted,
    :mod:`flwr_fsl.crypto.identity`): S1 inside S0's process is no separate party anyway.

    Attributes
    ----------
    service : HelperService
        The wrapped service (tests may inspect it).
    """

    def __init__(
        self,
        service: HelperService | None = None,
        *,
        keypair: SealingKeyPair | None = None,
        session_ids: Callable[[], bytes] | None = None,
        limits: HelperLimits | None = None,
        state_dir: Path | None = None,
    ) -> None:
        if service is None:
            if state_dir is None:
                self._state = tempfile.TemporaryDirectory(prefix="flwr-fsl-s1-")
                state_dir = Path(self._state.name)
            service = HelperService(
                keypair or SealingKeyPair.generate(),
                limits=limits,
                state_dir=state_dir,
                session_ids=session_ids,
                enrollment=Enrollment.open(),  # S1 in S0's process: no separation anyway
            )
        self.service = service
        self._closed = False

    def _transport(self, method: str, body: bytes) -> bytes:
        if self._closed:
            raise HelperUnavailableError("the in-process helper is closed")
        try:
            return self.service.handle(method, bytes(body), self._secret or None)
        except HelperAuthError as err:
            raise HelperAuthError(str(err)) from None
        except HelperSessionLostError as err:
            raise HelperSessionLostError(str(err)) from None
        except HelperBudgetExhaustedError as err:
            raise HelperBudgetExhaustedError(str(err)) from None
        except HelperResourceError as err:
            raise HelperResourceError(str(err)) from None
        except HelperRequestError as err:
            raise HelperRequestError(str(err)) from None
        except Exception as err:  # same surface as the gRPC transport's INTERNAL status
            raise HelperError(
                f"S1 call {method} failed (INTERNAL): S1 internal error: "
                f"{type(err).__name__}: {err}"
            ) from err

    def close(self) -> None:
        """End the session and close: later calls raise :class:`HelperUnavailableError`."""
        if not self._closed:
            self._close_session_quietly()
        self._closed = True


def is_loopback(host: str) -> bool:
    """Return whether ``host`` is a loopback address (``localhost``, ``127.0.0.0/8``, ``::1``).

    Any other name, a wildcard (``0.0.0.0``, ``::``) or a private address is not loopback.
    """
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_of(address: str) -> str:
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


def grpc_options(max_message_bytes: int = wire.MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Return the gRPC channel/server options both ends use (message size limits).

    Parameters
    ----------
    max_message_bytes : int
        Send and receive limit (default :data:`flwr_fsl.helper.wire.MAX_MESSAGE_BYTES`,
        512 MiB).

    Returns
    -------
    list[tuple[str, int]]
        ``grpc.max_send_message_length`` and ``grpc.max_receive_message_length``.
    """
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


class HelperClient(HelperFacade):
    """S1 over gRPC: plain by default, TLS when given the CA certificate.

    The channel connects lazily; a call to an unreachable S1 fails fast with
    :class:`HelperUnavailableError` (no waiting for the server to come up).

    Parameters
    ----------
    address : str
        ``host:port`` of the ``flwr-fsl-helper`` process.
    timeout : float (default: 300.0)
        Deadline of each call in seconds.
    root_certificates : bytes, optional
        PEM CA certificate(s) to verify S1's TLS certificate with; enables TLS.
    token : str, optional
        Access token S1 was started with (``--token-file``, or the one it generated).

    Without ``root_certificates`` to a non-loopback address, a warning is logged: the token
    and the session secrets travel in clear.

    Raises
    ------
    ConfigurationError
        If ``address`` is empty, ``timeout`` is not positive or ``token`` is empty.
    """

    def __init__(
        self,
        address: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        root_certificates: bytes | None = None,
        token: str | None = None,
    ) -> None:
        if not isinstance(address, str) or not address:
            raise ConfigurationError("address must be a non-empty 'host:port' string")
        if not timeout > 0:
            raise ConfigurationError(f"timeout must be > 0, got {timeout}")
        if token is not None and (not isinstance(token, str) or not token):
            raise ConfigurationError("token must be a non-empty string")
        self.address = address
        self.timeout = float(timeout)
        self._token = token
        self._root_certificates = root_certificates
        if root_certificates is None and not is_loopback(_host_of(address)):
            log.warning(
                "S1 at %s is not on loopback and reached over plain gRPC (no TLS): %s travel "
                "in clear; set ssa-helper-ca-file (flwr-fsl-helper --tls-cert/--tls-key)",
                address,
                "the access token and session secrets" if token is not None else "session secrets",
            )
        self._channel: grpc.Channel | None = self._new_channel()

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        out: tuple[tuple[str, str], ...] = ()
        if self._token is not None:
            out += ((TOKEN_METADATA_KEY, self._token),)
        if self._secret:
            out += ((SECRET_METADATA_KEY, self._secret.hex()),)
        return out

    def _new_channel(self) -> grpc.Channel:
        if self._root_certificates is None:
            return grpc.insecure_channel(self.address, options=grpc_options())
        credentials = grpc.ssl_channel_credentials(root_certificates=self._root_certificates)
        return grpc.secure_channel(self.address, credentials, options=grpc_options())

    def _transport(self, method: str, body: bytes) -> bytes:
        if self._channel is None:
            raise HelperUnavailableError(f"connection to S1 at {self.address} is closed")
        channel: grpc.Channel = self._channel
        call = channel.unary_unary(f"/{SERVICE_NAME}/{method}")
        try:
            response = call(body, timeout=self.timeout, metadata=self._metadata() or None)
        except grpc.RpcError as err:
            code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
            details = err.details() if isinstance(err, grpc.Call) else str(err)
            if code == grpc.StatusCode.UNAVAILABLE and self._channel is channel:
                # A fresh channel for the next call: the old one would refuse calls for its
                # reconnect backoff (up to minutes) after S1 is back, e.g. after a restart.
                self._channel = self._new_channel()
                channel.close()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise HelperUnavailableError(
                    f"S1 at {self.address} unreachable ({code.name}): {details}"
                ) from None
            refused = _REFUSALS.get(code)
            if refused is not None:
                raise refused(details or code.name) from None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                hint = "a wrong" if self._token is not None else "no"
                raise HelperAuthError(
                    f"S1 at {self.address} refused the call: it requires an access token and "
                    f"got {hint} token; set {TOKEN_FILE_KEY} in the run config to the file "
                    f"holding the token S1 was started with ({details})"
                ) from None
            raise HelperError(f"S1 call {method} failed ({code.name}): {details}") from None
        except ValueError as err:  # grpc raises this on a closed channel
            raise HelperUnavailableError(f"connection to S1 at {self.address}: {err}") from None
        if not isinstance(response, bytes):
            raise HelperError(f"S1 call {method} returned {type(response).__name__}")
        return response

    def close(self) -> None:
        """End the session on S1 (best effort) and close the channel (idempotent)."""
        if self._channel is not None:
            self._close_session_quietly()
            self._channel.close()
            self._channel = None


def verify_helper(connection: HelperConnection, pinned_fingerprint: str) -> bytes:
    """Fetch S1's public key and check it against the fingerprint pinned in the run config.

    Parameters
    ----------
    connection : HelperConnection
        The connection to S1.
    pinned_fingerprint : str
        Hex SHA-256 of S1's public key (``flwr-fsl-helper`` prints it on start).

    Returns
    -------
    bytes
        S1's verified public key, to pass to clients for sealing.

    Raises
    ------
    HelperError
        If the key does not match (or the fingerprint is malformed).
    HelperUnavailableError
        If S1 cannot be reached.
    """
    key = connection.public_key()
    try:
        return verify_fingerprint(key, pinned_fingerprint)
    except SealedBoxError as err:
        raise HelperError(f"S1 is not the pinned helper: {err}") from None
