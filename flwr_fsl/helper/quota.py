"""What all callers of S1 together, and each session, may hold: S1's memory, sessions and calls.

:class:`~flwr_fsl.helper.limits.HelperLimits` bounds what *one round* may cost. A token holder
(any run's S0) can still open many rounds in many sessions, or keep S1's threads busy, so
:class:`ServiceLimits` bounds what *every caller together* may hold, and what each session may
take of it:

* **Memory** (:class:`MemoryLedger`). S1 accounts its big allocations before making them, per
  session: each open round's share, hashing table and evaluation buffers (the round's
  :func:`~flwr_fsl.helper.limits.round_words`, with its PSR table once ``SetModel`` set one),
  the U-DPF keys of a round's accepted clients (:func:`key_bytes` each) and the keys the
  session stores across rounds, and every call's request while it runs (twice its size: the
  bytes and what is decoded from them). A charge that would take the session past
  ``max_session_bytes`` (``--max-session-mib``) or S1 past ``max_memory_bytes``
  (``--max-memory-mib``) is refused before the allocation with
  :class:`~flwr_fsl.helper.errors.HelperResourceError` (gRPC ``RESOURCE_EXHAUSTED``) naming
  the flag. Every open session is guaranteed ``session_reserve_bytes``
  (``--session-reserve-mib``): S1 counts ``max(used, reserve)`` per session against its
  budget, and opens a new session only if its reserve still fits, so a flood of rounds in
  other sessions never takes away what an open session needs for rounds up to its reserve.
* **Sessions.** At most ``max_sessions`` (``--max-sessions``) at once, at most
  ``max_sessions_per_peer`` (``--max-sessions-per-peer``) from one network address. A session
  without a call for ``session_idle_s`` (``--session-idle-s``, default 5 minutes) is dropped;
  one with an open round keeps up to ``round_idle_s`` (``--round-idle-s``, default 1 hour)
  since its last call, so a run whose clients train for a while keeps its round. When the
  table (or the peer's share) is full, a new session evicts an *idle* session — no call
  running, no open round, idle for at least ``evict_idle_s`` (``--evict-idle-s``) — one that
  never opened a round first, else the idlest — so idle callers cannot lock new runs out; a
  new session whose memory reserve does not fit evicts only sessions that never opened a
  round (never a run under way). An evicted run's S0 gets
  :class:`~flwr_fsl.helper.errors.HelperSessionLostError` and opens a new session.
* **Calls.** A session runs one call at a time (its lock) and queues at most
  ``max_calls_per_session - 1`` more (``--max-calls-per-session``); a call beyond is refused
  at once. The gRPC server gets a thread for every call that may run or queue, plus
  :data:`RESERVED_THREADS` that only session-less calls (``Health``, ``PublicKey``) can find
  free, so a long ``AddClients`` in any number of sessions never delays ``Health``; calls of
  different sessions run side by side (the operating system shares the cores), so no
  session's long call holds up another session's.

What stays possible: a token holder that keeps sessions *busy* (a call always running or a
round open and called) holds them, within ``max_sessions_per_peer`` per address and its
sessions' memory; it slows other runs (shared cores) but cannot make S1 refuse an open
session's round that fits the reserve, nor grow S1 past ``max_memory_bytes``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from dataclasses import dataclass, fields

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.ssa.protocol import SSAParams
from flwr_fsl.helper.errors import HelperResourceError

__all__ = ["RESERVED_THREADS", "MemoryLedger", "ServiceLimits", "key_bytes"]

RESERVED_THREADS = 2
"""gRPC threads beyond every session call's: only session-less calls (``Health``) find them."""

_MIB = 1 << 20
_GIB = 1 << 30


def _mib(n: int) -> str:
    return f"{n / _MIB:,.1f} MiB"


