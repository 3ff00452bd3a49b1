"""Private set union (Niu Alg. 3) over Bonawitz SecAgg: exact union in exact mode, a superset
within the reported FPR with Bloom filters, and an aggregate that does not count clients."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.families.secagg.protocol import SecAggParams, run_round
from flwr_fsl.families.sfsl.psu import PSUParams, client_vector, reconstruct_union, union_report


def secure_sum(vectors: dict[int, np.ndarray], t: int = 2) -> np.ndarray:
    """The vectors' sum through a full SecAgg round (no dropouts)."""
    length = next(iter(vectors.values())).size
    params = SecAggParams(1, os.urandom(16), t, length)
    return run_round(vectors, params).total


def test_exact_mode_recovers_the_union_exactly_through_secagg() -> None:
    rng = np.random.default_rng(1)
    m = 5000
    sets = {10 + u: rng.choice(m, size=rng.integers(1, 200), replace=False) for u in range(6)}
    params = PSUParams.exact(m)
    total = secure_sum({u: client_vector(params, s) for u, s in sets.items()})
    union = reconstruct_union(params, total)
    np.testing.assert_array_equal(union, np.unique(np.concatenate(list(sets.values()))))
    report = union_report(params, total, union, len(sets))
    assert report.false_positive_rate == 0.0 and report.false_negative_bound < 1e-12


def test_bloom_mode_gives_a_superset_within_the_target_rate() -> None:
    rng = np.random.default_rng(2)
    m = 200_000
    sets = {u: rng.choice(m, size=400, replace=False) for u in range(5)}
    truth = np.unique(np.concatenate(list(sets.values())))
    params = PSUParams.for_target(m, expected_union=2000, target_fpr=1e-3, num_partitions=64)
    total = secure_sum({u: client_vector(params, s) for u, s in sets.items()})
    union = reconstruct_union(params, total)
    assert np.isin(truth, union).all()  # no false negative
    extra = np.setdiff1d(union, truth)
    report = union_report(params, total, union, len(sets))
    tested = report.candidates_tested - truth.size
    assert report.false_positive_rate < 2e-3
    # False positives among the tested non-members: about the realized rate (5 sigma).
    expected = tested * report.false_positive_rate
    assert extra.size <= expected + 5 * np.sqrt(expected) + 1
    assert params.false_positive_rate(truth.size) == pytest.approx(
        report.false_positive_rate, rel=0.5
    )


def test_empty_partitions_are_never_tested() -> None:
    params = PSUParams.for_target(1000, 10, 1e-2, num_partitions=10)
    total = client_vector(params, [5, 7]) + client_vector(params, [8])
    union = reconstruct_union(params, total)
    assert set(union.tolist()) >= {5, 7, 8} and union.max() < 100  # partition 0 only
    assert union_report(params, total, union, 2).candidates_tested == 100


def test_the_aggregate_does_not_count_the_clients_that_set_a_position() -> None:
    # Positions set by one client and by three clients: both uniform nonzero words.
    params = PSUParams.exact(1 << 14)
    prg = PRGStream(b"psu-uniform-0001")  # fixed: the chi-square bound is checked on one draw
    one = client_vector(params, np.arange(0, 1 << 14), prg)
    three = sum(
        (client_vector(params, np.arange(0, 1 << 14), prg) for _ in range(3)),
        np.zeros(params.vector_length, np.uint64),
    )
    for total in (one, three):
        top = np.bincount((total[: 1 << 14] >> np.uint64(56)).astype(np.int64), minlength=256)
        expected = top.sum() / 256
        chi2 = float(((top - expected) ** 2 / expected).sum())
        assert chi2 < 255 + 5 * np.sqrt(510)


def test_parameters_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="exact mode"):
        PSUParams(100, 50, 0, 1, bytes(16))
    with pytest.raises(ConfigurationError, match="target_fpr"):
        PSUParams.for_target(100, 10, 0.0, 1)
    with pytest.raises(ConfigurationError, match="num_partitions"):
        PSUParams(100, 100, 0, 101, bytes(16))
    with pytest.raises(ValueError, match="indices"):
        client_vector(PSUParams.exact(10), [10])
    with pytest.raises(ValueError, match="uint64"):
        reconstruct_union(PSUParams.exact(10), np.zeros(9, np.uint64))
    # Eq. (1): 10,000 elements at FPR 1% need about 95,851 positions and 7 hashes.
    p = PSUParams.for_target(10**6, 10_000, 0.01, 1)
    assert p.bloom_length == 95_851 and p.num_hashes == 7


@settings(max_examples=40, deadline=None)
@given(
    sets=st.lists(st.sets(st.integers(0, 499), max_size=40), min_size=1, max_size=5),
    parts=st.integers(1, 50),
)
def test_union_property(sets: list[set[int]], parts: int) -> None:
    params = PSUParams(500, 500, 0, parts, bytes(16))
    total = sum(
        (client_vector(params, sorted(s)) for s in sets), np.zeros(params.vector_length, np.uint64)
    )
    assert reconstruct_union(params, total).tolist() == sorted(set().union(*sets))
