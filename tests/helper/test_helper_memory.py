"""S1's allocator settings (:mod:`flwr_fsl.helper.memory`): peak memory flat in the clients.

The effect is measured by ``benchmarks/ssa_bench.py --scale 50 200 800`` (issue 26's memory
target); here: the settings apply in a fresh process where glibc has ``mallopt``, the
operator's ``MALLOC_*`` variables win, and ``flwr-fsl-helper`` applies them when it serves
(and not when it only prints its fingerprint, so the test process keeps its own allocator).
"""

from __future__ import annotations

import ctypes.util
import subprocess
import sys

import pytest

from flwr_fsl.helper import cli as helper_cli
from flwr_fsl.helper import memory


def test_the_operators_malloc_variables_win() -> None:
    for name in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_"):
        assert memory.bound_allocator({name: "4"}) is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_bound_allocator_applies_in_a_fresh_process() -> None:
    if ctypes.util.find_library("c") is None:
        pytest.skip("no C library found")
    code = "from flwr_fsl.helper.memory import bound_allocator as b; print(b({}))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "True"


def test_the_cli_bounds_the_allocator_only_when_it_serves(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    calls: list[str] = []
    monkeypatch.setattr(helper_cli, "bound_allocator", lambda: calls.append("bound") or True)
    key = str(tmp_path / "k.pem")
    assert helper_cli.main(["--key-file", key, "--generate-key", "--print-fingerprint"]) == 0
    assert calls == []

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("port in use")  # stop right where serving would start

    monkeypatch.setattr(helper_cli, "start_server", refuse)
    state = tmp_path / "state"
    argv = ["--key-file", key, "--open-enrollment", "--state-dir", str(state)]
    assert helper_cli.main(argv) == 1
    assert calls == ["bound"]
