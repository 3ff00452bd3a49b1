"""gRPC transport of the helper server S1: generic handlers over raw bytes, no generated code.

Service ``flwr_fsl.helper.v1.Helper`` with unary-unary methods ``Health``, ``PublicKey``,
``OpenRound``, ``AddClients``, ``AddClientHints``, ``FinishRound``, ``AbortRound``, ``SetModel``
and ``PsrAnswer`` plus ``OpenSession`` and ``CloseSession`` (every method registered on the
:class:`~flwr_fsl.helper.service.HelperService`,
:attr:`~flwr_fsl.helper.service.HelperService.methods`). Request and response bodies are
:mod:`flwr_fsl.helper.wire` messages passed through gRPC as opaque bytes (identity
(de)serializers), so no ``.proto`` compilation and no pickle are involved. Both ends set
``grpc.max_send_message_length`` and ``grpc.max_receive_message_length`` to
:data:`~flwr_fsl.helper.wire.MAX_MESSAGE_BYTES` (512 MiB) by default.

**Authentication** (on by default). ``start_server`` needs an access ``token`` unless called
with ``insecure=True``: every call but ``Health`` and ``PublicKey`` (health checks and key
pinning, which say nothing about sessions) must carry it as metadata ``x-flwr-fsl-token``
(constant-time compare; missing or wrong is ``UNAUTHENTICATED``). Each session's calls must
also carry the session's secret (metadata ``x-flwr-fsl-session-secret``, hex; checked by
:meth:`HelperService.handle <flwr_fsl.helper.service.HelperService.handle>`, wrong or missing is
answered as an id S1 does not hold, ``NOT_FOUND``, so the id alone does not tell a live session
from a dead one). A token on a non-loopback address without TLS (``tls=(key PEM,
certificate PEM)``; S0 passes the CA certificate to
:class:`~flwr_fsl.helper.connection.HelperClient`) is refused at start unless ``insecure``:
it, and the session secrets, would travel in clear.

Status codes: a refused call (:class:`~flwr_fsl.helper.errors.HelperRequestError`) is
``INVALID_ARGUMENT`` with the reason as details, except a call naming a session S1 does not hold
(:class:`~flwr_fsl.helper.errors.HelperSessionLostError`: S1 restarted, the session expired or was
closed, or the call lacks its secret), which is ``NOT_FOUND``, and a round refused for the run's
privacy budget
(:class:`~flwr_fsl.helper.errors.HelperBudgetExhaustedError`), which is
``FAILED_PRECONDITION``, and a call over a resource limit
(:class:`~flwr_fsl.helper.errors.HelperResourceError`, :mod:`flwr_fsl.helper.quota`), which
is ``RESOURCE_EXHAUSTED``; an unexpected exception in S1 is ``INTERNAL``
(logged with its traceback on S1). :class:`~flwr_fsl.helper.connection.HelperClient` maps them
back to the same exceptions the in-process twin raises.

**Threads.** The server has a thread for every call the sessions may run or queue at once
(:attr:`ServiceLimits.call_threads <flwr_fsl.helper.quota.ServiceLimits.call_threads>`, or
``max_workers``) plus :data:`~flwr_fsl.helper.quota.RESERVED_THREADS`; the service refuses
a session's call beyond its share at once instead of queueing it, so ``Health`` and
``PublicKey`` always find a free thread, however long other calls run. The caller's address
(its host) is passed on for the per-address session limit.

**Threat model.** As :mod:`flwr_fsl.helper.service`, which says what a caller with and without
the token or a session's secret can do. Client material is protected end to end by the sealed
channel whatever the transport; the S0–S1 link carries S1's share, public data, the token and
the session secrets: serve TLS unless S1 listens on loopback (the start refuses otherwise,
unless ``insecure``). With ``insecure=True`` and no token, anyone who reaches the port can open
sessions of their own (never call another's), up to the service's limits.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import grpc

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.helper import wire
from flwr_fsl.helper.connection import (
    SECRET_METADATA_KEY,
    TOKEN_METADATA_KEY,
    grpc_options,
    is_loopback,
)
from flwr_fsl.helper.errors import (
    HelperAuthError,
    HelperBudgetExhaustedError,
    HelperRequestError,
    HelperResourceError,
    HelperSessionLostError,
)
from flwr_fsl.helper.quota import RESERVED_THREADS
from flwr_fsl.helper.service import SERVICE_NAME, HelperService

__all__ = [
    "PUBLIC_METHODS",
    "SECRET_METADATA_KEY",
    "TOKEN_METADATA_KEY",
    "format_address",
    "is_loopback",
    "peer_host",
    "start_server",
]

PUBLIC_METHODS = frozenset({"Health", "PublicKey"})
"""Methods served without the access token (they reveal S1's version and public key only)."""

log = logging.getLogger("flwr_fsl.helper")


def format_address(host: str, port: int) -> str:
    """Return ``host:port`` (``[host]:port`` for an IPv6 literal)."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def _secret_of(context: grpc.ServicerContext) -> bytes | None:
    sent = dict(context.invocation_metadata()).get(SECRET_METADATA_KEY)
    if not isinstance(sent, str):
        return None
    try:
        return bytes.fromhex(sent)
    except ValueError:
        return None


def peer_host(peer: str) -> str:
    """Return the host of a gRPC peer string (``ipv4:1.2.3.4:5678`` -> ``ipv4:1.2.3.4``)."""
    if peer.startswith(("ipv4:", "ipv6:")):
        return peer.rsplit(":", 1)[0]
    return peer or "unknown"


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    context.abort(code, details)
    raise AssertionError("grpc context.abort returned")  # pragma: no cover


def _handler(
    service: HelperService, method: str, token: str | None
) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    expected = token.encode() if token is not None else None

    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        if expected is not None and method not in PUBLIC_METHODS:
            sent = dict(context.invocation_metadata()).get(TOKEN_METADATA_KEY, "")
            given = sent.encode() if isinstance(sent, str) else bytes(sent)
            if not hmac.compare_digest(given, expected):
                log.warning("%s refused: missing or wrong access token", method)
                _abort(context, grpc.StatusCode.UNAUTHENTICATED, "missing or wrong access token")
        try:
            return service.handle(method, request, _secret_of(context), peer_host(context.peer()))
        except HelperAuthError as err:
            _abort(context, grpc.StatusCode.PERMISSION_DENIED, str(err))
        except HelperSessionLostError as err:
            log.warning("%s refused: %s", method, err)
            _abort(context, grpc.StatusCode.NOT_FOUND, str(err))
        except HelperBudgetExhaustedError as err:
            log.warning("%s refused: %s", method, err)
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(err))
        except HelperResourceError as err:
            log.warning("%s refused: %s", method, err)
            _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        except HelperRequestError as err:
            log.warning("%s refused: %s", method, err)
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except Exception as err:
            log.exception("%s failed", method)
            _abort(
                context,
                grpc.StatusCode.INTERNAL,
                f"S1 internal error: {type(err).__name__}: {err}",
            )

    return handle


def _check_server_args(
    port: int,
    max_message_bytes: int,
    token: str | None,
    tls: tuple[bytes, bytes] | None,
    insecure: bool,
    host: str,
) -> None:
    """Check :func:`start_server`'s transport arguments.

    Raises
    ------
    ConfigurationError
        As :func:`start_server` says.
    """
    if not 0 <= port <= 65535:
        raise ConfigurationError(f"port must be in [0, 65535], got {port}")
    if not 0 < max_message_bytes <= wire.MAX_MESSAGE_BYTES:
        raise ConfigurationError(f"max_message_bytes must be in (0, {wire.MAX_MESSAGE_BYTES}]")
    if token is not None and (not isinstance(token, str) or not token or not token.isprintable()):
        raise ConfigurationError("token must be a non-empty printable string")
    if token is None and not insecure:
        raise ConfigurationError(
            "S1 needs an access token (or insecure=True / --insecure to serve every caller)"
        )
    if token is not None and tls is None and not insecure and not is_loopback(host):
        raise ConfigurationError(
            f"the access token would travel in clear to {host}: serve TLS (--tls-cert, "
            "--tls-key), bind a loopback address, or pass --insecure"
        )


def start_server(
    service: HelperService,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_workers: int | None = None,
    max_message_bytes: int = wire.MAX_MESSAGE_BYTES,
    tls: tuple[bytes, bytes] | None = None,
    token: str | None = None,
    insecure: bool = False,
) -> tuple[grpc.Server, int]:
    """Start serving ``service`` over gRPC.

    Parameters
    ----------
    service : HelperService
        S1's logic and state.
    host : str (default: "127.0.0.1")
        Interface to bind.
    port : int (default: 0)
        TCP port; 0 picks a free one (the bound port is returned).
    max_workers : int, optional
        Threads for session calls (running, or waiting for their session's lock); by default
        one for every call the sessions may make at once
        (:attr:`~flwr_fsl.helper.quota.ServiceLimits.call_threads`). The server has
        :data:`~flwr_fsl.helper.quota.RESERVED_THREADS` more, which session calls never
        hold, so ``Health`` never waits for them; a session call beyond ``max_workers`` at
        once is refused (``RESOURCE_EXHAUSTED``), never queued.
    max_message_bytes : int (default: 512 MiB)
        gRPC send/receive message limit.
    tls : tuple[bytes, bytes], optional
        ``(private key PEM, certificate chain PEM)``: serve TLS instead of plain gRPC.
    token : str, optional
        Shared access token: calls (but ``Health`` and ``PublicKey``) without metadata
        ``x-flwr-fsl-token`` equal to it are refused with ``UNAUTHENTICATED``. Required
        unless ``insecure``.
    insecure : bool (default: False)
        Allow serving without a token, and a token over plain gRPC on a non-loopback
        address.

    Returns
    -------
    tuple[grpc.Server, int]
        The started server (stop it with ``server.stop(grace)``) and the bound port.

    Raises
    ------
    ConfigurationError
        If an argument is out of range, no token is given without ``insecure``, or a token
        would travel in clear to a non-loopback address without ``insecure``.
    OSError
        If the address cannot be bound (port in use, bad host).
    """
    _check_server_args(port, max_message_bytes, token, tls, insecure, host)
    if max_workers is None:
        max_workers = service.quota.call_threads
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ConfigurationError(f"max_workers must be an integer >= 1, got {max_workers!r}")
    service.max_calls = max_workers
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            _handler(service, name, token), request_deserializer=None, response_serializer=None
        )
        for name in service.methods
    }
    server = grpc.server(
        ThreadPoolExecutor(
            max_workers=max_workers + RESERVED_THREADS, thread_name_prefix="flwr-fsl-helper"
        ),
        handlers=[grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)],
        options=[*grpc_options(max_message_bytes), ("grpc.so_reuseport", 0)],
    )
    address = format_address(host, port)
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, grpc.ssl_server_credentials([tls]))
    except RuntimeError as err:
        server.stop(None)
        raise OSError(f"cannot bind {address}: {err}") from None
    if bound == 0:
        server.stop(None)
        raise OSError(f"cannot bind {address}")
    server.start()
    return server, bound
