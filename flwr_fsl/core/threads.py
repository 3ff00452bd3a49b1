"""Process-wide worker pools for GIL-free kernels, and one way to run numbered work on them.

The SSA servers' evaluation and the clients' key generation both split their work into ranges
whose numba kernels release the GIL; each kind keeps one pool per thread count for the life of
the process (threads are started once, not per client). :func:`pipelined` runs a sequence of
items through two steps, the next item's first step on the pool while the caller does this
item's second (the SSA servers parse client ``i + 1`` while they evaluate client ``i``); with
``defer`` that first step waits for the tail of the caller's next :func:`run_ranges`, where a
worker would otherwise idle.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial
from typing import TypeVar

__all__ = ["pipelined", "run_ranges", "worker_pool"]

_T = TypeVar("_T")
_I = TypeVar("_I")
_P = TypeVar("_P")

_POOLS: dict[tuple[int, str], ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


class _Deferred:
    """One ``prepare`` call waiting for an idle worker of a pool (:func:`pipelined`'s ``defer``).

    Whoever claims it first runs it: the tail task of a :func:`run_ranges` on its pool, or the
    caller of :func:`pipelined` when no worker took it in time.
    """

    def __init__(self, run: Callable[[], object]) -> None:
        self._run = run
        self._lock = threading.Lock()
        self._taken = False
        self.done = threading.Event()
        self.result: object = None

    def claim(self) -> bool:
        """Return True exactly once: to the one who runs it."""
        with self._lock:
            taken, self._taken = self._taken, True
            return not taken

    def run(self) -> None:
        """Run it (once claimed); ``done`` is set even if it raises."""
        try:
            self.result = self._run()
        finally:
            self.done.set()


_DEFERRED: dict[str, list[_Deferred]] = {}
_DEFERRED_LOCK = threading.Lock()


def _run_deferred(name: str) -> None:
    """Tail task of :func:`run_ranges`: run a deferred ``prepare`` of the pool ``name``, if any."""
    with _DEFERRED_LOCK:
        waiting = _DEFERRED.get(name, [])
        job = next((d for d in waiting if d.claim()), None)
        if job is not None:
            waiting.remove(job)
    if job is not None:
        job.run()


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

    Every call has finished when this returns or raises (the first error is re-raised after
    all of them are done, so no call still writes into a buffer the caller reuses).

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
    if threads <= 1 or count <= 1:
        return [work(j) for j in range(count)]
    pool = worker_pool(threads, name)
    futures: list[Future[_T]] = [pool.submit(work, j) for j in range(count)]
    if _DEFERRED.get(name):  # the first worker without a range left runs it (not waited for)
        pool.submit(_run_deferred, name)
    wait(futures)
    return [f.result() for f in futures]


def pipelined(
    items: Sequence[_I],
    prepare: Callable[[_I], _P],
    use: Callable[[_I, _P | Exception], _T],
    threads: int,
    name: str = "fsl-ssa-eval",
    *,
    defer: bool = False,
) -> list[_T]:
    """Return ``[use(x, prepare(x)) for x in items]``, each ``prepare`` one item ahead.

    ``use`` runs in the caller, item after item, in order; while it runs for ``items[i]``,
    ``prepare(items[i + 1])`` runs as one task on the pool ``name``, so work the caller did
    alone between two items overlaps the pool's work on the first. ``use`` receives what
    ``prepare`` returned or the :class:`Exception` it raised (``use`` decides when to raise it:
    an item fails alone). An error ``use`` raises propagates once the pending ``prepare`` is
    done. ``prepare`` runs beside ``use``, so it must not touch what ``use`` changes, nor wait
    for other work on the pool ``name`` (a pool that waits on itself can deadlock).

    With ``defer``, ``prepare(items[i + 1])`` is not queued ahead of ``use``'s work: it runs
    as the last task of the first :func:`run_ranges` on the pool ``name`` that ``use`` makes
    (on the first worker left without a range: the one that would idle while the other
    finishes the last range, and then beside the caller's own work after it), or in the caller
    after ``use`` if no worker took it (``use`` made no such call); if ``use`` raises first,
    an untaken ``prepare`` never runs. The results are the same.

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
    defer : bool, optional
        Run each ``prepare`` at the tail of ``use``'s pool work (default False: at once).

    Returns
    -------
    list
        ``use``'s results, in the order of ``items``.
    """
    if threads <= 1 or len(items) <= 1:
        return [use(x, _attempt(prepare, x)) for x in items]
    pool = worker_pool(threads, name)
    out: list[_T] = []
    ready: _P | Exception = _attempt(prepare, items[0])
    for i, item in enumerate(items):
        last = i + 1 == len(items)
        if defer and not last:
            job = _Deferred(partial(_attempt, prepare, items[i + 1]))
            with _DEFERRED_LOCK:
                _DEFERRED.setdefault(name, []).append(job)
            try:
                out.append(use(item, ready))
            except BaseException:
                _withdraw(name, job)
                raise
            if _withdraw(name, job):
                job.run()  # no worker took it: run it here
            job.done.wait()
            ready = job.result  # type: ignore[assignment]
            continue
        ahead = None if last else pool.submit(_attempt, prepare, items[i + 1])
        try:
            out.append(use(item, ready))
        finally:
            if ahead is not None:
                wait([ahead])
        if ahead is not None:
            ready = ahead.result()
    return out


def _withdraw(name: str, job: _Deferred) -> bool:
    """Take a deferred job off the pool's list; True if nobody had claimed it (now ours).

    If a worker claimed it, wait until it has finished.
    """
    with _DEFERRED_LOCK:
        waiting = _DEFERRED.get(name, [])
        if job in waiting:
            waiting.remove(job)
        if not waiting:
            _DEFERRED.pop(name, None)
    if job.claim():
        return True
    job.done.wait()
    return False


def _attempt(prepare: Callable[[_I], _P], item: _I) -> _P | Exception:
    """``prepare(item)``, or the :class:`Exception` it raised."""
    try:
        return prepare(item)
    except Exception as err:  # handed to ``use``, which raises it in order
        return err
