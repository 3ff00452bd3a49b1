"""Fixed-point codec: unbiased stochastic rounding, exact decode, checked overflow bound."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.crypto.fixedpoint import FixedPoint, FixedPointOverflowError


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
    with pytest.raises(ValueError, match=match):
        FixedPoint(**kwargs)
