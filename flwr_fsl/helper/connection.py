"""S0's side of the helper server S1: one interface, two transports (gRPC and in-process).

:class:`HelperConnection` is what a strategy codes against. :class:`HelperClient` reaches a
running ``flwr-fsl-helper`` process over gRPC; :class:`InProcessHelper` wraps a
:class:`~flwr_fsl.helper.service.HelperService` in the same process (simulation, tests). Both
encode every request with :mod:`flwr_fsl.helper.wire`, hand the *bytes* to
:meth:`HelperService.handle <flwr_fsl.helper.service.HelperService.handle>` (directly, or
through gRPC) and decode the response bytes, so simulation exercises the deployment path.

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
:attr:`~_Facade.session_id` is what S0 sends clients; the secret never leaves S0.

**Restarts of S1.** A connection opens its session before its first round (or when
:func:`~flwr_fsl.helper.setup.connect_helper` creates it) and never re-creates it silently: after
S1 restarts, its calls raise :class:`~flwr_fsl.helper.errors.HelperSessionLostError` until S0
calls :meth:`~HelperConnection.open_session` again — a new session, with a new id (what
:meth:`LeadServer.open <flwr_fsl.families.ssa.two_server.LeadServer.open>` does, after forgetting
its stored U-DPF keys). :class:`HelperClient` replaces its gRPC channel after a call finds S1
unreachable, so the first call after S1 is back connects at once instead of waiting out gRPC's
reconnect backoff (up to two minutes).

**Threat model.** As :mod:`flwr_fsl.helper.service`: S0 relays clients' sealed material it
cannot read or alter; what S0 receives from S1 is S1's additive share (random on its own) and
answers sealed to clients. S0 authenticates S1 by its pinned public-key fingerprint; S1
authenticates S0 by the access token and each session by its secret.
:class:`HelperClient` logs a warning when it would send the token or session secrets in clear
(no TLS) to a non-loopback address.
"""

from __future__ import annotations

import abc
import ipaddress
import logging
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar, runtime_checkable

import grpc
import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import (
    SealedBoxError,
    SealingKeyPair,
    public_key_fingerprint,
    verify_fingerprint,
)
from flwr_fsl.crypto.identity import Enrollment
from flwr_fsl.families.ssa.two_server import HelperParty
from flwr_fsl.helper import wire
from flwr_fsl.helper.errors import (
    HelperAuthError,
    HelperBudgetExhaustedError,
    HelperError,
    HelperRequestError,
    HelperResourceError,
    HelperSessionLostError,
    HelperUnavailableError,
    WireFormatError,
)
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

M = TypeVar("M", bound=wire.Message)


@dataclass(frozen=True)
class HelperHealth:
    """S1's status.

    Attributes
    ----------
    protocol_version : int
        Wire format version S1 speaks.
    fingerprint : str
        Hex SHA-256 of S1's public key.
    """

    protocol_version: int
    fingerprint: str


class HelperShare(NamedTuple):
    """S1's result of a finished SSA round (a named tuple: ``ids, share = finish_round(r)``).

    Attributes
    ----------
    client_ids : tuple[int, ...]
        The clients (sorted) whose keys are in the share: S0 must aggregate exactly these.
    share : numpy.ndarray
        S1's additive share of the aggregate, ``(m, tau)`` uint64.
    """

    client_ids: tuple[int, ...]
    share: NDArray[np.uint64]


@runtime_checkable
class HelperConnection(HelperParty, Protocol):
    """What S0 can ask S1: the round calls of a ``HelperParty``, plus status and closing.

    The round calls are :class:`~flwr_fsl.families.ssa.two_server.HelperParty`'s (see
    :mod:`flwr_fsl.helper.services.ssa` for the round life cycle).

    A connection is one session on S1: every round-scoped call carries :attr:`session_id`.
    """

    def health(self) -> HelperHealth:
        """Return S1's status (also a reachability check)."""
        ...

    def close(self) -> None:
        """End the session on S1 (best effort) and release the connection (idempotent)."""
        ...


