"""Process-wide worker pools for GIL-free kernels, and one way to run numbered work on them.

The SSA servers' evaluation and the clients' key generation both split their work into ranges
whose numba kernels release the GIL; each kind keeps one pool per thread count for the life of
the process (threads are started once, not per client). :func:`pipelined` runs a sequence of
items through two steps, the next item's first step on the pool while the caller does this
item's second (the SSA servers parse client ``i + 1`` while they evaluate client ``i``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Generic, TypeVar

__all__ = [
    "StartedRanges",
    "pipelined",
    "run_ranges",
    "start_ranges",
    "streamed",
    "worker_pool",
]

_T = TypeVar("_T")
_I = TypeVar("_I")
_P = TypeVar("_P")
_S = TypeVar("_S")

_POOLS: dict[tuple[int, str], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def worker_pool(threads: int, name: str) -> ThreadPoolExecutor:
    """Return the process-wide pool ``name`` with ``threads`` workers (made on first use).

    Parameters
    ----------
    threads : int
        Its worker count.
    name : str
        Its threads' name prefix; pools of different names never share a worker, so work on one
        may wait for work on another without a deadlock.

    Returns
    -------
    ThreadPoolExecutor
        The same pool on every call with the same arguments.
    """
    with _POOLS_LOCK:
        pool = _POOLS.get((threads, name))
        if pool is None:
            pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
            _POOLS[(threads, name)] = pool
        return pool


def run_ranges(
    work: Callable[[int], _T], count: int, threads: int, name: str = "fsl-ssa-eval"
) -> list[_T]:
    """Run ``work(0) .. work(count - 1)`` on ``threads`` threads; return results in order.

    Every call has finished when this returns or raises (the error of the lowest-numbered
    call that failed is re-raised after all of them are done, so no call still writes into
    a buffer the caller reuses). The pool's workers take the numbers in increasing order as
    they become free.

    Parameters
    ----------
    work : callable
        Called once with each number in ``range(count)``.
    count : int
        How many calls.
    threads : int
        The pool's worker count (one or fewer: the calls run in this thread, in order).
    name : str, optional
        The pool (:func:`worker_pool`).

    Returns
    -------
    list
        ``[work(0), ..., work(count - 1)]``.
    """
    return start_ranges(work, count, threads, name).result()


class StartedRanges(Generic[_T]):
    """The calls of one :func:`start_ranges`, running or done.

    Parameters
    ----------
    count : int
        How many calls.
    """

    def __init__(self, count: int) -> None:
        self.results: list[_T | None] = [None] * count
        self.errors: list[BaseException | None] = [None] * count
        self.futures: list[Future[None]] = []

    def wait(self) -> None:
        """Return once every call has finished (raises nothing)."""
        wait(self.futures)

    def result(self) -> list[_T]:
        """Wait for every call; return their results in order.

        Raises
        ------
        BaseException
            The error of the lowest-numbered call that failed, once all of them are done.
        """
        self.wait()
        for f in self.futures:
            f.result()  # the drains never raise; anything else (a dead pool) surfaces here
        for err in self.errors:
            if err is not None:
                raise err
        return self.results  # type: ignore[return-value]


def start_ranges(
    work: Callable[[int], _T], count: int, threads: int, name: str = "fsl-ssa-eval"
) -> StartedRanges[_T]:
    """:func:`run_ranges` without waiting: the calls are queued on the pool, in order.

    The pool's workers take them after any work queued before (an SSA server queues client
    ``i + 1``'s evaluation while client ``i``'s runs, so no worker idles at the end of
    ``i``); :meth:`StartedRanges.result` waits. With ``threads <= 1`` or ``count <= 1`` the
    calls run here, in order, before this returns.

    Parameters
    ----------
    work, count, threads, name
        As :func:`run_ranges`.

    Returns
    -------
    StartedRanges
        The calls' handle.
    """
    started: StartedRanges[_T] = StartedRanges(count)
    results, errors = started.results, started.errors
    if threads <= 1 or count <= 1:
        for j in range(count):
            try:
                results[j] = work(j)
            except BaseException as err:  # raised by result(), as on the pool
                errors[j] = err
                break  # in order: nothing after a failed call runs, as before
        return started
    # One task per worker, each taking the next number until none is left (``next`` on an
    # ``itertools.count`` is atomic under the GIL), not one task per number: a server's client
    # is 52 ranges, and each submitted task cost a Future, a queue put and a wake-up, all
    # holding the GIL (about 2 ms of CPU per 52 ranges on 2 cores, session 35).
    numbers = itertools.count()

    def drain() -> None:
        for j in numbers:
            if j >= count:
                return
            try:
                results[j] = work(j)
            except BaseException as err:  # raised by result(), after every call
                errors[j] = err

    pool = worker_pool(threads, name)
    started.futures = [pool.submit(drain) for _ in range(min(threads, count))]
    return started


def pipelined(
    items: Sequence[_I],
    prepare: Callable[[_I], _P],
    use: Callable[[_I, _P | Exception], _T],
    threads: int,
    name: str = "fsl-ssa-eval",
) -> list[_T]:
    """Return ``[use(x, prepare(x)) for x in items]``, each ``prepare`` one item ahead.

    ``use`` runs in the caller, item after item, in order; while it runs for ``items[i]``,
    ``prepare(items[i + 1])`` runs as one task on the pool ``name``, so work the caller did
    alone between two items overlaps the pool's work on the first (``prepare(items[1])``
    also runs beside ``prepare(items[0])``, which the caller does). ``use`` receives what
    ``prepare`` returned or the :class:`Exception` it raised (``use`` decides when to raise it:
    an item fails alone). An error ``use`` raises propagates once the pending ``prepare`` is
    done. ``prepare`` runs beside ``use``, so it must not touch what ``use`` changes, nor wait
    for other work on the pool ``name`` (a pool that waits on itself can deadlock).

    Parameters
    ----------
    items : Sequence
        What to process, in order.
    prepare : callable
        The first step of an item (no side effects that ``use`` depends on).
    use : callable
        The second step: ``use(item, prepared or the exception)``.
    threads : int
        The pool's worker count (one or fewer: everything runs in the caller, in order).
    name : str, optional
        The pool (:func:`worker_pool`).

    Returns
    -------
    list
        ``use``'s results, in the order of ``items``.
    """
    if threads <= 1 or len(items) <= 1:
        return [use(x, _attempt(prepare, x)) for x in items]
    pool = worker_pool(threads, name)
    out: list[_T] = []
    # The second item is prepared on the pool while the caller prepares the first: before the
    # first ``use`` the pool is idle, and the caller's first ``prepare`` was serial work
    # (issue 26's Amdahl part: one per relayed chunk on an SSA server).
    second = pool.submit(_attempt, prepare, items[1])
    try:
        ready: _P | Exception = _attempt(prepare, items[0])
    except BaseException:
        wait([second])
        raise
    ahead: Future[_P | Exception] | None = second
    for i, item in enumerate(items):
        if i:
            assert ahead is not None
            ready = ahead.result()
            ahead = pool.submit(_attempt, prepare, items[i + 1]) if i + 1 < len(items) else None
        try:
            out.append(use(item, ready))
        finally:
            if ahead is not None:
                wait([ahead])
    return out


def streamed(
    items: Sequence[_I],
    prepare: Callable[[_I], _P],
    start: Callable[[_I, _P | Exception], _S],
    finish: Callable[[_I, _S], _T],
    cancel: Callable[[_I, _S], None],
    threads: int,
    name: str = "fsl-ssa-eval",
) -> list[_T]:
    """Return ``[finish(x, start(x, prepare(x))) for x in items]``, item ``i + 1`` started first.

    Everything runs in the caller, in order, except the pool work ``start`` queues: before
    ``finish`` of item ``i`` (which waits for its pool work, then settles it), item ``i + 1`` is
    prepared and started, so its work is queued behind item ``i``'s and the pool never idles
    between the two, and what ``finish`` and ``prepare`` do in the caller overlaps the pool's
    work on item ``i + 1`` (the SSA servers' per-client tail, issue 26). At most two items are
    started and not finished. The second item is prepared on the pool ``name`` while the
    caller prepares the first (before the first start the pool has nothing else to do).
    ``start`` receives what ``prepare`` returned or the :class:`Exception` it raised, and must
    not raise (it hands any refusal to ``finish``). If ``finish`` raises, the item started after
    it is cancelled (``cancel``, which waits for its work and undoes it) and the error
    propagates.

    Parameters
    ----------
    items : Sequence
        What to process, in order.
    prepare : callable
        The first step of an item, in the caller.
    start : callable
        Queues an item's pool work; returns its handle.
    finish : callable
        Waits for a started item and settles it (in item order).
    cancel : callable
        Waits for a started item that will not be finished and undoes its work.
    threads : int
        The pool's worker count (one or fewer: the second item is prepared in the caller).
    name : str, optional
        The pool (:func:`worker_pool`).

    Returns
    -------
    list
        ``finish``'s results, in the order of ``items``.
    """
    if not items:
        return []
    second: Future[_P | Exception] | None = None
    if threads > 1 and len(items) > 1:
        second = worker_pool(threads, name).submit(_attempt, prepare, items[1])

    def begin(i: int) -> _S:
        ready = second.result() if i == 1 and second is not None else _attempt(prepare, items[i])
        return start(items[i], ready)

    ahead: _S | None = _first(begin, second)
    out: list[_T] = []
    for i, item in enumerate(items):
        started, ahead = ahead, None
        if i + 1 < len(items):
            try:
                ahead = begin(i + 1)
            except BaseException:
                cancel(item, started)  # type: ignore[arg-type]
                raise
        try:
            out.append(finish(item, started))  # type: ignore[arg-type]
        except BaseException:
            if ahead is not None:
                cancel(items[i + 1], ahead)
            raise
    return out


def _first(begin: Callable[[int], _S], second: Future[Any] | None) -> _S:
    """``begin(0)``; if it raises, the second item's prepare (on the pool) is waited for first."""
    try:
        return begin(0)
    except BaseException:
        if second is not None:
            wait([second])
        raise


def _attempt(prepare: Callable[[_I], _P], item: _I) -> _P | Exception:
    """``prepare(item)``, or the :class:`Exception` it raised."""
    try:
        return prepare(item)
    except Exception as err:  # handed to ``use``, which raises it in order
        return err
