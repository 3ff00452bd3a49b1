"""One real ``flwr run`` of ``examples/topk-mnist`` on a tiny setting (Ray simulation).

The test starts its own local SuperLink (simulation mode, free ports, ``FLWR_HOME`` in a
temporary folder) exactly as ``flwr run ... local`` would, submits the app with
``--format json``, polls ``flwr ls`` until the run is ``finished:completed`` (``--stream``
exits 0 even when the ServerApp crashes, so the exit code alone proves nothing), checks the
printed comparison table with ``flwr log``, and stops the SuperLink it started.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.flwr_cli import run_until_finished, simulation_superlink

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "examples" / "topk-mnist"
RUN_TIMEOUT_S = 150.0


@pytest.fixture
def superlink(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Start a local simulation SuperLink on free ports; yield the env for the flwr CLI."""
    with simulation_superlink(tmp_path / "flwr-home") as env:
        yield env


def test_flwr_run_topk_mnist_completes(superlink: dict[str, str]) -> None:
    env = superlink
    run_id, status, logs = run_until_finished(
        env,
        "local",
        [
            str(APP),
            "local",
            "--run-config",
            "num-server-rounds=1 max-client-samples=300 test-size=500 "
            "fraction-train=1.0 fraction-evaluate=1.0",
            "--federation-config",
            "num-supernodes=2 client-resources-num-cpus=1",
        ],
        RUN_TIMEOUT_S,
    )
    assert status == "finished:completed", f"run {run_id} ended as {status!r}:\n{logs[-4000:]}"
    # The ServerApp printed its dense vs top-k comparison table.
    assert "final acc %" in logs and "dense" in logs and "top-k 10% EF" in logs, logs[-4000:]
