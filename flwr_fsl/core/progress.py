"""One line per round: what a run is doing, readable with Flower's log turned down to warnings.

The round engine (:meth:`PhasedStrategy.start <flwr_fsl.core.engine.PhasedStrategy.start>`)
and :class:`~flwr_fsl.experiment.Experiment` (for Flower's own strategies) print, after each
round, one line such as::

    round 3/10  advertise>train>unmask  9/10 clients  down 1.21 MB  up 310 kB  acc 0.9123  4.2 s

— the round, the phases that ran, the clients that survived the round of those sampled, the
bytes sent to and received from all clients in the round, the headline metric (the server's
evaluation if there is one, else the clients'), and the round's seconds; a failed round ends
in ``FAILED: <why>``. It is on by default and goes to standard output (so a notebook or
``flwr run --stream`` shows it whatever Flower's log level); turn it off with
``FLWR_FSL_PROGRESS=0`` or per strategy with ``strategy.progress = False``.

Flower-free: the engine passes plain values.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "PROGRESS_ENV",
    "RoundProgress",
    "headline_metric",
    "progress_enabled",
    "report_round",
]

PROGRESS_ENV = "FLWR_FSL_PROGRESS"
"""Environment variable: ``0``, ``false``, ``off`` or ``no`` turns the progress lines off."""

HEADLINE_KEYS = ("accuracy", "acc", "rmse", "loss", "eval-loss", "train-loss")
"""Metric keys shown, first found first (else the record's first key)."""


MAX_PHASES_TEXT = 40
"""Longest phase chain written out; a longer one is summarized (count, first..last)."""


def progress_enabled(setting: bool | None = None) -> bool:
    """Return whether to print progress lines.

    Parameters
    ----------
    setting : bool, optional
        A strategy's own ``progress`` attribute; None defers to :data:`PROGRESS_ENV`
        (default on).
    """
    if setting is not None:
        return bool(setting)
    return os.environ.get(PROGRESS_ENV, "1").strip().lower() not in {"0", "false", "off", "no"}


def headline_metric(*records: Mapping[str, object] | None) -> tuple[str, float] | None:
    """Return the first record's headline ``(key, value)`` (:data:`HEADLINE_KEYS`), or None."""
    for record in records:
        if not record:
            continue
        numbers = {k: v for k, v in record.items() if isinstance(v, int | float)}
        for key in (*HEADLINE_KEYS, *numbers):
            if key in numbers:
                return key, float(numbers[key])
    return None


def _bytes(value: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


@dataclass
class RoundProgress:
    """One round's progress line (:meth:`line`); :meth:`emit` prints it.

    Attributes
    ----------
    server_round, num_rounds : int
        The round and the run's rounds.
    phases : list[str]
        Phases that ran, in order (duplicates dropped).
    sampled, survivors : int or None
        Clients sampled for training, and those left at the round's end (None: unknown).
    down_bytes, up_bytes : float or None
        Bytes sent to and received from all clients in the round (None: not counted).
    metric : tuple[str, float] or None
        The headline metric (:func:`headline_metric`).
    seconds : float or None
        The round's wall time.
    failure : str or None
        Why the round failed.
    """

    server_round: int
    num_rounds: int
    phases: list[str]
    sampled: int | None = None
    survivors: int | None = None
    down_bytes: float | None = None
    up_bytes: float | None = None
    metric: tuple[str, float] | None = None
    seconds: float | None = None
    failure: str | None = None

    @classmethod
    def of_round(
        cls,
        state: object,
        num_rounds: int,
        metrics: Iterable[Mapping[str, object] | None] = (),
        seconds: float | None = None,
    ) -> RoundProgress:
        """Build the line of a round engine's ``RoundState`` (read by attribute).

        Parameters
        ----------
        state : RoundState
            Has ``server_round``, ``sampled``, ``survivors``, ``traffic`` (entries with
            ``phase``, ``down_bytes``, ``up_bytes``) and ``failure``.
        num_rounds : int
            The run's rounds.
        metrics : Iterable[Mapping], optional
            Metric records in order of preference (server evaluation first).
        seconds : float, optional
            The round's wall time.
        """
        traffic = list(getattr(state, "traffic", []))
        phases = list(dict.fromkeys(t.phase for t in traffic if t.down_bytes or t.up_bytes))
        sampled = list(getattr(state, "sampled", []))
        return cls(
            server_round=int(getattr(state, "server_round", 0)),
            num_rounds=num_rounds,
            phases=phases,
            sampled=len(sampled),
            survivors=len(getattr(state, "survivors", [])) if sampled else None,
            down_bytes=float(sum(sum(t.down_bytes.values()) for t in traffic)),
            up_bytes=float(sum(sum(t.up_bytes.values()) for t in traffic)),
            metric=headline_metric(*metrics),
            seconds=seconds,
            failure=getattr(state, "failure", None),
        )

    def line(self) -> str:
        """Return the line (no newline)."""
        parts = [f"round {self.server_round}/{self.num_rounds}"]
        if self.phases:
            chain = ">".join(self.phases)
            if len(chain) > MAX_PHASES_TEXT:  # e.g. SFSL's ten phases
                chain = f"{len(self.phases)} phases {self.phases[0]}..{self.phases[-1]}"
            parts.append(chain)
        if self.sampled:
            parts.append(f"{self.survivors}/{self.sampled} clients")
        if self.down_bytes or self.up_bytes:
            parts.append(
                f"down {_bytes(self.down_bytes or 0.0)}  up {_bytes(self.up_bytes or 0.0)}"
            )
        if self.metric is not None:
            parts.append(f"{self.metric[0]} {self.metric[1]:.4g}")
        if self.seconds is not None:
            parts.append(f"{self.seconds:.1f} s")
        if self.failure:
            reason = self.failure.splitlines()[0] if self.failure.strip() else "failed"
            parts.append(f"FAILED: {reason[:120]}")
        return "  ".join(parts)

    def emit(self, setting: bool | None = None) -> None:
        """Print :meth:`line` to standard output when :func:`progress_enabled`."""
        if progress_enabled(setting):
            print(self.line(), file=sys.stdout, flush=True)


def report_round(
    state: object, num_rounds: int, result: object, began: float, setting: bool | None
) -> None:
    """Print a round engine round's line (metrics from a Flower ``Result``, server's first).

    ``began`` is the round's ``time.time()`` at its start.
    """
    if not progress_enabled(setting):
        return
    seconds = time.time() - began
    rnd = int(getattr(state, "server_round", 0))
    metrics = [
        getattr(result, name, {}).get(rnd)
        for name in (
            "evaluate_metrics_serverapp",
            "evaluate_metrics_clientapp",
            "train_metrics_clientapp",
        )
    ]
    RoundProgress.of_round(state, num_rounds, metrics, seconds).emit(True)
