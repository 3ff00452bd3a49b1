"""One long-running ``flwr-fsl-helper`` serves many ``flwr run``s: one after another and at once.

Real processes on 127.0.0.1: one S1 started with ``--token-file``, simulation SuperLinks, and
``examples/dpf-ssa-mnist`` submitted with ``flwr run``; S0 reaches S1 through ``connect_helper``
from the run config (address, pinned fingerprint, token file). Each run must finish
``finished:completed`` *and* have securely aggregated every round (before sessions, a second run
against the same helper failed every round and still ended "completed" with an untrained
model). The concurrent case uses two SuperLinks so both runs talk to S1 at the same time; S1's
log must show two sessions open at once. Three runs cover both cases (each run boots its own Ray
cluster, the bulk of the test's time): the first alone, then the second through the same
SuperLink and S1 once the first has closed its session (one after another), with the third
started through the other SuperLink while the second is still going (at once).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.flwr_cli import RAY_SIMULATION, exe, run_until_finished, simulation_superlink, stop

pytestmark = RAY_SIMULATION  # one Ray boot at a time under xdist (tests/flwr_cli.py)

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "examples" / "dpf-ssa-mnist"
ROUNDS = 2
RUN_TIMEOUT_S = 240.0


@pytest.fixture
def superlinks(tmp_path: Path) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """Two independent simulation SuperLinks (each its own FLWR_HOME and ports)."""
    with (
        simulation_superlink(tmp_path / "home-a") as first,
        simulation_superlink(tmp_path / "home-b") as second,
    ):
        yield first, second


@pytest.fixture
def helper(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Start ``flwr-fsl-helper`` with a fresh key and an access token; yield its run config."""
    token = tmp_path / "token"
    token.write_text("correct horse battery staple\n")
    token.chmod(0o600)
    log = tmp_path / "helper.log"
    cmd = [
        exe("flwr-fsl-helper"),
        "--host",
        "127.0.0.1",
        "--port",
        "0",  # S1 binds a free port itself and prints it: no other process can take it first
        "--key-file",
        str(tmp_path / "s1.pem"),
        "--generate-key",
        "--token-file",
        str(token),
        "--open-enrollment",  # simulation nodes make their keys on first use, unenrolled
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120  # a cold numba cache compiles kernels on import
        while "listening on" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"flwr-fsl-helper did not start:\n{log.read_text()}")
            time.sleep(0.2)
        found = re.search(r"fingerprint ([0-9a-f]{64})", log.read_text())
        assert found, log.read_text()
        address = re.search(r"listening on (127\.0\.0\.1:\d+)", log.read_text())
        assert address, log.read_text()
        yield {
            "address": address.group(1),
            "fingerprint": found.group(1),
            "token_file": str(token),
            "log": str(log),
        }
    finally:
        stop(proc)


# Ray's own start-up failures on a loaded 2-core machine (its raylet has a fixed 30 s to
# register): an infrastructure flake, not this project's behaviour. Such a run is resubmitted
# once; a run that fails for any other reason fails the test.
RAY_STARTUP_FAILURES = ("timed out during startup", "raylet", "GCS has become overloaded")
RETRIES: list[str] = []


def _run(
    env: dict[str, str], helper: dict[str, str], seed: int, rounds: int = ROUNDS
) -> tuple[str, str, str]:
    outcome = _submit(env, helper, seed, rounds)
    run_id, status, logs = outcome
    if status == "finished:failed" and any(m in logs for m in RAY_STARTUP_FAILURES):
        RETRIES.append(run_id)
        outcome = _submit(env, helper, seed, rounds)
    return outcome


def _submit(
    env: dict[str, str], helper: dict[str, str], seed: int, rounds: int
) -> tuple[str, str, str]:
    run_config = (
        f"num-server-rounds={rounds} max-client-samples=200 test-size=300 fraction-train=1.0 "
        f"compare-plaintext=false seed={seed} log-level='info' "  # its INFO lines are read
        f"ssa-helper-address='{helper['address']}' "
        f"ssa-helper-fingerprint='{helper['fingerprint']}' "
        f"ssa-helper-token-file='{helper['token_file']}'"
    )
    return run_until_finished(
        env,
        "local",
        [
            str(APP),
            "local",
            "--run-config",
            run_config,
            "--federation-config",
            "num-supernodes=2 client-resources-num-cpus=1",
        ],
        RUN_TIMEOUT_S,
    )


