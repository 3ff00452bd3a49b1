"""The shared worker pools: results in order, errors after every call, pools by name; pipelines."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.threads import pipelined, run_ranges, worker_pool


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


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_pipelined_is_prepare_then_use_in_order(threads: int) -> None:
    used: list[tuple[int, object]] = []

    def prepare(x: int) -> int:
        if x == 2:
            raise ValueError("item 2 is bad")
        return x * 10

    def use(x: int, ready: int | Exception) -> str:
        used.append((x, ready if isinstance(ready, int) else str(ready)))
        return f"{x}:{ready}"

    out = pipelined(list(range(5)), prepare, use, threads, "fsl-test")
    assert out == ["0:0", "1:10", "2:item 2 is bad", "3:30", "4:40"]
    assert used == [(0, 0), (1, 10), (2, "item 2 is bad"), (3, 30), (4, 40)]
    assert pipelined([], prepare, use, threads) == []


def test_pipelined_prepares_the_next_item_on_the_pool_while_this_one_is_used() -> None:
    seen: dict[int, str] = {}
    started = threading.Event()

    def prepare(x: int) -> int:
        seen[x] = threading.current_thread().name
        if x == 1:
            started.set()
        return x

    def use(x: int, ready: int | Exception) -> int:
        if x == 0:  # item 1 is prepared while item 0 is still being used
            assert started.wait(5.0)
        return x

    assert pipelined([0, 1, 2], prepare, use, 2, "fsl-pipe") == [0, 1, 2]
    assert seen[0] == threading.current_thread().name  # the first one in the caller
    assert seen[1].startswith("fsl-pipe") and seen[2].startswith("fsl-pipe")


def test_pipelined_raises_an_error_of_use_once_the_next_prepare_is_done() -> None:
    done: list[int] = []

    def prepare(x: int) -> int:
        time.sleep(0.02)
        done.append(x)
        return x

    def use(x: int, ready: int | Exception) -> int:
        if x == 1:
            raise RuntimeError("use failed")
        return x

    with pytest.raises(RuntimeError, match="use failed"):
        pipelined([0, 1, 2, 3], prepare, use, 2, "fsl-test")
    assert done == [0, 1, 2]  # item 2 was being prepared: finished, item 3 never started


def test_pipelined_on_one_thread_runs_in_the_caller_in_order() -> None:
    calls: list[str] = []
    me = threading.current_thread().name

    def prepare(x: int) -> int:
        calls.append(f"prepare {x}")
        assert threading.current_thread().name == me
        return x

    def use(x: int, ready: int | Exception) -> int:
        calls.append(f"use {x}")
        return x

    pipelined([0, 1], prepare, use, 1)
    assert calls == ["prepare 0", "use 0", "prepare 1", "use 1"]


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(0, 6),
    threads=st.sampled_from([1, 2, 3]),
    bad=st.sets(st.integers(0, 5)),
    ranges=st.integers(0, 4),
)
def test_deferred_prepare_gives_what_prepare_at_once_gives(
    n: int, threads: int, bad: set[int], ranges: int
) -> None:
    def prepare(x: int) -> int:
        if x in bad:
            raise ValueError(f"item {x} is bad")
        return x * 10

    def use(x: int, ready: int | Exception) -> str:
        parts = run_ranges(lambda j: j + x, ranges, threads, "fsl-defer")  # some pool work
        return f"{x}:{ready}:{sum(parts)}"

    want = [use(x, ValueError(f"item {x} is bad") if x in bad else x * 10) for x in range(n)]
    for defer in (False, True):
        assert pipelined(list(range(n)), prepare, use, threads, "fsl-defer", defer=defer) == want


def test_a_deferred_prepare_runs_at_the_tail_of_the_pool_work_of_use() -> None:
    events: list[str] = []
    lock = threading.Lock()
    where: dict[int, str] = {}

    def prepare(x: int) -> int:
        where[x] = threading.current_thread().name
        with lock:
            events.append(f"prepare {x}")
        return x

    def work(j: int) -> int:
        with lock:
            events.append(f"range {j}")
        time.sleep(0.05)
        return j

    def use(x: int, ready: int | Exception) -> int:
        if x == 0:
            run_ranges(work, 3, 2, "fsl-tail")  # 2 workers, 3 ranges: one idles at the end
        return x

    assert pipelined([0, 1], prepare, use, 2, "fsl-tail", defer=True) == [0, 1]
    assert sorted(events) == ["prepare 0", "prepare 1", "range 0", "range 1", "range 2"]
    assert events[0] == "prepare 0"  # the first item's, in the caller
    assert events.index("prepare 1") > max(events.index("range 0"), events.index("range 1"))
    assert where[1].startswith("fsl-tail")  # on the worker left without a range


def test_a_deferred_prepare_no_worker_took_runs_in_the_caller() -> None:
    where: dict[int, str] = {}

    def prepare(x: int) -> int:
        where[x] = threading.current_thread().name
        return x

    assert pipelined([0, 1, 2], prepare, lambda x, r: r, 2, "fsl-test", defer=True) == [0, 1, 2]
    me = threading.current_thread().name
    assert where == {0: me, 1: me, 2: me}


def test_an_error_of_use_drops_an_untaken_deferred_prepare_and_waits_for_a_taken_one() -> None:
    done: list[int] = []

    def prepare(x: int) -> int:
        time.sleep(0.02)
        done.append(x)
        return x

    def fail_alone(x: int, ready: int | Exception) -> int:
        if x == 1:
            raise RuntimeError("use failed")
        return x

    with pytest.raises(RuntimeError, match="use failed"):
        pipelined([0, 1, 2, 3], prepare, fail_alone, 2, "fsl-test", defer=True)
    assert done == [0, 1]  # nobody took item 2's prepare: it never ran

    def fail_after_pool_work(x: int, ready: int | Exception) -> int:
        run_ranges(lambda j: time.sleep(0.05 * j), 2, 2, "fsl-test")  # a worker takes it
        raise RuntimeError("use failed")

    done.clear()
    with pytest.raises(RuntimeError, match="use failed"):
        pipelined([0, 1], prepare, fail_after_pool_work, 2, "fsl-test", defer=True)
    assert done == [0, 1]  # item 1's prepare was taken by a worker: finished before the error
