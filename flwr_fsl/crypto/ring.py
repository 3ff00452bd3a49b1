"""Rings for secret sharing behind one small interface: Z_2^k with wrap-around, and F_p.

Every protocol above this module computes on numpy ``uint64`` arrays and names its ring once:
two-server SSA, PrivHFL's three-party computation and fixed point live in ``Z_2^64``
(:class:`Z2k`), SESA's Lagrange coding and Shamir sharing (Bonawitz/Niu SecAgg seeds) in a
prime field (:class:`PrimeField`, default ``p = 2^32 - 5``, the largest prime below 2^32). As
in google/distributed_point_functions, the interface is small and explicit: a :class:`Ring`
has ``add``, ``sub``, ``neg``, ``mul``, ``matmul``, ``sum``, ``random``, signed
``encode_signed`` / ``decode_signed``, and ``element`` / ``validate`` to admit trusted and
untrusted values; a field adds ``inv``, ``batch_inv`` and ``pow``.

Representation and the arguments that nothing overflows:

* **Z_2^k** (``1 <= k <= 64``): an element is its residue in ``[0, 2^k)``. Numpy and numba
  ``uint64`` arithmetic is exact modulo 2^64, and reduction mod 2^k commutes with it, so each
  operation is the uint64 operation followed by ``& (2^k - 1)`` (skipped when ``k = 64``).
  Signed integers are two's complement: ``v -> v mod 2^k``, read back in
  ``[-2^(k-1), 2^(k-1))``; for ``k = 64`` this is exactly ``int64 <-> uint64`` reinterpretation
  (``.view``), which the fixed-point codec's encoded words rely on byte for byte.
* **F_p** with ``3 <= p < 2^32`` prime (checked by deterministic Miller–Rabin): an element is
  its canonical representative in ``[0, p)``. Sums of two are ``< 2p < 2^33`` and reduced by
  one conditional subtraction; a product of two is ``<= (p-1)^2 < 2^64`` and reduced by ``% p``;
  matrix products accumulate exactly in 128 bits (:mod:`flwr_fsl.kernels.field`). Signed
  integers use centred representatives: ``v`` with ``|v| <= (p-1)/2`` maps to ``v mod p`` and
  reads back as the representative of smallest magnitude.
* **Sampling** (:meth:`Ring.random`) reads a :class:`WordSource` such as
  :class:`~flwr_fsl.crypto.prg.PRGStream` (AES-128-CTR). ``Z_2^k`` keeps the low ``k`` bits of
  each word: exactly uniform. ``F_p`` never reduces ``word % p``, whose residues below
  ``2^64 mod p`` come out slightly more often (statistical distance up to ``p / 2^64`` per
  value, about 2^-32 for SESA's prime, and far more when fewer random bits are reduced).
  Instead each 64-bit word gives two 32-bit candidates, each masked to ``b = bitlen(p)`` bits
  and accepted iff ``< p`` (rejection sampling). An accepted candidate is exactly uniform on
  ``[0, p)`` given a uniform stream, and the acceptance probability ``p / 2^b`` is above 1/2.
  The values drawn are a deterministic function of the stream, so parties sharing a seed
  derive the same elements by making the same calls in the same order.

Trusted values (a party's own data, a dealer's output) enter through :meth:`Ring.element`
(``ValueError`` if not in range); material received from another party goes through
:meth:`Ring.validate`, which raises :class:`~flwr_fsl.core.errors.ClientInputError` (drop that
client). Arithmetic methods assume canonical elements and do not re-check them, which keeps
them O(1) passes over memory. Bad constructor arguments raise
:class:`~flwr_fsl.core.errors.ConfigurationError`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.kernels import field as _fk
from flwr_fsl.kernels import gpu as _gpu
from flwr_fsl.kernels.ring import matmul_wrap

__all__ = [
    "SESA_PRIME",
    "Z2_64",
    "PrimeField",
    "Ring",
    "WordSource",
    "Z2k",
    "is_prime",
]

SESA_PRIME = 2**32 - 5
"""The prime of SESA's Lagrange-coded aggregation: 4294967291, the largest prime below 2^32."""

