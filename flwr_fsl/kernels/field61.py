"""Numba kernels for F_p with the Mersenne prime p = 2^61 - 1 (the range check's FLP).

:mod:`flwr_fsl.crypto.flp` keeps its elementwise arithmetic in numpy; the prover's one hot
loop, evaluating every wire polynomial at the ``m`` extra points (a ``(m, m + 1) @ (m + 1, c)``
product mod p), runs here. Inputs are canonical (``< p``); nothing here validates them.
A product ``a * b`` of two 61-bit values is formed from 32-bit halves (each partial product fits
in 64 bits) and folded with ``2^61 = 1`` and ``2^64 = 8 (mod p)``, exactly as
:func:`flwr_fsl.crypto.flp.mul` does.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.typing import NDArray

_P = np.uint64((1 << 61) - 1)
_M32 = np.uint64(0xFFFFFFFF)
_M29 = np.uint64((1 << 29) - 1)


@njit(cache=True, inline="always")
def _mul(a: np.uint64, b: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """Return ``a * b mod p`` (canonical inputs)."""
    ah = a >> np.uint64(32)
    al = a & _M32
    bh = b >> np.uint64(32)
    bl = b & _M32
    mid = ah * bl + al * bh
    low = al * bl
    s = np.uint64(8) * (ah * bh) + (mid >> np.uint64(29)) + ((mid & _M29) << np.uint64(32))
    s = s + (low >> np.uint64(61)) + (low & _P)
    s = (s & _P) + (s >> np.uint64(61))
    if s >= _P:
        s -= _P
    return s


@njit(cache=True, nogil=True)
def matmul_mod61(
    a: NDArray[np.uint64], b: NDArray[np.uint64], out: NDArray[np.uint64]
) -> None:  # pragma: no cover - compiled
    """``out = a @ b mod p`` for canonical ``(r, k)`` and ``(k, c)`` uint64 matrices."""
    rows, inner = a.shape
    cols = b.shape[1]
    for i in range(rows):
        for j in range(cols):
            out[i, j] = np.uint64(0)
        for t in range(inner):
            x = a[i, t]
            for j in range(cols):
                s = out[i, j] + _mul(x, b[t, j])
                if s >= _P:
                    s -= _P
                out[i, j] = s
