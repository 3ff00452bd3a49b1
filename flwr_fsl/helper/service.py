"""The helper server S1's host: sessions, locking and dispatch to pluggable services (bytes in/out).

S1 is the second, non-colluding server of the two-server protocols. This module is protocol
agnostic: it owns S1's key pair, the **sessions**, the lock discipline and the method table; each
protocol is a :class:`HelperPlugin` in its own file that registers its methods
(:mod:`flwr_fsl.helper.services.ssa` — secure aggregation rounds, U-DPF;
:mod:`flwr_fsl.helper.services.psr` — private submodel retrieval). A future service (PSU, a
PrivHFL computing party) is one new file registered the same way (and its own wire kinds,
:func:`flwr_fsl.helper.wire.register_message`).

**Sessions.** Every round-scoped request carries a 16-byte session id, and beside it the
session's 32-byte secret. Both are drawn by S1 (``os.urandom``) when S0 calls ``OpenSession``
(what :func:`~flwr_fsl.helper.setup.connect_helper` sends, so a session spans the whole run; a
connection also sends it before its first ``OpenRound``) and returned to that caller only; S0
sends the id, never the secret, to clients (they bind their sealed material to it). Every later
call naming the session must carry the secret (compared in constant time); a missing or wrong
one is refused with :class:`~flwr_fsl.helper.errors.HelperAuthError` before the session is
touched (not even its idle clock), so knowing a session id — every client of the run does —
opens nothing. Session ids are single-use: S0 cannot name the id of a new session, so sealed
material bound to a closed session never opens in another one (a replay after
close-and-reopen fails per client), and the last :data:`RETIRED_SESSIONS` closed or expired
ids are remembered for a clear error. Everything S1 keeps — open and closed rounds, stored
U-DPF keys, PSR tables — lives in the session, so one long-running ``flwr-fsl-helper`` serves
many runs, one after another and at once, and round ids of different runs never collide. A
session ends with ``CloseSession`` (a connection's ``close()``) and is dropped after
``session_idle_s`` without a call; at most ``max_sessions`` exist at once (a new one beyond
that is refused, after expired ones are dropped) and each has at most ``max_open_rounds`` open
rounds. Sessions live in memory only: any other call naming a session S1 does not hold —
after a restart of S1, an expiry or a close — is refused with
:class:`~flwr_fsl.helper.errors.HelperSessionLostError`, so S0 learns that S1 lost the run's
rounds and U-DPF keys instead of a round silently starting on an empty session; S0 then opens
a *new* session (a new id: clients get it with the next round). Calls of different sessions
run concurrently (one lock per session); calls of one session are serialized. ``Health`` and
``PublicKey`` take no session lock and say nothing about sessions.

:meth:`HelperService.handle` is the one entry point, so the gRPC server
(:mod:`flwr_fsl.helper.server`) and the in-process twin
(:class:`~flwr_fsl.helper.connection.InProcessHelper`) run byte-identical code paths.

**Limits.** What one round may cost S1 is bounded by :class:`~flwr_fsl.helper.limits.HelperLimits`
(``limits``): ``OpenRound`` and ``SetModel`` check the domain, width, number of items and the
round's memory (a formula over the public parameters), ``AddClients``, ``AddClientHints`` and
``PsrAnswer`` the clients and the work of the round — all before anything is allocated or
evaluated; a round over a limit is refused with a
:class:`~flwr_fsl.helper.errors.HelperRequestError` naming the limit and its CLI flag.

**Privacy accounts.** S1's account of each run's DP rounds (its noise: the guarantee against S0)
belongs to the run, not the session, and lives in ``state_dir`` when one is given
(:mod:`flwr_fsl.helper.accounts`, :attr:`HelperService.accounts`): a new session of the run
or a restarted S1 resumes it, and S1 refuses rounds past the run's budget or its own ceiling.
Each enrolled client also has an account across runs (:attr:`HelperService.client_accounts`,
:mod:`flwr_fsl.helper.client_accounts`), capped by S1's per-client ceiling when one is set.

**Client identities.** S1 accepts SSA uploads and U-DPF hints only when signed by a key on its
enrollment list (``enrollment``, :class:`~flwr_fsl.crypto.identity.Enrollment`;
``flwr-fsl-helper --enrollment FILE``), and counts distinct enrolled signers for its minimum
participation (:mod:`flwr_fsl.helper.services.ssa`), so S0 cannot invent clients. Open
enrollment (any signer; ``--open-enrollment``, the in-process twin, and this class's default)
does not stop a deviating S0 from inventing clients: it makes keys itself.

**Locking.** Each session has one lock, held for the whole of its calls (key evaluation
included); the only lock shared across sessions guards the session table and is held for a
dictionary lookup, never during a service call. So a long ``AddClients`` delays only later
calls of its own session (S0 calls one at a time anyway); other sessions' calls and
``Health``/``PublicKey`` proceed, limited only by the gRPC worker threads
(``flwr-fsl-helper --workers``: that many calls run at once) and CPU cores.

**Errors.** A malformed request, an unknown method, session or round, or a call in the wrong
state raises :class:`~flwr_fsl.helper.errors.HelperRequestError` for the whole call. A single
client's bad material is never an exception: services report it per client and leave S1's
state for the other clients unchanged.

**Threat model and leakage.** Two non-colluding servers, either of which may deviate, and
anyone on the network may call S1. What S1 learns is stated per service; across sessions S1
learns only which sessions exist and when they call. Who may do what (the gRPC layer,
:mod:`flwr_fsl.helper.server`, adds the access token in front of every method but ``Health``
and ``PublicKey``):

* anyone reaching the port: ``Health`` (S1's wire version and public key: nothing about
  sessions or rounds) and ``PublicKey``; nothing else without the token
  (``tests/attacks/test_helper_outsider.py``);
* a holder of the token (another run's S0, say) and anyone who knows a session id (every
  client of that run): opens sessions of its own, but cannot call any method of another
  session — add items or hints, finish or abort rounds, set a table, answer queries, close it
  (``tests/attacks/test_helper_outsider.py``);
* the S0 of a session: cannot reopen a closed session id or make sealed material of one
  session open in another (``tests/attacks/test_helper_replay.py``); a new session resumes the
  run's privacy account rather than starting a fresh one (see below).

A caller with the token (or any caller of an S1 started with ``--insecure``) can still create
sessions up to ``max_sessions``, each with up to ``max_open_rounds`` rounds of at most
``max_round_bytes`` (plus the keys of at most ``max_clients_per_round`` clients per round and
the U-DPF keys the session stores): a denial of service, not a leak.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.identity import Enrollment
from flwr_fsl.helper import wire
from flwr_fsl.helper.accounts import RunAccounts
from flwr_fsl.helper.client_accounts import ClientAccounts
from flwr_fsl.helper.errors import (
    HelperAuthError,
    HelperRequestError,
    HelperSessionLostError,
    WireFormatError,
)
from flwr_fsl.helper.limits import HelperLimits

__all__ = [
    "PARTY",
    "RETIRED_SESSIONS",
    "SERVICE_NAME",
    "HelperLimits",
    "HelperPlugin",
    "HelperService",
    "Method",
    "Session",
]

SERVICE_NAME = "flwr_fsl.helper.v1.Helper"
"""Fully qualified gRPC service name."""
PARTY = 1
"""S1 is party 1 of every two-party protocol."""
RETIRED_SESSIONS = 4096
"""How many closed or expired session ids S1 remembers (for a clear error; ids never repeat)."""

log = logging.getLogger("flwr_fsl.helper")


@dataclass
class Session:
    """Everything S1 keeps for one run.

    Attributes
    ----------
    session_id : bytes
        The 16-byte id S1 drew.
    secret : bytes
        The 32-byte secret S1 drew; only the S0 that opened the session knows it.
    rounds : dict[int, Any]
        Open rounds: round id -> the owning service's round state.
    closed : set[int]
        Rounds finished or aborted (never reopened: replay protection within the run).
    data : dict[str, Any]
        Per-service state that outlives a round (e.g. stored U-DPF keys), keyed by service.
    last_used : float
        Monotonic time of the last call (for idle expiry).
    """

    session_id: bytes
    secret: bytes = field(default=b"", repr=False)
    rounds: dict[int, Any] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)
    data: dict[str, Any] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def round(self, round_id: int) -> Any:
        """Return an open round's state.

        Raises
        ------
        HelperRequestError
            If the round is not open in this session.
        """
        state = self.rounds.get(round_id)
        if state is None:
            what = "already finished or aborted" if round_id in self.closed else "not open"
            raise HelperRequestError(f"round {round_id} is {what}")
        return state

    def close_round(self, round_id: int) -> None:
        """Drop an open round for good (it can never be reopened in this session)."""
        del self.rounds[round_id]
        self.closed.add(round_id)


@dataclass(frozen=True)
class Method:
    """One registered method: its request type, its handler and whether it opens a session.

    The handler gets the call's :class:`Session` (None for session-less methods) and the
    decoded request, and returns the response message. A ``creates_session`` method gets a new
    session (id and secret drawn by S1; the handler must return them to the caller, as
    ``OpenSession`` does); any other session method gets the session its request names, only
    when the call carries that session's secret.
    """

    request: type[wire.Message]
    handler: Callable[[Session | None, Any], wire.Message]
    creates_session: bool = False
    needs_session: bool = True


class HelperPlugin(Protocol):
    """A service S1 hosts: a name and its methods (``gRPC method name -> Method``)."""

    name: str

    def methods(self) -> Mapping[str, Method]:
        """Return the service's methods."""
        ...


