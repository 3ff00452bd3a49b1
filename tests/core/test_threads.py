"""The shared worker pools: results in order, errors after every call, pools by name; pipelines
and streams (:func:`~flwr_fsl.core.threads.streamed`: item ``i + 1`` started before ``i`` ends)."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.threads import pipelined, run_ranges, start_ranges, streamed, worker_pool


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


@settings(max_examples=40, deadline=None)
@given(
    count=st.integers(0, 40),
    threads=st.integers(1, 4),
    failing=st.sets(st.integers(0, 39), max_size=4),
)
def test_every_number_runs_once_and_the_lowest_failure_is_raised(
    count: int, threads: int, failing: set[int]
) -> None:
    """Each worker takes numbers until none is left (session 35): as one task per number."""
    calls: list[int] = []

    def work(j: int) -> int:
        calls.append(j)  # list.append is atomic
        if j in failing:
            raise ValueError(j)
        return 3 * j + 1

    bad = sorted(f for f in failing if f < count)
    if bad:
        with pytest.raises(ValueError) as caught:
            run_ranges(work, count, threads, "fsl-test")
        assert caught.value.args == (bad[0],)
    else:
        assert run_ranges(work, count, threads, "fsl-test") == [3 * j + 1 for j in range(count)]
    if threads > 1 or not bad:
        assert sorted(calls) == list(range(count))
    else:  # one thread: the calls run in the caller, in order, and stop at the error
        assert calls == list(range(bad[0] + 1))


def test_a_base_exception_is_raised_after_every_call() -> None:
    done: list[int] = []

    def work(j: int) -> int:
        if j == 1:
            raise KeyboardInterrupt
        done.append(j)
        return j

    with pytest.raises(KeyboardInterrupt):
        run_ranges(work, 6, 2, "fsl-test")
    assert sorted(done) == [0, 2, 3, 4, 5]


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


def test_pipelined_prepares_the_second_item_beside_the_first() -> None:
    """The caller prepares item 0 while the pool prepares item 1 (the pool is idle until the
    first ``use``); results and errors still reach ``use`` in order."""
    second = threading.Event()

    def prepare(x: int) -> int:
        if x == 0:  # returns only once item 1's prepare has started on the pool
            assert second.wait(5.0)
            raise ValueError("item 0 is bad")
        if x == 1:
            second.set()
        return x

    def use(x: int, ready: int | Exception) -> str:
        return f"{x}:{ready}"

    assert pipelined([0, 1, 2], prepare, use, 2, "fsl-pipe") == ["0:item 0 is bad", "1:1", "2:2"]


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
    # items 0 and 1 are prepared at once; item 2 was being prepared: finished; 3 never started
    assert sorted(done) == [0, 1, 2]


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


def test_started_ranges_run_behind_work_queued_before_and_wait_on_result() -> None:
    """``start_ranges`` queues without waiting: a second batch runs once the first is taken."""
    gate = threading.Event()
    order: list[str] = []

    def first(j: int) -> int:
        assert gate.wait(5.0)
        order.append(f"a{j}")
        return j

    a = start_ranges(first, 2, 2, "fsl-test-start")
    b = start_ranges(lambda j: order.append(f"b{j}") or j, 3, 2, "fsl-test-start")
    time.sleep(0.02)
    assert order == []  # both workers hold batch a: batch b is queued behind it
    gate.set()
    assert b.result() == [0, 1, 2] and a.result() == [0, 1]
    assert sorted(order) == ["a0", "a1", "b0", "b1", "b2"]


def test_started_ranges_on_one_thread_are_done_before_start_returns() -> None:
    calls: list[int] = []

    def work(j: int) -> int:
        calls.append(j)
        if j == 2:
            raise ValueError("two")
        return j

    started = start_ranges(work, 5, 1)
    assert calls == [0, 1, 2]  # in the caller, in order, stopping at the error
    started.wait()
    with pytest.raises(ValueError, match="two"):
        started.result()


class _Log:
    """What ``streamed``'s callbacks saw, in order; ``fail`` names the calls that raise."""

    def __init__(self, fail: dict[str, int]) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.lock = threading.Lock()

    def note(self, what: str, x: int) -> None:
        with self.lock:
            self.calls.append(f"{what} {x}")
        if self.fail.get(what) == x:
            raise RuntimeError(f"{what} {x} failed")


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(0, 6),
    threads=st.integers(1, 3),
    bad_prepare=st.integers(-1, 6),
    bad_finish=st.integers(-1, 6),
)
def test_streamed_starts_the_next_item_before_finishing_this_one(
    count: int, threads: int, bad_prepare: int, bad_finish: int
) -> None:
    """Property: ``finish`` sees items in order, each started before the one before it is
    finished; a refused ``prepare`` reaches ``finish`` as its exception; an error of ``finish``
    cancels exactly the item started after it and propagates."""
    log = _Log({"prepare": bad_prepare, "finish": bad_finish})
    starts: list[int] = []

    def prepare(x: int) -> int:
        log.note("prepare", x)
        return 10 * x

    def start(x: int, ready: int | Exception) -> str:
        starts.append(x)
        log.calls.append(f"start {x}")
        return f"{x}:{ready}"

    def finish(x: int, started: str) -> str:
        log.note("finish", x)
        return started.upper()

    def cancel(x: int, started: str) -> None:
        log.calls.append(f"cancel {x}")

    items = list(range(count))
    want = [
        f"{x}:prepare {x} failed".upper() if x == bad_prepare else f"{x}:{10 * x}" for x in items
    ]
    if 0 <= bad_finish < count:
        with pytest.raises(RuntimeError, match=f"finish {bad_finish} failed"):
            streamed(items, prepare, start, finish, cancel, threads, "fsl-test-stream")
        cancelled = [c for c in log.calls if c.startswith("cancel")]
        assert cancelled == ([f"cancel {bad_finish + 1}"] if bad_finish + 1 < count else [])
        assert starts == list(range(min(count, bad_finish + 2)))
    else:
        got = streamed(items, prepare, start, finish, cancel, threads, "fsl-test-stream")
        assert got == [w.upper() for w in want]
        assert not any(c.startswith("cancel") for c in log.calls)
    finishes = [int(c.split()[1]) for c in log.calls if c.startswith("finish")]
    assert finishes == sorted(finishes)
    for x in finishes:  # the next item was started before this one was finished
        if x + 1 < count:
            assert log.calls.index(f"start {x + 1}") < log.calls.index(f"finish {x}")


def test_streamed_prepares_the_second_item_on_the_pool_beside_the_first() -> None:
    second = threading.Event()
    where: dict[int, str] = {}

    def prepare(x: int) -> int:
        where[x] = threading.current_thread().name
        if x == 0:
            assert second.wait(5.0)  # item 1 is being prepared on the pool meanwhile
        if x == 1:
            second.set()
        return x

    out = streamed(
        [0, 1, 2], prepare, lambda x, r: r, lambda x, s: s, lambda x, s: None, 2, "fsl-stream"
    )
    assert out == [0, 1, 2]
    assert where[1].startswith("fsl-stream")
    me = threading.current_thread().name
    assert where[0] == me and where[2] == me


def test_streamed_cancels_the_started_item_when_the_next_start_raises() -> None:
    cancelled: list[int] = []

    def start(x: int, ready: int | Exception) -> int:
        if x == 2:
            raise KeyError("start 2")
        return x

    with pytest.raises(KeyError):
        streamed(
            [0, 1, 2, 3],
            lambda x: x,
            start,
            lambda x, s: s,
            lambda x, s: cancelled.append(x),
            2,
            "fsl-test-stream",
        )
    assert cancelled == [1]  # item 0 was finished; item 1 was started and is undone
