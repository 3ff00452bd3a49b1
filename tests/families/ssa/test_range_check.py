"""The SSA value words' range check (flwr_fsl.families.ssa.range_check), on its own.

Honest words in ``[-bound, bound]`` (the edges included) pass at both servers; a client whose
word is outside is caught whatever it sends: a proof for the word clipped (the exact Z_2^64
relation fails), claimed "bits" that are not bits but satisfy the relation (the FLP fails),
a "bit" that is 1 only mod p (S0's share bound fails), tampered parts, a mismatched query.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto import flp
from flwr_fsl.families.ssa import range_check as rc
from flwr_fsl.families.ssa.messages import SSAInputError

U64 = 1 << 64


def _words(values: list[int]) -> np.ndarray:
    return np.array([v % U64 for v in values], np.uint64)


def _split(v: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    s1 = np.random.default_rng(seed).integers(0, 2**63, v.shape[0], dtype=np.uint64) * np.uint64(3)
    return v - s1, s1


def _run(values: np.ndarray, bound: int, up: rc.RangeUpload) -> tuple[bool, bool, bool]:
    """Both servers' checks; return (digests equal, S1 accepts, S0 accepts)."""
    v0, v1 = _split(values)
    c0 = rc.server_check(0, v0, bound, (up.part0, up.part1), up)
    c1 = rc.server_check(1, v1, bound, (up.part0, up.part1), up.seed1, c0.query_seed)
    b0, b1 = c0.to_bytes(), c1.to_bytes()
    return b0[:32] == b1[:32], rc.same_check(b1, b0), rc.same_check(b0, b1)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300))
def test_coefficients_reach_exactly_zero_to_twice_the_bound(bound: int) -> None:
    coef = [int(c) for c in rc.coefficients(bound)]
    assert len(coef) == (2 * bound).bit_length()
    sums = set()
    for bits in itertools.product((0, 1), repeat=len(coef)):
        sums.add(sum(c * b for c, b in zip(coef, bits, strict=True)))
    assert sums == set(range(2 * bound + 1))


@settings(max_examples=50, deadline=None)
@given(bound=st.integers(1, 2**40), data=st.data())
def test_decompose_round_trips_every_in_range_word(bound: int, data: st.DataObject) -> None:
    values = data.draw(st.lists(st.integers(-bound, bound), min_size=1, max_size=20))
    values += [bound, -bound, 0]
    bits = rc.decompose(_words(values), bound)
    assert set(np.unique(bits).tolist()) <= {0, 1}
    coef = [int(c) for c in rc.coefficients(bound)]
    for row, v in zip(bits.tolist(), values, strict=True):
        assert sum(c * b for c, b in zip(coef, row, strict=True)) - bound == v


@pytest.mark.parametrize("bad", [lambda b: b + 1, lambda b: -b - 1, lambda b: 2**63])
def test_decompose_refuses_out_of_range_words(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError, match="outside"):
        rc.decompose(_words([0, bad(1000)]), 1000)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    bound=st.sampled_from([1, 3, 1000, 2**24, 10_000 * 2**24, 2**60 - 1]),
    width=st.integers(0, 40),
    data=st.data(),
)
def test_honest_words_pass_edges_included(bound: int, width: int, data: st.DataObject) -> None:
    values = data.draw(st.lists(st.integers(-bound, bound), min_size=width, max_size=width))
    values += [bound, -bound]
    words = _words(values)
    assert _run(words, bound, rc.make_upload(words, bound)) == (True, True, True)


@pytest.mark.parametrize("outside", [1, 2, 10**6, -1, -(10**9), 2**62])
def test_a_word_outside_with_a_proof_for_it_clipped_is_caught(outside: int) -> None:
    bound = 2**24
    real = bound + outside if outside > 0 else -bound + outside
    clipped = max(-bound, min(bound, real))
    values = _words([5, real, -7])
    up = rc.make_upload(_words([5, clipped, -7]), bound)  # the best a forger can prove
    same, s1_accepts, s0_accepts = _run(values, bound, up)
    assert not same and not s1_accepts and not s0_accepts


def test_non_bits_that_satisfy_the_relation_are_caught_by_the_flp() -> None:
    bound = 1000
    real = bound + 1  # a + bound = 2 bound + 1: one past every 0/1 combination
    bits = rc.decompose(_words([bound]), bound).reshape(-1).copy()
    bits[0] += np.uint64(1)  # the weight-1 bit becomes 1 or 2: sum is exactly 2 bound + 1
    assert (bits > 1).any()
    up = rc.upload_bits(bits)
    same, s1_accepts, s0_accepts = _run(_words([real]), bound, up)
    assert same  # the exact relation holds...
    assert not s1_accepts and not s0_accepts  # ...but a "bit" is 2


@pytest.mark.parametrize("bit", [flp.MODULUS + 1, 1 - flp.MODULUS, flp.MODULUS])
def test_a_bit_that_is_one_only_mod_p_is_refused_by_s0(bit: int) -> None:
    bits = np.zeros(rc.coefficients(1000).shape[0], np.uint64)
    bits[3] = np.uint64(bit % U64)
    up = rc.upload_bits(bits)
    with pytest.raises(SSAInputError, match="out of range"):
        rc.server_check(0, _words([0]), 1000, (up.part0, up.part1), up)


def test_tampered_parts_and_queries_are_refused() -> None:
    bound = 2**24
    words = _words([1, -2, 3])
    up = rc.make_upload(words, bound)
    v0, v1 = _split(words)
    bad = bytes(32)
    with pytest.raises(SSAInputError, match="part0"):
        rc.server_check(0, v0, bound, (bad, up.part1), up)
    with pytest.raises(SSAInputError, match="part1"):
        rc.server_check(1, v1, bound, (up.part0, bad), up.seed1, bytes(16))
    c0 = rc.server_check(0, v0, bound, (up.part0, up.part1), up)
    c1 = rc.server_check(1, v1, bound, (up.part0, up.part1), up.seed1, bytes(16))
    assert not rc.same_check(c0.to_bytes(), c1.to_bytes())  # another query seed
    c1 = rc.server_check(1, v1, bound, (up.part0, up.part1), up.seed1, c0.query_seed)
    good = c1.to_bytes()
    assert rc.same_check(c0.to_bytes(), good)
    flipped = good[:-8] + bytes([good[-8] ^ 1]) + good[-7:]
    assert not rc.same_check(c0.to_bytes(), flipped)
    assert not rc.same_check(c0.to_bytes(), good[:-8])
    with pytest.raises(SSAInputError, match="query seed"):
        rc.server_check(1, v1, bound, (up.part0, up.part1), up.seed1, b"short")


def test_false_accept_bound_is_negligible_at_round_sizes() -> None:
    # 2,000 keys of 64 words at max_abs = 1e4, 24 fractional bits (39 bits a word).
    bound = rc.fixed_point_bound(1e4, 24)
    assert rc.coefficients(bound).shape[0] == 39
    assert rc.false_accept_bound(2000 * 64, bound) < 2.0**-53  # (2m + 2) / p + 1 / p, m = 64
