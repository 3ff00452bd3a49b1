"""One real ``flwr run`` of ``examples/topk-mnist`` on a tiny setting (Ray simulation).

The test starts its own local SuperLink (simulation mode, free ports, ``FLWR_HOME`` in a
temporary folder) exactly as ``flwr run ... local`` would, submits the app with
``--format json``, polls ``flwr ls`` until the run is ``finished:completed`` (``--stream``
exits 0 even when the ServerApp crashes, so the exit code alone proves nothing), checks the
printed comparison table with ``flwr log``, and stops the SuperLink it started.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flwr_fsl.data import cache_dir
from tests.flwr_cli import BIN, exe, free_port, healthy, run_until_finished, stop
from tests.prepared_data import require_prepared

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "examples" / "topk-mnist"
RUN_TIMEOUT_S = 150.0


@pytest.fixture
def superlink(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Start a local simulation SuperLink on free ports; yield the env for the flwr CLI."""
    require_prepared("mnist")
    http_port = free_port()  # Runtime, Control and Fleet HTTP APIs share it in Flower 1.41
    env = dict(os.environ)
    env.update(
        {
            "FLWR_HOME": str(tmp_path / "flwr-home"),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(http_port),
            "FLWR_FSL_CACHE": str(cache_dir()),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
    )
    home = Path(env["FLWR_HOME"])
    home.mkdir()
    log_file = home / "superlink.log"
    # The command `flwr run ... local` uses to start its managed SuperLink (minus the
    # deprecated --control-api-address).
    cmd = [
        exe("flower-superlink"),
        "--insecure",
        "--simulation",
        "--isolation",
        "subprocess",
        "--host",
        "127.0.0.1",
        "--port",
        str(http_port),
        "--database",
        str(home / "state.db"),
        "--log-file",
        str(log_file),
    ]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the simulation children stop with it
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"flower-superlink exited with {proc.returncode}; see {log_file}")
            if healthy(http_port):
                break
            if time.monotonic() > deadline:
                pytest.fail(f"flower-superlink was not healthy within 30 s; see {log_file}")
            time.sleep(0.2)
        yield env
    finally:
        stop(proc)


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
