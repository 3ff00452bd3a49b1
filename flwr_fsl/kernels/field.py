"""Numba kernels for arithmetic in a prime field F_p with p < 2^32 (SESA uses p = 2^32 - 5).

These are the hot loops behind :class:`flwr_fsl.crypto.ring.PrimeField` and the Lagrange
helpers of :mod:`flwr_fsl.crypto.sharing`; nothing here validates its inputs, the public API
does that. Conventions and the overflow argument every kernel relies on:

* Elements are canonical representatives in ``[0, p)`` stored as ``uint64``; ``p`` is passed
  as ``np.uint64`` and every constant is ``np.uint64`` so numba never promotes to float64.
* **One product fits.** ``p < 2^32`` gives ``a, b <= p - 1 < 2^32``, hence
  ``a * b <= (p - 1)^2 < 2^64``: a single product is exact in uint64 and is reduced with one
  ``% p`` before it meets anything else. Sums of two reduced values are ``< 2p < 2^33``.
* **Matmul accumulates exactly in 128 bits.** A dot product of length ``k`` can reach
  ``k (p - 1)^2``, far above 2^64, and reducing every product costs a division per term.
  :func:`matmul_mod` instead keeps the exact sum as a pair ``(hi, lo)`` with value
  ``hi * 2^64 + lo``: each step adds one exact product ``q < 2^64`` to ``lo`` with wrap-around;
  the true sum ``lo + q < 2^65`` overflows at most once, exactly when the wrapped result is
  smaller than the old ``lo``, and then ``hi`` gains 1. So ``hi <= k`` never overflows, and at
  the end ``S mod p = ((hi mod p) * (2^64 mod p) + lo mod p) mod p``, where the product is
  ``< p^2 < 2^64`` and the sum ``< 2p``. One division per output entry, none per term.
* **SESA's mask evaluations in one pass.** :func:`mask_evaluations_mod` computes
  ``out[j, k, w] = sel[j, k] r[k, w] + Σ_t extra[j, t] v[t, k, w]`` (Sami & Güler eq. 22 at
  every point: per slot the ``(J × (T+1)) @ ((T+1) × d)`` product) with the same 128-bit
  accumulation, without the broadcast ``sel ⊗ r`` or a second ``(J, K_i, d)`` array, over
  tiles of :data:`TILE` words so the accumulators stay in the first-level cache while the
  ``T + 1`` operand rows stream through (the untiled loop re-read accumulators of the whole
  shard length from memory for every term).
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.typing import NDArray

_ZERO = np.uint64(0)
_ONE = np.uint64(1)


@njit(cache=True, inline="always")
def _pow_mod(base: np.uint64, exponent: np.uint64, p: np.uint64) -> np.uint64:  # pragma: no cover
    """Return ``base ** exponent mod p`` by square-and-multiply (operands < p < 2^32)."""
    result = _ONE % p
    b = base % p
    e = exponent
    while e > _ZERO:
        if e & _ONE:
            result = (result * b) % p
        b = (b * b) % p
        e = e >> _ONE
    return result


@njit(cache=True, nogil=True)
def mul_mod(
    a: NDArray[np.uint64], b: NDArray[np.uint64], p: np.uint64, out: NDArray[np.uint64]
) -> None:  # pragma: no cover - compiled
    """``out[i] = a[i] * b[i] mod p`` on flat arrays (each product < 2^64, see module doc)."""
    for i in range(a.shape[0]):
        out[i] = (a[i] * b[i]) % p


@njit(cache=True, nogil=True)
def pow_mod(
    a: NDArray[np.uint64], exponent: np.uint64, p: np.uint64, out: NDArray[np.uint64]
) -> None:  # pragma: no cover - compiled
    """``out[i] = a[i] ** exponent mod p`` on flat arrays."""
    for i in range(a.shape[0]):
        out[i] = _pow_mod(a[i], exponent, p)


@njit(cache=True, nogil=True)
def batch_inverse(
    a: NDArray[np.uint64], p: np.uint64, out: NDArray[np.uint64]
) -> int:  # pragma: no cover - compiled
    """``out[i] = a[i]^-1 mod p`` with one exponentiation (Montgomery's trick).

    Forward pass: ``out[i] = a[0] * ... * a[i-1]`` (prefix products). One Fermat inverse
    ``inv = (a[0] * ... * a[n-1])^(p-2)``. Backward pass: ``out[i] *= inv`` gives ``a[i]^-1``,
    then ``inv *= a[i]`` drops ``a[i]`` from the running inverse. Returns the index of the first
    zero entry (which has no inverse; ``out`` is then garbage) or -1.
    """
    n = a.shape[0]
    acc = _ONE % p
    for i in range(n):
        if a[i] == _ZERO:
            return i
        out[i] = acc
        acc = (acc * a[i]) % p
    inv = _pow_mod(acc, p - np.uint64(2), p)
    for i in range(n - 1, -1, -1):
        out[i] = (out[i] * inv) % p
        inv = (inv * a[i]) % p
    return -1


@njit(cache=True, nogil=True)
def matmul_mod(
    a: NDArray[np.uint64],
    b: NDArray[np.uint64],
    p: np.uint64,
    two64_mod_p: np.uint64,
    out: NDArray[np.uint64],
) -> None:  # pragma: no cover - compiled
    """``out = a @ b mod p`` for ``a`` (m, k), ``b`` (k, n), exact 128-bit accumulation.

    ``two64_mod_p`` is ``2^64 mod p``. See the module docstring for why nothing overflows.
    Loop order i-t-j reads rows of ``b`` contiguously; the two accumulator rows are reused.
    """
    m, k = a.shape
    n = b.shape[1]
    lo = np.empty(n, dtype=np.uint64)
    hi = np.empty(n, dtype=np.uint64)
    for i in range(m):
        for j in range(n):
            lo[j] = _ZERO
            hi[j] = _ZERO
        for t in range(k):
            x = a[i, t]
            if x == _ZERO:
                continue
            for j in range(n):
                s = lo[j] + x * b[t, j]  # x * b < 2^64 exactly; the add wraps at most once
                hi[j] += np.uint64(s < lo[j])  # the carry out of the low word
                lo[j] = s
        for j in range(n):
            out[i, j] = ((hi[j] % p) * two64_mod_p % p + lo[j] % p) % p


@njit(cache=True, nogil=True)
def lagrange_matrix(
    xs: NDArray[np.uint64], at: NDArray[np.uint64], p: np.uint64, out: NDArray[np.uint64]
) -> int:  # pragma: no cover - compiled
    """``out[i, j] = L_j(at[i])``, the Lagrange basis through the distinct nodes ``xs``.

    ``L_j(z) = prod_{m != j} (z - xs[m]) / (xs[j] - xs[m])``, so for values ``y`` at the nodes,
    ``out @ y`` evaluates the interpolating polynomial (degree < len(xs)) at every ``at[i]``.
    Denominators ``w_j = prod_{m != j} (xs[j] - xs[m])`` depend on ``j`` only: O(K^2) once,
    inverted together by :func:`batch_inverse`. Numerators per row use prefix and suffix
    products of ``d_m = at[i] - xs[m]``: ``prod_{m != j} d_m = pre[j] * suf[j + 1]``, O(K) per
    row. If ``at[i] == xs[j]`` the row is the unit vector ``e_j`` with no special case (every
    other numerator contains the factor ``at[i] - xs[j] = 0``). Returns -1, or the index ``j``
    of a zero denominator (duplicate nodes; ``out`` is then garbage).
    """
    k = xs.shape[0]
    denominators = np.empty(k, dtype=np.uint64)
    for j in range(k):
        w = _ONE % p
        for m in range(k):
            if m != j:
                w = (w * ((xs[j] + p - xs[m]) % p)) % p
        denominators[j] = w
    inverses = np.empty(k, dtype=np.uint64)
    bad = batch_inverse(denominators, p, inverses)
    if bad >= 0:
        return bad
    pre = np.empty(k + 1, dtype=np.uint64)
    suf = np.empty(k + 1, dtype=np.uint64)
    diff = np.empty(k, dtype=np.uint64)
    for i in range(at.shape[0]):
        z = at[i]
        for m in range(k):
            diff[m] = (z + p - xs[m]) % p
        pre[0] = _ONE % p
        for m in range(k):
            pre[m + 1] = (pre[m] * diff[m]) % p
        suf[k] = _ONE % p
        for m in range(k - 1, -1, -1):
            suf[m] = (suf[m + 1] * diff[m]) % p
        for j in range(k):
            out[i, j] = (((pre[j] * suf[j + 1]) % p) * inverses[j]) % p
    return -1


# -- SESA offline coding ------------------------------------------------------------------------
TILE = 512
"""Words per tile (two accumulator rows of 4 KiB each)."""


@njit(cache=True, nogil=True)
def mask_evaluations_mod(
    extra: NDArray[np.uint64],
    sel: NDArray[np.uint64],
    v: NDArray[np.uint64],
    r: NDArray[np.uint64],
    p: np.uint64,
    two64_mod_p: np.uint64,
    out: NDArray[np.uint64],
) -> None:  # pragma: no cover - compiled
    """``out[j, k] = sel[j, k] r[k] + Σ_t extra[j, t] v[t, k]`` mod ``p`` (module docstring).

    Shapes: ``extra`` (J, T), ``sel`` (J, K), ``v`` (T, K, d), ``r`` (K, d), ``out`` (J, K, d);
    every input a canonical element ``< p < 2^32``.
    """
    n_points, terms = extra.shape
    slots = sel.shape[1]
    d = r.shape[1]
    lo = np.empty(TILE, dtype=np.uint64)
    hi = np.empty(TILE, dtype=np.uint64)
    for k in range(slots):
        for w0 in range(0, d, TILE):
            width = min(TILE, d - w0)
            for j in range(n_points):
                x = sel[j, k]
                for w in range(width):
                    lo[w] = x * r[k, w0 + w]  # < 2^64: the first term needs no carry
                    hi[w] = _ZERO
                for t in range(terms):
                    x = extra[j, t]
                    for w in range(width):
                        s = lo[w] + x * v[t, k, w0 + w]
                        hi[w] += np.uint64(s < lo[w])  # the carry out of the low word
                        lo[w] = s
                for w in range(width):
                    out[j, k, w0 + w] = ((hi[w] % p) * two64_mod_p % p + lo[w] % p) % p
