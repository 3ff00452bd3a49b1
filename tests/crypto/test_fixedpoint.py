"""Fixed-point codec: unbiased stochastic rounding, exact decode, checked bound, per ring."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.fixedpoint import FixedPoint, FixedPointOverflowError
from flwr_fsl.crypto.ring import SESA_PRIME, Z2_64, PrimeField, Z2k


@given(st.lists(st.floats(-100, 100), min_size=1, max_size=50), st.integers(0, 2**32))
def test_round_trip_error_below_resolution(values: list[float], seed: int) -> None:
    fp = FixedPoint(frac_bits=20, max_abs=100, max_summands=10)
    got = fp.decode(fp.encode(values, np.random.default_rng(seed)))
    assert np.all(np.abs(got - np.asarray(values)) < 2.0**-20)


def test_stochastic_rounding_is_unbiased() -> None:
    fp = FixedPoint(frac_bits=2, max_abs=10, max_summands=1)
    x = np.full(200_000, 0.1)  # between the grid points 0 and 0.25
    mean = fp.decode(fp.encode(x, np.random.default_rng(0))).mean()
    assert abs(mean - 0.1) < 0.002  # std of the mean is about 0.25*sqrt(0.4*0.6)/447
    assert np.rint(0.1 * 4) / 4 == 0.0  # round-to-nearest would be biased to 0


def test_sums_wrap_and_decode_signed() -> None:
    fp = FixedPoint(frac_bits=16, max_abs=1000, max_summands=3)
    words = fp.encode_exact([-999.5, 500.25, -0.75])
    assert fp.decode(words.sum(dtype=np.uint64)) == pytest.approx(-500.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"frac_bits": 40, "max_abs": 1e6, "max_summands": 100},
        {"frac_bits": 52, "max_abs": 2048.0, "max_summands": 1},
    ],
)
def test_overflow_bound_is_checked(kwargs: dict) -> None:
    with pytest.raises(FixedPointOverflowError, match="2\\^63"):
        FixedPoint(**kwargs)


def test_headroom_reported() -> None:
    fp = FixedPoint(frac_bits=24, max_abs=1024, max_summands=1024)
    assert fp.headroom_bits == pytest.approx(63 - 44)


@pytest.mark.parametrize("bad", [[np.nan], [np.inf], [1e9]])
def test_encode_refuses_bad_values(bad: list[float]) -> None:
    fp = FixedPoint(frac_bits=10, max_abs=100, max_summands=2)
    with pytest.raises(FixedPointOverflowError):
        fp.encode(bad)
    with pytest.raises(FixedPointOverflowError):
        fp.encode_exact(bad)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"frac_bits": -1}, "frac_bits"),
        ({"frac_bits": 53}, "frac_bits"),
        ({"max_abs": 0.0}, "max_abs"),
        ({"max_abs": float("inf")}, "max_abs"),
        ({"max_summands": 0}, "max_summands"),
    ],
)
def test_argument_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        FixedPoint(**kwargs)


# ---------------------------------------------------------------------------------- rings


def test_default_ring_is_z2_64_and_words_are_unchanged() -> None:
    # The encoded words of the default codec are int64 two's complement reinterpreted as
    # uint64, exactly as before the ring became a parameter (independent formula here).
    fp = FixedPoint(frac_bits=20, max_abs=100, max_summands=10)
    assert fp.ring == Z2_64 and fp == FixedPoint(20, 100, 10, Z2_64)
    x = np.random.default_rng(1).uniform(-100, 100, 1000)
    got = fp.encode(x, np.random.default_rng(2))
    u = np.random.default_rng(2).random(size=x.shape)
    scaled = x * 2.0**20
    want = (np.floor(scaled) + (u < scaled - np.floor(scaled))).astype(np.int64).view(np.uint64)
    assert got.dtype == np.uint64 and got.tobytes() == want.tobytes()
    exact = fp.encode_exact(x)
    assert exact.tobytes() == np.rint(scaled).astype(np.int64).view(np.uint64).tobytes()
    assert np.array_equal(fp.decode(exact), exact.view(np.int64) / 2.0**20)


@given(st.lists(st.floats(-100, 100), min_size=1, max_size=50), st.integers(0, 2**32))
def test_field_round_trip_error_below_resolution(values: list[float], seed: int) -> None:
    fp = FixedPoint(frac_bits=16, max_abs=100, max_summands=10, ring=PrimeField())
    words = fp.encode(values, np.random.default_rng(seed))
    assert words.dtype == np.uint64 and int(words.max()) < SESA_PRIME
    got = fp.decode(words)
    assert np.all(np.abs(got - np.asarray(values)) < 2.0**-16)


def test_field_sums_decode_signed() -> None:
    f = PrimeField()
    fp = FixedPoint(frac_bits=10, max_abs=1000, max_summands=3, ring=f)
    words = fp.encode_exact([-999.5, 500.25, -0.75])
    assert fp.decode(f.sum(words)) == pytest.approx(-500.0)
    # Unbiased in the field too.
    fp2 = FixedPoint(frac_bits=2, max_abs=10, max_summands=1, ring=PrimeField(65521))
    mean = fp2.decode(fp2.encode(np.full(200_000, -0.1), np.random.default_rng(0))).mean()
    assert abs(mean + 0.1) < 0.002


def test_field_bound_is_derived_from_p() -> None:
    # SESA's prime leaves 31 bits for a signed sum: (p - 1)/2 ~ 2^31.
    f = PrimeField()
    ok = FixedPoint(frac_bits=16, max_abs=64, max_summands=100, ring=f)  # 100 * 2^22 < 2^31
    assert ok.headroom_bits == pytest.approx(np.log2((SESA_PRIME + 1) / 2) - np.log2(100 * 2**22))
    with pytest.raises(FixedPointOverflowError, match=r"\(p-1\)/2 \+ 1 = 2147483646"):
        FixedPoint(frac_bits=16, max_abs=64, max_summands=1000, ring=f)
    # The exact integer check covers stochastic rounding up: F_11 holds |v| <= 5, so 5.5 at
    # 0 fractional bits (rounds to 6) is refused although 5.5 < 6 = (p-1)/2 + 1.
    small = PrimeField(11)
    assert FixedPoint(frac_bits=0, max_abs=5.0, max_summands=1, ring=small).headroom_bits > 0
    with pytest.raises(FixedPointOverflowError):
        FixedPoint(frac_bits=0, max_abs=5.5, max_summands=1, ring=small)


def test_smaller_power_of_two_ring() -> None:
    fp = FixedPoint(frac_bits=8, max_abs=10, max_summands=4, ring=Z2k(16))
    words = fp.encode_exact([-9.5, 3.25])
    assert int(words.max()) < 2**16
    assert fp.decode(words).tolist() == [-9.5, 3.25]
    with pytest.raises(FixedPointOverflowError, match="2\\^15"):
        FixedPoint(frac_bits=8, max_abs=64, max_summands=4, ring=Z2k(16))


def test_ring_must_be_a_ring() -> None:
    with pytest.raises(ConfigurationError, match="ring"):
        FixedPoint(ring="Z2_64")  # type: ignore[arg-type]
    assert issubclass(FixedPointOverflowError, ConfigurationError)
    assert issubclass(FixedPointOverflowError, ValueError)


# ------------------------------------------------------- the one-pass kernel (issue 26)


def _numpy_encode(fp: FixedPoint, x: np.ndarray, seed: int) -> np.ndarray:
    """The encode before the kernel: numpy temporaries, then the ring's ``encode_signed``."""
    scaled = np.asarray(x, np.float64) * fp.scale
    low = np.floor(scaled)
    low = low + (np.random.default_rng(seed).random(size=low.shape) < scaled - low)
    return fp.ring.encode_signed(low.astype(np.int64))


