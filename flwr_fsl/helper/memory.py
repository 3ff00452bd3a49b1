"""Keep S1's resident memory flat in the number of clients (glibc's allocator settings).

S1 serves calls on a pool of gRPC threads. With glibc's defaults every thread allocates from
its own arena, and the size above which a block is mapped on its own grows with the largest
block freed so far (up to 32 MiB), so the per-client evaluation buffers and relay chunks came
from several arenas and left freed but fragmented pages behind: S1's peak resident memory
grew with the number of clients of a round (by 58 MiB from 50 to 800 clients at
``m = 2**16`` with 8 MiB relay chunks, 37.5 MiB from 50 to 200 at ``m = 2**20``; S0 stayed
flat). :func:`bound_allocator` fixes the threshold at :data:`MMAP_THRESHOLD_BYTES` and the
arenas at :data:`ARENA_MAX` (glibc's ``mallopt``), which measured flat (0.5 MiB from 50 to 800
clients) and lower (at ``m = 2**20``: 590-614 MiB against 776-830 MiB for 24 clients), at the
price of page faults on every large buffer: S1 took about 5% longer per client there (0.81-0.83
against 0.77-0.78 s, same machine, load 2-3): ``benchmarks/ssa_bench.py --scale``, issue 26's
memory target. ``flwr-fsl-helper``
calls it at start unless the operator set ``MALLOC_ARENA_MAX`` or ``MALLOC_MMAP_THRESHOLD_``
(glibc's own variables, which then decide); elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD_BYTES", "bound_allocator"]

ARENA_MAX = 2
"""Allocator arenas S1's threads share (glibc's default: 8 per core)."""
MMAP_THRESHOLD_BYTES = 128 * 1024
"""Blocks at least this large are mapped on their own and unmapped when freed (fixed)."""
_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8  # glibc's mallopt parameter numbers (malloc.h)
_ENV = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_")


def bound_allocator(environ: Mapping[str, str] | None = None) -> bool:
    """Fix glibc's mmap threshold and arena count for this process (see the module docstring).

    Parameters
    ----------
    environ : Mapping[str, str], optional
        The environment to consult (default ``os.environ``): if it sets ``MALLOC_ARENA_MAX``
        or ``MALLOC_MMAP_THRESHOLD_``, the operator's values stand and nothing is changed.

    Returns
    -------
    bool
        Whether both settings were applied (False without glibc's ``mallopt``).
    """
    env = os.environ if environ is None else environ
    if any(name in env for name in _ENV):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    applied = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    return bool(mallopt(_M_ARENA_MAX, ARENA_MAX) == 1 and applied)
