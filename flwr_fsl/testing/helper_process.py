"""A real helper server S1 as a child process, for tests, benchmarks and notebooks.

:class:`HelperProcess` starts ``python -m flwr_fsl.helper`` on a free loopback port, waits until
it prints its address and fingerprint, and stops it with SIGTERM. The child is the same program
an operator runs as ``flwr-fsl-helper``; extra CLI flags (limits, ``--min-clients``,
``--insecure``, ``--token-file``) pass through unchanged. By default the child generates its
access token in ``state_dir`` (:attr:`HelperProcess.token`; :meth:`HelperProcess.client` is a
:class:`~flwr_fsl.helper.HelperClient` that sends it); a restarted process given the same
``state_dir`` keeps the token. Its privacy accounts go to ``state_dir`` (``--state-dir``): a fresh
temporary directory unless given, so tests never share the operator's default one; give the
same ``state_dir`` to a restarted process to resume the accounts. Client signing keys: the
child reads ``enrollment`` (``--enrollment``) when given, else runs with ``--open-enrollment``
(any signer; tests of round mechanics).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flwr_fsl.helper.connection import HelperClient

__all__ = ["HelperProcess"]

READY_TIMEOUT_S = 120.0  # generous: a cold numba cache compiles kernels on first import


class HelperProcess:
    """A ``python -m flwr_fsl.helper`` child on a free loopback port (``--port 0``).

    Parameters
    ----------
    key_file : Path
        S1's key file (PKCS#8 PEM, created beforehand).
    log_file : Path
        Where the child's stderr (its log) goes.
    extra_args : sequence of str
        More ``flwr-fsl-helper`` flags, e.g. ``("--max-clients-per-round", "5000")``.
    log_level : str
        The child's ``--log-level`` (default ``WARNING``).
    state_dir : Path, optional
        The child's ``--state-dir`` (its per-run privacy accounts); a new temporary directory
        by default.
    enrollment : Path, optional
        The child's ``--enrollment`` list of client keys; ``--open-enrollment`` by default.

    Raises
    ------
    RuntimeError
        If the child exits or does not report its address within two minutes.

    Attributes
    ----------
    address : str
        ``host:port`` the child listens on.
    fingerprint : str
        The fingerprint of S1's public key, as the child printed it.
    token_file : Path or None
        The access token file the child printed (None with ``--insecure`` and no token file).
    token : str or None
        Its content.
    """

    def __init__(
        self,
        key_file: Path,
        log_file: Path,
        extra_args: Sequence[str] = (),
        log_level: str = "WARNING",
        state_dir: Path | None = None,
        enrollment: Path | None = None,
    ) -> None:
        self.log_file = log_file
        if state_dir is None:
            state_dir = Path(tempfile.mkdtemp(prefix="flwr-fsl-s1-state-"))
        self.state_dir = state_dir
        self._log = open(log_file, "wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "flwr_fsl.helper", "--host", "127.0.0.1", "--port", "0"]
        cmd += ["--key-file", str(key_file), "--log-level", log_level]
        cmd += ["--state-dir", str(state_dir)]
        cmd += ["--open-enrollment"] if enrollment is None else ["--enrollment", str(enrollment)]
        cmd += list(extra_args)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.fingerprint = ""
        self.address = ""
        self.token_file: Path | None = None
        self.token: str | None = None
        while not self.address:
            try:
                line = self.lines.get(timeout=READY_TIMEOUT_S)
            except queue.Empty:
                self.stop()
                raise RuntimeError(f"helper not ready; log:\n{log_file.read_text()}") from None
            if line == "":
                self.stop()
                raise RuntimeError(f"helper exited; log:\n{log_file.read_text()}")
            if "public key fingerprint" in line:
                self.fingerprint = line.rsplit(" ", 1)[1]
            if ": access token file " in line:
                self.token_file = Path(line.split(": access token file ", 1)[1])
                self.token = self.token_file.read_text().strip()
            if "listening on" in line:
                self.address = line.rsplit(" ", 1)[1]

    def client(self, timeout: float = 60.0) -> HelperClient:
        """Return a new gRPC connection to this S1 that sends its access token."""
        from flwr_fsl.helper.connection import HelperClient

        return HelperClient(self.address, timeout=timeout, token=self.token)

    def run_config(self) -> dict[str, str]:
        """Return S0's run-config keys for this S1 (address, pinned fingerprint, token file)."""
        config = {"ssa-helper-address": self.address, "ssa-helper-fingerprint": self.fingerprint}
        if self.token_file is not None:
            config["ssa-helper-token-file"] = str(self.token_file.resolve())
        return config

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode().strip()
            self.stdout.append(line)
            self.lines.put(line)
        self.lines.put("")

    def peak_rss_bytes(self) -> int | None:
        """Return the child's peak resident memory (Linux ``VmHWM``), or None if unknown."""
        return self._status_bytes("VmHWM:")

    def rss_bytes(self) -> int | None:
        """Return the child's resident memory now (Linux ``VmRSS``), or None if unknown."""
        return self._status_bytes("VmRSS:")

    def _status_bytes(self, field: str) -> int | None:
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
        return None

    def stop(self) -> int:
        """Stop the child (SIGTERM, then SIGKILL after 20 s); return its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> HelperProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
