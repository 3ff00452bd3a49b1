"""Replay detection across rounds: a SecAgg reply seen in an earlier round drops its client.

Every SecAgg reply a client makes is fresh random bytes each round (new key pairs, new Shamir
polynomials, new masks), so the same bytes twice mean a replay: a network or client fault
that re-sends an earlier round's reply. :class:`ReplayGuard` remembers a SHA-256 digest of
every share bundle, masked input and unmask reply of the last ``keep`` rounds and refuses a
repeat with :class:`~flwr_fsl.families.secagg.messages.SecAggError` — the round engine then
drops that client at that phase with the reason, before anything of it is used (a masked
input is refused before it enters the sum). A replay that is *changed* (re-sealed,
re-tagged, shifted) is not caught here: its shares do not open for their recipients (blamed
on the sender) or its masked input unmasks to words outside the sum's plausibility bounds
(the round fails), since masks are bound to the round.

A masked input is remembered by :func:`fingerprint`: its length and its first and last 512
words, not all of it (hashing every 8 MB input cost a third of the server's time at
``L = 1M``, issue 26). Its words are uniform under the masks, so two inputs that agree there
are a replay; one changed only elsewhere is a *changed* replay, handled as above.

Memory: 32 bytes per client and phase per remembered round.
"""

from __future__ import annotations

import hashlib
import struct
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.secagg.messages import SecAggError

__all__ = ["ReplayGuard", "fingerprint"]

_EDGE_WORDS = 512


def fingerprint(words: NDArray[np.uint64]) -> bytes:
    """Return a masked input's length and its first and last 512 words (module docstring)."""
    flat = np.ascontiguousarray(words).reshape(-1)
    head = flat[:_EDGE_WORDS].tobytes()
    tail = flat[-_EDGE_WORDS:].tobytes() if flat.size > _EDGE_WORDS else b""
    return struct.pack("<Q", flat.size) + head + tail


@dataclass
class ReplayGuard:
    """Digests of the SecAgg replies of recent rounds (module docstring); one per strategy.

    Parameters
    ----------
    keep : int
        Rounds remembered besides the current one (default 8).

    Raises
    ------
    ConfigurationError
        If ``keep`` is not a positive int.
    """

    keep: int = 8
    _earlier: deque[set[bytes]] = field(default_factory=deque, repr=False)
    _current: set[bytes] = field(default_factory=set, repr=False)
    _round: tuple[bytes, int] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise ConfigurationError(f"ReplayGuard keep must be an int >= 1, got {self.keep!r}")

    def check(self, session: bytes, round_id: int, what: str, data: bytes) -> None:
        """Refuse ``data`` if a reply of an earlier round had the same bytes; remember it.

        Parameters
        ----------
        session, round_id : bytes, int
            The round (a new one moves the current round's digests to the remembered ones).
        what : str
            The kind of reply (``"shares"``, ``"masked input"``, ``"unmask"``).
        data : bytes
            The reply's bytes.

        Raises
        ------
        SecAggError
            If the same bytes came in an earlier round.
        """
        key = (session, round_id)
        if key != self._round:
            if self._round is not None:
                self._earlier.append(self._current)
                while len(self._earlier) > self.keep:
                    self._earlier.popleft()
            self._round, self._current = key, set()
        digest = hashlib.sha256(what.encode() + b"\x00" + data).digest()
        if any(digest in earlier for earlier in self._earlier):
            raise SecAggError(f"the {what} is a replay of an earlier round's reply")
        self._current.add(digest)
