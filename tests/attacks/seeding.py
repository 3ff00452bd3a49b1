"""Reproducible servers' and clients' randomness for attack tests with statistical bounds.

An attack test at default settings asserts a threshold on a measured rate (a decoder's accuracy
against chance plus a margin). Drawn from the OS, the DP noise behind that rate changes every
run, so the bound holds only with high probability and CI could fail at random. The fixture
below keys every :meth:`~flwr_fsl.crypto.prg.PRGStream.fresh` stream (DP noise, share
randomness) from a run seed and a call counter instead: each stream is still fresh and
independent of the others, but the run is the same every time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest

from flwr_fsl.crypto.prg import PRGStream

__all__ = ["seed_fresh_streams"]


def seed_fresh_streams(monkeypatch: pytest.MonkeyPatch, run_seed: str) -> Callable[[], int]:
    """Make ``PRGStream.fresh()`` deterministic for the rest of the test.

    Parameters
    ----------
    monkeypatch : pytest.MonkeyPatch
        The test's monkeypatch (the patch ends with the test).
    run_seed : str
        Names the run; the ``i``-th fresh stream is keyed by ``SHA-256(run_seed)[:16]`` at
        index ``i`` (:meth:`~flwr_fsl.crypto.prg.PRGStream.from_seed`).

    Returns
    -------
    Callable[[], int]
        How many fresh streams were drawn so far (a test can check the patch was used).
    """
    key = hashlib.sha256(run_seed.encode()).digest()[:16]
    drawn = [0]

    def fresh(cls: type[PRGStream]) -> PRGStream:
        drawn[0] += 1
        return cls.from_seed(key, drawn[0])

    monkeypatch.setattr(PRGStream, "fresh", classmethod(fresh))
    return lambda: drawn[0]
