"""Quiet by default: Flower's and Ray's loggers at warnings unless the run config asks.

A tiny run printed 75 to 830 log lines, mostly Flower's per-round INFO lines; with them at
``warning`` what is left is the progress view (one line per round,
:mod:`flwr_fsl.core.progress`), the tables, and real warnings. The run-config key
``log-level`` (``debug``, ``info``, ``warning``, ``error``; the examples default to
``warning``) asks for more::

    flwr run examples/topk-mnist --run-config "log-level='info'"
    python -m flwr_fsl.testing.local examples/topk-mnist --verbose

:class:`~flwr_fsl.experiment.Experiment` applies it for the length of its run (and puts the
previous levels back); an app of one's own may use :func:`flower_log_level` the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from flwr_fsl.core.checks import check_choice

__all__ = ["LOGGERS", "LOG_LEVELS", "LOG_LEVEL_KEY", "flower_log_level", "log_level"]

LOG_LEVEL_KEY = "log-level"
LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
LOGGERS = ("flwr", "ray")
"""The loggers set: Flower's (its strategies' per-round lines) and Ray's."""


def log_level(run_config: Mapping[str, Any], default: str | None = None) -> int | None:
    """Return the level the run config's ``log-level`` asks for (``default`` when absent).

    Raises
    ------
    ConfigurationError
        If ``log-level`` is not one of :data:`LOG_LEVELS` (naming the key).
    """
    value = run_config.get(LOG_LEVEL_KEY, default)
    if value is None:
        return None
    name = value.strip().lower() if isinstance(value, str) else value
    return LOG_LEVELS[check_choice(LOG_LEVEL_KEY, name, LOG_LEVELS)]


@contextmanager
def flower_log_level(run_config: Mapping[str, Any], default: str | None = None) -> Iterator[None]:
    """Set :data:`LOGGERS` to the run config's ``log-level`` inside the block, then restore.

    Without the key (and no ``default``) nothing changes. The key is checked on entry
    (:class:`~flwr_fsl.core.errors.ConfigurationError` naming it), before anything runs.
    """
    level = log_level(run_config, default)
    loggers = [logging.getLogger(name) for name in LOGGERS]
    previous = [logger.level for logger in loggers]
    try:
        if level is not None:
            for logger in loggers:
                logger.setLevel(level)
        yield
    finally:
        for logger, old in zip(loggers, previous, strict=True):
            logger.setLevel(old)
