"""Numba kernel for SESA's offline coding: every mask evaluation of a client in one pass.

:func:`mask_evaluations_mod` computes, for evaluation points ``j``, slots ``k`` and words ``w``,

``out[j, k, w] = sel[j, k] · r[k, w] + Σ_t extra[j, t] · v[t, k, w]  (mod p)``

— eq. 22 of Sami & Güler at every point, the ``(J × (T+1)) @ ((T+1) × d)`` product per slot
that :func:`flwr_fsl.families.sesa.coding.mask_evaluations` describes — without materialising
the broadcast product ``sel ⊗ r`` or a second ``(J, K_i, d)`` array for the sum. Arithmetic as
:mod:`flwr_fsl.kernels.field` (``p < 2^32``, each product ``< 2^64``, the sum kept exactly in
128 bits as ``(hi, lo)``, one reduction per output word). The words are processed in tiles of
:data:`TILE` so the two accumulator rows stay in the first-level cache while the ``T + 1``
operand rows stream through: the untiled loop re-read accumulators of the whole shard length
from memory for every term.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numpy.typing import NDArray

__all__ = ["TILE", "mask_evaluations_mod"]

TILE = 512
"""Words per tile (two accumulator rows of 4 KiB each)."""

_ZERO = np.uint64(0)


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
