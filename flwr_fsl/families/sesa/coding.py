"""SESA's coding steps (Sami & Güler eqs. 21–22): a client's selector and mask evaluations.

Flower-free field arithmetic that :class:`~flwr_fsl.families.sesa.protocol.SesaClient` runs when
it builds its offline evaluations (and its own evaluation at decode); re-exported by
:mod:`flwr_fsl.families.sesa.protocol`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.crypto.ring import PrimeField
from flwr_fsl.kernels import gpu as _gpu
from flwr_fsl.kernels.field import mask_evaluations_mod

__all__ = ["mask_evaluations", "selector_evaluations"]


def selector_evaluations(
    field: PrimeField,
    basis: NDArray[np.uint64],
    chosen: Sequence[int],
    u: NDArray[np.uint64],
) -> NDArray[np.uint64]:
    """``ϕ_k(α_j)`` for every slot ``k`` and evaluation point ``j`` (eq. 21).

    Parameters
    ----------
    field : PrimeField
        ``F_p``.
    basis : numpy.ndarray
        ``(J, K+T)``: ``basis[j, n] = L_n(α_j)`` (:func:`~flwr_fsl.crypto.sharing.lagrange_matrix`
        through ``β``).
    chosen : sequence of int
        The shard ``s_k`` of each slot (0-based, ``< K``).
    u : numpy.ndarray
        ``(K_i, T)`` uniform coefficients ``u_{k, K+1..K+T}``.

    Returns
    -------
    numpy.ndarray
        ``(J, K_i)``: ``L_{s_k}(α_j) + Σ_n u_kn L_{K+n}(α_j)``.
    """
    t = u.shape[1]
    extra = np.ascontiguousarray(basis[:, basis.shape[1] - t :])
    return field.add(basis[:, list(chosen)], field.matmul(extra, np.ascontiguousarray(u.T)))


def mask_evaluations(
    field: PrimeField,
    basis: NDArray[np.uint64],
    chosen: Sequence[int],
    r: NDArray[np.uint64],
    v: NDArray[np.uint64],
) -> NDArray[np.uint64]:
    """``φ_k(α_j)`` for every slot ``k`` and point ``j`` (eq. 22), one fused field product.

    Per slot, the ``(J × (T+1)) @ ((T+1) × d)`` product of ``[L_{K+n}(α_j) | L_{s_k}(α_j)]``
    with ``[v_k; r_k]``, computed by the numba kernel
    :func:`~flwr_fsl.kernels.field.mask_evaluations_mod` in one pass (no broadcast
    ``(J, K_i, d)`` temporaries), or, where the matmul device is a GPU
    (:func:`~flwr_fsl.kernels.gpu.offload_device`), one exact limb GEMM per slot there.

    Parameters
    ----------
    field : PrimeField
        ``F_p``.
    basis : numpy.ndarray
        ``(J, K+T)`` Lagrange basis values at the points.
    chosen : sequence of int
        The shard of each slot.
    r : numpy.ndarray
        ``(K_i, d)`` masks.
    v : numpy.ndarray
        ``(T, K_i, d)`` uniform vectors at the extra points.

    Returns
    -------
    numpy.ndarray
        ``(J, K_i, d)``: ``r_k L_{s_k}(α_j) + Σ_n v_kn L_{K+n}(α_j)``.
    """
    t, slots, d = v.shape
    extra = np.ascontiguousarray(basis[:, basis.shape[1] - t :], dtype=np.uint64)
    sel = np.ascontiguousarray(basis[:, list(chosen)], dtype=np.uint64)
    out = np.empty((basis.shape[0], slots, d), dtype=np.uint64)
    device = _gpu.offload_device(basis.shape[0], t + 1, d, slots)
    if device is not None:  # per slot [extra | sel_k] @ [v_k; r_k] on the GPU, the same words
        for k in range(slots):
            out[:, k] = _gpu.field_limb_matmul(
                np.hstack([extra, sel[:, k : k + 1]]),
                np.vstack([v[:, k], r[k : k + 1]]),
                field.p,
                device,
            )
        return out
    p = np.uint64(field.p)
    mask_evaluations_mod(
        extra,
        sel,
        np.ascontiguousarray(v, dtype=np.uint64),
        np.ascontiguousarray(r, dtype=np.uint64),
        p,
        np.uint64((1 << 64) % field.p),
        out,
    )
    return out
