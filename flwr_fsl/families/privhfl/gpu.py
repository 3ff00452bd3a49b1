r"""Ring matmul in ``Z_2^64`` on a GPU for PrivHFL's secret-shared linear layers (optional).

Π_Matmul's products (:mod:`flwr_fsl.families.privhfl.ops`: ``P([x]_0 + F) M`` at ``A``,
``P(b) E`` at ``S``, ``P(b) a`` at ``Q``) are ``(P x K) @ (K x O)`` in ``Z_2^64``. torch has no
``uint64`` matmul on CUDA, so :func:`limb_matmul` splits each operand into four exact 16-bit
limbs (as CryptGPU and PrivHFL App. C.6 do) and multiplies them with float64 GEMMs: the
product mod ``2^64`` needs only the limb pairs ``(i, j)`` with ``i + j <= 3``, grouped by
``s = i + j`` into four sums ``G_s = sum_{i+j=s} A_i B_j``. Every entry of ``A_i B_j`` is an
integer below ``K 2^32``, so ``G_s < 4 K 2^32 < 2^53`` while ``K < 2^19``
(:data:`MAX_INNER`): every partial sum is an integer float64 represents exactly, in any
summation order. Then ``a @ b = sum_s G_s 2^(16 s) mod 2^64``, combined on the host in
``uint64`` (wrapping) arithmetic. The result is bit-identical to the CPU kernel
(:func:`flwr_fsl.kernels.ring.matmul_wrap`); ``tests/families/privhfl/test_gpu.py`` checks
it on the CPU with full-range operands.

:func:`ring_matmul` is what the ops call: the CPU kernel, or :func:`limb_matmul` on the GPU
for products of at least :data:`GPU_MIN_MACS` multiply-adds when the matmul device is CUDA.
The device is a process-wide setting (:func:`set_matmul_device`): ``"auto"`` (default: CUDA
when torch is installed and ``torch.cuda.is_available()``, decided at the first large
product), ``"cpu"``, or ``"cuda[:N]"`` (refused with a
:class:`~flwr_fsl.core.errors.ConfigurationError` where there is no such GPU). torch is
imported only when a GPU is asked for or ``"auto"`` meets a large product: the protocol
itself is numpy only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
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
LIMB_BITS = 16
MAX_INNER = 1 << 19  # G_s < 4 K 2^32 < 2^53: every float64 partial sum is exact
GPU_MIN_MACS = 1 << 22  # smaller products stay on the CPU (transfers cost more)


class _Setting:
    """The process-wide matmul device: the setting and, once decided, the torch device."""

    def __init__(self) -> None:
        self.setting = "auto"
        self.device: Any = None  # torch.device, "cpu" (decided: CPU kernel) or None (undecided)


_STATE = _Setting()


def set_matmul_device(device: str = "auto") -> None:
    """Choose where :func:`ring_matmul` runs large products: ``auto``, ``cpu`` or ``cuda[:N]``.

    Parameters
    ----------
    device : str
        ``"auto"`` (CUDA when available, decided at the first large product), ``"cpu"`` (the
        numba kernel always), ``"cuda"`` / ``"cuda:N"`` (checked now).

    Raises
    ------
    ConfigurationError
        If the value is unknown, or a GPU is named and torch or CUDA is missing.
    """
    if not isinstance(device, str):
        raise ConfigurationError(f"matmul device must be 'auto', 'cpu' or 'cuda[:N]': {device!r}")
    name = device.strip().lower()
    if name in ("auto", "cpu"):
        _STATE.setting, _STATE.device = name, ("cpu" if name == "cpu" else None)
        return
    kind, _, index = name.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ConfigurationError(f"matmul device must be 'auto', 'cpu' or 'cuda[:N]': {device!r}")
    try:
        from flwr_fsl.models.privhfl import resolve_device
    except ImportError as err:  # pragma: no cover - torch missing
        raise ConfigurationError(f"matmul device {device!r} needs torch") from err
    _STATE.setting, _STATE.device = name, resolve_device(name)


def matmul_device() -> str:
    """Return where large products run now: ``"cpu"`` or the CUDA device's name."""
    return str(_decide())


def _decide() -> Any:
    if _STATE.device is None:  # "auto", first time
        try:
            import torch
        except ImportError:  # pragma: no cover - torch missing
            _STATE.device = "cpu"
        else:
            _STATE.device = torch.device("cuda") if torch.cuda.is_available() else "cpu"
    return _STATE.device


def limb_matmul(a: NDArray[np.uint64], b: NDArray[np.uint64], device: Any) -> NDArray[np.uint64]:
    """Return ``a @ b mod 2^64`` from float64 GEMMs of 16-bit limbs on a torch ``device``.

    Parameters
    ----------
    a, b : numpy.ndarray
        ``uint64`` matrices ``(P, K)`` and ``(K, O)``, ``K < 2^19`` (:data:`MAX_INNER`).
    device : torch.device or str
        Where the GEMMs run (``"cpu"`` works too: the tests prove exactness there).

    Returns
    -------
    numpy.ndarray
        ``(P, O)`` ``uint64``, bit-identical to :func:`flwr_fsl.kernels.ring.matmul_wrap`.

    Raises
    ------
    ConfigurationError
        If the operands are not ``uint64`` matrices of matching inner size, or ``K`` is too
        large for exact float64 sums.
    """
    import torch

    if (
        not isinstance(a, np.ndarray)
        or not isinstance(b, np.ndarray)
        or a.dtype != _U64
        or b.dtype != _U64
        or a.ndim != 2
        or b.ndim != 2
        or a.shape[1] != b.shape[0]
    ):
        raise ConfigurationError("limb_matmul needs uint64 matrices (P, K) @ (K, O)")
    if a.shape[1] >= MAX_INNER:
        raise ConfigurationError(f"limb_matmul is exact for K < {MAX_INNER}, got {a.shape[1]}")
    mask = (1 << LIMB_BITS) - 1

    def limbs(m: NDArray[np.uint64]) -> list[Any]:
        host = np.ascontiguousarray(m).view(np.int64)
        if not host.flags.writeable:  # a received message's read-only view: torch needs a copy
            host = host.copy()
        t = torch.from_numpy(host).to(device)
        # arithmetic >> then the mask: the limb's 16 bits whatever the sign extension
        return [((t >> (LIMB_BITS * i)) & mask).to(torch.float64) for i in range(4)]

    la, lb = limbs(a), limbs(b)
    out = np.zeros((a.shape[0], b.shape[1]), dtype=_U64)
    for s in range(4):  # limb pairs of total shift 16 s (larger shifts vanish mod 2^64)
        g = la[0] @ lb[s]
        for i in range(1, s + 1):
            g += la[i] @ lb[s - i]
        exact = g.to(torch.int64).cpu().numpy().view(_U64)  # < 2^53: exact integers
        out += exact << _U64(LIMB_BITS * s)  # wraps mod 2^64
    return out


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
    macs = p * k * int(b.shape[1])
    if (
        _STATE.setting != "cpu"
        and macs >= GPU_MIN_MACS
        and k < MAX_INNER
        and a.dtype == _U64
        and b.dtype == _U64
    ):
        device = _decide()
        if device != "cpu":
            return limb_matmul(a, b, device)
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