def _assert_trained(run_id: str, status: str, logs: str, rounds: int = ROUNDS) -> None:
    assert status == "finished:completed", f"run {run_id} ended as {status!r}:\n{logs[-4000:]}"
    assert "flwr-fsl-helper at 127.0.0.1" in logs, logs[-4000:]
    aggregated = re.findall(r"securely aggregated (\d+) clients", logs)
    assert len(aggregated) == rounds and all(int(n) == 2 for n in aggregated), logs[-4000:]
    assert "secure aggregation with S1 failed" not in logs, logs[-4000:]


def _open_sessions(log_text: str) -> int:
    """Sessions S1's log shows opened and not (yet) closed."""
    return len(re.findall(r"session \w+ opened", log_text)) - len(
        re.findall(r"session \w+ closed", log_text)
    )


def _wait_until_only_leaked_sessions_are_open(
    helper: dict[str, str], timeout_s: float = 60.0
) -> None:
    """Wait until the only sessions open on S1 are those of runs Ray killed (see RETRIES).

    A run whose ServerApp process is stopped by Flower (a Ray start-up failure) cannot close
    its session: it stays open on S1 until S1's idle expiry.
    """
    log = Path(helper["log"])
    deadline = time.monotonic() + timeout_s
    while _open_sessions(text := log.read_text()) > len(RETRIES):
        assert time.monotonic() < deadline, (
            f"a finished run left its S1 session open:\n{text[-3000:]}"
        )
        time.sleep(0.2)


def test_one_helper_serves_runs_one_after_another_and_at_once(
    superlinks: tuple[dict[str, str], dict[str, str]], helper: dict[str, str]
) -> None:
    superlink, superlink_2 = superlinks
    RETRIES.clear()
    # The first run, alone.
    _assert_trained(*_run(superlink, helper, 1))
    # `flwr ls` may report the run finished a moment before its ServerApp process has closed
    # its S1 session: wait for the close, so the next run's session is alone on S1.
    _wait_until_only_leaked_sessions_are_open(helper)
    sequential_retries = len(RETRIES)
    # One after another: the second run goes through the same SuperLink and the same S1 as the
    # first. At once: the third, through its own SuperLink against the same S1, starts once the
    # second has opened a round on S1 (its Ray cluster is up): two Ray clusters booting at the
    # same instant on a 2-core machine can miss Ray's fixed 30 s raylet start-up wait. The
    # second run has many short rounds (about 0.3 s each here once Ray is up), so it is still
    # going when the third opens its session a few seconds later.
    rounds = {0: 50, 1: ROUNDS}
    results: dict[int, tuple[str, str, str]] = {}

    def submit(index: int, env: dict[str, str]) -> None:
        results[index] = _run(env, helper, 10 + index, rounds[index])

    opened_before = Path(helper["log"]).read_text().count("round 1 opened")
    second = threading.Thread(target=submit, args=(0, superlink))
    second.start()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while Path(helper["log"]).read_text().count("round 1 opened") <= opened_before:
        assert second.is_alive() and time.monotonic() < deadline, (
            f"the second run did not open a round on S1: {results.get(0, ('', ''))[:2]}"
            f"\n{Path(helper['log']).read_text()[-3000:]}"
        )
        time.sleep(0.5)
    third = threading.Thread(target=submit, args=(1, superlink_2))
    third.start()
    for t in (second, third):
        t.join(timeout=RUN_TIMEOUT_S + 120)
    assert sorted(results) == [0, 1]
    for index, outcome in results.items():
        _assert_trained(*outcome, rounds=rounds[index])
    helper_log = Path(helper["log"]).read_text()
    opened = [int(n) for n in re.findall(r"session \w+ opened \((\d+) open\)", helper_log)]
    runs = 3 + len(RETRIES)  # a resubmitted run opened a session of its own
    assert len(opened) == runs, helper_log[-4000:]  # one session per run
    # Each of the first two alone when it opened, apart from sessions of runs Ray killed before
    # they could close (the third starts only after the second has opened a round).
    sequential = 1 + sequential_retries
    assert max(opened[: sequential + 1]) <= 1 + sequential_retries, helper_log[-4000:]
    # The second and third runs' sessions were open at once.
    assert max(opened[sequential:]) >= 2 + sequential_retries, helper_log[-4000:]
    # Every run ended its session (a run Ray killed could not).
    assert helper_log.count("closed") >= runs - len(RETRIES), helper_log[-4000:]
