"""Randomized-response index perturbation (Niu Alg. 2): Table V's numbers, the coins'
frequencies, memoization across rounds and restarts, the server's view, strict memo decoding."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.families.sfsl.perturb import (
    MemoStore,
    PermanentMemo,
    RRParams,
    perturb_index_set,
    theorem2_events,
)

# Niu et al. Table V: (p1 = p3, p2 = p4) -> p5, p6, eps1, eps_inf.
TABLE_V = {
    "CPP1": (1.0, 0.0, 1.0, 0.0, math.inf, math.inf),
    "CPP2": (15 / 16, 1 / 16, 0.883, 0.117, 2.02, 2.71),
    "CPP3": (7 / 8, 1 / 8, 0.781, 0.219, 1.27, 1.95),
    "CPP4": (3 / 4, 1 / 4, 0.625, 0.375, 0.51, 1.10),
    "CPP5": (1.0, 1.0, 1.0, 1.0, 0.0, 0.0),
}


@pytest.mark.parametrize("name", list(TABLE_V))
def test_table_v(name: str) -> None:
    keep, flip, p5, p6, eps1, eps_inf = TABLE_V[name]
    params = RRParams.symmetric(keep, flip)
    assert round(params.p5, 3) == p5 and round(params.p6, 3) == p6
    for got, want in ((params.epsilon_one_round, eps1), (params.epsilon_permanent, eps_inf)):
        assert got == want if math.isinf(want) else round(got, 2) == want


def test_theorem2_events_match_the_formulas() -> None:
    params = RRParams.symmetric(15 / 16, 1 / 16)
    p7, p8 = theorem2_events(params, [1, 2, 0], [99, 98, 100])
    p5, p6 = params.p5, params.p6
    assert p7[0] == pytest.approx(p5 * (1 - p6) ** 99)
    assert p7[1] == pytest.approx(p5 * (1 - p5) * (1 - p6) ** 98)
    assert p7[2] == 0.0
    assert p8[0] == pytest.approx((1 - p5) * (1 - (1 - p6) ** 99))
    # CPP1 (no perturbation): an index owned by one client alone is always exposed.
    p7, p8 = theorem2_events(RRParams.symmetric(1.0, 0.0), [1, 2], [9, 8])
    assert list(p7) == [1.0, 0.0] and list(p8) == [0.0, 0.0]


def test_bad_probabilities_are_configuration_errors() -> None:
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ConfigurationError):
            RRParams(bad, 0.1, 0.5, 0.5)  # type: ignore[arg-type]


def test_frequencies_are_p5_for_owned_and_p6_for_other_indices() -> None:
    # Many fresh clients (fresh memos) on one union: each index's inclusion rate.
    params = RRParams(0.8, 0.3, 0.9, 0.2)
    union = np.arange(4000)
    real = np.arange(2000)
    prg = PRGStream(b"sfsl-rr-rates-01")  # fixed: a 5-sigma bound checked on one known draw
    hits = np.zeros(union.size)
    trials = 50
    for _ in range(trials):
        out, _ = perturb_index_set(real, union, PermanentMemo(), params, prg)
        hits[out] += 1
    n = trials * 2000
    for rate, p in ((hits[:2000].sum() / n, params.p5), (hits[2000:].sum() / n, params.p6)):
        assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_memoized_answers_do_not_change_across_rounds_or_restarts(tmp_path: Path) -> None:
    params = RRParams(0.75, 0.25, 1.0, 0.0)  # p3 = 1, p4 = 0: S'' is exactly the "yes" set
    real = np.arange(0, 300, 2)
    store = MemoStore(tmp_path / "client-7.rr")
    first, memo = perturb_index_set(real, np.arange(300), store.load(), params)
    store.save(memo)
    assert (tmp_path / "client-7.rr").stat().st_mode & 0o777 == 0o600
    np.testing.assert_array_equal(first, memo.yes)
    # A restarted client with a larger union: old indices keep their answers, new ones get one.
    restored = store.load()
    again, memo2 = perturb_index_set(real, np.arange(400), restored, params)
    np.testing.assert_array_equal(np.intersect1d(again, np.arange(300)), first)
    assert np.union1d(memo2.yes, memo2.no).size == 400
    np.testing.assert_array_equal(memo2.yes[memo2.yes < 300], memo.yes)


def test_repeated_rounds_do_not_average_the_noise_away() -> None:
    # The curious server collects S'' over 200 rounds and keeps the indices seen more than half
    # the time. Without memoization that majority vote recovers S exactly; with it the server
    # recovers only the permanent answers, whose error rate stays 1 - p1 / p2 per index.
    params = RRParams.symmetric(7 / 8, 1 / 8)
    union = np.arange(2000)
    real = np.arange(0, 2000, 2)
    owned = np.isin(union, real)
    prg = PRGStream(b"sfsl-rr-memo-002")  # fixed: the 0.03 bound is 4 sd of the accuracy

    def majority(memoize: bool) -> float:
        counts = np.zeros(union.size)
        memo = PermanentMemo()
        for _ in range(200):
            out, new = perturb_index_set(real, union, memo, params, prg)
            memo = new if memoize else PermanentMemo()
            counts[out] += 1
        guess = counts > 100
        return float(np.mean(guess == owned))

    assert majority(memoize=False) == 1.0
    accuracy = majority(memoize=True)
    assert abs(accuracy - 7 / 8) < 0.03  # bounded by the permanent layer (eps_inf)


def test_a_corrupted_memo_file_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    store = MemoStore(tmp_path / "m.rr")
    _, memo = perturb_index_set(
        [1, 2], np.arange(10), PermanentMemo(), RRParams.symmetric(0.5, 0.5)
    )
    store.save(memo)
    raw = bytearray((tmp_path / "m.rr").read_bytes())
    raw[-1] ^= 0xFF
    (tmp_path / "m.rr").write_bytes(bytes(raw))
    with pytest.raises(ClientInputError):
        store.load()


def test_memo_codec_rejects_inconsistent_content() -> None:
    memo = PermanentMemo(np.array([1, 5], np.int64), np.array([2], np.int64))
    assert PermanentMemo.from_bytes(memo.to_bytes()).yes.tolist() == [1, 5]
    for bad in (
        PermanentMemo(np.array([5, 1], np.int64), np.zeros(0, np.int64)),
        PermanentMemo(np.array([1], np.int64), np.array([1], np.int64)),
        PermanentMemo(np.array([-1], np.int64), np.zeros(0, np.int64)),
    ):
        with pytest.raises(ClientInputError):
            PermanentMemo.from_bytes(bad.to_bytes())
    huge = b"FSRR" + bytes([1]) + (2**40).to_bytes(8, "little") + bytes(8)
    with pytest.raises(ClientInputError, match="length"):
        PermanentMemo.from_bytes(huge)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_memo_decoder_fuzz(blob: bytes) -> None:
    try:
        PermanentMemo.from_bytes(b"FSRR" + blob)
    except ClientInputError:
        pass


@settings(max_examples=60, deadline=None)
@given(
    real=st.sets(st.integers(0, 300), max_size=60),
    extra=st.sets(st.integers(0, 300), max_size=60),
    keep=st.floats(0, 1),
    flip=st.floats(0, 1),
)
def test_perturbed_set_lies_in_the_union_and_memo_partitions_it(
    real: set[int], extra: set[int], keep: float, flip: float
) -> None:
    union = np.array(sorted(real | extra), dtype=np.int64)
    out, memo = perturb_index_set(
        np.array(sorted(real), dtype=np.int64),
        union,
        PermanentMemo(),
        RRParams.symmetric(keep, flip),
    )
    assert set(out.tolist()) <= set(union.tolist())
    assert sorted(np.union1d(memo.yes, memo.no).tolist()) == union.tolist()
    assert not np.intersect1d(memo.yes, memo.no).size