class _Facade(abc.ABC):
    """Shared request building and response checking of both transports."""

    _session_id: bytes = b""
    _secret: bytes = b""
    _session_live: bool = False

    @property
    def session_id(self) -> bytes:
        """The 16-byte id S1 drew for this connection's session (clients bind material to it).

        Reading it before any session was opened opens one (:meth:`open_session`). After
        :meth:`open_session` (e.g. once S1 lost the session) it is the new session's id.
        """
        if not self._session_id:
            self.open_session()
        return self._session_id

    def open_session(self) -> None:
        """Start a new session on S1 now (otherwise the first round or :attr:`session_id` does).

        S1 draws the session's id and secret; the connection keeps both. Also the way back
        after :class:`HelperSessionLostError`: the new session is empty (no rounds, no stored
        keys) and has a new id. A session this connection still holds is closed first.

        Raises
        ------
        HelperRequestError
            If S1 holds too many sessions.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        if self._session_live:
            self._close_session_quietly()
        r = self._call("OpenSession", wire.OpenSessionRequest(), wire.SessionInfoResponse)
        self._session_id, self._secret, self._session_live = r.session, r.secret, True

    def _sid(self) -> bytes:
        """Return the current session's id for a round call (which never opens a session)."""
        if not self._session_id:
            raise HelperRequestError("unknown session: none was opened on this connection")
        return self._session_id

    def close_session(self) -> None:
        """End this connection's session on S1: S1 drops its rounds and stored keys.

        Raises
        ------
        HelperRequestError
            If no session was opened, or S1 does not know it (already closed or lost).
        HelperUnavailableError
            If S1 cannot be reached.
        """
        if not self._session_id:
            raise HelperRequestError("no session was opened on this connection")
        self._session_live = False
        self._call("CloseSession", wire.CloseSessionRequest(self._session_id), wire.OkResponse)

    def _close_session_quietly(self) -> None:
        if not self._session_live:
            return
        try:
            self.close_session()
        except HelperError:  # never opened a round, already gone, or S1 unreachable
            pass

    @abc.abstractmethod
    def _transport(self, method: str, body: bytes) -> bytes:
        """Send one encoded request and return the encoded response."""

    def _call(self, method: str, request: wire.Message, expected: type[M]) -> M:
        try:
            body = wire.encode(request)
        except WireFormatError as err:
            raise HelperRequestError(f"cannot encode {method} request: {err}") from None
        try:
            response = self._transport(method, body)
        except HelperSessionLostError:
            self._session_live = False  # keep the id: later calls fail until open_session()
            raise
        try:
            return wire.decode(response, expected)
        except WireFormatError as err:
            raise HelperError(f"malformed {method} response from S1: {err}") from None

    def health(self) -> HelperHealth:
        """Return S1's status (also a reachability check).

        Returns
        -------
        HelperHealth
            Wire version and key fingerprint (S1 says nothing about sessions or rounds).

        Raises
        ------
        HelperError
            If S1 is unreachable or answers with a malformed public key.
        """
        r = self._call("Health", wire.HealthRequest(), wire.HealthResponse)
        try:
            fp = public_key_fingerprint(r.public_key)
        except SealedBoxError as err:
            raise HelperError(f"S1 announced a malformed public key: {err}") from None
        return HelperHealth(r.protocol_version, fp)

    def public_key(self) -> bytes:
        """Return S1's raw 32-byte X25519 public key.

        Raises
        ------
        HelperError
            If S1 is unreachable or the key is not 32 bytes.
        """
        key = self._call("PublicKey", wire.PublicKeyRequest(), wire.PublicKeyResponse).public_key
        if len(key) != 32:
            raise HelperError(f"S1 announced a {len(key)}-byte public key, expected 32")
        return key

    def open_round(self, round_id: int, params: bytes, digest_key: bytes | None = None) -> None:
        """Open a round on S1.

        Parameters
        ----------
        round_id : int
            The round (must equal ``params``' ``round_id``; never reused).
        params : bytes
            ``SSAParams.to_bytes()``.
        digest_key : bytes, optional
            A checked round's secret digest key (sent with ``OpenCheckedRound``).

        The connection's first round opens its session first (:meth:`open_session`); a later
        one does not (not even after a lost session), so a restarted S1 is noticed rather than
        papered over.

        Raises
        ------
        HelperRequestError
            If the round was opened before, too many are open, or the parameters are bad.
        HelperSessionLostError
            If S1 no longer holds the session (restarted, expired): call
            :meth:`open_session`, then open the round again.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        if not self._session_id:
            self.open_session()
        request = wire.OpenRoundRequest(self._sid(), round_id, params)
        if digest_key is not None:
            request = wire.OpenCheckedRoundRequest(self._sid(), round_id, params, digest_key)
        method = request.KIND.name.title().replace("_", "")  # OpenRound, OpenCheckedRound
        self._call(method, request, wire.OkResponse)

    def add_clients(
        self, round_id: int, uploads: Iterable[tuple[int, bytes, bytes]]
    ) -> dict[int, str]:
        """Relay clients' SSA uploads to S1.

        Parameters
        ----------
        round_id : int
            An open round.
        uploads : iterable of (int, bytes, bytes)
            ``(client_id, public_part, sealed)``; ``sealed`` from
            :func:`~flwr_fsl.helper.sealing.seal_ssa_upload`.

        Returns
        -------
        dict[int, str]
            Client id -> reason, for the rejected clients only (they are not in S1's share;
            drop them on S0 as well).

        Raises
        ------
        HelperRequestError
            If the round is not open, the request is malformed or repeats a client id.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        items = _unique(tuple(wire.SealedItem(int(c), p, s) for c, p, s in uploads))
        r = self._call("AddClients", wire.AddClientsRequest(self._sid(), round_id, items), _Results)
        return _rejections(r, items)

    def add_client_hints(
        self, round_id: int, hints: Iterable[tuple[int, bytes, bytes]]
    ) -> dict[int, str]:
        """Relay clients' public U-DPF hints to S1 (no sealing: the hint is public).

        Parameters
        ----------
        round_id : int
            An open round whose parameters carry the new epoch.
        hints : iterable of (int, bytes)
            ``(client_id, hint)``.

        Returns
        -------
        dict[int, str]
            Client id -> reason, for the rejected clients only.

        Raises
        ------
        HelperRequestError
            If the round is not open or the request is malformed.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        items = _unique(tuple(wire.HintItem(int(c), h, s) for c, h, s in hints))
        r = self._call(
            "AddClientHints", wire.AddHintsRequest(self._sid(), round_id, items), _Results
        )
        return _rejections(r, items)

    def add_checked(
        self, round_id: int, items: Iterable[tuple[int, bytes, bytes, bytes]], *, hints: bool
    ) -> dict[int, str | bytes]:
        """Relay a checked round's uploads (or U-DPF hints) with S0's key-check digests.

        Parameters
        ----------
        round_id : int
            An open round whose parameters carry ``verify``.
        items : iterable of (int, bytes, bytes, bytes)
            ``(client_id, public part or hint, sealed, S0's digest)``.
        hints : bool
            True for U-DPF hints, False for fresh uploads.

        Returns
        -------
        dict[int, str | bytes]
            Client id -> S1's digest (bytes) when S1 accepted it, else S1's reason (str).

        Raises
        ------
        HelperRequestError
            If the round is not open, does not check keys, or the request is malformed.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        checked = tuple(wire.CheckedItem(int(c), b, s, d) for c, b, s, d in items)
        if len({it.client_id for it in checked}) != len(checked):
            raise HelperRequestError("duplicate client ids in one request")
        kind = wire.AddCheckedHintsRequest if hints else wire.AddCheckedRequest
        method = "AddCheckedHints" if hints else "AddCheckedClients"
        r = self._call(method, kind(self.session_id, round_id, checked), _Results)
        if [res.client_id for res in r.results] != [it.client_id for it in checked]:
            raise HelperError("S1 answered for other clients than it was asked about")
        return {res.client_id: res.payload if res.ok else res.reason for res in r.results}

    def finish_round(self, round_id: int) -> HelperShare:
        """Close a round and fetch S1's share.

        Parameters
        ----------
        round_id : int
            An open round.

        Returns
        -------
        HelperShare
            ``(client_ids, share)``: the ids of the clients in S1's share and the
            ``(m, tau)`` uint64 share.

        Raises
        ------
        HelperRequestError
            If the round is not open.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        r = self._call(
            "FinishRound", wire.FinishRoundRequest(self._sid(), round_id), wire.ShareResponse
        )
        return HelperShare(r.client_ids, r.share)

    def abort_round(self, round_id: int) -> None:
        """Drop an open round (S1 keeps no result and no U-DPF keys from it).

        Raises
        ------
        HelperRequestError
            If the round is not open.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        self._call("AbortRound", wire.AbortRoundRequest(self._sid(), round_id), wire.OkResponse)

    def set_model(self, round_id: int, table: NDArray[np.uint64]) -> None:
        """Give S1 the table that the round's PSR queries are answered from.

        Parameters
        ----------
        round_id : int
            An open round.
        table : numpy.ndarray
            ``(m, value_width)`` uint64 (see :func:`flwr_fsl.families.ssa.psr.encode_table`).

        Raises
        ------
        HelperRequestError
            If the round is not open, already has a table, or the table has the wrong
            dtype or shape.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        arr = np.asarray(table)
        if arr.dtype != np.uint64:
            raise HelperRequestError(f"PSR table must be uint64, got {arr.dtype}")
        self._call("SetModel", wire.SetModelRequest(self._sid(), round_id, arr), wire.OkResponse)

    def psr_answer(
        self, round_id: int, queries: Iterable[tuple[int, bytes, bytes]]
    ) -> dict[int, bytes | str]:
        """Relay clients' PSR queries; collect S1's answers sealed to each client.

        Parameters
        ----------
        round_id : int
            An open round with a table.
        queries : iterable of (int, bytes, bytes)
            ``(client_id, public_part, sealed)``; ``sealed`` from
            :func:`~flwr_fsl.helper.sealing.seal_psr_query`.

        Returns
        -------
        dict[int, bytes | str]
            Client id -> sealed answer (bytes, relay it to the client) or rejection reason
            (str).

        Raises
        ------
        HelperRequestError
            If the round is not open or has no table, or the request is malformed.
        HelperUnavailableError
            If S1 cannot be reached.
        """
        items = _unique(tuple(wire.SealedItem(int(c), p, s) for c, p, s in queries))
        r = self._call("PsrAnswer", wire.PsrAnswerRequest(self._sid(), round_id, items), _Results)
        _check_clients(r, items)
        return {res.client_id: (res.payload if res.ok else res.reason) for res in r.results}

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources (idempotent)."""


_Results = wire.ClientResultsResponse
_I = TypeVar("_I", wire.SealedItem, wire.HintItem)


def _unique(items: tuple[_I, ...]) -> tuple[_I, ...]:
    ids = [it.client_id for it in items]
    if len(set(ids)) != len(ids):
        dup = sorted({c for c in ids if ids.count(c) > 1})
        raise HelperRequestError(f"duplicate client ids in one request: {dup}")
    return items


def _check_clients(
    response: wire.ClientResultsResponse, items: tuple[wire.SealedItem | wire.HintItem, ...]
) -> None:
    if [r.client_id for r in response.results] != [it.client_id for it in items]:
        raise HelperError("S1 answered for other clients than it was asked about")


def _rejections(
    response: wire.ClientResultsResponse, items: tuple[wire.SealedItem | wire.HintItem, ...]
) -> dict[int, str]:
    _check_clients(response, items)
    return {res.client_id: res.reason for res in response.results if not res.ok}


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


class InProcessHelper(_Facade):
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


class HelperClient(_Facade):
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
