"""Fixed-point encoding of real values in the ring Z_2^64, with stochastic rounding.

Secure aggregation adds values in Z_2^64 (DPF outputs, additive shares), so floats are scaled
by ``2**frac_bits`` and rounded to integers first. Rounding is *stochastic* (``floor(x) + 1``
with probability ``frac(x)``), which is unbiased: ``E[decode(encode(x))] == x`` (Niu et al.,
App. B). The error of one encoded value is below ``2**-frac_bits``; a sum of ``n`` values is
off by less than ``n * 2**-frac_bits``.

Sums wrap around modulo 2^64 and are read back as signed int64, which is exact as long as
every partial sum stays inside ``(-2**63, 2**63)``. :class:`FixedPoint` checks the bound
``max_summands * max_abs * 2**frac_bits < 2**63`` when it is built, and :meth:`encode` refuses
values above ``max_abs``: the bound is checked, not assumed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

_LIMIT = 2.0**63


class FixedPointOverflowError(ValueError):
    """The chosen parameters (or a value) could overflow a sum in Z_2^64."""


@dataclass(frozen=True)
class FixedPoint:
    """Fixed-point codec for values in ``[-max_abs, max_abs]``, summed ``max_summands`` times.

    Parameters
    ----------
    frac_bits : int
        Fractional bits (resolution ``2**-frac_bits``), in ``[0, 52]``.
    max_abs : float
        Largest magnitude one party may encode (> 0).
    max_summands : int
        Largest number of encoded values that will be added together (e.g. clients per
        round), >= 1.

    Raises
    ------
    ValueError
        If an argument is out of range.
    FixedPointOverflowError
        If ``max_summands * max_abs * 2**frac_bits >= 2**63``.
    """

    frac_bits: int = 24
    max_abs: float = 1e4
    max_summands: int = 1000

    def __post_init__(self) -> None:
        if isinstance(self.frac_bits, bool) or not 0 <= int(self.frac_bits) <= 52:
            raise ValueError(f"frac_bits must be in [0, 52], got {self.frac_bits}")
        if not (math.isfinite(self.max_abs) and self.max_abs > 0):
            raise ValueError(f"max_abs must be finite and > 0, got {self.max_abs}")
        if isinstance(self.max_summands, bool) or int(self.max_summands) < 1:
            raise ValueError(f"max_summands must be >= 1, got {self.max_summands}")
        if self.headroom_bits <= 0:
            raise FixedPointOverflowError(
                f"{self.max_summands} summands of |x| <= {self.max_abs} at {self.frac_bits} "
                f"fractional bits can reach 2^{63 - self.headroom_bits:.1f} >= 2^63"
            )

    @property
    def scale(self) -> float:
        """``2**frac_bits``."""
        return float(2**self.frac_bits)

    @property
    def headroom_bits(self) -> float:
        """``63 - log2(max_summands * max_abs * 2**frac_bits)``: bits to spare (must be > 0)."""
        return 63.0 - math.log2(self.max_summands * self.max_abs * self.scale)

    def encode(
        self, values: ArrayLike, rng: np.random.Generator | None = None
    ) -> NDArray[np.uint64]:
        """Encode reals as ring elements with stochastic rounding.

        Parameters
        ----------
        values : array_like
            Finite reals with ``|x| <= max_abs``.
        rng : numpy.random.Generator, optional
            Source of the rounding randomness (unbiasedness only; not a secret). A fresh
            OS-seeded generator by default.

        Returns
        -------
        numpy.ndarray
            uint64 array of the same shape (two's complement of ``round(x * 2**frac_bits)``).

        Raises
        ------
        FixedPointOverflowError
            If a value is not finite or exceeds ``max_abs``.
        """
        x = np.asarray(values, dtype=np.float64)
        if x.size and not np.all(np.isfinite(x)):
            raise FixedPointOverflowError("cannot encode NaN or inf")
        if x.size and float(np.max(np.abs(x))) > self.max_abs:
            raise FixedPointOverflowError(
                f"value {float(np.max(np.abs(x)))} exceeds max_abs={self.max_abs}"
            )
        rng = rng if rng is not None else np.random.default_rng()
        scaled = x * self.scale
        low = np.floor(scaled)
        rounded = low + (rng.random(size=x.shape) < (scaled - low))
        return rounded.astype(np.int64).view(np.uint64)

    def encode_exact(self, values: ArrayLike) -> NDArray[np.uint64]:
        """Encode with round-to-nearest (deterministic), e.g. for public model weights."""
        x = np.asarray(values, dtype=np.float64)
        if x.size and (not np.all(np.isfinite(x)) or float(np.max(np.abs(x))) > self.max_abs):
            raise FixedPointOverflowError(f"values must be finite with |x| <= {self.max_abs}")
        return np.rint(x * self.scale).astype(np.int64).view(np.uint64)

    def decode(self, words: ArrayLike) -> NDArray[np.float64]:
        """Decode ring elements (e.g. a reconstructed sum) back to reals.

        Parameters
        ----------
        words : array_like
            uint64 ring elements.

        Returns
        -------
        numpy.ndarray
            float64 values ``int64(words) / 2**frac_bits``.
        """
        w = np.asarray(words, dtype=np.uint64)
        return w.view(np.int64).astype(np.float64) / self.scale
