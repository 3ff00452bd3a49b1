"""The numba field and Z_2^64 kernels against Python big-int references (exact, uint64 only)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.crypto.ring import SESA_PRIME
from flwr_fsl.kernels import field as fk
from flwr_fsl.kernels.ring import matmul_wrap

U64 = np.uint64
PRIMES = [3, 11, 65521, 2**31 - 1, SESA_PRIME]


def _ref_matmul(a: np.ndarray, b: np.ndarray, modulus: int) -> list[list[int]]:
    m, k = a.shape
    n = b.shape[1]
    return [
        [sum(int(a[i, t]) * int(b[t, j]) for t in range(k)) % modulus for j in range(n)]
        for i in range(m)
    ]


def _matmul_mod(a: np.ndarray, b: np.ndarray, p: int) -> np.ndarray:
    out = np.empty((a.shape[0], b.shape[1]), dtype=U64)
    fk.matmul_mod(a, b, U64(p), U64(2**64 % p), out)
    return out


def _lagrange_ref(xs: list[int], at: list[int], p: int) -> list[list[int]]:
    rows = []
    for z in at:
        row = []
        for j, xj in enumerate(xs):
            num, den = 1, 1
            for m, xm in enumerate(xs):
                if m != j:
                    num = num * (z - xm) % p
                    den = den * (xj - xm) % p
            row.append(num * pow(den, -1, p) % p)
        rows.append(row)
    return rows


@pytest.mark.parametrize("p", PRIMES)
@given(st.lists(st.tuples(st.integers(0, 2**32), st.integers(0, 2**32)), max_size=30))
def test_mul_mod(p: int, pairs: list[tuple[int, int]]) -> None:
    a = np.array([x % p for x, _ in pairs] + [p - 1], dtype=U64)
    b = np.array([y % p for _, y in pairs] + [p - 1], dtype=U64)
    out = np.empty_like(a)
    fk.mul_mod(a, b, U64(p), out)
    assert out.tolist() == [int(x) * int(y) % p for x, y in zip(a, b, strict=True)]


@pytest.mark.parametrize("p", PRIMES)
@given(base=st.lists(st.integers(0, 2**32), max_size=10), e=st.integers(0, 2**64 - 1))
def test_pow_mod(p: int, base: list[int], e: int) -> None:
    a = np.array([x % p for x in base] + [0], dtype=U64)
    out = np.empty_like(a)
    fk.pow_mod(a, U64(e), U64(p), out)
    assert out.tolist() == [pow(int(x), e, p) for x in a]


@pytest.mark.parametrize("p", PRIMES)
@given(values=st.lists(st.integers(1, 2**32), max_size=40))
def test_batch_inverse(p: int, values: list[int]) -> None:
    a = np.array([v % (p - 1) + 1 for v in values], dtype=U64)  # nonzero
    out = np.empty_like(a)
    assert fk.batch_inverse(a, U64(p), out) == -1
    assert out.tolist() == [pow(int(x), -1, p) for x in a]


def test_batch_inverse_reports_the_first_zero() -> None:
    out = np.empty(4, dtype=U64)
    assert fk.batch_inverse(np.array([3, 0, 5, 0], dtype=U64), U64(11), out) == 1


@pytest.mark.parametrize("p", PRIMES)
@given(
    dims=st.tuples(st.integers(0, 6), st.integers(0, 9), st.integers(0, 6)),
    seed=st.integers(0, 2**32 - 1),
)
def test_matmul_mod_matches_big_int(p: int, dims: tuple[int, int, int], seed: int) -> None:
    m, k, n = dims
    rng = np.random.default_rng(seed)
    a = rng.integers(0, p, (m, k), dtype=U64)
    b = rng.integers(0, p, (k, n), dtype=U64)
    a[rng.random((m, k)) < 0.2] = 0  # the kernel skips zero entries of a
    assert _matmul_mod(a, b, p).tolist() == _ref_matmul(a, b, p)


@pytest.mark.parametrize("p", [65521, SESA_PRIME])
def test_matmul_mod_many_carries(p: int) -> None:
    # k = 20000 products of (p-1)^2 ~ 2^64: the low word wraps on almost every term, so the
    # high word counts ~20000 carries; the result must still be exact.
    k = 20000
    a = np.full((2, k), p - 1, dtype=U64)
    b = np.full((k, 3), p - 1, dtype=U64)
    b[::7, 1] = 1
    want = _ref_matmul(a, b, p)
    assert _matmul_mod(a, b, p).tolist() == want
    assert want[0][0] == k * (p - 1) ** 2 % p


@given(
    dims=st.tuples(st.integers(0, 6), st.integers(0, 9), st.integers(0, 6)),
    seed=st.integers(0, 2**32 - 1),
)
def test_matmul_wrap_matches_big_int(dims: tuple[int, int, int], seed: int) -> None:
    m, k, n = dims
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**64, (m, k), dtype=U64, endpoint=False)
    b = rng.integers(0, 2**64, (k, n), dtype=U64, endpoint=False)
    a[rng.random((m, k)) < 0.2] = 0
    b[rng.random((k, n)) < 0.2] = 2**64 - 1
    out = np.full((m, n), 12345, dtype=U64)  # stale contents are overwritten
    matmul_wrap(a, b, out)
    assert out.tolist() == _ref_matmul(a, b, 2**64)


@pytest.mark.parametrize("p", PRIMES)
@given(data=st.data())
def test_lagrange_matrix_matches_rational_reference(p: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, min(8, p)))
    xs = data.draw(st.lists(st.integers(0, p - 1), min_size=k, max_size=k, unique=True))
    at = [*data.draw(st.lists(st.integers(0, p - 1), max_size=6)), xs[0]]
    out = np.empty((len(at), k), dtype=U64)
    assert fk.lagrange_matrix(np.array(xs, dtype=U64), np.array(at, dtype=U64), U64(p), out) == -1
    assert out.tolist() == _lagrange_ref(xs, at, p)
    # At a node the row is a unit vector.
    assert out[-1].tolist() == [1] + [0] * (k - 1)


def test_lagrange_matrix_reports_repeated_nodes() -> None:
    out = np.empty((1, 3), dtype=U64)
    bad = fk.lagrange_matrix(np.array([4, 9, 4], dtype=U64), np.array([0], dtype=U64), U64(11), out)
    assert bad in (0, 2)
