"""Shared pytest settings: hypothesis profiles (CI runs the default, bounded one), log levels.

Scripts that tests run in-process (benchmarks, example tools) may quieten Flower's loggers; the
autouse fixture puts every logger level back after each test, so a test that reads INFO lines
does not depend on which test ran before it. A collection hook keeps pytest-xdist's
``--dist loadgroup`` groups (``make test``) working under pytest 9.
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


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook has suffixed the ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Carry pytest-xdist's ``@<group>`` id suffix over to the id pytest 9 reads.

    Under ``--dist loadgroup`` pytest-xdist (3.8) marks each ``xdist_group`` test by setting
    ``item._nodeid`` to its id plus ``@<group>``, and schedules tests by that suffix. pytest 9
    reads a node's id from ``item._id`` instead, so the suffix was lost: every grouped test was
    scheduled alone, and the Ray tests of ``tests.flwr_cli.RAY_SIMULATION`` could run on both
    workers at once. Nothing changes where no suffix was set or where pytest reads ``_nodeid``.
    """
    for item in items:
        suffixed = getattr(item, "_nodeid", None)
        if isinstance(suffixed, str) and "@" in suffixed and suffixed != item.nodeid:
            from _pytest.nodeid import NodeId  # pytest 9; older pytest never gets here

            item._id = NodeId.parse(suffixed)


@pytest.fixture
def field_limbs_on_cpu(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """Send every ``F_p`` product down the GPU path (``kernels.gpu.field_limb_matmul``) with
    torch's CPU GEMMs; returns the list each such product's ``(m, k, n)`` is appended to."""
    torch = pytest.importorskip("torch")
    from flwr_fsl.kernels import gpu

    calls: list[tuple[int, int, int]] = []
    real = gpu.field_limb_matmul

    def counted(a: object, b: object, p: int, device: object) -> object:
        calls.append((a.shape[0], a.shape[1], b.shape[1]))  # type: ignore[attr-defined]
        return real(a, b, p, device)  # type: ignore[arg-type]

    monkeypatch.setattr(gpu, "field_limb_matmul", counted)
    monkeypatch.setattr(gpu, "GPU_MIN_MACS", 0)
    monkeypatch.setattr(gpu, "MIN_INTENSITY", 0)
    monkeypatch.setattr(gpu._STATE, "setting", "cuda")
    monkeypatch.setattr(gpu._STATE, "device", torch.device("cpu"))
    return calls