def key_bytes(params: SSAParams) -> int:
    """Upper bound of the bytes one client's stored DPF key batch takes on S1.

    Per key: a root seed (16 bytes), one correction word per level (a 16-byte seed and two
    control bits, stored as 8 bytes each; at most ``ceil(log2 m) + 1`` levels), the final
    correction word (``key_tau`` words) and, in a checked round, the 64-byte proof word; plus
    a fixed 4 KiB per batch for the arrays' headers. Checked against real batches in
    ``tests/helper/test_helper_quota.py``.
    """
    levels = max(1, math.ceil(math.log2(max(params.domain_size, 2)))) + 1
    per_key = 16 + 32 * levels + 8 * params.key_tau + (64 if params.verify else 0)
    return params.num_keys * per_key + 4096


@dataclass(frozen=True)
class ServiceLimits:
    """What all sessions together, and each one, may hold of S1 (module docstring).

    Parameters
    ----------
    max_memory_bytes : int (default: 8 GiB)
        S1's memory budget over all sessions (``--max-memory-mib``).
    max_session_bytes : int (default: 2 GiB)
        What one session may hold (``--max-session-mib``); at least the largest round
        (:attr:`HelperLimits.max_round_bytes <flwr_fsl.helper.limits.HelperLimits>`).
    session_reserve_bytes : int (default: 64 MiB)
        Memory guaranteed to every open session (``--session-reserve-mib``); the defaults
        keep half the budget for reserves of a full table (64 x 64 MiB), half shared.
    max_sessions : int (default: 64)
        Sessions at once (``--max-sessions``).
    max_sessions_per_peer : int (default: 16)
        Sessions at once from one network address (``--max-sessions-per-peer``); at most
        ``max_sessions`` (a larger value is lowered to it).
    max_open_rounds : int (default: 4)
        Rounds open at once in one session (``--max-open-rounds``).
    max_calls_per_session : int (default: 2)
        Calls of one session running or queued at once (``--max-calls-per-session``).
    session_idle_s : float (default: 300)
        A session without a call for this long, and without an open round, is dropped
        (``--session-idle-s``).
    round_idle_s : float (default: 3600)
        A session with an open round is dropped after this long without a call
        (``--round-idle-s``); at least ``session_idle_s`` (a smaller value is raised to it).
    evict_idle_s : float (default: 30)
        A session idle this long (no call running, no open round) may be evicted for a new
        one when the table is full (``--evict-idle-s``); at most ``session_idle_s`` (a larger
        value is lowered to it).

    Raises
    ------
    ConfigurationError
        If a value is out of range (naming the field), or the reserve exceeds the session
        limit or the session limit the budget.
    """

    max_memory_bytes: int = 8 * _GIB
    max_session_bytes: int = 2 * _GIB
    session_reserve_bytes: int = 64 * _MIB
    max_sessions: int = 64
    max_sessions_per_peer: int = 16
    max_open_rounds: int = 4
    max_calls_per_session: int = 2
    session_idle_s: float = 300.0
    round_idle_s: float = 3600.0
    evict_idle_s: float = 30.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s"):
                ok = not isinstance(value, bool) and isinstance(value, int | float)
                if not (ok and math.isfinite(value) and value > 0):
                    raise ConfigurationError(f"{f.name} must be a finite number > 0, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 62:
                raise ConfigurationError(
                    f"{f.name} must be an integer in [1, 2**62], got {value!r}"
                )
        # Lowering one setting alone works: these follow it (documented per field).
        object.__setattr__(
            self, "max_sessions_per_peer", min(self.max_sessions_per_peer, self.max_sessions)
        )
        object.__setattr__(self, "round_idle_s", max(self.round_idle_s, self.session_idle_s))
        object.__setattr__(self, "evict_idle_s", min(self.evict_idle_s, self.session_idle_s))
        for small, large in (
            ("session_reserve_bytes", "max_session_bytes"),
            ("max_session_bytes", "max_memory_bytes"),
        ):
            if getattr(self, small) > getattr(self, large):
                raise ConfigurationError(
                    f"{small} ({getattr(self, small)}) must not exceed {large} "
                    f"({getattr(self, large)})"
                )

    @property
    def call_threads(self) -> int:
        """Threads for every session call that may run or queue at once."""
        return self.max_sessions * self.max_calls_per_session


class MemoryLedger:
    """S1's account of the memory each session holds, checked before every big allocation.

    Thread-safe. Charges are keyed per session (``("round", 3)``, ``("stored-keys",)``, a
    call's request); :meth:`charge` sets one (replacing its old amount), :meth:`release`
    drops it, :meth:`close` drops a session's all. S1 counts ``max(used, reserve)`` per
    session against ``max_memory_bytes``.

    Parameters
    ----------
    limits : ServiceLimits
        The budget, the per-session cap and the reserve.
    """

    def __init__(self, limits: ServiceLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._charges: dict[bytes, dict[Hashable, int]] = {}
        self._used: dict[bytes, int] = {}
        self._reserved = 0  # sum over sessions of max(used, reserve)

    def _floor(self, used: int) -> int:
        return max(used, self.limits.session_reserve_bytes)

    def open(self, session_id: bytes) -> None:
        """Reserve a new session's guaranteed memory.

        Raises
        ------
        HelperResourceError
            If the reserve does not fit S1's budget beside the other sessions'.
        """
        with self._lock:
            reserve = self.limits.session_reserve_bytes
            if self._reserved + reserve > self.limits.max_memory_bytes:
                raise HelperResourceError(
                    f"S1's memory budget is taken: {len(self._used)} sessions hold or reserve "
                    f"{_mib(self._reserved)} of {_mib(self.limits.max_memory_bytes)}, no room "
                    f"for a new session's {_mib(reserve)} (flwr-fsl-helper --max-memory-mib, "
                    "--session-reserve-mib)"
                )
            self._charges[session_id] = {}
            self._used[session_id] = 0
            self._reserved += reserve

    def charge(
        self, session_id: bytes, key: Hashable, nbytes: int, what: str, *, check: bool = True
    ) -> None:
        """Set a session's charge ``key`` to ``nbytes``, refusing it if it does not fit.

        Parameters
        ----------
        session_id : bytes
            The session (opened with :meth:`open`).
        key : hashable
            What the charge is for, within the session.
        nbytes : int
            Its new amount (replacing the old one).
        what : str
            For the message.
        check : bool
            False: record without refusing (memory that already exists, moved between keys).

        Raises
        ------
        HelperResourceError
            If the session would exceed ``max_session_bytes`` or S1 ``max_memory_bytes``;
            nothing is charged then.
        """
        with self._lock:
            charges = self._charges.get(session_id)
            if charges is None:
                return  # a retired session: what it held is gone with it
            used = self._used[session_id]
            new_used = used - charges.get(key, 0) + nbytes
            reserved = self._reserved - self._floor(used) + self._floor(new_used)
            limits = self.limits
            if check and new_used > used:
                if new_used > limits.max_session_bytes:
                    raise HelperResourceError(
                        f"{what} would bring this session to {_mib(new_used)} on S1, over its "
                        f"per-session limit {_mib(limits.max_session_bytes)} "
                        "(flwr-fsl-helper --max-session-mib): finish or abort a round first"
                    )
                if reserved > limits.max_memory_bytes:
                    raise HelperResourceError(
                        f"{what} needs {_mib(nbytes)}, but S1's memory budget "
                        f"{_mib(limits.max_memory_bytes)} is taken ({_mib(self._reserved)} held "
                        "or reserved by open sessions; flwr-fsl-helper --max-memory-mib)"
                    )
            charges[key] = nbytes
            self._used[session_id] = new_used
            self._reserved = reserved

    def release(self, session_id: bytes, key: Hashable) -> None:
        """Drop a session's charge ``key`` (nothing if it has none)."""
        self.charge(session_id, key, 0, "", check=False)
        with self._lock:
            charges = self._charges.get(session_id)
            if charges is not None:
                charges.pop(key, None)

    def close(self, session_id: bytes) -> None:
        """Drop a session's charges and its reserve."""
        with self._lock:
            if self._charges.pop(session_id, None) is None:
                return
            self._reserved -= self._floor(self._used.pop(session_id))

    def used(self, session_id: bytes | None = None) -> int:
        """Return the bytes a session holds (all sessions with None)."""
        with self._lock:
            if session_id is None:
                return sum(self._used.values())
            return self._used.get(session_id, 0)

    def reserved(self) -> int:
        """Return what S1 counts against its budget: ``sum(max(used, reserve))``."""
        with self._lock:
            return self._reserved
