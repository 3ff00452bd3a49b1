"""Numba loop of the projected value check's ``y += Z a`` in Z_2^64.

In :mod:`~flwr_fsl.families.ssa.projected_check` the projections ``z_(k,n) = b0 - b1`` in {-1, 0,
+1} come from an AES-CTR stream read as ``uint64`` words: in one block of ``count`` value words, the
pair of projection ``k`` and value word ``j`` is bits ``t = 2 (r j + k)`` and ``t + 1`` of the
block's stream, bit ``t`` being bit ``t % 64`` of word ``t // 64`` (the little-endian bit order of
:func:`~flwr_fsl.families.ssa.projected_check.projection_matrix`). :func:`project_block` adds
``sum_j z_(k,j) a_j`` to ``y[k]`` for every ``k`` straight from those words, without laying out the
``(count, r)`` matrix: ``a & -b0`` minus ``a & -b1``, wrapping in ``uint64`` (Z_2^64), exactly the
sums of the matrix product. When ``2 r`` is a multiple of 64, each value word's bits start on a word
boundary and the inner loop over 32 projections reads one stream word (a loop LLVM vectorizes);
otherwise every pair is located by its bit index.
"""

from __future__ import annotations

import numpy as np
from numba import njit

ZERO = np.uint64(0)
ONE = np.uint64(1)


@njit(cache=True, nogil=True)
def project_block(
    words: np.ndarray, a: np.ndarray, r: int, y: np.ndarray
) -> None:  # pragma: no cover - numba
    """Add ``sum_j z_(k,j) a[j]`` to ``y[k]`` (``uint64``, wrapping) for ``k < r``.

    ``words`` is the block's stream (``ceil(2 r len(a) / 64)`` ``uint64`` words), ``a`` the
    block's value words (``uint64``) and ``y`` the ``(r,)`` ``uint64`` running sums.
    """
    n = a.shape[0]
    if (2 * r) % 64 == 0:
        per = (2 * r) // 64  # stream words per value word
        for j in range(n):
            aj = a[j]
            for q in range(per):
                w = words[j * per + q]
                base = 32 * q
                for s in range(32):
                    pair = w >> np.uint64(2 * s)
                    y[base + s] += (aj & (ZERO - (pair & ONE))) - (
                        aj & (ZERO - ((pair >> ONE) & ONE))
                    )
        return
    for j in range(n):
        aj = a[j]
        for k in range(r):
            t = 2 * (r * j + k)  # even: both bits of the pair are in one word
            pair = words[t >> 6] >> np.uint64(t & 63)
            y[k] += (aj & (ZERO - (pair & ONE))) - (aj & (ZERO - ((pair >> ONE) & ONE)))
