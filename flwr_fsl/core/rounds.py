"""One server round's state: :class:`RoundState` (sampled, survivors, dropped, traffic, failure).

The round engine (:mod:`flwr_fsl.core.engine`) creates one per round and re-exports it;
:mod:`flwr_fsl.core.replies` fills it as replies are checked. :func:`wait_for_nodes` is the
engine's (and the experiment's) bounded wait for nodes to connect.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from logging import ERROR, INFO, WARNING
from typing import Any

import numpy as np
from flwr.supercore import log
from numpy.typing import NDArray

from flwr_fsl.core.traffic import RoundTraffic

__all__ = ["RoundState", "wait_for_nodes"]

# How long waiting for nodes to connect sleeps before it re-checks.
WAIT_FOR_NODES_S = 1.0


@dataclass
class RoundState:
    """Everything one server round knows about its clients.

    Attributes
    ----------
    server_round : int
        The round number (1-based).
    timeout : float
        Seconds a phase waits for replies (``start``'s ``timeout``).
    sampled : list[int]
        Nodes sampled for training this round.
    survivors : list[int]
        Nodes whose reply to the latest phase was accepted (shrinks phase by phase).
    traffic : list[RoundTraffic]
        Bytes per node, one entry per phase, in the order the phases ran.
    dropped : dict[int, str]
        Node id -> why it left the round (its first reason is kept).
    failure : str or None
        Why the round failed (the model was left unchanged), or None.
    model : dict[str, numpy.ndarray]
        The global model the round started from (what clients' deltas refer to).
    protocol : Any
        The protocol's own per-round object (e.g. the round's ``SSAParams``), or None.
    """

    server_round: int
    timeout: float = 3600.0
    sampled: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    traffic: list[RoundTraffic] = field(default_factory=list)
    dropped: dict[int, str] = field(default_factory=dict)
    failure: str | None = None
    model: dict[str, NDArray[np.generic]] = field(default_factory=dict, repr=False)
    protocol: Any = None
    # phase -> (message type, node -> None) of what was sent, to recognise unsolicited replies.
    _asked: dict[str, tuple[str, set[int]]] = field(default_factory=dict, repr=False)
    # Sent messages' metadata and message id -> destination (error replies' node; replies.py).
    _sent: list[Any] = field(default_factory=list, repr=False)
    _targets: dict[str, int] = field(default_factory=dict, repr=False)

    def phase(self, phase: str) -> RoundTraffic:
        """Return the traffic of ``phase`` (created empty if the phase has not run)."""
        for t in self.traffic:
            if t.phase == phase:
                return t
        traffic = RoundTraffic(self.server_round, phase)
        self.traffic.append(traffic)
        return traffic

    def drop(self, node: int, reason: str) -> None:
        """Remove ``node`` from the round with a logged reason (the first reason is kept)."""
        self.dropped.setdefault(node, reason)
        if node in self.survivors:
            self.survivors.remove(node)
        log(WARNING, "round %s: dropping node %s: %s", self.server_round, node, reason)

    def fail(self, reason: str) -> None:
        """Mark the round failed: its result is discarded and the model stays unchanged."""
        if self.failure is None:
            self.failure = reason
        log(ERROR, "round %s failed (%s); the global model is unchanged", self.server_round, reason)


def wait_for_nodes(grid: Any, count: int, timeout: float) -> list[int]:
    """Return the grid's node ids once ``count`` are connected, or after ``timeout`` seconds.

    A grid whose ``synchronous`` attribute is true (the in-process grid) has all its nodes
    already and is not waited for. The caller decides what too few nodes mean.
    """
    nodes = list(grid.get_node_ids())
    deadline = time.monotonic() + timeout
    while len(nodes) < count and not getattr(grid, "synchronous", False):
        if time.monotonic() >= deadline:
            break
        log(INFO, "Waiting for nodes to connect: %d of %d", len(nodes), count)
        time.sleep(WAIT_FOR_NODES_S)
        nodes = list(grid.get_node_ids())
    return nodes
