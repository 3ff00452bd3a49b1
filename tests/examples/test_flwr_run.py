"""Real ``flwr run``s on a tiny setting (Ray simulation): topk-mnist, secagg-mnist, width-mnist.

The module starts its own local SuperLink (simulation mode, free ports, ``FLWR_HOME`` in a
temporary folder) exactly as ``flwr run ... local`` would; each test submits its app with
``--format json``, polls ``flwr ls`` until the run is ``finished:completed`` (``--stream``
exits 0 even when the ServerApp crashes, so the exit code alone proves nothing), checks the
printed comparison table with ``flwr log``; the SuperLink stops after the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.flwr_cli import RAY_SIMULATION, run_until_finished, simulation_superlink

pytestmark = RAY_SIMULATION  # one Ray boot at a time under xdist (tests/flwr_cli.py)

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "examples" / "topk-mnist"
RUN_TIMEOUT_S = 150.0


@pytest.fixture(scope="module")
def superlink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Start a local simulation SuperLink on free ports; yield the env for the flwr CLI.

    One for the module: the runs are submitted one after another, each its own run (and Ray
    cluster) on it, as ``flwr run ... local`` reuses a running SuperLink.
    """
    with simulation_superlink(tmp_path_factory.mktemp("flwr-run") / "flwr-home") as env:
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


SECAGG_APP = REPO / "examples" / "secagg-mnist"
# SecAgg's 24-bit fixed point after one round; a wrong aggregate (a client missing, unweighted
# averaging) differs by far more than this.
SECAGG_ATOL = 1e-5


def test_flwr_run_secagg_mnist_equals_flower_fedavg(
    superlink: dict[str, str], tmp_path: Path
) -> None:
    """``SecAggFedAvg`` under Flower's simulation engine (Ray): same model as Flower ``FedAvg``.

    The app trains Flower's own ``FedAvg`` and then ``SecAggFedAvg`` from the same initial
    model on the same clients (``compare-fedavg``) and saves both final models.
    """
    results = tmp_path / "results"
    run_id, status, logs = run_until_finished(
        superlink,
        "local",
        [
            str(SECAGG_APP),
            "local",
            "--run-config",
            "num-server-rounds=1 max-client-samples=200 test-size=500 fraction-train=1.0 "
            f"min-nodes=3 compare-fedavg=true results-dir='{results}'",
            "--federation-config",
            "num-supernodes=3 client-resources-num-cpus=1",
        ],
        RUN_TIMEOUT_S,
    )
    assert status == "finished:completed", f"run {run_id} ended as {status!r}:\n{logs[-4000:]}"
    fedavg = np.load(results / "global-model-fedavg.npz")
    secagg = np.load(results / "global-model-secagg.npz")
    assert sorted(fedavg.files) == sorted(secagg.files)
    moved = 0.0
    for name in fedavg.files:
        np.testing.assert_allclose(secagg[name], fedavg[name], rtol=0, atol=SECAGG_ATOL)
        moved = max(moved, float(np.max(np.abs(fedavg[name]))))
    assert moved > 0, "the models are empty"


WIDTH_APP = REPO / "examples" / "width-mnist"


def test_flwr_run_width_mnist_sesa_and_fedavg_twin(
    superlink: dict[str, str], tmp_path: Path
) -> None:
    """width-mnist under Ray: Flower's ``FedAvg``, ``full`` and SESA's four phases complete.

    Six SuperNodes, all sampled: SESA with ``T = 1`` needs ``K + T = 5`` of them (four shards
    per layer). ``full`` (``WidthFedAvg`` at rate 1) must equal Flower's ``FedAvg``; the SESA
    model must have moved from the initial one.
    """
    results = tmp_path / "results"
    run_id, status, logs = run_until_finished(
        superlink,
        "local",
        [
            str(WIDTH_APP),
            "local",
            "--run-config",
            "num-server-rounds=1 max-client-samples=32 test-size=300 fraction-train=1.0 "
            f"sesa-privacy=1 arms='fedavg,full,sesa' results-dir='{results}'",
            "--federation-config",
            "num-supernodes=6 client-resources-num-cpus=1",
        ],
        RUN_TIMEOUT_S,
    )
    assert status == "finished:completed", f"run {run_id} ended as {status!r}:\n{logs[-4000:]}"
    # The progress line (quiet log by default): SESA's four phases over 6 of 6 clients.
    assert "round 1/1  advertise>offline>train>decode  6/6 clients" in logs, logs[-4000:]
    fedavg = np.load(results / "global-model-fedavg.npz")
    full = np.load(results / "global-model-full.npz")
    sesa = np.load(results / "global-model-sesa.npz")
    for name in fedavg.files:
        np.testing.assert_allclose(full[name], fedavg[name], rtol=0, atol=1e-6)
        assert np.all(np.isfinite(sesa[name]))
    assert max(float(np.max(np.abs(sesa[n] - fedavg[n]))) for n in fedavg.files) > 0
