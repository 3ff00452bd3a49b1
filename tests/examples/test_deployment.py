"""Two example apps on Flower's deployment engine: real SuperLink and SuperNode processes.

A fixture helper starts, on free loopback ports and in a temporary ``FLWR_HOME``:

- optionally ``flwr-fsl-helper`` (S1) with a fresh key pair (its printed fingerprint is pinned)
  and the access token it generates on first start (S0 gets its file as
  ``ssa-helper-token-file``, as an operator would pass it), and ``--enrollment`` listing one
  fresh Ed25519 signing key per SuperNode (``flwr-fsl-identity --generate`` makes each and
  prints its line),
- ``flower-superlink --insecure`` (the ServerApp runs under it),
- N ``flower-supernode --insecure`` with ``partition-id=i num-partitions=N`` (and, with S1,
  ``fsl-signing-key=<its key file>``),

and a ``deploy`` federation in ``config.toml``. Each test submits an app with ``flwr run ...
deploy --format json`` (2 rounds, every node trains each round, tiny data), polls ``flwr ls``
until the run is ``finished:completed`` (``--stream`` exits 0 even when the ServerApp
crashes), and checks the final global model the run saved against a plaintext reference
recomputed here with the example's own ClientApp on an in-process grid with the same node
configs. Every process is stopped (its whole process group) even when the test fails.

- ``examples/dpf-ssa-mnist`` with S1 and two SuperNodes: equal to plaintext top-k
  ``FedSubAvg`` up to the fixed-point rounding of the secure sum.
- ``examples/secagg-mnist`` (``SecAggFedAvg`` + ``secagg_mod``, no helper) with three
  SuperNodes: each round's four SecAgg phases (advertise, share, masked train, unmask) cross
  the SuperLink, the client's round secrets live in the SuperNode's ``Context.state`` between
  ``flwr-clientapp`` processes, and the final model equals Flower ``FedAvg``'s on the same
  clients up to SecAgg's fixed point. It is in the default suite although it takes about
  2.5 minutes on two shared cores (every one of the 8 phases starts a ``flwr-clientapp``
  process per SuperNode): it is the only check that SecAgg's per-round client secrets survive
  between ``flwr-clientapp`` processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flwr_fsl.data import cache_dir
from flwr_fsl.experiment import load_experiment
from tests.flwr_cli import (
    BIN,
    exe,
    healthy,
    run_until_finished,
    start_on_free_port,
    start_on_free_ports,
    stop,
)
from tests.prepared_data import require_prepared

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "examples" / "dpf-ssa-mnist"
SECAGG_APP = REPO / "examples" / "secagg-mnist"
# Waits, not assertions on time: a healthy run returns as soon as it finishes. The SecAgg run
# takes about 150 s on two quiet shared cores (8 phases, each a flwr-clientapp process per
# SuperNode); at load 15-25 it ran past the old 240 s and failed with an empty status. Both
# waits now leave 6x headroom over a quiet machine; only a run that hangs waits them out.
START_TIMEOUT_S = 180.0
RUN_TIMEOUT_S = 900.0
ROUNDS = 2
# Fixed-point rounding (2^-24 per summand) after two rounds of training; a wrong aggregate
# (another client set, a dropped client, unweighted averaging) differs by > 1e-3.
ATOL = 1e-5

SECAGG_NODES = 3
# secagg-mnist alone (its FedAvg arm is recomputed in-process); min-nodes makes round 1 wait
# for all three SuperNodes, so every round samples the clients the reference samples.
SECAGG_CONFIG: dict[str, Any] = {
    "num-server-rounds": ROUNDS,
    "fraction-train": 1.0,
    "fraction-evaluate": 0.0,
    "min-nodes": SECAGG_NODES,
    "max-client-samples": 64,
    "test-size": 300,
    "compare-fedavg": False,
}
SECAGG_PHASES = {"advertise", "share", "train", "unmask"}

RUN_CONFIG: dict[str, Any] = {
    "num-server-rounds": ROUNDS,
    "fraction-train": 1.0,
    "fraction-evaluate": 0.0,
    "min-nodes": 2,
    "max-client-samples": 160,
    "test-size": 500,
    "compare-plaintext": False,
}


@dataclass
class Deployment:
    """What the fixture started."""

    env: dict[str, str]
    logs: Path
    helper_address: str = ""  # empty when started without S1
    fingerprint: str = ""
    token_file: str = ""  # the access token file S1 generated and printed


def _wait_for(what: str, ready: Any, procs: list[subprocess.Popen[bytes]], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        for proc in procs:
            if proc.poll() is not None:
                tails = "\n".join(f.read_text()[-2000:] for f in sorted(log.glob("*.log")))
                pytest.fail(
                    f"{proc.args!r} exited with {proc.returncode} while waiting for {what}; "
                    f"logs in {log}:\n{tails}"
                )
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not ready within {START_TIMEOUT_S:.0f} s; see {log}")
        time.sleep(0.2)


@contextlib.contextmanager
def _deploy(tmp_path: Path, *, nodes: int, helper: bool) -> Iterator[Deployment]:
    """Start (S1 if ``helper``,) a SuperLink and ``nodes`` SuperNodes; stop them all after."""
    require_prepared("mnist")
    home, logs = tmp_path / "flwr-home", tmp_path / "logs"
    home.mkdir()
    logs.mkdir()
    env = dict(os.environ)
    env.update(
        {
            "FLWR_HOME": str(home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_FSL_CACHE": str(cache_dir()),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
        }
    )
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = logs / f"{name}.log"
        with log.open("ab") as out:  # appended: a retry on another port keeps the first try's log
            proc = subprocess.Popen(
                [exe(args[0]), *args[1:]],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: children stop with it
            )
        procs.append(proc)
        return proc, log

    try:
        helper_log = None
        signing = _node_keys(tmp_path, nodes, env) if helper else {}
        if helper:
            (tmp_path / "s1").mkdir(mode=0o700)
            _, helper_log = start(
                "helper",
                "flwr-fsl-helper",
                "--host",
                "127.0.0.1",
                "--port",
                "0",  # S1 binds a free port itself and prints it: nobody can take it first
                "--key-file",
                str(tmp_path / "s1" / "s1.pem"),
                "--generate-key",
                "--state-dir",
                str(tmp_path / "s1" / "state"),
                "--enrollment",
                str(tmp_path / "enrollment.txt"),
            )
        # The SuperLink and the SuperNodes' Runtime APIs on free ports; one that exits before it
        # answers /health (its port was taken meanwhile) is started again on another port.
        _, link_port = start_on_free_port(
            lambda port: start(
                "superlink",
                "flower-superlink",
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--database",
                str(home / "state.db"),
                "--disable-runtime-dependency-installation",
            )[0],
            healthy,
            name=f"flower-superlink (logs in {logs})",
            timeout=START_TIMEOUT_S,
        )

        def supernode(pid: int) -> Callable[[int], subprocess.Popen[bytes]]:
            node_config = f"partition-id={pid} num-partitions={nodes}{signing.get(pid, '')}"
            return lambda port: start(
                f"supernode-{pid}",
                "flower-supernode",
                "--insecure",
                "--superlink",
                f"127.0.0.1:{link_port}",
                "--port",
                str(port),
                "--node-config",
                node_config,
            )[0]

        start_on_free_ports(
            [(f"flower-supernode {pid} (logs in {logs})", supernode(pid)) for pid in range(nodes)],
            healthy,
            timeout=START_TIMEOUT_S,
        )
        deployment = Deployment(env, logs)
        if helper_log is not None:
            log_file = helper_log
            _wait_for(
                "flwr-fsl-helper", lambda: "listening on" in log_file.read_text(), procs, logs
            )
            found = re.search(r"fingerprint ([0-9a-f]{64})", log_file.read_text())
            assert found, log_file.read_text()
            address = re.search(r"listening on (127\.0\.0\.1:\d+)", log_file.read_text())
            assert address, log_file.read_text()
            deployment.helper_address = address.group(1)
            deployment.fingerprint = found.group(1)
            token = re.search(r"access token file (\S+)", log_file.read_text())
            assert token, log_file.read_text()
            deployment.token_file = token.group(1)
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "deploy"\n\n'
            f'[superlink.deploy]\naddress = "127.0.0.1:{link_port}"\ninsecure = true\n'
        )
        yield deployment
    finally:
        for proc in reversed(procs):
            stop(proc)


def _node_keys(tmp_path: Path, nodes: int, env: dict[str, str]) -> dict[int, str]:
    """Make one signing key per SuperNode and S1's enrollment list; return node-config tails."""
    keys = tmp_path / "identity"
    keys.mkdir(mode=0o700)
    lines, tails = [], {}
    for pid in range(nodes):
        path = keys / f"node-{pid}.pem"
        cmd = [sys.executable, "-m", "flwr_fsl.crypto.identity", str(path), "--generate"]
        out = subprocess.run(
            [*cmd, "--label", f"node-{pid}"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        lines.append(out.stdout.strip())
        tails[pid] = f' fsl-signing-key="{path}"'
    (tmp_path / "enrollment.txt").write_text("# S1's enrolled clients\n" + "\n".join(lines) + "\n")
    return tails


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    """Start S1, a SuperLink and two SuperNodes on free ports; stop them all afterwards."""
    with _deploy(tmp_path, nodes=2, helper=True) as started:
        yield started


@pytest.fixture
def secagg_deployment(tmp_path: Path) -> Iterator[Deployment]:
    """Start a SuperLink and SECAGG_NODES SuperNodes (no S1); stop them all afterwards."""
    with _deploy(tmp_path, nodes=SECAGG_NODES, helper=False) as started:
        yield started


def _run_config_arg(config: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return f"'{v}'" if isinstance(v, str) else str(v)

    return " ".join(f"{k}={value(v)}" for k, v in config.items())


def _plaintext_reference() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Return the initial model and plaintext top-k FedSubAvg's final model.

    The example's own ClientApp and ServerApp experiment on an in-process grid with the same
    node configs (partition-id 0/1 of 2) and run config as the deployment; its plaintext arm
    is the reference (its secure arm runs through an in-process S1 with a fresh key).
    """
    import torch

    from flwr_fsl.crypto.channel import SealingKeyPair
    from flwr_fsl.helper import InProcessHelper
    from flwr_fsl.testing import InProcessGrid

    threads = torch.get_num_threads()  # the example's task module pins torch to 1 thread
    sys.path.insert(0, str(APP))
    try:
        from dpf_ssa_mnist.client_app import app as client_app
        from dpf_ssa_mnist.server_app import run_experiment
        from dpf_ssa_mnist.task import Net, Settings

        settings = Settings.from_run_config(RUN_CONFIG)
        torch.manual_seed(settings.task.seed)
        initial = {k: v.detach().numpy().copy() for k, v in Net().state_dict().items()}
        key = SealingKeyPair.generate()
        config = {
            **RUN_CONFIG,
            "compare-plaintext": True,
            "ssa-helper-fingerprint": key.fingerprint,
        }
        grid = InProcessGrid(client_app, 2, config)
        result = run_experiment(grid, config, helper=InProcessHelper(keypair=key))
        return initial, result.arm("plaintext").arrays
    finally:
        sys.path.remove(str(APP))
        torch.set_num_threads(threads)


def test_secure_deployment_equals_plaintext_topk(deployment: Deployment, tmp_path: Path) -> None:
    """Two rounds with a real S1 equal plaintext top-k FedSubAvg up to fixed-point rounding."""
    env, results = deployment.env, tmp_path / "results"
    config = {
        **RUN_CONFIG,
        "ssa-helper-address": deployment.helper_address,
        "ssa-helper-fingerprint": deployment.fingerprint,
        "ssa-helper-token-file": deployment.token_file,
        "results-dir": str(results),
    }
    run_id, status, logs = run_until_finished(
        env,
        "deploy",
        [str(APP), "deploy", "--run-config", _run_config_arg(config)],
        RUN_TIMEOUT_S,
    )
    assert status == "finished:completed", (
        f"run {run_id} ended as {status!r} (logs in {deployment.logs}):\n{logs[-4000:]}"
    )
    # S0 talked to the helper process, not to an in-process twin.
    assert f"S1: flwr-fsl-helper at {deployment.helper_address}" in logs, logs[-4000:]
    assert not re.search(r"WARNING: .*: round \d+ failed", logs), logs[-4000:]
    # S1 accepted only the enrolled SuperNodes' signed uploads, and rejected none of them.
    s1_log = (deployment.logs / "helper.log").read_text()
    assert "client enrollment: 2 enrolled client keys" in s1_log, s1_log[-4000:]
    assert "AddCheckedClients round 1: 2 accepted, 0 rejected" in s1_log, s1_log[-4000:]
    assert "rejected:" not in s1_log, s1_log[-4000:]
    # Every round aggregated through S1; no round failed, no reply was dropped.
    record = load_experiment(results / "dpf-ssa-mnist.json").arm("secure")
    assert record.aggregated_rounds == list(range(1, ROUNDS + 1))
    assert all(r.failed is None and not r.dropped for r in record.rounds), record.rounds

    with np.load(results / "global-model-secure.npz", allow_pickle=False) as npz:
        secure = {k: npz[k] for k in npz.files}
    initial, plain = _plaintext_reference()
    assert set(secure) == set(plain) == set(initial)
    for name, value in plain.items():
        np.testing.assert_allclose(secure[name], value, rtol=0, atol=ATOL, err_msg=name)
    # Training moved the model far beyond the tolerance, in every round.
    moved = max(float(np.max(np.abs(secure[n] - initial[n]))) for n in initial)
    assert moved > 100 * ATOL
    history = json.loads((results / "dpf-ssa-mnist.json").read_text())
    assert history["runs"][0]["traffic_rounds"] == list(range(1, ROUNDS + 1))


def _fedavg_reference() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Return secagg-mnist's initial model and Flower ``FedAvg``'s final model.

    The example's own ServerApp experiment with ``compare-fedavg`` on an in-process grid with
    the deployment's node configs (partition-id i of SECAGG_NODES) and run config: its
    ``fedavg`` arm is Flower's ``FedAvg`` on the same clients, trained with the same seeds.
    """
    import torch

    from flwr_fsl.testing import InProcessGrid
    from flwr_fsl.testing.local import app_run_config

    threads = torch.get_num_threads()  # the example's task module pins torch to 1 thread
    sys.path.insert(0, str(SECAGG_APP))
    try:
        from secagg_mnist.client_app import app as client_app
        from secagg_mnist.server_app import run_experiment
        from secagg_mnist.task import Net

        # The app's pyproject defaults under the test's settings, as `flwr run` fuses them.
        config = {**app_run_config(SECAGG_APP), **SECAGG_CONFIG, "compare-fedavg": True}
        torch.manual_seed(int(config["seed"]))  # as run_experiment seeds the initial model
        initial = {k: v.detach().numpy().copy() for k, v in Net().state_dict().items()}
        result = run_experiment(InProcessGrid(client_app, SECAGG_NODES, config), config)
        return initial, result.arm("fedavg").arrays
    finally:
        sys.path.remove(str(SECAGG_APP))
        torch.set_num_threads(threads)


def test_secagg_deployment_equals_flower_fedavg(
    secagg_deployment: Deployment, tmp_path: Path
) -> None:
    """Two SecAggFedAvg rounds over three SuperNodes equal Flower FedAvg up to fixed point."""
    env, results = secagg_deployment.env, tmp_path / "results"
    config = {**SECAGG_CONFIG, "results-dir": str(results)}
    run_id, status, logs = run_until_finished(
        env,
        "deploy",
        [str(SECAGG_APP), "deploy", "--run-config", _run_config_arg(config)],
        RUN_TIMEOUT_S,
    )
    assert status == "finished:completed", (
        f"run {run_id} ended as {status!r} (logs in {secagg_deployment.logs}):\n{logs[-4000:]}"
    )
    assert not re.search(r"WARNING: .*: round \d+ failed", logs), logs[-4000:]
    # Every round ran the four SecAgg phases with all three SuperNodes; none was dropped.
    record = load_experiment(results / "secagg-mnist.json")
    assert [a.key for a in record.arms] == ["secagg"]
    secagg = record.arm("secagg")
    assert secagg.aggregated_rounds == list(range(1, ROUNDS + 1))
    for r in secagg.rounds:
        assert r.failed is None and not r.dropped, r
        assert r.clients == SECAGG_NODES
        assert set(r.phases) == SECAGG_PHASES
        assert all(p.nodes == SECAGG_NODES for p in r.phases.values()), r.phases
    assert secagg.rounds[-1].train_metrics["secagg-clients"] == SECAGG_NODES

    with np.load(results / "global-model-secagg.npz", allow_pickle=False) as npz:
        secure = {k: npz[k] for k in npz.files}
    initial, fedavg = _fedavg_reference()
    assert set(secure) == set(fedavg) == set(initial)
    for name, value in fedavg.items():
        np.testing.assert_allclose(secure[name], value, rtol=0, atol=ATOL, err_msg=name)
    # Training moved the model far beyond the tolerance.
    moved = max(float(np.max(np.abs(secure[n] - initial[n]))) for n in initial)
    assert moved > 100 * ATOL
