"""Fixed-point encoding of real values in a ring (Z_2^64 by default, or F_p), stochastic rounding.

Secure aggregation adds values in a ring (Z_2^64 for DPF outputs and additive shares, F_p for
SESA's Lagrange coding), so floats are scaled by ``2**frac_bits`` and rounded to integers
first. Rounding is *stochastic* (``floor(x) + 1`` with probability ``frac(x)``), which is
unbiased: ``E[decode(encode(x))] == x`` (Niu et al., App. B). The error of one encoded value is
below ``2**-frac_bits``; a sum of ``n`` values is off by less than ``n * 2**-frac_bits``.

The integers are mapped into the ring by its signed encoding
(:meth:`~flwr_fsl.crypto.ring.Ring.encode_signed`: two's complement in Z_2^64, centred
representatives in F_p), and a sum is read back exactly as long as it stays within the ring's
signed range ``[-M, M]``, ``M = ring.max_signed`` (``2^63 - 1`` for Z_2^64, ``(p - 1)/2`` for
F_p). One encoded value has magnitude at most ``ceil(max_abs * 2**frac_bits)`` (both rounding
modes stay between floor and ceil of the scaled value), so a sum of ``max_summands`` values is
exact when ``max_summands * ceil(max_abs * 2**frac_bits) <= M``. :class:`FixedPoint` checks
that bound when it is built (reporting ``headroom_bits``, the bits to spare below ``M + 1``:
``2^63`` for Z_2^64), and :meth:`encode` refuses values above ``max_abs``: the bound is checked,
not assumed. In the default ring ``Z_2^64`` the encoded words are exactly those of the codec
before the ring was a parameter (``int64`` two's complement reinterpreted as ``uint64``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.ring import Z2_64, Ring, Z2k
from flwr_fsl.kernels.rounding import abs_max_finite, stochastic_round


class FixedPointOverflowError(ConfigurationError):
    """The chosen parameters (or a value) could overflow a sum in the ring."""


def _limit_text(ring: Ring) -> str:
    """``2^63`` for Z_2^64, ``(p-1)/2 = ...`` for a field: the bound a sum must stay below."""
    limit = ring.max_signed + 1
    if limit & (limit - 1) == 0:
        return f"2^{limit.bit_length() - 1}"
    return f"(p-1)/2 + 1 = {limit}"


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
    ring : Ring, optional
        Where the encoded values live (default :data:`~flwr_fsl.crypto.ring.Z2_64`), e.g.
        ``PrimeField()`` for SESA.

    Raises
    ------
    ValueError
        If an argument is out of range (a :class:`~flwr_fsl.core.errors.ConfigurationError`).
    FixedPointOverflowError
        If ``max_summands * ceil(max_abs * 2**frac_bits)`` exceeds the ring's signed range
        (``2**63 - 1`` for Z_2^64, ``(p - 1)/2`` for F_p).
    """

    frac_bits: int = 24
    max_abs: float = 1e4
    max_summands: int = 1000
    ring: Ring = Z2_64

    def __post_init__(self) -> None:
        if isinstance(self.frac_bits, bool) or not 0 <= int(self.frac_bits) <= 52:
            raise ConfigurationError(f"frac_bits must be in [0, 52], got {self.frac_bits}")
        if not (math.isfinite(self.max_abs) and self.max_abs > 0):
            raise ConfigurationError(f"max_abs must be finite and > 0, got {self.max_abs}")
        if isinstance(self.max_summands, bool) or int(self.max_summands) < 1:
            raise ConfigurationError(f"max_summands must be >= 1, got {self.max_summands}")
        if not isinstance(self.ring, Ring):
            raise ConfigurationError(f"ring must be a Ring, got {type(self.ring).__name__}")
        # headroom_bits > 0 is the float form of the bound; the exact integer check then also
        # covers rounding up to ceil(max_abs * 2^f) (it is evaluated only when finite).
        if (
            self.headroom_bits <= 0
            or int(self.max_summands) * math.ceil(self.max_abs * self.scale) > self.ring.max_signed
        ):
            limit_bits = math.log2(self.ring.max_signed + 1)
            raise FixedPointOverflowError(
                f"{self.max_summands} summands of |x| <= {self.max_abs} at {self.frac_bits} "
                f"fractional bits can reach 2^{limit_bits - self.headroom_bits:.1f} >= "
                f"{_limit_text(self.ring)}, the signed range of {self.ring}"
            )

    @property
    def scale(self) -> float:
        """``2**frac_bits``."""
        return float(2**self.frac_bits)

    @property
    def headroom_bits(self) -> float:
        """``log2(M + 1) - log2(max_summands * max_abs * 2**frac_bits)``: bits to spare.

        ``M = ring.max_signed``; in Z_2^64 this is ``63 - log2(...)``. Always > 0 for a built
        codec.
        """
        limit_bits = math.log2(self.ring.max_signed + 1)
        return limit_bits - math.log2(self.max_summands * self.max_abs * self.scale)

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
            uint64 array of the same shape: ``round(x * 2**frac_bits)`` in the ring's signed
            encoding (two's complement in Z_2^64).

        Raises
        ------
        FixedPointOverflowError
            If a value is not finite or exceeds ``max_abs``.
        """
        x = np.asarray(values, dtype=np.float64)
        flat = np.ascontiguousarray(x).reshape(-1)  # C order: the order of the draws below
        finite, largest = abs_max_finite(flat)
        if not finite:
            raise FixedPointOverflowError("cannot encode NaN or inf")
        if largest > self.max_abs:
            raise FixedPointOverflowError(f"value {largest} exceeds max_abs={self.max_abs}")
        rng = rng if rng is not None else np.random.default_rng()
        draws = np.array(rng.random(size=x.shape), np.float64, copy=None).reshape(-1)
        # ``floor(x·2^f) + (u < x·2^f - floor(x·2^f))`` in one pass, each word written over
        # its own draw: no temporaries, no second buffer (nothing else holds the draws).
        low = draws.view(np.int64)
        stochastic_round(flat, draws, self.scale, low)
        if isinstance(self.ring, Z2k) and self.ring.bits == 64:  # two's complement: the words
            return low.view(np.uint64).reshape(x.shape)
        return self.ring.encode_signed(low.reshape(x.shape))

    def encode_exact(self, values: ArrayLike) -> NDArray[np.uint64]:
        """Encode with round-to-nearest (deterministic), e.g. for public model weights."""
        x = np.asarray(values, dtype=np.float64)
        if x.size and (not np.all(np.isfinite(x)) or float(np.max(np.abs(x))) > self.max_abs):
            raise FixedPointOverflowError(f"values must be finite with |x| <= {self.max_abs}")
        return self.ring.encode_signed(np.rint(x * self.scale).astype(np.int64))

    def decode(self, words: ArrayLike) -> NDArray[np.float64]:
        """Decode ring elements (e.g. a reconstructed sum) back to reals.

        Parameters
        ----------
        words : array_like
            uint64 ring elements.

        Returns
        -------
        numpy.ndarray
            float64 values ``signed(words) / 2**frac_bits`` (``int64(words)`` in Z_2^64).
        """
        w = np.asarray(words, dtype=np.uint64)
        return self.ring.decode_signed(w).astype(np.float64) / self.scale
