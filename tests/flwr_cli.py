"""Helpers for tests that drive real Flower processes (``flwr``, SuperLink, SuperNodes, S1)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import pytest

from flwr_fsl.data import cache_dir
from tests.prepared_data import require_prepared

BIN = Path(sys.executable).parent


RAY_SIMULATION = pytest.mark.xdist_group("ray-simulation")
"""Mark of the tests that boot Ray (a simulation SuperLink, :func:`simulation_superlink`).

``make test`` runs the suite on two pytest-xdist workers with ``--dist loadgroup``: this group's
tests all run on one worker, one after another, so two Ray clusters never boot at the same
instant on a 2-core machine (they can then miss Ray's fixed 30 s raylet start-up wait).
"""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now.

    Only right now: another process can bind it before the caller's server does. Start a
    server on it with :func:`start_on_free_port` (which retries on another port), or let a
    server that can bind port 0 itself do so and report its port (``flwr-fsl-helper --port
    0`` prints it in its ``listening on`` line).
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def refused_port() -> Iterator[int]:
    """Yield a port on 127.0.0.1 that refuses connections until the block ends.

    The port stays bound to a socket that never listens, so no other process can take it
    meanwhile (as it could a port from :func:`free_port`): a connection is refused.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def start_on_free_port(
    start: Callable[[int], subprocess.Popen[bytes]],
    ready: Callable[[int], bool],
    *,
    name: str,
    timeout: float = 30.0,
    attempts: int = 3,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start a server on a :func:`free_port`; on another one if that was taken meanwhile.

    A port free a moment ago can be bound by another process before the server binds it;
    the server then exits (``EADDRINUSE``). A server that exits before it is ready is
    started again on a new port, ``attempts`` times in all.

    Parameters
    ----------
    start : Callable[[int], subprocess.Popen]
        Starts the server on the given port.
    ready : Callable[[int], bool]
        Whether the server answers on the port (polled every 0.2 s).
    name : str
        The server's name, for failures.
    timeout : float, optional
        Seconds each attempt may take to become ready.
    attempts : int, optional
        Ports to try.

    Returns
    -------
    tuple[subprocess.Popen, int]
        The running server and its port.
    """
    return start_on_free_ports([(name, start)], ready, timeout=timeout, attempts=attempts)[0]


def start_on_free_ports(
    servers: Sequence[tuple[str, Callable[[int], subprocess.Popen[bytes]]]],
    ready: Callable[[int], bool],
    *,
    timeout: float = 30.0,
    attempts: int = 3,
) -> list[tuple[subprocess.Popen[bytes], int]]:
    """Start several servers at once, each as :func:`start_on_free_port` starts one.

    They start side by side (no server waits for the one before to be ready); a server that
    exits before it is ready is started again on a new port, ``attempts`` times in all. On a
    failure every server started here is stopped before the test fails.

    Parameters
    ----------
    servers : Sequence[tuple[str, Callable[[int], subprocess.Popen]]]
        Each server's name (for failures) and the function that starts it on a given port.
    ready : Callable[[int], bool]
        Whether a server answers on a port (polled every 0.2 s).
    timeout : float, optional
        Seconds each attempt may take to become ready.
    attempts : int, optional
        Ports to try per server.

    Returns
    -------
    list[tuple[subprocess.Popen, int]]
        The running servers and their ports, in the order of ``servers``.
    """
    running: list[tuple[subprocess.Popen[bytes], int]] = []
    for _, start in servers:
        port = free_port()
        running.append((start(port), port))
    exits: list[list[str]] = [[] for _ in servers]
    deadlines = [time.monotonic() + timeout] * len(servers)
    waiting = set(range(len(servers)))

    def fail(message: str) -> NoReturn:
        for proc, _ in running:
            stop(proc)
        pytest.fail(message)

    while waiting:
        for i in sorted(waiting):
            (name, start), (proc, port) = servers[i], running[i]
            if proc.poll() is not None:  # exited: its port was taken meanwhile, say
                exits[i].append(f"port {port}: exit {proc.returncode}")
                if len(exits[i]) == attempts:
                    tried = ", ".join(exits[i])
                    fail(f"{name} exited before it was ready on {attempts} ports ({tried})")
                port = free_port()
                running[i] = (start(port), port)
                deadlines[i] = time.monotonic() + timeout
            elif ready(port) and proc.poll() is None:
                waiting.discard(i)
            elif time.monotonic() > deadlines[i]:
                fail(f"{name} was not ready within {timeout:.0f} s on port {port}")
        if waiting:
            time.sleep(0.2)
    return running


def healthy(port: int) -> bool:
    """Return True if a SuperLink or a SuperNode answers ``GET /health`` on ``port``.

    What ``flwr`` itself probes for a SuperLink.
    """
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def exe(name: str) -> str:
    """Return the path of a console script installed beside this interpreter."""
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} not found beside {sys.executable}")
    return str(path)


def flwr(env: dict[str, str], *args: str, timeout: float = 60.0) -> str:
    """Run the ``flwr`` CLI; fail the test (with its output) if it exits non-zero."""
    proc = subprocess.run(
        [exe("flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        pytest.fail(
            f"flwr {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc.stdout


def run_until_finished(
    env: dict[str, str], federation: str, run_args: list[str], timeout: float
) -> tuple[str, str, str]:
    """Submit ``flwr run <run_args>`` and poll ``flwr ls`` until the run has finished.

    ``flwr run --stream`` exits 0 even when the ServerApp crashes, so only the status that
    ``flwr ls`` reports proves a run completed.

    Returns
    -------
    tuple[str, str, str]
        The run id, its final status (e.g. ``finished:completed``; empty on timeout) and its
        logs (``flwr log --show``).
    """
    submitted = json.loads(flwr(env, "run", *run_args, "--format", "json"))
    assert submitted["success"] is True, submitted
    run_id = str(submitted["run-id"])
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        try:
            listing = json.loads(
                flwr(env, "ls", federation, "--run-id", run_id, "--format", "json")
            )
        except subprocess.TimeoutExpired:  # one slow CLI start under load: poll again
            continue
        runs = [r for r in listing.get("runs", []) if str(r.get("run-id")) == run_id]
        status = runs[0]["status"] if runs else ""
        if status.startswith("finished:"):
            break
        time.sleep(2)
    logs = flwr(env, "log", run_id, federation, "--show", timeout=60)
    return run_id, status, logs


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a process started with ``start_new_session=True`` and its children."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)


@contextlib.contextmanager
def simulation_superlink(home: Path) -> Iterator[dict[str, str]]:
    """Start a local simulation SuperLink on free ports with ``FLWR_HOME=home``; yield its env.

    Started exactly as ``flwr run ... local`` starts its managed SuperLink; stopped (with its
    simulation children) on exit.
    """
    require_prepared("mnist")
    env = dict(os.environ)
    env.update(
        {
            "FLWR_HOME": str(home),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_FSL_CACHE": str(cache_dir()),
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
    )
    home.mkdir(parents=True)
    log_file = home / "superlink.log"

    def start(http_port: int) -> subprocess.Popen[bytes]:
        # Runtime, Control and Fleet HTTP APIs share the port in Flower 1.41.
        env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(http_port)
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
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: simulation children stop with it
        )

    proc, _ = start_on_free_port(start, healthy, name=f"flower-superlink (log {log_file})")
    try:
        yield env
    finally:
        stop(proc)
