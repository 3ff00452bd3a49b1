"""Rings Z_2^k and F_p: laws and every operation against Python big-int references; errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.crypto.ring import SESA_PRIME, Z2_64, PrimeField, Ring, Z2k, is_prime

U64 = np.uint64

RINGS: list[Ring] = [
    Z2_64,
    Z2k(32),
    Z2k(8),
    Z2k(1),
    PrimeField(),
    PrimeField(11),
    PrimeField(65521),
    PrimeField(3),
]
FIELDS = [r for r in RINGS if isinstance(r, PrimeField)]


def _ids(r: Ring) -> str:
    return str(r)


def _elements(ring: Ring, size: int) -> st.SearchStrategy[list[int]]:
    """Lists of ring elements with the extremes 0, 1, m-1 likely."""
    m = ring.modulus
    return st.lists(
        st.one_of(st.sampled_from([0, 1 % m, m - 1, m // 2]), st.integers(0, m - 1)),
        min_size=size,
        max_size=size,
    )


def _arr(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=U64)


def _ints(a: np.ndarray) -> list[int]:
    return [int(v) for v in a.reshape(-1)]


# ---------------------------------------------------------------------------------- primality


def _trial_division(n: int) -> bool:
    return n >= 2 and all(n % q for q in range(2, math.isqrt(n) + 1))


def test_is_prime_matches_trial_division_below_5000() -> None:
    assert [n for n in range(5000) if is_prime(n)] == [n for n in range(5000) if _trial_division(n)]


@pytest.mark.parametrize(
    "n, prime",
    [
        (SESA_PRIME, True),
        (2**32 - 1, False),
        (2**31 - 1, True),
        (2**61 - 1, True),
        (2**64 - 59, True),  # the largest 64-bit prime
        (2**64 - 1, False),
        (561, False),  # Carmichael numbers fool Fermat, not Miller-Rabin
        (41041, False),
        (3215031751, False),  # strong pseudoprime to bases 2, 3, 5, 7
        (3825123056546413051, False),  # strong pseudoprime to bases 2..23
    ],
)
def test_is_prime_known_values(n: int, prime: bool) -> None:
    assert is_prime(n) is prime


@pytest.mark.parametrize("bad", [-1, 2**64, True, 1.5, "7"])
def test_is_prime_refuses_non_64_bit_integers(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="is_prime"):
        is_prime(bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------- laws


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
@given(data=st.data())
def test_operations_match_big_int_reference(ring: Ring, data: st.DataObject) -> None:
    m = ring.modulus
    a_l, b_l = data.draw(_elements(ring, 6)), data.draw(_elements(ring, 6))
    a, b = _arr(a_l), _arr(b_l)
    assert _ints(ring.add(a, b)) == [(x + y) % m for x, y in zip(a_l, b_l, strict=True)]
    assert _ints(ring.sub(a, b)) == [(x - y) % m for x, y in zip(a_l, b_l, strict=True)]
    assert _ints(ring.mul(a, b)) == [(x * y) % m for x, y in zip(a_l, b_l, strict=True)]
    assert _ints(ring.neg(a)) == [(-x) % m for x in a_l]
    for out in (ring.add(a, b), ring.sub(a, b), ring.mul(a, b), ring.neg(a)):
        assert out.dtype == U64
    # Inputs are never modified.
    assert _ints(a) == a_l and _ints(b) == b_l


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
@given(data=st.data())
def test_ring_laws(ring: Ring, data: st.DataObject) -> None:
    a, b, c = (_arr(data.draw(_elements(ring, 5))) for _ in range(3))
    eq = np.testing.assert_array_equal
    zero, one = ring.zeros(5), ring.element(np.full(5, 1 % ring.modulus))
    eq(ring.add(a, b), ring.add(b, a))
    eq(ring.mul(a, b), ring.mul(b, a))
    eq(ring.add(ring.add(a, b), c), ring.add(a, ring.add(b, c)))
    eq(ring.mul(ring.mul(a, b), c), ring.mul(a, ring.mul(b, c)))
    eq(ring.mul(a, ring.add(b, c)), ring.add(ring.mul(a, b), ring.mul(a, c)))
    eq(ring.add(a, ring.neg(a)), zero)
    eq(ring.sub(a, b), ring.add(a, ring.neg(b)))
    eq(ring.add(a, zero), a)
    eq(ring.mul(a, one), a)


@pytest.mark.parametrize("f", FIELDS, ids=_ids)
@given(data=st.data())
def test_field_inverses_and_powers(f: PrimeField, data: st.DataObject) -> None:
    values = [v for v in data.draw(_elements(f, 8)) if v] or [1]
    a = _arr(values)
    np.testing.assert_array_equal(f.mul(a, f.inv(a)), np.ones(len(values), dtype=U64))
    np.testing.assert_array_equal(f.batch_inv(a), f.inv(a))
    e = data.draw(st.integers(0, 2**64 - 1))
    assert _ints(f.pow(a, e)) == [pow(v, e, f.p) for v in values]
    assert _ints(f.pow(_arr([0]), 0)) == [1]


@pytest.mark.parametrize("f", FIELDS, ids=_ids)
def test_field_inverse_of_zero_raises(f: PrimeField) -> None:
    with pytest.raises(ZeroDivisionError, match="0 has no inverse"):
        f.inv(_arr([1, 0]))
    with pytest.raises(ZeroDivisionError, match="flat index 2"):
        f.batch_inv(np.array([[1, 2], [0, 1]], dtype=U64))
    with pytest.raises(ConfigurationError, match="exponent"):
        f.pow(_arr([2]), -1)
    with pytest.raises(ConfigurationError, match="exponent"):
        f.pow(_arr([2]), 2**64)
    with pytest.raises(ConfigurationError, match="exponent"):
        f.pow(_arr([2]), 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
def test_broadcasting_and_zero_dimensional(ring: Ring) -> None:
    m = ring.modulus
    a = _arr([0, 1 % m, (m - 1)]).reshape(3, 1)
    b = _arr([m - 1, m // 2])
    got = ring.mul(a, b)
    assert got.shape == (3, 2)
    assert _ints(got) == [(x * y) % m for x in _ints(a) for y in _ints(b)]
    scalar = ring.add(np.asarray(U64(m - 1)), np.asarray(U64(1 % m)))
    assert isinstance(scalar, np.ndarray) and scalar.shape == () and int(scalar) == 0 % m
    assert int(ring.sub(np.asarray(U64(0)), np.asarray(U64(1 % m)))) == (-1) % m


# ---------------------------------------------------------------------------------- matmul, sum


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
@given(dims=st.tuples(st.integers(0, 5), st.integers(0, 7), st.integers(0, 5)), seed=st.integers())
def test_matmul_matches_big_int_reference(
    ring: Ring, dims: tuple[int, int, int], seed: int
) -> None:
    m_, k_, n_ = dims
    rng = np.random.default_rng(seed % 2**32)
    a = rng.integers(0, ring.modulus, (m_, k_), dtype=U64, endpoint=False)
    b = rng.integers(0, ring.modulus, (k_, n_), dtype=U64, endpoint=False)
    want = (a.astype(object) @ b.astype(object)) % ring.modulus if k_ else np.zeros((m_, n_))
    got = ring.matmul(a, b)
    assert got.dtype == U64 and got.shape == (m_, n_)
    assert _ints(got) == [int(v) for v in np.asarray(want).reshape(-1)]


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
def test_matmul_at_the_extremes(ring: Ring) -> None:
    # Every entry m - 1 and a long inner dimension: every 128-bit carry path is exercised.
    top = ring.modulus - 1
    a = np.full((3, 3000), top, dtype=U64)
    b = np.full((3000, 2), top, dtype=U64)
    got = ring.matmul(a, b)
    assert _ints(got) == [3000 * top * top % ring.modulus] * 6
    # Non-contiguous operands (a transposed view) give the same product.
    np.testing.assert_array_equal(ring.matmul(b.T, a.T), got.T)


@pytest.mark.parametrize("ring", [Z2_64, PrimeField()], ids=_ids)
def test_matmul_shape_errors(ring: Ring) -> None:
    with pytest.raises(ConfigurationError, match="matmul needs"):
        ring.matmul(ring.zeros((2, 3)), ring.zeros((2, 3)))
    with pytest.raises(ConfigurationError, match="matmul needs"):
        ring.matmul(ring.zeros(3), ring.zeros((3, 1)))


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
@given(rows=st.integers(0, 6), cols=st.integers(0, 6), seed=st.integers(0, 2**32 - 1))
def test_sum_matches_reference(ring: Ring, rows: int, cols: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, ring.modulus, (rows, cols), dtype=U64, endpoint=False)
    ref = a.astype(object)
    assert int(ring.sum(a)) == int(ref.sum()) % ring.modulus
    assert _ints(ring.sum(a, axis=0)) == [int(ref[:, j].sum()) % ring.modulus for j in range(cols)]
    assert _ints(ring.sum(a, axis=1)) == [int(ref[i].sum()) % ring.modulus for i in range(rows)]
    assert ring.sum(a).dtype == U64 and ring.sum(a).shape == ()


def test_field_sum_of_max_elements_does_not_overflow() -> None:
    f = PrimeField()
    a = np.full(5_000_000, f.p - 1, dtype=U64)  # the uint64 sum alone would be 2^54-ish: exact
    assert int(f.sum(a)) == 5_000_000 * (f.p - 1) % f.p


# ---------------------------------------------------------------------------------- sampling


class _Scripted:
    """A word source that replays fixed words (then zeros), to drive the sampler exactly."""

    def __init__(self, words: list[int]) -> None:
        self._words = list(words)

    def words(self, n_words: int) -> np.ndarray:
        out = self._words[:n_words] + [0] * max(0, n_words - len(self._words))
        self._words = self._words[n_words:]
        return np.array(out, dtype=U64)


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
def test_random_is_in_range_deterministic_and_seed_dependent(ring: Ring) -> None:
    seed = bytes(range(16))
    x = ring.random((40, 25), PRGStream(seed))
    assert x.dtype == U64 and x.shape == (40, 25)
    assert int(x.max()) < ring.modulus
    np.testing.assert_array_equal(x, ring.random((40, 25), PRGStream(seed)))
    if ring.modulus > 2:
        assert not np.array_equal(x, ring.random((40, 25), PRGStream(bytes(16))))
    # Successive draws continue the stream: two draws are not equal to each other.
    s = PRGStream(seed)
    if ring.modulus > 4:
        assert not np.array_equal(ring.random(100, s), ring.random(100, s))
    assert ring.random(0, s).shape == (0,)


def test_z2k_random_keeps_the_low_bits_of_each_word() -> None:
    words = [0xFFFF_0000_1234_5678, 0x8000_0000_0000_0001, 7]
    assert _ints(Z2k(8).random(3, _Scripted(words))) == [0x78, 0x01, 7]
    assert _ints(Z2_64.random(3, _Scripted(words))) == words


def test_field_rejection_sampling_is_exactly_uniform() -> None:
    # p = 11 (4 bits): feed every 4-bit candidate 0..15 once, in 32-bit halves. Exactly the
    # 11 candidates below p are accepted, in order, each once: no value is favoured (``% 11``
    # of the 16 candidates would give 0..4 twice as often as 5..10).
    f = PrimeField(11)
    halves = list(range(16))
    words = [halves[i] | (halves[i + 1] << 32) for i in range(0, 16, 2)]
    assert _ints(f.random(11, _Scripted(words))) == list(range(11))
    # High bits above bitlen(p) are masked off: candidate 0x10 + 3 counts as 3.
    assert _ints(f.random(1, _Scripted([0x13]))) == [3]


def test_field_rejection_sampling_chi_square() -> None:
    f = PrimeField(11)
    draws = f.random(110_000, PRGStream(b"\x01" * 16))
    counts = np.bincount(draws.astype(np.int64), minlength=11)
    expected = 10_000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert counts.size == 11
    assert chi2 < 35.0  # chi-square with 10 dof: P(> 35) ~ 1e-4


@pytest.mark.parametrize("ring", [Z2_64, PrimeField(11)], ids=_ids)
def test_random_refuses_a_bad_word_source(ring: Ring) -> None:
    class Short:
        def words(self, n_words: int) -> np.ndarray:
            return np.zeros(max(0, n_words - 1), dtype=U64)

    with pytest.raises(ConfigurationError, match="word source"):
        ring.random(5, Short())
    with pytest.raises(ConfigurationError, match="shape"):
        ring.random((2, -1), PRGStream(bytes(16)))


# ---------------------------------------------------------------------------------- signed


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
@given(data=st.data())
def test_signed_round_trip(ring: Ring, data: st.DataObject) -> None:
    lo = -ring.max_signed - (1 if isinstance(ring, Z2k) else 0)
    hi = ring.max_signed
    values = data.draw(
        st.lists(st.one_of(st.sampled_from([lo, hi, 0]), st.integers(lo, hi)), max_size=10)
    )
    arr = np.array(values, dtype=np.int64)
    words = ring.encode_signed(arr)
    assert words.dtype == U64
    assert _ints(words) == [v % ring.modulus for v in values]
    assert ring.decode_signed(words).tolist() == values
    assert ring.decode_signed(words).dtype == np.int64


def test_z2_64_encoding_is_the_int64_reinterpretation() -> None:
    v = np.array([-(2**63), -1, 0, 1, 2**63 - 1], dtype=np.int64)
    words = Z2_64.encode_signed(v)
    assert words.tobytes() == v.tobytes()
    v[0] = 5  # the result does not alias the input
    assert int(words[0]) == 2**63


@pytest.mark.parametrize(
    "ring, bad",
    [
        (Z2k(8), [128]),
        (Z2k(8), [-129]),
        (Z2_64, np.array([2**63], dtype=U64)),
        (PrimeField(11), [6]),
        (PrimeField(11), [-6]),
        (PrimeField(), [SESA_PRIME // 2 + 1]),
    ],
    ids=str,
)
def test_encode_signed_refuses_out_of_range(ring: Ring, bad: list[int]) -> None:
    with pytest.raises(ConfigurationError, match="signed values must"):
        ring.encode_signed(bad)


@pytest.mark.parametrize("ring", [Z2_64, PrimeField()], ids=_ids)
def test_encode_signed_refuses_non_integers(ring: Ring) -> None:
    with pytest.raises(ConfigurationError, match="integers"):
        ring.encode_signed([1.5])


# ---------------------------------------------------------------------------------- admission


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
def test_element_admits_only_ring_values(ring: Ring) -> None:
    assert _ints(ring.element([0, ring.modulus - 1])) == [0, ring.modulus - 1]
    with pytest.raises(ConfigurationError, match="elements must lie"):
        ring.element([-1])
    if ring.modulus < 2**64:
        with pytest.raises(ConfigurationError, match="elements must lie"):
            ring.element([ring.modulus])
    with pytest.raises(ConfigurationError, match="integers"):
        ring.element([0.5])
    with pytest.raises(ConfigurationError, match="fit in 64 bits"):
        ring.element([0, 2**64])
    with pytest.raises(ConfigurationError, match="fit in 64 bits"):
        ring.element([-1, 2**63])
    # Arithmetic on non-uint64 integers goes through the same check.
    with pytest.raises(ConfigurationError, match="elements must lie"):
        ring.add([-1], [0])


@pytest.mark.parametrize("ring", RINGS, ids=_ids)
def test_validate_rejects_untrusted_material(ring: Ring) -> None:
    ok = ring.zeros((2, 3))
    assert ring.validate(ok, "share", (2, 3)) is ok
    with pytest.raises(ClientInputError, match="uint64 numpy array"):
        ring.validate([0, 1], "share")
    with pytest.raises(ClientInputError, match="uint64 numpy array"):
        ring.validate(np.zeros(3, dtype=np.int64), "share")
    with pytest.raises(ClientInputError, match="shape"):
        ring.validate(ok, "share", (3, 2))
    if ring.modulus < 2**64:
        with pytest.raises(ClientInputError, match="not an element"):
            ring.validate(np.array([ring.modulus], dtype=U64), "share")


# ---------------------------------------------------------------------------------- constructors


@pytest.mark.parametrize("bits", [0, 65, -1, True, 8.0, "64"])
def test_z2k_rejects_bad_bits(bits: object) -> None:
    with pytest.raises(ConfigurationError, match="Z2k bits"):
        Z2k(bits)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "p, match",
    [
        (2, r"\[3, 2\^32\)"),
        (4294967311, r"\[3, 2\^32\)"),  # prime, but a product would not fit in 64 bits
        (15, "prime"),
        (2**32 - 1, "prime"),
        (True, "int"),
        (11.0, "int"),
    ],
)
def test_prime_field_rejects_bad_moduli(p: object, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        PrimeField(p)  # type: ignore[arg-type]


def test_ring_values_are_hashable_and_printable() -> None:
    assert {Z2k(64), Z2_64, PrimeField(), PrimeField(SESA_PRIME)} == {Z2_64, PrimeField()}
    assert str(Z2_64) == "Z_2^64" and str(PrimeField(11)) == "F_11"
    assert Z2_64.modulus == 2**64 and Z2_64.max_signed == 2**63 - 1
    assert PrimeField().modulus == SESA_PRIME == 4294967291
    assert PrimeField().max_signed == (SESA_PRIME - 1) // 2
    assert Z2_64.zeros((2, 0)).shape == (2, 0)
