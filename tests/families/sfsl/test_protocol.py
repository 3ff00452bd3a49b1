"""Niu et al. count-weighted secure submodel averaging: PSU -> RR -> a subset SecAgg round ->
the same rows as the plaintext count-weighted average over the surviving clients."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.families.secagg.protocol import SecAggParams
from flwr_fsl.families.secagg.protocol import run_round as secagg_round
from flwr_fsl.families.sfsl.perturb import PermanentMemo, RRParams, perturb_index_set
from flwr_fsl.families.sfsl.protocol import RowVector
from flwr_fsl.families.sfsl.psu import PSUParams, client_vector, reconstruct_union

CODEC = FixedPoint(frac_bits=24, max_abs=1e5, max_summands=100)


def full_round(m: int, d: int, sets: dict[int, np.ndarray], rr: RRParams, drop=(), seed=0):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    # Alg. 3 (exact mode, the sum taken in the clear here: test_psu covers it under SecAgg).
    psu = PSUParams.exact(m)
    union = reconstruct_union(psu, sum(client_vector(psu, s) for s in sets.values()))
    # Alg. 2 and the clients' succinct training on S'' ∩ S.
    layout = RowVector(union, d, CODEC)
    perturbed, deltas, counts = {}, {}, {}
    for u, s in sets.items():
        perturbed[u], _ = perturb_index_set(s, union, PermanentMemo(), rr)
        kept = np.intersect1d(perturbed[u], s)
        deltas[u] = {int(r): rng.normal(size=d) for r in kept}
        counts[u] = {int(r): int(rng.integers(1, 20)) for r in kept}
    # Alg. 1 lines 7-9: one subset SecAgg round over the rows' participants.
    params = SecAggParams(1, os.urandom(16), 2, layout.length)
    rows = {u: layout.positions(perturbed[u]) for u in sets}
    inputs = {u: layout.encode(perturbed[u], deltas[u], counts[u]) for u in sets}
    out = secagg_round(inputs, params, rows=rows, dropouts={"mask": set(drop)})
    server = out.server
    got_rows, mean, total = layout.decode(out.total)
    # Plaintext count-weighted average over the survivors.
    num: dict[int, np.ndarray] = {}
    den: dict[int, float] = {}
    for u in server.survivors:
        for r, delta in deltas[u].items():
            num[r] = num.get(r, 0) + counts[u][r] * delta
            den[r] = den.get(r, 0) + counts[u][r]
    return got_rows, mean, total, num, den, server, perturbed


@pytest.mark.parametrize("cpp", [(1.0, 0.0), (15 / 16, 1 / 16), (3 / 4, 1 / 4), (1.0, 1.0)])
def test_secure_rows_equal_the_plaintext_count_weighted_average(cpp) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    m, d = 300, 4
    sets = {u: rng.choice(m, size=rng.integers(5, 40), replace=False) for u in range(1, 7)}
    got_rows, mean, total, num, den, _, _ = full_round(
        m, d, sets, RRParams.symmetric(*cpp), drop={3}
    )
    assert sorted(got_rows.tolist()) == sorted(num)
    for k, r in enumerate(got_rows.tolist()):
        np.testing.assert_allclose(mean[k], num[r] / den[r], atol=1e-5)
        assert total[k] == pytest.approx(den[r], abs=1e-5)


def test_a_row_with_one_participant_is_that_clients_row_in_the_clear() -> None:
    # Event 1 (Theorem 2): without perturbation (CPP1) a row only one client has is exposed:
    # its aggregate is that client's v·Δ and its participant count is 1.
    sets = {1: np.array([0, 1, 2]), 2: np.array([1, 2]), 3: np.array([2, 5])}
    got_rows, mean, _, num, den, server, _ = full_round(10, 2, sets, RRParams.symmetric(1, 0))
    layout_participants = server.participants()[0 * 3]  # row 0 is union slot 0
    assert layout_participants == 1
    k = got_rows.tolist().index(0)
    np.testing.assert_allclose(mean[k], num[0] / den[0], atol=1e-6)


def test_encode_refuses_rows_outside_the_perturbed_set() -> None:
    layout = RowVector(np.array([1, 4, 9]), 2, CODEC)
    with pytest.raises(ClientInputError, match="S''"):
        layout.encode([1, 4], {9: np.ones(2)}, {9: 1})
    with pytest.raises(ClientInputError, match="union"):
        layout.positions([2])
    with pytest.raises(ClientInputError, match="count or width"):
        layout.encode([1], {1: np.ones(3)}, {1: 1})


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_property_random_sets_and_dropouts(data: st.DataObject) -> None:
    m = data.draw(st.integers(5, 60))
    n = data.draw(st.integers(3, 6))
    sets = {
        u: np.array(sorted(data.draw(st.sets(st.integers(0, m - 1), min_size=1, max_size=m))))
        for u in range(1, n + 1)
    }
    keep = data.draw(st.sampled_from([1.0, 0.9, 0.6]))
    drop = data.draw(st.sets(st.integers(1, n), max_size=n - 2))
    got_rows, mean, _, num, den, _, _ = full_round(
        m, 3, sets, RRParams.symmetric(keep, 1 - keep), drop
    )
    assert sorted(got_rows.tolist()) == sorted(num)
    for k, r in enumerate(got_rows.tolist()):
        np.testing.assert_allclose(mean[k], num[r] / den[r], atol=1e-5)


# -- γ-level stochastic quantization (App. B) ----------------------------------------------------


def test_gamma_quantization_of_a_weighted_mean_is_unbiased() -> None:
    from flwr_fsl.families.sfsl.protocol import GammaQuantizer

    q = GammaQuantizer(levels=16, low=-1.0, high=1.0)
    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, size=(5, 200))  # 5 clients, 200 coordinates
    v = np.array([1, 3, 2, 7, 4], dtype=np.float64)
    truth = (v[:, None] * x).sum(0) / v.sum()
    trials = 2000
    estimates = np.zeros((trials, x.shape[1]))
    for k in range(trials):
        z = q.quantize(x, rng)
        assert z.min() >= 0 and z.max() <= 15
        estimates[k] = q.dequantize((v[:, None] * z).sum(0) / v.sum())
    # Each estimate is within one unit of the truth; their mean converges to it.
    assert np.abs(estimates - truth).max() <= q.unit + 1e-12
    bias = estimates.mean(0) - truth
    assert np.abs(bias).max() < 5 * q.unit / np.sqrt(trials)
    # A deterministic rounding would be biased by up to half a unit at some coordinates.
    rounded = q.dequantize((v[:, None] * np.rint((x + 1) / q.unit)).sum(0) / v.sum())
    assert np.abs(rounded - truth).max() > 10 * np.abs(bias).max()


def test_quantized_rows_through_subset_secagg_stay_within_one_unit() -> None:
    from flwr_fsl.families.sfsl.protocol import GammaQuantizer

    q = GammaQuantizer(levels=2**15, low=-4.0, high=4.0)
    layout = RowVector(np.arange(6), 2, FixedPoint(0, 1e9, 100), quantizer=q)
    deltas = {0: {1: np.array([0.5, -0.25])}, 1: {1: np.array([1.0, 0.0]), 4: np.array([2, 2])}}
    counts = {0: {1: 3}, 1: {1: 1, 4: 2}}
    total = np.zeros(layout.length, dtype=np.uint64)
    for u in (0, 1):
        rows = np.array(sorted(deltas[u]))
        words = layout.encode(rows, deltas[u], counts[u])
        total[layout.positions(rows)] += words
    got_rows, mean, count = layout.decode(total)
    assert got_rows.tolist() == [1, 4] and count.tolist() == [4.0, 2.0]
    np.testing.assert_allclose(mean[0], (3 * np.array([0.5, -0.25]) + [1.0, 0.0]) / 4, atol=q.unit)
    np.testing.assert_allclose(mean[1], [2.0, 2.0], atol=q.unit)


def test_quantizer_settings_are_checked() -> None:
    from flwr_fsl.core.errors import ConfigurationError
    from flwr_fsl.families.sfsl.protocol import GammaQuantizer

    with pytest.raises(ConfigurationError):
        GammaQuantizer(1, 0.0, 1.0)
    with pytest.raises(ConfigurationError):
        GammaQuantizer(4, 1.0, 1.0)