@given(
    st.lists(st.floats(-1000, 1000), min_size=0, max_size=60),
    st.sampled_from([0, 1, 3]),
    st.sampled_from([Z2_64, Z2k(48), PrimeField(SESA_PRIME)]),
    st.integers(0, 2**32),
    st.booleans(),
)
def test_kernel_equals_the_numpy_encode(values, columns, ring, seed, transposed) -> None:
    """Every ring, shape and memory order: the words and the draws of the numpy encode."""
    fp = FixedPoint(frac_bits=8, max_abs=1000, max_summands=4, ring=ring)
    x = np.asarray(values, np.float64)
    if columns:  # (n, columns), or its transpose: not C-contiguous
        x = x[: x.size - x.size % columns].reshape(-1, columns)
        x = x.T if transposed else x
    rng = np.random.default_rng(seed)
    got = fp.encode(x, rng)
    want = _numpy_encode(fp, x, seed)
    assert got.shape == x.shape and got.dtype == np.uint64
    assert got.tobytes() == want.tobytes()
    assert rng.random() == np.random.default_rng(seed).random(size=x.size + 1)[-1]


def test_scalar_and_empty_inputs() -> None:
    fp = FixedPoint(frac_bits=4, max_abs=10, max_summands=1)
    assert fp.encode(2.5, np.random.default_rng(0)).shape == ()
    assert int(fp.encode(2.5, np.random.default_rng(0))) == 40  # 2.5 * 16 is on the grid
    assert fp.encode(np.zeros((0, 3)), np.random.default_rng(0)).shape == (0, 3)


@pytest.mark.parametrize("where", [0, 5, 99])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_first_non_finite_value_is_refused_anywhere(where: int, bad: float) -> None:
    fp = FixedPoint(frac_bits=10, max_abs=100, max_summands=2)
    x = np.ones(100)
    x[where] = bad
    rng = np.random.default_rng(3)
    with pytest.raises(FixedPointOverflowError, match="NaN or inf"):
        fp.encode(x, rng)
    assert rng.random() == np.random.default_rng(3).random()  # refused before any draw


def test_largest_value_is_quoted_in_the_bound_error() -> None:
    fp = FixedPoint(frac_bits=10, max_abs=100, max_summands=2)
    with pytest.raises(FixedPointOverflowError, match=r"value 250.5 exceeds max_abs=100"):
        fp.encode([1.0, -250.5, 120.0])
    assert fp.encode([-100.0, 100.0], np.random.default_rng(0)).view(np.int64).tolist() == [
        -102400,
        102400,
    ]
