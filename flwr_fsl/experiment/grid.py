"""The harness's measurements: bytes per round from a traffic log, a grid that times its calls."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from flwr_fsl.core.progress import RoundProgress, headline_metric
from flwr_fsl.core.traffic import RoundTraffic
from flwr_fsl.experiment.records import EVALUATE_PHASE, PhaseBytes, _mean

__all__ = ["round_bytes"]


# -- traffic ----------------------------------------------------------------------------------
def round_bytes(
    traffic: Iterable[RoundTraffic], server_round: int
) -> tuple[dict[str, PhaseBytes], int, float | None, float | None]:
    """Summarize one round of a strategy's traffic log.

    Parameters
    ----------
    traffic : Iterable[RoundTraffic]
        The strategy's ``traffic`` (several entries of one phase and round are added up;
        entries that moved no bytes are left out).
    server_round : int
        The round.

    Returns
    -------
    tuple
        ``(phases, clients, down, up)``: per phase the node count and mean bytes; the nodes
        sent a message in a training phase (every phase but ``"evaluate"``); and the training
        phases' bytes per client — down averaged over those nodes, up over the nodes that
        replied in a training phase (None for both when the round has no training phase).
    """
    per_phase: dict[str, tuple[Counter[int], Counter[int]]] = {}
    for t in traffic:
        if t.server_round != server_round or not (t.down_bytes or t.up_bytes):
            continue  # another round, or a phase that sent nothing (e.g. no evaluation)
        down, up = per_phase.setdefault(t.phase, (Counter(), Counter()))
        down.update(t.down_bytes)  # adds bytes per node
        up.update(t.up_bytes)
    phases = {
        name: PhaseBytes(len(down), _mean(down.values()) or 0.0, _mean(up.values()) or 0.0)
        for name, (down, up) in per_phase.items()
    }
    train_down: Counter[int] = Counter()
    train_up: Counter[int] = Counter()
    for name, (down, up) in per_phase.items():
        if name != EVALUATE_PHASE:
            train_down.update(down)
            train_up.update(up)
    if not train_down and not train_up:
        return phases, 0, None, None
    return phases, len(train_down), _mean(train_down.values()) or 0.0, _mean(train_up.values())


# -- instrumentation --------------------------------------------------------------------------
class _RoundClock:
    """Round boundaries from ``evaluate_fn`` calls; grid time accumulated per round.

    With ``progress_rounds`` set (a strategy whose rounds print no progress line of their
    own: Flower's ``FedAvg`` and kin), each round's line is printed here
    (:mod:`flwr_fsl.core.progress`: round, server metric, seconds).
    """

    def __init__(self, initial: ArrayRecord, progress_rounds: int | None = None) -> None:
        self.progress_rounds = progress_rounds
        self.boundary = time.perf_counter()
        self.grid = 0.0
        self.previous: ArrayRecord = initial
        self.seconds: dict[int, float] = {}
        self.grid_seconds: dict[int, float] = {}
        self.eval_seconds: dict[int, float] = {}
        self.changed: dict[int, bool] = {}

    def wrap(
        self, evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None
    ) -> Callable[[int, ArrayRecord], MetricRecord | None]:
        def timed_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            entered = time.perf_counter()
            if server_round > 0:
                self.seconds[server_round] = entered - self.boundary
                self.grid_seconds[server_round] = self.grid
                # Flower's loop passes the same object on when a round aggregated nothing.
                self.changed[server_round] = arrays is not self.previous
            self.previous = arrays
            metrics = None
            try:
                metrics = evaluate_fn(server_round, arrays) if evaluate_fn is not None else None
                return metrics
            finally:
                self.boundary = time.perf_counter()
                self.grid = 0.0
                if server_round > 0:
                    self.eval_seconds[server_round] = self.boundary - entered
                    if self.progress_rounds is not None:
                        RoundProgress(
                            server_round, self.progress_rounds, [],
                            metric=headline_metric(metrics),
                            seconds=self.seconds[server_round] + self.eval_seconds[server_round],
                        ).emit()  # fmt: skip

        return timed_evaluate


class _MeteredGrid(Grid):
    """A grid that forwards everything to another and adds the time spent in it to a clock."""

    def __init__(self, inner: Grid, clock: _RoundClock) -> None:
        self._inner, self._clock = inner, clock

    def _timed(self, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return call()
        finally:
            self._clock.grid += time.perf_counter() - started

    def set_run(self, run: Run) -> None:
        """Forward to the wrapped grid."""
        self._inner.set_run(run)

    @property
    def run(self) -> Run:
        """The wrapped grid's run."""
        return self._inner.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Forward to the wrapped grid."""
        return self._inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """Forward to the wrapped grid (timed: a real grid may wait for nodes)."""
        return list(self._timed(lambda: list(self._inner.get_node_ids())))

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Forward to the wrapped grid (timed)."""
        return list(self._timed(lambda: list(self._inner.push_messages(messages))))

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Forward to the wrapped grid (timed)."""
        return list(self._timed(lambda: list(self._inner.pull_messages(message_ids))))

    @property
    def synchronous(self) -> bool:
        """Whether the wrapped grid has every reply as soon as it pushed the messages."""
        return bool(getattr(self._inner, "synchronous", False))

    @property
    def pull_interval(self) -> float:
        """The wrapped grid's pause between pulls."""
        return float(getattr(self._inner, "pull_interval", 0.1))

    def pause(self, seconds: float) -> None:
        """Wait between pulls for replies (timed: it is time spent waiting for the grid)."""
        self._timed(lambda: time.sleep(seconds))

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Forward to the wrapped grid (timed)."""
        return list(
            self._timed(lambda: list(self._inner.send_and_receive(messages, timeout=timeout)))
        )
