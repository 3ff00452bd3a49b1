"""gRPC transport of the helper server S1: generic handlers over raw bytes, no generated code.

Service ``flwr_fsl.helper.v1.Helper`` with unary-unary methods ``Health``, ``PublicKey``,
``OpenRound``, ``AddClients``, ``AddClientHints``, ``FinishRound``, ``AbortRound``, ``SetModel``
and ``PsrAnswer`` (:data:`~flwr_fsl.helper.service.METHODS`). Request and response bodies are
:mod:`flwr_fsl.helper.wire` messages passed through gRPC as opaque bytes (identity
(de)serializers), so no ``.proto`` compilation and no pickle are involved. Both ends set
``grpc.max_send_message_length`` and ``grpc.max_receive_message_length`` to
:data:`~flwr_fsl.helper.wire.MAX_MESSAGE_BYTES` (512 MiB) by default.

Status codes: a refused call (:class:`~flwr_fsl.helper.errors.HelperRequestError`) is
``INVALID_ARGUMENT`` with the reason as details; an unexpected exception in S1 is ``INTERNAL``
(logged with its traceback on S1). :class:`~flwr_fsl.helper.connection.HelperClient` maps them
back to the same exceptions the in-process twin raises.

**Threat model.** As :mod:`flwr_fsl.helper.service`. The port is plain (insecure) gRPC and
unauthenticated: bind it to loopback or a private network that only S0 can reach.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import grpc

from flwr_fsl.helper import wire
from flwr_fsl.helper.connection import grpc_options
from flwr_fsl.helper.errors import HelperRequestError
from flwr_fsl.helper.service import METHODS, SERVICE_NAME, HelperService

__all__ = ["format_address", "start_server"]

log = logging.getLogger("flwr_fsl.helper")


def format_address(host: str, port: int) -> str:
    """Return ``host:port`` (``[host]:port`` for an IPv6 literal)."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    context.abort(code, details)
    raise AssertionError("grpc context.abort returned")  # pragma: no cover


def _handler(service: HelperService, method: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            return service.handle(method, request)
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


def start_server(
    service: HelperService,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_workers: int = 4,
    max_message_bytes: int = wire.MAX_MESSAGE_BYTES,
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
    max_workers : int (default: 4)
        gRPC worker threads (calls are serialized by the service's lock anyway).
    max_message_bytes : int (default: 512 MiB)
        gRPC send/receive message limit.

    Returns
    -------
    tuple[grpc.Server, int]
        The started server (stop it with ``server.stop(grace)``) and the bound port.

    Raises
    ------
    ValueError
        If an argument is out of range.
    OSError
        If the address cannot be bound (port in use, bad host).
    """
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be in [0, 65535], got {port}")
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    if not 0 < max_message_bytes <= wire.MAX_MESSAGE_BYTES:
        raise ValueError(f"max_message_bytes must be in (0, {wire.MAX_MESSAGE_BYTES}]")
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            _handler(service, name), request_deserializer=None, response_serializer=None
        )
        for name in METHODS
    }
    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="flwr-fsl-helper"),
        handlers=[grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)],
        options=[*grpc_options(max_message_bytes), ("grpc.so_reuseport", 0)],
    )
    address = format_address(host, port)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as err:
        server.stop(None)
        raise OSError(f"cannot bind {address}: {err}") from None
    if bound == 0:
        server.stop(None)
        raise OSError(f"cannot bind {address}")
    server.start()
    return server, bound
