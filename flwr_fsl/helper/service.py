"""The helper server S1's host: sessions, locking and dispatch to pluggable services (bytes in/out).

S1 is the second, non-colluding server of the two-server protocols. This module is protocol
agnostic: it owns S1's key pair, the **sessions**, the lock discipline and the method table; each
protocol is a :class:`HelperPlugin` in its own file that registers its methods
(:mod:`flwr_fsl.helper.services.ssa` — secure aggregation rounds, U-DPF;
:mod:`flwr_fsl.helper.services.psr` — private submodel retrieval). A future service (PSU, a
PrivHFL computing party) is one new file registered the same way (and its own wire kinds,
:func:`flwr_fsl.helper.wire.register_message`).

**Sessions.** Every round-scoped request carries a 16-byte session id, and beside it the session's
32-byte secret. Both are drawn by S1 (``os.urandom``) when S0 calls ``OpenSession`` (what
:func:`~flwr_fsl.helper.setup.connect_helper` sends, so a session spans the whole run; a connection
also sends it before its first ``OpenRound``) and returned to that caller only; S0 sends the id,
never the secret, to clients (they bind their sealed material to it). Every later call naming the
session must carry the secret (compared in constant time); a missing or wrong one is refused before
the session is touched (not even its idle clock), with the answer S1 gives for an id it does not
hold (:class:`~flwr_fsl.helper.errors.HelperSessionLostError`, "unknown session"), so knowing a
session id — every client of the run does — opens nothing and does not even tell whether the session
is live. Session ids are single-use: S0 cannot name the id of a new session, so sealed material
bound to a closed session never opens in another one (a replay after close-and-reopen fails per
client), and the last :data:`RETIRED_SESSIONS` closed or expired ids are remembered for a clear
error (why it ended, said only to a caller holding its secret).
Everything S1 keeps — open and closed rounds, stored
U-DPF keys, PSR tables — lives in the session, so one long-running ``flwr-fsl-helper`` serves
many runs, one after another and at once, and round ids of different runs never collide. A
session ends with ``CloseSession`` (a connection's ``close()``) and is dropped after
``session_idle_s`` without a call (``round_idle_s`` while it has an open round); at most
``max_sessions`` exist at once, at most ``max_sessions_per_peer`` from one address (a new one
beyond evicts the idlest idle session, or is refused) and each has at most
``max_open_rounds`` open rounds (:class:`~flwr_fsl.helper.quota.ServiceLimits`). Sessions
live in memory only: any other call naming a session S1 does not hold — after a restart of
S1, an expiry, an eviction or a close — is refused with
:class:`~flwr_fsl.helper.errors.HelperSessionLostError`, so S0 learns that S1 lost the run's
rounds and U-DPF keys instead of a round silently starting on an empty session; S0 then opens
a *new* session (a new id: clients get it with the next round). Calls of different sessions
run concurrently (one lock per session); calls of one session are serialized. ``Health`` and
``PublicKey`` take no session lock and say nothing about sessions.

:meth:`HelperService.handle` is the one entry point, so the gRPC server
(:mod:`flwr_fsl.helper.server`) and the in-process twin
(:class:`~flwr_fsl.helper.connection.InProcessHelper`) run byte-identical code paths.

**Resources** (:mod:`flwr_fsl.helper.quota`, ``quota``). What all sessions together and
each one may hold: S1's memory budget (every open round, stored key and running request is
charged to its session before it is allocated; a session keeps a guaranteed reserve), the
session table and each session's calls. A call over one of them is refused with
:class:`~flwr_fsl.helper.errors.HelperResourceError` (gRPC ``RESOURCE_EXHAUSTED``).

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
calls of its own session (S0 calls one at a time anyway; at most ``max_calls_per_session``
may run or wait at once); other sessions' calls and ``Health``/``PublicKey`` proceed: the
gRPC server has a thread for every call the sessions may make plus threads only session-less
calls can use (:data:`~flwr_fsl.helper.quota.RESERVED_THREADS`).

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
sessions up to ``max_sessions_per_peer`` per address and use memory up to S1's budget minus
the other open sessions' reserves, and it slows other runs by sharing the cores; it cannot
take an open session's reserve, grow S1 past its budget, hold up ``Health`` or keep idle
sessions that lock new runs out (:mod:`flwr_fsl.helper.quota`;
``tests/helper/test_helper_quota.py``).
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
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
    HelperRequestError,
    HelperResourceError,
    HelperSessionLostError,
    WireFormatError,
)
from flwr_fsl.helper.limits import HelperLimits
from flwr_fsl.helper.quota import MemoryLedger, ServiceLimits

__all__ = [
    "PARTY",
    "RETIRED_SESSIONS",
    "SERVICE_NAME",
    "HelperLimits",
    "HelperPlugin",
    "HelperService",
    "Method",
    "ServiceLimits",
    "Session",
]

SERVICE_NAME = "flwr_fsl.helper.v1.Helper"
"""Fully qualified gRPC service name."""
PARTY = 1
"""S1 is party 1 of every two-party protocol."""
RETIRED_SESSIONS = 4096
"""How many closed or expired session ids S1 remembers (for a clear error; ids never repeat)."""

_UNKNOWN_SECRET = bytes(32)
"""Compared against when a call names no live session (the answer takes the same path)."""


def _digest(secret: bytes) -> bytes:
    """Return what S1 keeps of a retired session's secret: enough to recognise its owner."""
    return hashlib.sha256(b"flwr-fsl retired session\x00" + secret).digest()


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
    peer : str
        The network address that opened it (``"local"`` in process).
    calls : int
        Its calls running or waiting for its lock now.
    ledger : MemoryLedger or None
        S1's memory account (:meth:`charge` and :meth:`release` go to it).
    """

    session_id: bytes
    secret: bytes = field(default=b"", repr=False)
    rounds: dict[int, Any] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)
    data: dict[str, Any] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    peer: str = "local"
    calls: int = 0
    ledger: MemoryLedger | None = field(default=None, repr=False)

    def charge(self, key: Any, nbytes: int, what: str, *, check: bool = True) -> None:
        """Charge ``nbytes`` for ``key`` to this session before allocating them.

        Raises
        ------
        HelperResourceError
            If the session or S1 would exceed its memory limit (nothing charged).
        """
        if self.ledger is not None:
            self.ledger.charge(self.session_id, key, nbytes, what, check=check)

    def release(self, key: Any) -> None:
        """Drop the charge ``key`` (its memory was freed)."""
        if self.ledger is not None:
            self.ledger.release(self.session_id, key)

    def idle_for(self, now: float) -> float | None:
        """Return how long it has been idle (None while a call runs or waits)."""
        return None if self.calls or self.lock.locked() else now - self.last_used

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
        self.release(("round", round_id))
        self.release(("round-keys", round_id))


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
    quota : ServiceLimits, optional
        What all sessions together and each one may hold (:mod:`flwr_fsl.helper.quota`);
        the defaults by default.
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
        ``limits`` is not a :class:`HelperLimits`, ``quota`` not a :class:`ServiceLimits`,
        or a round at ``limits.max_round_bytes`` would not fit ``quota.max_session_bytes``.
    """

    def __init__(
        self,
        keypair: SealingKeyPair,
        *,
        quota: ServiceLimits | None = None,
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
        self.keypair = keypair
        if quota is not None and not isinstance(quota, ServiceLimits):
            raise ConfigurationError(f"quota must be a ServiceLimits, got {type(quota).__name__}")
        self.quota = quota if quota is not None else ServiceLimits()
        self.limits = limits if limits is not None else HelperLimits()
        if self.limits.max_round_bytes > self.quota.max_session_bytes:
            raise ConfigurationError(
                f"max_round_bytes ({self.limits.max_round_bytes}) exceeds max_session_bytes "
                f"({self.quota.max_session_bytes}): no such round could open "
                "(flwr-fsl-helper --max-round-mib, --max-session-mib)"
            )
        self.memory = MemoryLedger(self.quota)
        self.max_calls: int | None = None  # session calls at once (set by start_server)
        self._running = 0
        self._call_ids = itertools.count()
        self._next_sweep = 0.0
        self.accounts = RunAccounts(state_dir, self.limits.dp_budget)
        self.client_accounts = ClientAccounts(state_dir, self.limits.dp_client_budget)
        self._sessions: dict[bytes, Session] = {}
        # Retired id -> (why it ended, SHA-256 of its secret): the reason goes only to its owner.
        self._retired: OrderedDict[bytes, tuple[str, bytes]] = OrderedDict()
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
    def max_open_rounds(self) -> int:
        """Rounds open at once in one session (``quota.max_open_rounds``)."""
        return self.quota.max_open_rounds

    @property
    def max_sessions(self) -> int:
        """Sessions at once (``quota.max_sessions``)."""
        return self.quota.max_sessions

    @property
    def session_idle_s(self) -> float:
        """Idle time before a session without an open round is dropped."""
        return self.quota.session_idle_s

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

    def handle(
        self, method: str, request: bytes, secret: bytes | None = None, peer: str | None = None
    ) -> bytes:
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
        peer : str, optional
            The caller's network address (its host, without the port), for the per-address
            session limit; ``"local"`` by default.

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
            session S1 does not hold or ``secret`` is not that session's (one answer for
            both; the session is left untouched);
            :class:`~flwr_fsl.helper.errors.HelperResourceError` if it would exceed a
            resource limit (:mod:`flwr_fsl.helper.quota`; nothing changed).
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
        self._sweep()
        if entry.creates_session:
            session = self._new_session(peer or "local")
        else:
            session = self._session(message.session, secret)  # type: ignore[attr-defined]
        self._admit(session, fresh=entry.creates_session)
        key = ("call", next(self._call_ids))
        try:
            # The request's bytes and what was decoded from them, until the call ends.
            session.charge(key, 2 * len(request), f"this {method} request")
            with session.lock:
                try:
                    response = entry.handler(session, message)
                finally:
                    session.last_used = time.monotonic()  # idle time counts from a call's end
        finally:
            session.release(key)
            with self._sessions_lock:
                session.calls -= 1
                self._running -= 1
        return wire.encode(response)

    # --------------------------------------------------------------------------------------------

    def _admit(self, session: Session, *, fresh: bool) -> None:
        """Count a call against its session's and S1's share of threads, or refuse it.

        Raises
        ------
        HelperResourceError
            If the session already has ``max_calls_per_session`` calls running or waiting,
            or S1 ``max_calls`` (a ``fresh`` session is then dropped again).
        """
        with self._sessions_lock:
            reason = None
            if session.calls >= self.quota.max_calls_per_session:
                reason = (
                    f"{session.calls} calls of this session are running or waiting (limit "
                    f"{self.quota.max_calls_per_session}, flwr-fsl-helper "
                    "--max-calls-per-session): S0 calls S1 one call at a time"
                )
            elif self.max_calls is not None and self._running >= self.max_calls:
                reason = (
                    f"S1 is busy: {self._running} session calls are running or waiting "
                    "(flwr-fsl-helper --workers); try again"
                )
            if reason is not None:
                if fresh:
                    self._retire(session.session_id, "refused: S1 was busy")
                raise HelperResourceError(reason)
            session.calls += 1
            self._running += 1

    def _session(self, session_id: bytes, secret: bytes | None) -> Session:
        given = secret if isinstance(secret, bytes) else b""
        with self._sessions_lock:
            session = self._sessions.get(session_id)
            # Compared even for an unknown id, so the answer's timing says nothing either.
            expected = session.secret if session is not None else _UNKNOWN_SECRET
            matches = hmac.compare_digest(given, expected)
            if session is not None and matches:
                # Touched under the sessions lock, so a concurrent _expire_idle cannot drop
                # a session between this lookup and the call taking its lock.
                session.last_used = time.monotonic()
                return session
            if session is not None:
                log.warning("session %s: call refused, wrong secret", session_id.hex()[:8])
            # One answer for a live id with a wrong secret and for an id S1 does not hold, so
            # the id alone tells its holder nothing, not even whether the session is live;
            # why a session ended is said only to the caller holding its secret.
            retired = self._retired.get(session_id)
            why = "closed, expired, or S1 restarted"
            if retired is not None and hmac.compare_digest(_digest(given), retired[1]):
                why = retired[0]
            raise HelperSessionLostError(f"unknown session ({why})")

    def _new_session(self, peer: str) -> Session:
        quota = self.quota
        with self._sessions_lock:
            self._expire_idle()
            self._make_room(
                list(self._sessions.values()),
                quota.max_sessions,
                f"{len(self._sessions)} sessions are open (limit {quota.max_sessions}, "
                "flwr-fsl-helper --max-sessions)",
            )
            mine = [s for s in self._sessions.values() if s.peer == peer]
            self._make_room(
                mine,
                quota.max_sessions_per_peer,
                f"{len(mine)} sessions are open from {peer} (limit {quota.max_sessions_per_peer}"
                ", flwr-fsl-helper --max-sessions-per-peer)",
            )
            session_id = self._draw_id()
            if not isinstance(session_id, bytes) or len(session_id) != wire.SESSION_BYTES:
                raise HelperRequestError("S1 drew a malformed session id")
            if session_id in self._sessions or session_id in self._retired:
                raise HelperRequestError("S1 drew a session id it has used before")
            while True:  # the new session's guaranteed memory: evict unused ones until it fits
                try:
                    self.memory.open(session_id)
                    break
                except HelperResourceError:
                    unused = [s for s in self._sessions.values() if not (s.rounds or s.closed)]
                    if not self._evict_idlest(unused):
                        raise
            session = Session(session_id, os.urandom(wire.SECRET_BYTES), peer=peer)
            session.ledger = self.memory
            self._sessions[session_id] = session
            log.info(  # "session <id> opened (<n> open)": operators' and tests' grep
                "session %s opened (%d open) from %s",
                session_id.hex()[:8],
                len(self._sessions),
                peer,
            )
            return session

    def _make_room(self, sessions: list[Session], limit: int, why: str) -> None:
        """Evict the idlest idle sessions of ``sessions`` until fewer than ``limit`` remain.

        Raises
        ------
        HelperResourceError
            If no more of them may be evicted (``why``).
        """
        while len(sessions) >= limit:
            evicted = self._evict_idlest(sessions)
            if evicted is None:
                raise HelperResourceError(f"{why}; none is idle enough to make room")
            sessions.remove(evicted)

    def _evict_idlest(self, sessions: list[Session]) -> Session | None:
        """Retire the first evictable session among ``sessions`` (None if there is none).

        Evictable: no call running or waiting, no open round, idle ``evict_idle_s`` or more.
        Sessions that never opened a round (idle callers) go first, then the idlest: a run
        under way between two rounds is evicted only when no idle caller is left. (A new
        session's memory reserve evicts only sessions that never opened a round.)
        """
        now = time.monotonic()
        idle = [
            (not (s.rounds or s.closed), t, s)
            for s in sessions
            if not s.rounds and (t := s.idle_for(now)) is not None and t >= self.quota.evict_idle_s
        ]
        if not idle:
            return None
        _, t, victim = max(idle, key=lambda entry: entry[:2])
        self._retire(victim.session_id, "evicted: idle while S1's session table was full")
        log.warning("session %s evicted after %.0f s idle", victim.session_id.hex()[:8], t)
        return victim

    def _sweep(self) -> None:
        """Expire idle sessions at most once a second (frees their memory)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + 1.0
            with self._sessions_lock:
                self._expire_idle()

    def _retire(self, session_id: bytes, why: str) -> None:
        """Forget a session for good, remembering its id (bounded) for a clear error."""
        session = self._sessions.pop(session_id, None)
        self.memory.close(session_id)
        owner = _digest(session.secret) if session is not None else b""
        self._retired[session_id] = (why, owner)
        while len(self._retired) > RETIRED_SESSIONS:
            self._retired.popitem(last=False)

    def _expire_idle(self) -> None:
        """Drop sessions idle past ``session_idle_s`` (``round_idle_s`` with an open round)."""
        now = time.monotonic()
        for sid, session in list(self._sessions.items()):
            idle = session.idle_for(now)
            limit = self.quota.round_idle_s if session.rounds else self.quota.session_idle_s
            if idle is not None and idle > limit:
                self._retire(sid, "expired: idle too long")
                log.warning("session %s expired after %.0f s idle", sid.hex()[:8], idle)

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
    """Return the built-in services (SSA, PSR, PSU) bound to ``service``'s key and limits."""
    from flwr_fsl.helper.services.psr import PSRService
    from flwr_fsl.helper.services.psu import PSUService
    from flwr_fsl.helper.services.ssa import SSAService

    return [SSAService(service), PSRService(service), PSUService(service)]
