"""SESA's fused mask-evaluation kernel equals the field-operation formula of eq. 22 exactly,
and a whole round over shard lengths that cross the kernel's tiles decodes the plaintext sums
exactly (hypothesis-chosen N, T, K, d)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.crypto.ring import SESA_PRIME, PrimeField
from flwr_fsl.crypto.sharing import lagrange_matrix
from flwr_fsl.families.sesa.coding import mask_evaluations
from flwr_fsl.kernels.field import TILE
from tests.families.sesa.test_protocol import _params, _random_choices, run_round

U64 = np.uint64


def _reference(field: PrimeField, basis, chosen, r, v):  # type: ignore[no-untyped-def]
    """Eq. 22 with the field's own operations: ``r_k L_{s_k}(α_j) + Σ_n v_kn L_{K+n}(α_j)``."""
    t, slots, d = v.shape
    extra = np.ascontiguousarray(basis[:, basis.shape[1] - t :])
    out = field.matmul(extra, v.reshape(t, slots * d)).reshape(-1, slots, d)
    return field.add(out, field.mul(basis[:, list(chosen)][:, :, None], r[None, :, :]))


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_fused_kernel_equals_the_field_formula(data: st.DataObject) -> None:
    p = data.draw(st.sampled_from([13, 65521, 2**31 - 1, SESA_PRIME]), label="p")
    field = PrimeField(p)
    k = data.draw(st.integers(1, 5), label="K")
    t = data.draw(st.integers(1, 12), label="T")
    j = data.draw(st.integers(1, 9), label="J")
    d = data.draw(st.sampled_from([1, 7, TILE - 1, TILE, TILE + 1, 2 * TILE + 3]), label="d")
    slots = data.draw(st.integers(1, k), label="K_i")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    chosen = sorted(rng.choice(k, slots, replace=False).tolist())
    extreme = data.draw(st.booleans(), label="all p-1")  # the largest sums: every carry taken
    if extreme:
        basis = np.full((j, k + t), p - 1, dtype=U64)
        r = np.full((slots, d), p - 1, dtype=U64)
        v = np.full((t, slots, d), p - 1, dtype=U64)
    else:
        basis = rng.integers(0, p, (j, k + t), dtype=U64)
        r = rng.integers(0, p, (slots, d), dtype=U64)
        v = rng.integers(0, p, (t, slots, d), dtype=U64)
    got = mask_evaluations(field, basis, chosen, r, v)
    np.testing.assert_array_equal(got, _reference(field, basis, chosen, r, v))


def test_fused_kernel_at_the_papers_points() -> None:
    # T = 50, K = 4 at 100 users' points, a shard length crossing tiles: equal to the formula.
    field = PrimeField(SESA_PRIME)
    k, t = 4, 50
    betas = np.arange(1, k + t + 1, dtype=U64)
    alphas = np.arange(k + t + 1, k + t + 101, dtype=U64)
    basis = lagrange_matrix(field, betas, alphas)
    rng = np.random.default_rng(7)
    r = rng.integers(0, SESA_PRIME, (3, 1200), dtype=U64)
    v = rng.integers(0, SESA_PRIME, (t, 3, 1200), dtype=U64)
    got = mask_evaluations(field, basis, (0, 2, 3), r, v)
    np.testing.assert_array_equal(got, _reference(field, basis, (0, 2, 3), r, v))


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_a_round_over_tile_crossing_shards_is_exact(data: st.DataObject) -> None:
    t = data.draw(st.integers(1, 4), label="T")
    k = data.draw(st.integers(1, 4), label="K")
    d = data.draw(st.sampled_from([TILE - 1, TILE + 1, 2 * TILE + 5]), label="d")
    params = _params(t, [(k, d), (1, 3)])
    n = data.draw(st.integers(params.threshold, params.threshold + 3), label="N")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    nodes = list(range(1, n + 1))
    choices = _random_choices(params, nodes, rng)
    result, expected, _ = run_round(params, choices, seed=int(rng.integers(1 << 30)))
    assert isinstance(result, list)
    for got, want in zip(result, expected, strict=True):
        np.testing.assert_array_equal(got, want)
