"""The shared worker pools: results in order, errors after every call, one pool per name."""

from __future__ import annotations

import threading
import time

import pytest

from flwr_fsl.core.threads import run_ranges, worker_pool


def test_results_come_back_in_call_order_on_any_thread_count() -> None:
    for threads in (1, 2, 3):
        assert run_ranges(lambda j: j * j, 7, threads) == [j * j for j in range(7)]
    assert run_ranges(lambda j: j, 0, 2) == []


def test_an_error_is_raised_only_after_every_call_finished() -> None:
    done: list[int] = []
    lock = threading.Lock()

    def work(j: int) -> int:
        if j == 0:
            raise RuntimeError("range 0 failed")
        time.sleep(0.01)
        with lock:
            done.append(j)
        return j

    with pytest.raises(RuntimeError, match="range 0 failed"):
        run_ranges(work, 5, 2, "fsl-test")
    assert sorted(done) == [1, 2, 3, 4]


def test_pools_are_kept_per_name_and_thread_count() -> None:
    assert worker_pool(2, "fsl-test") is worker_pool(2, "fsl-test")
    assert worker_pool(2, "fsl-test") is not worker_pool(2, "fsl-test-other")
    assert worker_pool(3, "fsl-test") is not worker_pool(2, "fsl-test")
    names = run_ranges(lambda _: threading.current_thread().name, 4, 2, "fsl-named")
    assert all(name.startswith("fsl-named") for name in names)
