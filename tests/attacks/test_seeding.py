"""The attack tests' seeding (:func:`~tests.attacks.seeding.seed_fresh_streams`): one run seed
gives one run, every draw is fresh within it, and the patch ends with the test."""

from __future__ import annotations

import os
import random
import secrets

import numpy as np
import pytest

from flwr_fsl.crypto.prg import PRGStream
from tests.attacks.seeding import seed_fresh_streams


def _draws() -> tuple[bytes, ...]:
    """One draw of every kind the patch covers, in a fixed order."""
    return (
        os.urandom(5),
        os.urandom(16),
        PRGStream.fresh().words(2).tobytes(),
        secrets.token_bytes(9),
        np.random.default_rng().bytes(8),
    )


def test_one_run_seed_gives_one_run(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = []
    for _ in range(2):
        with monkeypatch.context() as patch:
            drawn = seed_fresh_streams(patch, "a run", os_random=True)
            runs.append(_draws())
            assert drawn() >= 4  # numpy's entropy may take more than one call
    assert runs[0] == runs[1]
    assert [len(d) for d in runs[0]] == [5, 16, 16, 9, 8]
    assert len(set(runs[0])) == len(runs[0])  # fresh within the run
    with monkeypatch.context() as patch:
        seed_fresh_streams(patch, "another run", os_random=True)
        assert _draws() != runs[0]


def test_without_os_random_only_fresh_streams_are_keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    urandom, alias = os.urandom, random._urandom  # type: ignore[attr-defined]
    with monkeypatch.context() as patch:
        seed_fresh_streams(patch, "a run")
        assert os.urandom is urandom
        first = PRGStream.fresh().words(1)
    with monkeypatch.context() as patch:
        seed_fresh_streams(patch, "a run")
        assert np.array_equal(PRGStream.fresh().words(1), first)
    with monkeypatch.context() as patch:
        seed_fresh_streams(patch, "a run", os_random=True)
        assert os.urandom is not urandom
    assert os.urandom is urandom and random._urandom is alias  # type: ignore[attr-defined]