class HelperService:
    """S1's state and request handling (thread-safe): sessions plus registered services.

    Parameters
    ----------
    keypair : SealingKeyPair
        S1's X25519 key pair (clients seal to its public key).
    max_open_rounds : int (default: 4)
        Rounds that may be open at once in one session.
    max_sessions : int (default: 64)
        Sessions that may exist at once.
    session_idle_s : float (default: 6 hours)
        A session without a call for this long is dropped (with its rounds and keys).
    limits : HelperLimits, optional
        What one round may cost (:mod:`flwr_fsl.helper.limits`); the defaults by default.
    state_dir : Path, optional
        Where the per-run privacy accounts are kept (:mod:`flwr_fsl.helper.accounts`); None
        keeps them in memory (they then last as long as this object).
    session_ids : callable, optional
        Draws a new session's 16-byte id; 16 bytes of ``os.urandom`` by default. Tests pass a
        deterministic one; a drawn id that S1 holds or has retired is refused.
    enrollment : Enrollment, optional
        The client signing keys S1 accepts (:mod:`flwr_fsl.crypto.identity`); open
        enrollment (any signer, insecure against a deviating S0) by default.

    Raises
    ------
    ValueError
        If an argument is out of range, ``keypair`` is not a :class:`SealingKeyPair`,
        ``enrollment`` is not an :class:`~flwr_fsl.crypto.identity.Enrollment`,
        or ``limits`` is not a :class:`HelperLimits`.
    """

    def __init__(
        self,
        keypair: SealingKeyPair,
        *,
        max_open_rounds: int = 4,
        max_sessions: int = 64,
        session_idle_s: float = 6 * 3600.0,
        limits: HelperLimits | None = None,
        state_dir: Path | None = None,
        session_ids: Callable[[], bytes] | None = None,
        enrollment: Enrollment | None = None,
    ) -> None:
        if session_ids is not None and not callable(session_ids):
            raise ConfigurationError("session_ids must be a callable returning 16 bytes")
        if enrollment is not None and not isinstance(enrollment, Enrollment):
            raise ConfigurationError(
                f"enrollment must be an Enrollment, got {type(enrollment).__name__}"
            )
        self.enrollment = enrollment if enrollment is not None else Enrollment.open()
        if not isinstance(keypair, SealingKeyPair):
            raise ConfigurationError(
                f"keypair must be a SealingKeyPair, got {type(keypair).__name__}"
            )
        if limits is not None and not isinstance(limits, HelperLimits):
            raise ConfigurationError(f"limits must be a HelperLimits, got {type(limits).__name__}")
        for name, value in (("max_open_rounds", max_open_rounds), ("max_sessions", max_sessions)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigurationError(f"{name} must be an int")
            if value < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {value}")
        if not session_idle_s > 0:
            raise ConfigurationError(f"session_idle_s must be > 0, got {session_idle_s}")
        self.keypair = keypair
        self.max_open_rounds = max_open_rounds
        self.max_sessions = max_sessions
        self.session_idle_s = float(session_idle_s)
        self.limits = limits if limits is not None else HelperLimits()
        self.accounts = RunAccounts(state_dir, self.limits.dp_budget)
        self.client_accounts = ClientAccounts(state_dir, self.limits.dp_client_budget)
        self._sessions: dict[bytes, Session] = {}
        self._retired: OrderedDict[bytes, str] = OrderedDict()
        self._draw_id = session_ids or (lambda: os.urandom(wire.SESSION_BYTES))
        self._sessions_lock = threading.Lock()
        self._methods: dict[str, Method] = {
            "Health": Method(wire.HealthRequest, self._health, needs_session=False),
            "PublicKey": Method(wire.PublicKeyRequest, self._public_key, needs_session=False),
            "OpenSession": Method(
                wire.OpenSessionRequest, self._open_session, creates_session=True
            ),
            "CloseSession": Method(wire.CloseSessionRequest, self._close_session),
        }
        for plugin in default_plugins(self):  # SSA and PSR; add others with register()
            self.register(plugin)

    def register(self, plugin: HelperPlugin) -> None:
        """Add a service's methods.

        Raises
        ------
        ConfigurationError
            If one of its method names is already registered.
        """
        methods = dict(plugin.methods())
        taken = sorted(set(methods) & set(self._methods))
        if taken:
            raise ConfigurationError(
                f"service {plugin.name!r}: methods {taken} are already registered"
            )
        self._methods.update(methods)

    @property
    def methods(self) -> dict[str, type[wire.Message]]:
        """GRPC method name -> request message type, for every registered method."""
        return {name: m.request for name, m in self._methods.items()}

    @property
    def public_key(self) -> bytes:
        """S1's raw 32-byte X25519 public key."""
        return self.keypair.public_bytes

    @property
    def fingerprint(self) -> str:
        """Hex SHA-256 of :attr:`public_key` (what operators pin in the run config)."""
        return self.keypair.fingerprint

    def handle(self, method: str, request: bytes, secret: bytes | None = None) -> bytes:
        """Run one call: decode the request, check its session secret, update state, answer.

        Parameters
        ----------
        method : str
            A registered method name (the gRPC method name).
        request : bytes
            The wire-encoded request of that method.
        secret : bytes, optional
            The secret of the session the request names (what ``OpenSession`` returned);
            ignored by session-less methods and ``OpenSession``.

        Returns
        -------
        bytes
            The wire-encoded response.

        Raises
        ------
        HelperRequestError
            If the method is unknown, the request is malformed (any
            :class:`~flwr_fsl.helper.errors.WireFormatError`) or is refused in the current
            state; :class:`~flwr_fsl.helper.errors.HelperSessionLostError` if it names a
            session S1 does not hold; :class:`~flwr_fsl.helper.errors.HelperAuthError` if
            ``secret`` is not that session's (the session is left untouched).
        """
        entry = self._methods.get(method)
        if entry is None:
            raise HelperRequestError(f"unknown method {method!r}")
        try:
            message = wire.decode(request, entry.request)
        except WireFormatError as err:
            raise HelperRequestError(f"malformed {method} request: {err}") from None
        if not entry.needs_session:
            return wire.encode(entry.handler(None, message))
        if entry.creates_session:
            session = self._new_session()
        else:
            session = self._session(message.session, secret)  # type: ignore[attr-defined]
        with session.lock:
            try:
                response = entry.handler(session, message)
            finally:
                session.last_used = time.monotonic()  # idle time counts from a call's end
        return wire.encode(response)

    # --------------------------------------------------------------------------------------------

    def _session(self, session_id: bytes, secret: bytes | None) -> Session:
        with self._sessions_lock:
            session = self._sessions.get(session_id)
            if session is None:
                why = self._retired.get(session_id, "closed, expired, or S1 restarted")
                raise HelperSessionLostError(f"unknown session ({why})")
            if not isinstance(secret, bytes) or not hmac.compare_digest(secret, session.secret):
                log.warning("session %s: call refused, wrong secret", session_id.hex()[:8])
                raise HelperAuthError(
                    "wrong or missing session secret: only the S0 that opened a session may call it"
                )
            # Touched under the sessions lock, so a concurrent _expire_idle cannot drop a
            # session between this lookup and the call taking its lock.
            session.last_used = time.monotonic()
            return session

    def _new_session(self) -> Session:
        with self._sessions_lock:
            self._expire_idle()
            if len(self._sessions) >= self.max_sessions:
                raise HelperRequestError(
                    f"{len(self._sessions)} sessions are open (limit {self.max_sessions})"
                )
            session_id = self._draw_id()
            if not isinstance(session_id, bytes) or len(session_id) != wire.SESSION_BYTES:
                raise HelperRequestError("S1 drew a malformed session id")
            if session_id in self._sessions or session_id in self._retired:
                raise HelperRequestError("S1 drew a session id it has used before")
            session = Session(session_id, os.urandom(wire.SECRET_BYTES))
            self._sessions[session_id] = session
            log.info("session %s opened (%d open)", session_id.hex()[:8], len(self._sessions))
            return session

    def _retire(self, session_id: bytes, why: str) -> None:
        """Forget a session for good, remembering its id (bounded) for a clear error."""
        self._sessions.pop(session_id, None)
        self._retired[session_id] = why
        while len(self._retired) > RETIRED_SESSIONS:
            self._retired.popitem(last=False)

    def _expire_idle(self) -> None:
        now = time.monotonic()
        for sid, session in list(self._sessions.items()):
            if now - session.last_used > self.session_idle_s and not session.lock.locked():
                self._retire(sid, "expired: idle too long")
                log.warning(
                    "session %s expired after %.0f s idle", sid.hex()[:8], now - session.last_used
                )

    def session_count(self) -> int:
        """Return the number of sessions S1 holds now."""
        with self._sessions_lock:
            return len(self._sessions)

    def _health(self, _: Session | None, __: wire.Message) -> wire.Message:
        return wire.HealthResponse(wire.VERSION, self.public_key)

    def _public_key(self, _: Session | None, __: wire.Message) -> wire.Message:
        return wire.PublicKeyResponse(self.public_key)

    def _open_session(self, session: Session | None, _: wire.Message) -> wire.Message:
        assert session is not None  # created by the dispatcher
        return wire.SessionInfoResponse(session.session_id, session.secret)

    def _close_session(self, session: Session | None, _: wire.Message) -> wire.Message:
        assert session is not None
        with self._sessions_lock:
            self._retire(session.session_id, "closed; session ids are single-use")
        log.info("session %s closed", session.session_id.hex()[:8])
        return wire.OkResponse()


def default_plugins(service: HelperService) -> list[HelperPlugin]:
    """Return the built-in services (SSA and PSR) bound to ``service``'s key and limits."""
    from flwr_fsl.helper.services.psr import PSRService
    from flwr_fsl.helper.services.ssa import SSAService

    return [SSAService(service), PSRService(service)]
