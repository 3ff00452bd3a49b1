r"""Ring matmul in ``Z_2^64`` on a GPU for PrivHFL's secret-shared linear layers (optional).

Π_Matmul's products (:mod:`flwr_fsl.families.privhfl.ops`: ``P([x]_0 + F) M`` at ``A``,
``P(b) E`` at ``S``, ``P(b) a`` at ``Q``) are ``(P x K) @ (K x O)`` in ``Z_2^64``.
:func:`ring_matmul` is what the ops call: the numba kernel, or
:func:`~flwr_fsl.kernels.gpu.limb_matmul` (four exact 16-bit limbs in float64 GEMMs,
bit-identical: ``tests/families/privhfl/test_gpu.py``) on the GPU for products of at least
:data:`~flwr_fsl.kernels.gpu.GPU_MIN_MACS` multiply-adds when the process-wide matmul device
(:func:`set_matmul_device`, shared with the ``F_p`` products of SESA: :mod:`flwr_fsl.kernels.gpu`)
is CUDA. ``"auto"`` (default) is CUDA when there is one, decided at the first large product;
``"cpu"``; ``"cuda[:N]"`` is refused with a :class:`~flwr_fsl.core.errors.ConfigurationError`
where there is no such GPU. torch is imported only when a GPU is asked for or ``"auto"`` meets
a large product on a machine with a GPU: the protocol itself is numpy only.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.kernels import gpu as _gpu
from flwr_fsl.kernels.gpu import (
    GPU_MIN_MACS,
    MAX_INNER,
    limb_matmul,
    matmul_device,
    set_matmul_device,
)
from flwr_fsl.kernels.ring import matmul_wrap  # numba only: importable without cryptography

__all__ = [
    "GPU_MIN_MACS",
    "MAX_INNER",
    "cpu_matmul",
    "limb_matmul",
    "matmul_device",
    "ring_matmul",
    "set_matmul_device",
]

_U64 = np.uint64


def ring_matmul(a: NDArray[np.uint64], b: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """Return ``a @ b`` in ``Z_2^64``, on the GPU for large products when the device is CUDA.

    Parameters
    ----------
    a, b : numpy.ndarray
        ``uint64`` matrices ``(P, K)`` and ``(K, O)``.

    Returns
    -------
    numpy.ndarray
        ``(P, O)`` ``uint64`` (the same bits on either path).
    """
    p, k = a.shape
    if k < MAX_INNER and a.dtype == _U64 and b.dtype == _U64:
        device = _gpu.offload_device(p, k, int(b.shape[1]))
        if device is not None:
            return _gpu.limb_matmul(a, b, device)
    return cpu_matmul(a, b)


def cpu_matmul(a: NDArray[np.uint64], b: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """Return ``a @ b`` in ``Z_2^64`` with the numba kernel (what ``Z2_64.matmul`` runs)."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ConfigurationError(
            f"matmul needs (m, k) @ (k, n) matrices, got {a.shape} @ {b.shape}"
        )
    out = np.empty((a.shape[0], b.shape[1]), dtype=_U64)
    matmul_wrap(np.ascontiguousarray(a, dtype=_U64), np.ascontiguousarray(b, dtype=_U64), out)
    return out
