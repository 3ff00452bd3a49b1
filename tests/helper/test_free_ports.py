"""Starting servers on free ports (:mod:`tests.flwr_cli`): a port taken between the pick and
the server's bind costs a retry on another port, not the test; a held port refuses."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests import flwr_cli
from tests.flwr_cli import refused_port, start_on_free_port, start_on_free_ports, stop

# A server that binds the port it is given (exiting with EADDRINUSE if it is taken) and listens.
SERVER = (
    "import socket, sys, time\n"
    "s = socket.socket()\n"
    "s.bind(('127.0.0.1', int(sys.argv[1])))\n"
    "s.listen()\n"
    "time.sleep(120)\n"
)


def _start(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)],
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture
def taken() -> Iterator[socket.socket]:
    """A port another process took: bound and listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock


def test_a_taken_port_is_retried_on_another(
    taken: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = taken.getsockname()[1]
    picks = iter([held, flwr_cli.free_port()])  # the first pick was taken meanwhile
    monkeypatch.setattr(flwr_cli, "free_port", lambda: next(picks))
    proc, port = start_on_free_port(_start, lambda p: p != held and _answers(p), name="server")
    try:
        assert port != held and proc.poll() is None and _answers(port)
    finally:
        stop(proc)


def test_every_port_taken_fails_the_test(
    taken: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = taken.getsockname()[1]
    monkeypatch.setattr(flwr_cli, "free_port", lambda: held)
    with pytest.raises(pytest.fail.Exception, match="exited before it was ready on 2 ports"):
        start_on_free_port(_start, lambda p: False, name="server", attempts=2)


def test_a_server_never_ready_fails_the_test_and_is_stopped() -> None:
    started: list[subprocess.Popen[bytes]] = []

    def start(port: int) -> subprocess.Popen[bytes]:
        started.append(_start(port))
        return started[-1]

    with pytest.raises(pytest.fail.Exception, match="not ready within 1 s"):
        start_on_free_port(start, lambda p: False, name="server", timeout=1.0)
    assert len(started) == 1 and started[0].poll() is not None


def test_a_refused_port_refuses_and_stays_taken() -> None:
    with refused_port() as port:
        assert not _answers(port)
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))


def test_servers_start_side_by_side_and_only_the_one_whose_port_was_taken_moves(
    taken: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = taken.getsockname()[1]
    first, spare = flwr_cli.free_port(), flwr_cli.free_port()
    picks = iter([first, held, spare])  # the second server's first pick was taken meanwhile
    monkeypatch.setattr(flwr_cli, "free_port", lambda: next(picks))
    servers = [("a", _start), ("b", _start)]
    started = start_on_free_ports(servers, lambda p: p != held and _answers(p))
    try:
        assert [port for _, port in started] == [first, spare]
        assert all(proc.poll() is None and _answers(port) for proc, port in started)
    finally:
        for proc, _ in started:
            stop(proc)


def test_a_failing_server_stops_every_server_started_with_it(
    taken: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = taken.getsockname()[1]
    good = flwr_cli.free_port()
    picks = iter([good, held, held])
    monkeypatch.setattr(flwr_cli, "free_port", lambda: next(picks))
    started: list[subprocess.Popen[bytes]] = []

    def start(port: int) -> subprocess.Popen[bytes]:
        started.append(_start(port))
        return started[-1]

    servers = [("good", start), ("bad", start)]
    with pytest.raises(pytest.fail.Exception, match="bad exited before it was ready on 2 ports"):
        start_on_free_ports(servers, lambda p: p != held and _answers(p), attempts=2)
    assert len(started) == 3 and all(proc.poll() is not None for proc in started)
