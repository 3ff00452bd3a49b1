"""Reproducible servers' and clients' randomness for attack tests with statistical bounds.

An attack test at default settings asserts a threshold on a measured rate (a decoder's accuracy
against chance plus a margin). Drawn from the OS, the DP noise behind that rate changes every
run, so the bound holds only with high probability and CI could fail at random. The fixture
below keys every :meth:`~flwr_fsl.crypto.prg.PRGStream.fresh` stream (DP noise, share
randomness) from a run seed and a call counter instead: each stream is still fresh and
independent of the others, but the run is the same every time. Code that draws its secrets
from :func:`os.urandom` itself (PrivHFL's query seeds and session seeds, DCF/DPF master keys)
is covered with ``os_random=True``: every call then reads the next keyed stream too.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable

import pytest

from flwr_fsl.crypto.prg import PRGStream

__all__ = ["seed_fresh_streams"]


def seed_fresh_streams(
    monkeypatch: pytest.MonkeyPatch, run_seed: str, *, os_random: bool = False
) -> Callable[[], int]:
    """Make ``PRGStream.fresh()`` (and optionally ``os.urandom``) deterministic for the test.

    Parameters
    ----------
    monkeypatch : pytest.MonkeyPatch
        The test's monkeypatch (the patch ends with the test).
    run_seed : str
        Names the run; the ``i``-th fresh stream is keyed by ``SHA-256(run_seed)[:16]`` at
        index ``i`` (:meth:`~flwr_fsl.crypto.prg.PRGStream.from_seed`).
    os_random : bool, optional
        Also replace :func:`os.urandom` (process-wide, until the test ends) and
        :mod:`random`'s import-time alias of it, which ``SystemRandom``, :mod:`secrets` and
        numpy's unseeded ``default_rng()`` (stochastic rounding) read: the ``i``-th call of
        any kind reads stream ``i``, so the draws stay distinct and independent. Left random:
        OpenSSL's own generator (X25519 keys), which only seals seeds in transit.

    Returns
    -------
    Callable[[], int]
        How many fresh streams (and ``os.urandom`` calls) were drawn so far (a test can check
        the patch was used).
    """
    key = hashlib.sha256(run_seed.encode()).digest()[:16]
    drawn = [0]

    def fresh(cls: type[PRGStream]) -> PRGStream:
        drawn[0] += 1
        return cls.from_seed(key, drawn[0])

    def urandom(size: int) -> bytes:
        drawn[0] += 1
        return PRGStream.from_seed(key, drawn[0]).words(-(-size // 8)).tobytes()[:size]

    monkeypatch.setattr(PRGStream, "fresh", classmethod(fresh))
    if os_random:
        monkeypatch.setattr(os, "urandom", urandom)
        monkeypatch.setattr(random, "_urandom", urandom)
    return lambda: drawn[0]
