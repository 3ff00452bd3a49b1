"""Shared pytest settings: hypothesis profiles (CI runs the default, bounded one), log levels.

Scripts that tests run in-process (benchmarks, example tools) may quieten Flower's loggers; the
autouse fixture puts every logger level back after each test, so a test that reads INFO lines
does not depend on which test ran before it.
"""

import logging
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("thorough", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

_LOGGERS = ("flwr", "flwr_fsl", "ray")


@pytest.fixture(autouse=True)
def _restore_log_levels() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels, strict=True):
        logger.setLevel(level)
