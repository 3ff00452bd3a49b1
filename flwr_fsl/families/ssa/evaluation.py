"""The SSA servers' per-client DPF evaluation, in key ranges spread over threads (issue 26).

A client's keys are split into consecutive key ranges (:func:`segments`); each range is one
:func:`~flwr_fsl.crypto.dpf.evaluate_batch` call into its rows of the server's reused output
buffer. With ``threads >= 2`` the ranges run on a process-wide thread pool: the numba kernels
(``nogil``), ``cryptography``'s batched AES and ``hashlib`` release the GIL, so a server uses
every core it is given; with ``threads == 1`` they run in the calling thread, in order.

The thread count is an :class:`~flwr_fsl.families.ssa.protocol.SSAServer` argument; left out,
it is read from the environment variable ``FLWR_FSL_SSA_THREADS`` (so a helper process or a
``LeadServer`` can be capped without code), else every core this process may run on
(``os.sched_getaffinity``). The ranges and everything a server outputs (share, digest) do not
depend on the thread count.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.dpf import DPFKeyBatch

__all__ = [
    "THREADS_ENV",
    "default_threads",
    "key_range",
    "resolve_threads",
    "run_ranges",
    "segments",
]

THREADS_ENV = "FLWR_FSL_SSA_THREADS"
"""Environment variable with the SSA servers' default evaluation thread count."""

_T = TypeVar("_T")
_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def default_threads() -> int:
    """Return ``FLWR_FSL_SSA_THREADS`` if set, else the cores this process may run on.

    Raises
    ------
    ConfigurationError
        If the variable is set to anything but an integer ``>= 1``.
    """
    raw = os.environ.get(THREADS_ENV, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise ConfigurationError(
                f"{THREADS_ENV} must be an integer >= 1, got {raw!r}"
            ) from None
        if value < 1:
            raise ConfigurationError(f"{THREADS_ENV} must be an integer >= 1, got {raw!r}")
        return value
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)  # pragma: no cover - platforms without affinity


def resolve_threads(threads: int | None) -> int:
    """Validate a ``threads`` argument (None: :func:`default_threads`).

    Raises
    ------
    ConfigurationError
        If ``threads`` is not an integer ``>= 1`` (naming the argument).
    """
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int | np.integer) or threads < 1:
        raise ConfigurationError(f"threads must be an integer >= 1, got {threads!r}")
    return int(threads)


def _pool(threads: int) -> ThreadPoolExecutor:
    """Return the process-wide pool with ``threads`` workers (made on first use, then kept)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fsl-ssa-eval")
            _POOLS[threads] = pool
        return pool


def segments(lengths: NDArray[np.int64], points: int) -> list[tuple[int, int]]:
    """Split keys into consecutive ranges of at most ``points`` evaluated points.

    A single key larger than that (e.g. a stash key) is a range of its own.
    """
    out: list[tuple[int, int]] = []
    start, acc = 0, 0
    for j, n in enumerate(lengths.tolist()):
        if acc and acc + n > points:
            out.append((start, j))
            start, acc = j, 0
        acc += n
    if lengths.shape[0]:
        out.append((start, lengths.shape[0]))
    return out


def key_range(keys: DPFKeyBatch, lo: int, hi: int) -> DPFKeyBatch:
    """Keys ``lo..hi-1`` of a batch as a batch of their own (same party, same words; views)."""
    if (lo, hi) == (0, keys.public.num_keys):
        return keys
    part = keys.public.key_slice(lo, hi)
    return DPFKeyBatch(party=keys.party, root_seeds=keys.root_seeds[lo:hi], public=part)


def run_ranges(work: Callable[[int], _T], count: int, threads: int) -> list[_T]:
    """Run ``work(0) .. work(count - 1)`` on ``threads`` threads; return results in order.

    Every call has finished when this returns or raises (the first error is re-raised after
    all of them are done, so no call still writes into a buffer the caller reuses).
    """
    if threads <= 1 or count <= 1:
        return [work(j) for j in range(count)]
    futures: list[Future[_T]] = [_pool(threads).submit(work, j) for j in range(count)]
    wait(futures)
    return [f.result() for f in futures]