_U64 = np.uint64
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)

Shape = int | tuple[int, ...]


class WordSource(Protocol):
    """Anything that yields uniform uint64 words in sequence (e.g. ``PRGStream``)."""

    def words(self, n_words: int) -> NDArray[np.uint64]:
        """Return the next ``n_words`` words."""
        ...


def is_prime(n: int) -> bool:  # noqa: C901
    """Deterministic primality test for ``0 <= n < 2^64`` (Miller–Rabin, 12 fixed bases).

    The first twelve primes 2..37 as witnesses decide primality correctly for every
    ``n < 3.18 * 10^23`` (Sorenson & Webster, Math. Comp. 2017), which covers all 64-bit ``n``.

    Parameters
    ----------
    n : int
        Candidate.

    Returns
    -------
    bool
        Whether ``n`` is prime.

    Raises
    ------
    ConfigurationError
        If ``n`` is not an integer in ``[0, 2^64)``.
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise ConfigurationError(f"is_prime needs an integer, got {n!r}")
    n = int(n)
    if not 0 <= n < 1 << 64:
        raise ConfigurationError(f"is_prime is deterministic for 0 <= n < 2^64, got {n}")
    if n < 2:
        return False
    for q in _MR_BASES:
        if n % q == 0:
            return n == q
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _shape(shape: Shape) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0 for d in dims):
        raise ConfigurationError(f"shape must be non-negative integers, got {shape!r}")
    return tuple(int(d) for d in dims)


def _integer_array(values: ArrayLike, what: str) -> NDArray[np.integer]:
    arr = np.asarray(values)
    if arr.size == 0 and not isinstance(values, np.ndarray):
        return np.zeros(arr.shape, dtype=np.int64)  # an empty list is float64 to numpy
    if arr.dtype.kind in "fO" and not isinstance(values, np.ndarray):
        # Python ints mixing [0, 2^63) and [2^63, 2^64) (or beyond) become float64 or object
        # under np.asarray: take them exactly through Python ints instead.
        obj = np.array(values, dtype=object)
        items = obj.reshape(-1).tolist()
        if all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in items):
            lo, hi = min(items, default=0), max(items, default=0)
            if 0 <= lo and hi < 1 << 64:
                return obj.astype(_U64)
            if -(1 << 63) <= lo and hi < 1 << 63:
                return obj.astype(np.int64)
            raise ConfigurationError(f"{what} must fit in 64 bits, got [{lo}, {hi}]")
    if arr.dtype.kind not in "iu":
        raise ConfigurationError(
            f"{what} must be integers (an int or uint numpy dtype), got {arr.dtype}"
        )
    return arr


class Ring(ABC):
    """A finite commutative ring whose elements are ``uint64`` numpy arrays.

    Subclasses: :class:`Z2k` and :class:`PrimeField`. All methods are pure (inputs are never
    modified) and broadcast like numpy where the operation is elementwise.
    """

    @property
    @abstractmethod
    def modulus(self) -> int:
        """Number of elements: ``2^k`` or ``p``."""

    @property
    @abstractmethod
    def max_signed(self) -> int:
        """Largest ``M`` such that every integer in ``[-M, M]`` round-trips through encoding."""

    @abstractmethod
    def add(self, a: ArrayLike, b: ArrayLike) -> NDArray[np.uint64]:
        """Return ``a + b`` (elementwise, broadcast)."""

    @abstractmethod
    def sub(self, a: ArrayLike, b: ArrayLike) -> NDArray[np.uint64]:
        """Return ``a - b`` (elementwise, broadcast)."""

    @abstractmethod
    def neg(self, a: ArrayLike) -> NDArray[np.uint64]:
        """Return ``-a``."""

    @abstractmethod
    def mul(self, a: ArrayLike, b: ArrayLike) -> NDArray[np.uint64]:
        """Return ``a * b`` (elementwise, broadcast)."""

    @abstractmethod
    def _matmul(self, a: NDArray[np.uint64], b: NDArray[np.uint64]) -> NDArray[np.uint64]:
        """Matrix product of C-contiguous 2-D canonical elements with matching inner size."""

    @abstractmethod
    def _reduce_sum(self, a: NDArray[np.uint64], axis: int | None) -> NDArray[np.uint64]:
        """Sum of canonical elements along ``axis`` (``None``: all)."""

    @abstractmethod
    def _sample(self, n: int, prg: WordSource) -> NDArray[np.uint64]:
        """Draw ``n`` uniform elements from the stream."""

    @abstractmethod
    def encode_signed(self, values: ArrayLike) -> NDArray[np.uint64]:
        """Map signed integers with ``|v| <= max_signed`` to ring elements.

        Parameters
        ----------
        values : array_like
            Integers (numpy int or uint dtype, or Python ints).

        Returns
        -------
        numpy.ndarray
            ``uint64`` elements of the same shape.

        Raises
        ------
        ValueError
            If the values are not integers or one is outside the representable range.
        """

    @abstractmethod
    def decode_signed(self, words: ArrayLike) -> NDArray[np.int64]:
        """Inverse of :meth:`encode_signed`: the signed representative of each element.

        Parameters
        ----------
        words : array_like
            Canonical ring elements.

        Returns
        -------
        numpy.ndarray
            ``int64`` array of the same shape.
        """

    # ------------------------------------------------------------------ shared, concrete

    def zeros(self, shape: Shape) -> NDArray[np.uint64]:
        """Return the zero element in an array of ``shape``."""
        return np.zeros(_shape(shape), dtype=_U64)

    def element(self, values: ArrayLike) -> NDArray[np.uint64]:
        """Admit trusted non-negative integers in ``[0, modulus)`` as ring elements.

        Parameters
        ----------
        values : array_like
            Integers in ``[0, modulus)``.

        Returns
        -------
        numpy.ndarray
            ``uint64`` array (a copy only where the dtype changes).

        Raises
        ------
        ConfigurationError
            If a value is not an integer or is out of range.
        """
        arr = _integer_array(values, "ring elements")
        if arr.size:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= self.modulus:
                raise ConfigurationError(
                    f"{self} elements must lie in [0, {self.modulus}), got [{lo}, {hi}]"
                )
        return arr.astype(_U64, copy=False)

    def validate(
        self, values: object, name: str = "share", shape: tuple[int, ...] | None = None
    ) -> NDArray[np.uint64]:
        """Admit *untrusted* material (another party's share) as ring elements.

        Parameters
        ----------
        values : object
            Must be a ``uint64`` numpy array with every entry in ``[0, modulus)``.
        name : str, optional
            What the values are, for the error message.
        shape : tuple of int, optional
            Required shape.

        Returns
        -------
        numpy.ndarray
            The same array.

        Raises
        ------
        ClientInputError
            If the type, dtype, shape or a value is wrong.
        """
        if not isinstance(values, np.ndarray) or values.dtype != _U64:
            got = values.dtype if isinstance(values, np.ndarray) else type(values).__name__
            raise ClientInputError(f"{name} must be a uint64 numpy array, got {got}")
        if shape is not None and values.shape != tuple(shape):
            raise ClientInputError(f"{name} must have shape {tuple(shape)}, got {values.shape}")
        if self.modulus < 1 << 64 and values.size and int(values.max()) >= self.modulus:
            raise ClientInputError(
                f"{name} holds {int(values.max())}, not an element of {self} (must be < "
                f"{self.modulus})"
            )
        return values

    def _elements(self, values: ArrayLike) -> NDArray[np.uint64]:
        """Fast path: ``uint64`` arrays are taken as canonical; other integers are checked."""
        arr = np.asarray(values)
        return arr if arr.dtype == _U64 else self.element(arr)

    def matmul(self, a: ArrayLike, b: ArrayLike) -> NDArray[np.uint64]:
        """Matrix product ``a @ b`` of 2-D arrays, ``(m, k) @ (k, n) -> (m, n)``.

        Parameters
        ----------
        a, b : array_like
            2-D arrays of ring elements with ``a.shape[1] == b.shape[0]``.

        Returns
        -------
        numpy.ndarray
            ``uint64`` array of shape ``(m, n)``.

        Raises
        ------
        ConfigurationError
            If the operands are not 2-D or their inner sizes differ.
        """
        x = np.ascontiguousarray(self._elements(a))
        y = np.ascontiguousarray(self._elements(b))
        if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[0]:
            raise ConfigurationError(
                f"matmul needs (m, k) @ (k, n) matrices, got {x.shape} @ {y.shape}"
            )
        return self._matmul(x, y)

    def sum(self, a: ArrayLike, axis: int | None = None) -> NDArray[np.uint64]:
        """Sum along ``axis`` (all entries if ``None``); a 0-d array for a full sum.

        Parameters
        ----------
        a : array_like
            Ring elements.
        axis : int, optional
            Axis to reduce.

        Returns
        -------
        numpy.ndarray
            ``uint64`` array.
        """
        return np.asarray(self._reduce_sum(self._elements(a), axis), dtype=_U64)

    def random(self, shape: Shape, prg: WordSource) -> NDArray[np.uint64]:
        """Draw uniform elements of ``shape`` from the word stream ``prg``.

        Parameters
        ----------
        shape : int or tuple of int
            Output shape.
        prg : WordSource
            E.g. :class:`~flwr_fsl.crypto.prg.PRGStream`; it advances.

        Returns
        -------
        numpy.ndarray
            ``uint64`` array of ``shape``.

        Raises
        ------
        ValueError
            If ``shape`` is not a valid shape.
        """
        dims = _shape(shape)
        return self._sample(math.prod(dims), prg).reshape(dims)


@dataclass(frozen=True)
class Z2k(Ring):
    """The ring of integers modulo ``2^bits`` (wrap-around), default ``Z_2^64``.

    Parameters
    ----------
    bits : int
        ``k`` in ``[1, 64]``.

    Raises
    ------
    ConfigurationError
        If ``bits`` is out of range.
    """

    bits: int = 64

    def __post_init__(self) -> None:
        if (
            isinstance(self.bits, bool)
            or not isinstance(self.bits, int)
            or not 1 <= self.bits <= 64
        ):
            raise ConfigurationError(f"Z2k bits must be an integer in [1, 64], got {self.bits!r}")

    def __str__(self) -> str:
        return f"Z_2^{self.bits}"

    @property
    def modulus(self) -> int:
        """``2^bits``."""
        return 1 << self.bits

    @property
    def max_signed(self) -> int:
        """``2^(bits-1) - 1`` (``-2^(bits-1)`` is representable too)."""
        return (1 << (self.bits - 1)) - 1

    def _wrap(self, x: NDArray[np.uint64]) -> NDArray[np.uint64]:
        x = np.asarray(x, dtype=_U64)  # a ufunc on 0-d inputs returns a scalar
        if self.bits < 64:
            x &= _U64((1 << self.bits) - 1)
        return x

    def add(self, a: ArrayLike, b: ArrayLike) -> NDArray[np.uint64]:
        """Return ``a + b mod 2^k``."""
        return self._wrap(np.add(self._elements(a), self._elements(b), dtype=_U64))

    def sub(self, a: ArrayLike, b: ArrayLike) -> NDArray[np.uint64]:
        """Return ``a - b mod 2^k``."""
        return self._wrap(np.subtract(self._elements(a), self._elements(b), dtype=_U64))

    def neg(self, a: ArrayLike) -> NDArray[np.uint64]:
        """Return ``-a mod 2^k``."""
        return self._wrap(np.subtract(_U64(0), self._elements(a), dtype=_U64))

    def mul(self, a: ArrayLike, b: ArrayLike) -> NDArray[np.uint64]:
        """Return ``a * b mod 2^k``."""
        return self._wrap(np.multiply(self._elements(a), self._elements(b), dtype=_U64))

    def _matmul(self, a: NDArray[np.uint64], b: NDArray[np.uint64]) -> NDArray[np.uint64]:
        out = np.empty((a.shape[0], b.shape[1]), dtype=_U64)
        matmul_wrap(a, b, out)
        return self._wrap(out)

    def _reduce_sum(self, a: NDArray[np.uint64], axis: int | None) -> NDArray[np.uint64]:
        return self._wrap(np.asarray(np.sum(a, axis=axis, dtype=_U64)))

    def _sample(self, n: int, prg: WordSource) -> NDArray[np.uint64]:
        words = np.asarray(prg.words(n), dtype=_U64)
        if words.shape != (n,):
            raise ConfigurationError(f"word source returned shape {words.shape}, expected ({n},)")
        return self._wrap(words.copy())

    def encode_signed(self, values: ArrayLike) -> NDArray[np.uint64]:
        """Two's complement: ``v -> v mod 2^k`` for ``-2^(k-1) <= v < 2^(k-1)``.

        For ``k = 64`` an ``int64`` input is reinterpreted (``.view``), byte for byte.

        Parameters
        ----------
        values : array_like
            Signed integers in ``[-2^(k-1), 2^(k-1))``.

        Returns
        -------
        numpy.ndarray
            ``uint64`` elements.

        Raises
        ------
        ConfigurationError
            If the values are not integers or one is out of range.
        """
        arr = _integer_array(values, "signed values")
        if arr.size and not (arr.dtype == np.int64 and self.bits == 64):
            lo, hi = int(arr.min()), int(arr.max())
            if lo < -(1 << (self.bits - 1)) or hi > self.max_signed:
                raise ConfigurationError(
                    f"signed values must lie in [-2^{self.bits - 1}, 2^{self.bits - 1}) to encode "
                    f"in {self}, got [{lo}, {hi}]"
                )
        words = arr.astype(np.int64).view(_U64)  # a copy: never alias the caller's array
        return words if self.bits == 64 else words & _U64((1 << self.bits) - 1)

    def decode_signed(self, words: ArrayLike) -> NDArray[np.int64]:
        """Two's complement read-back into ``[-2^(k-1), 2^(k-1))`` (``int64``)."""
        w = np.asarray(self._elements(words), dtype=_U64)
        if self.bits == 64:
            return w.view(np.int64).copy()
        v = w.astype(np.int64)
        return np.where(v > self.max_signed, v - (1 << self.bits), v)


Z2_64 = Z2k(64)
"""The ring ``Z_2^64`` (DPF outputs, SSA, PrivHFL, fixed point by default)."""


@dataclass(frozen=True)
class PrimeField(Ring):
    """The prime field ``F_p`` for a prime ``3 <= p < 2^32``, default ``p = 2^32 - 5``.

    ``p < 2^32`` makes every product of two elements fit in a uint64 (module docstring).

    Parameters
    ----------
    p : int
        The prime modulus.

    Raises
    ------
    ConfigurationError
        If ``p`` is not an integer, not in ``[3, 2^32)``, or not prime.
    """

    p: int = SESA_PRIME

    def __post_init__(self) -> None:
        if isinstance(self.p, bool) or not isinstance(self.p, int):
            raise ConfigurationError(f"PrimeField p must be an int, got {self.p!r}")
        if not 3 <= self.p < 1 << 32:
            raise ConfigurationError(
                f"PrimeField p must lie in [3, 2^32) so a product fits in 64 bits, got {self.p}"
            )
        if not is_prime(self.p):
            raise ConfigurationError(f"PrimeField p must be prime, got {self.p}")

    def __str__(self) -> str:
        return f"F_{self.p}"

    @property
    def modulus(self) -> int:
        """``p``."""
        return self.p

    @property
    def max_signed(self) -> int:
        """``(p - 1) / 2``: centred representatives lie in ``[-(p-1)/2, (p-1)/2]``."""
        return (self.p - 1) // 2

    @property
    def _p(self) -> np.uint64:
        return _U64(self.p)

    def add(self, a: ArrayLike, b: ArrayLike) -> NDArray[np.uint64]:
        """Return ``a + b mod p`` (the sum is ``< 2p``; one conditional subtraction)."""
        s = np.asarray(np.add(self._elements(a), self._elements(b), dtype=_U64))
        np.subtract(s, self._p, out=s, where=s >= self._p)
        return s

    def sub(self, a: ArrayLike, b: ArrayLike) -> NDArray[np.uint64]:
        """Return ``a - b mod p`` (wrap-around ``a - b``, plus ``p`` where ``a < b``)."""
        x, y = self._elements(a), self._elements(b)
        d = np.asarray(np.subtract(x, y, dtype=_U64))
        np.add(d, self._p, out=d, where=np.less(x, y))
        return d

    def neg(self, a: ArrayLike) -> NDArray[np.uint64]:
        """Return ``-a mod p`` (``0`` stays ``0``)."""
        x = self._elements(a)
        return np.where(x == 0, _U64(0), np.subtract(self._p, x, dtype=_U64)).astype(_U64)

    def mul(self, a: ArrayLike, b: ArrayLike) -> NDArray[np.uint64]:
        """Return ``a * b mod p`` (each product ``< (p-1)^2 < 2^64``; numba kernel)."""
        x, y = np.broadcast_arrays(self._elements(a), self._elements(b))
        xf = np.ascontiguousarray(x).reshape(-1)
        yf = np.ascontiguousarray(y).reshape(-1)
        out = np.empty(xf.shape, dtype=_U64)
        _fk.mul_mod(xf, yf, self._p, out)
        return out.reshape(x.shape)

    def pow(self, a: ArrayLike, exponent: int) -> NDArray[np.uint64]:
        """Return ``a ** exponent mod p`` elementwise (``0 ** 0 = 1``).

        Parameters
        ----------
        a : array_like
            Field elements.
        exponent : int
            Non-negative exponent below 2^64.

        Returns
        -------
        numpy.ndarray
            ``uint64`` array of ``a``'s shape.

        Raises
        ------
        ConfigurationError
            If the exponent is negative or not an integer.
        """
        if isinstance(exponent, bool) or not isinstance(exponent, int | np.integer):
            raise ConfigurationError(f"exponent must be an integer, got {exponent!r}")
        if not 0 <= int(exponent) < 1 << 64:
            raise ConfigurationError(f"exponent must be in [0, 2^64), got {exponent}")
        x = np.ascontiguousarray(self._elements(a))
        out = np.empty(x.size, dtype=_U64)
        _fk.pow_mod(x.reshape(-1), _U64(int(exponent)), self._p, out)
        return out.reshape(x.shape)

    def inv(self, a: ArrayLike) -> NDArray[np.uint64]:
        """Return ``a^-1 = a^(p-2) mod p`` elementwise (Fermat).

        Parameters
        ----------
        a : array_like
            Nonzero field elements.

        Returns
        -------
        numpy.ndarray
            ``uint64`` inverses.

        Raises
        ------
        ZeroDivisionError
            If an entry is 0.
        """
        x = self._elements(a)
        if x.size and not np.all(x):
            raise ZeroDivisionError(f"0 has no inverse in {self}")
        return self.pow(x, self.p - 2)

    def batch_inv(self, a: ArrayLike) -> NDArray[np.uint64]:
        """Invert many elements with one exponentiation (Montgomery's trick, ~3 mul each).

        Parameters
        ----------
        a : array_like
            Nonzero field elements.

        Returns
        -------
        numpy.ndarray
            ``uint64`` inverses of ``a``'s shape.

        Raises
        ------
        ZeroDivisionError
            If an entry is 0.
        """
        x = np.ascontiguousarray(self._elements(a))
        out = np.empty(x.size, dtype=_U64)
        bad = _fk.batch_inverse(x.reshape(-1), self._p, out)
        if bad >= 0:
            raise ZeroDivisionError(f"0 has no inverse in {self} (flat index {bad})")
        return out.reshape(x.shape)

    def _matmul(self, a: NDArray[np.uint64], b: NDArray[np.uint64]) -> NDArray[np.uint64]:
        # Large products go to the GPU where the matmul device allows (bit-identical limbs).
        if a.shape[1] < _gpu.MAX_INNER_FIELD:
            device = _gpu.offload_device(a.shape[0], a.shape[1], b.shape[1])
            if device is not None:
                return _gpu.field_limb_matmul(a, b, self.p, device)
        out = np.empty((a.shape[0], b.shape[1]), dtype=_U64)
        _fk.matmul_mod(a, b, self._p, _U64((1 << 64) % self.p), out)
        return out

    def _reduce_sum(self, a: NDArray[np.uint64], axis: int | None) -> NDArray[np.uint64]:
        # A uint64 sum of c elements is exact while c * (p - 1) < 2^64, i.e. c <= chunk (> 2^32):
        # sum chunks of that many exactly, reduce each, and add the reduced partial sums mod p.
        flat = a.reshape(-1) if axis is None else np.moveaxis(a, axis, 0)
        chunk = ((1 << 64) - 1) // (self.p - 1)
        total = np.asarray(np.sum(flat[:chunk], axis=0, dtype=_U64) % self._p)
        for start in range(chunk, flat.shape[0], chunk):
            part = np.asarray(np.sum(flat[start : start + chunk], axis=0, dtype=_U64) % self._p)
            total = self.add(total, part)
        return total

    def _sample(self, n: int, prg: WordSource) -> NDArray[np.uint64]:
        # Rejection sampling (module docstring): two 32-bit candidates per word, masked to
        # bitlen(p) bits, kept iff < p. Acceptance q = p / 2^b > 1/2; draw a little more than
        # n / q candidates per pass and repeat until n are accepted.
        bits = self.p.bit_length()
        mask = _U64((1 << bits) - 1)
        accept = self.p / float(1 << bits)
        out = np.empty(n, dtype=_U64)
        filled = 0
        while filled < n:
            want = n - filled
            n_words = (int(want / accept * 1.05) + 64) // 2
            words = np.asarray(prg.words(n_words), dtype=_U64)
            if words.shape != (n_words,):
                raise ConfigurationError(
                    f"word source returned shape {words.shape}, expected ({n_words},)"
                )
            cand = np.empty(2 * n_words, dtype=_U64)
            cand[0::2] = words & _U64(0xFFFFFFFF)
            cand[1::2] = words >> _U64(32)
            cand &= mask
            good = cand[cand < self._p][:want]
            out[filled : filled + good.size] = good
            filled += good.size
        return out

    def encode_signed(self, values: ArrayLike) -> NDArray[np.uint64]:
        """Centred encoding: ``v -> v mod p`` for ``|v| <= (p-1)/2``.

        Parameters
        ----------
        values : array_like
            Signed integers with ``|v| <= (p-1)/2``.

        Returns
        -------
        numpy.ndarray
            ``uint64`` elements.

        Raises
        ------
        ConfigurationError
            If the values are not integers or one is out of range.
        """
        arr = _integer_array(values, "signed values")
        if arr.size:
            lo, hi = int(arr.min()), int(arr.max())
            if lo < -self.max_signed or hi > self.max_signed:
                raise ConfigurationError(
                    f"signed values must satisfy |v| <= (p-1)/2 = {self.max_signed} to encode in "
                    f"{self}, got [{lo}, {hi}]"
                )
        v = arr.astype(np.int64)
        return np.where(v < 0, v + self.p, v).astype(_U64)

    def decode_signed(self, words: ArrayLike) -> NDArray[np.int64]:
        """Centred read-back: ``w`` if ``w <= (p-1)/2`` else ``w - p`` (``int64``)."""
        v = np.asarray(self._elements(words), dtype=_U64).astype(np.int64)
        return np.where(v > self.max_signed, v - self.p, v)
