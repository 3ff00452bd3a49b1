"""Process-wide worker pools for GIL-free kernels, and one way to run numbered work on them.

The SSA servers' evaluation and the clients' key generation both split their work into ranges
whose numba kernels release the GIL; each kind keeps one pool per thread count for the life of
the process (threads are started once, not per client).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

__all__ = ["run_ranges", "worker_pool"]

_T = TypeVar("_T")

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
    futures: list[Future[_T]] = [worker_pool(threads, name).submit(work, j) for j in range(count)]
    wait(futures)
    return [f.result() for f in futures]
