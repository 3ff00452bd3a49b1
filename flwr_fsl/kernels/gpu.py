r"""Exact ``Z_2^64`` and ``F_p`` matrix products on a GPU, from float64 GEMMs of 16-bit limbs.

torch has no exact 64-bit integer matmul on CUDA, so both products split their operands into
exact 16-bit limbs (as CryptGPU and PrivHFL App. C.6 do) and multiply the limbs with float64
GEMMs, whose every partial sum stays an integer below ``2^53`` and so is exact in any
summation order:

* :func:`limb_matmul`, ``Z_2^64`` (PrivHFL's secret-shared linear layers): four limbs per
  operand; the product mod ``2^64`` needs only the limb pairs ``(i, j)`` with ``i + j <= 3``,
  grouped by ``s = i + j`` into ``G_s = sum_{i+j=s} A_i B_j``. Every entry of ``A_i B_j`` is
  below ``K 2^32``, so ``G_s < 4 K 2^32 < 2^53`` while ``K < 2^19`` (:data:`MAX_INNER`).
  Then ``a @ b = sum_s G_s 2^(16 s) mod 2^64``, combined on the host in wrapping ``uint64``.
* :func:`field_limb_matmul`, ``F_p`` for ``p < 2^32`` (SESA's Lagrange coding and decoding,
  :class:`~flwr_fsl.crypto.ring.PrimeField`): canonical elements ``< 2^32`` have two limbs;
  ``G_0 = A_0 B_0``, ``G_1 = A_0 B_1 + A_1 B_0`` and ``G_2 = A_1 B_1`` are below
  ``2 K 2^32 < 2^53`` while ``K < 2^20`` (:data:`MAX_INNER_FIELD`). The GPU reduces each
  ``G_s`` mod ``p`` in ``int64`` and folds them by Horner's rule,
  ``((G_2 mod p) 2^16 + G_1) mod p``, then ``(that 2^16 + G_0) mod p``, every intermediate
  below ``2^54``: one ``int64`` array comes back.

Both are bit-identical to the numba kernels (:func:`flwr_fsl.kernels.ring.matmul_wrap`,
:func:`flwr_fsl.kernels.field.matmul_mod`); ``tests/crypto/test_gpu_limbs.py`` and
``tests/families/privhfl/test_gpu.py`` check that with torch's CPU GEMMs and worst-case limbs.

Where large products run is one process-wide setting (:func:`set_matmul_device`): ``"auto"``
(default: CUDA when this machine has an NVIDIA device node and torch sees a GPU, decided at the
first large product), ``"cpu"`` (the numba kernels always), or ``"cuda[:N]"`` (refused with a
:class:`~flwr_fsl.core.errors.ConfigurationError` where there is no such GPU).
:func:`offload_device` says, for one product, whether it goes to the GPU: only from
:data:`GPU_MIN_MACS` multiply-adds and :data:`MIN_INTENSITY` multiply-adds per word moved,
below which the transfers cost more than the kernel saves. torch
is imported only when a GPU is named or ``"auto"`` meets a large product on a machine with an
NVIDIA device node: the library itself needs no torch.
"""

from __future__ import annotations

import glob
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError

__all__ = [
    "GPU_MIN_MACS",
    "MAX_INNER",
    "MAX_INNER_FIELD",
    "MIN_INTENSITY",
    "field_limb_matmul",
    "limb_matmul",
    "matmul_device",
    "offload_device",
    "set_matmul_device",
]

_U64 = np.uint64
LIMB_BITS = 16
_LIMB_MASK = (1 << LIMB_BITS) - 1
MAX_INNER = 1 << 19  # Z_2^64: G_s < 4 K 2^32 < 2^53, every float64 partial sum exact
MAX_INNER_FIELD = 1 << 20  # F_p: G_1 < 2 K 2^32 < 2^53
GPU_MIN_MACS = 1 << 22  # smaller products stay on the CPU (transfers cost more)
MIN_INTENSITY = 20  # multiply-adds per word moved, below which the transfers dominate
_NVIDIA_NODES = "/dev/nvidia[0-9]*"


class _Setting:
    """The process-wide matmul device: the setting and, once decided, the torch device."""

    def __init__(self) -> None:
        self.setting = "auto"
        self.device: Any = None  # torch.device, "cpu" (decided: CPU kernel) or None (undecided)


_STATE = _Setting()


def set_matmul_device(device: str = "auto") -> None:
    """Choose where large ring and field products run: ``auto``, ``cpu`` or ``cuda[:N]``.

    Parameters
    ----------
    device : str
        ``"auto"`` (CUDA when available, decided at the first large product), ``"cpu"`` (the
        numba kernels always), ``"cuda"`` / ``"cuda:N"`` (checked now).

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
        # No NVIDIA device node, no CUDA: a CPU-only process need not import torch to learn it.
        if not glob.glob(_NVIDIA_NODES):
            _STATE.device = "cpu"
            return _STATE.device
        try:
            import torch
        except ImportError:  # pragma: no cover - torch missing
            _STATE.device = "cpu"
        else:
            _STATE.device = torch.device("cuda") if torch.cuda.is_available() else "cpu"
    return _STATE.device


def offload_device(m: int, k: int, n: int, products: int = 1) -> Any | None:
    """Return the torch device for ``products`` products ``(m, k) @ (k, n)``, or None for the CPU.

    A product goes to the GPU only when the setting allows one, it has at least
    :data:`GPU_MIN_MACS` multiply-adds, and at least :data:`MIN_INTENSITY` of them per word
    moved (``m k + k n + m n``): below that the transfers cost what the GPU saves (a
    vector-matrix product ran 1.1x, a ``(6144, 27) @ (27, 64)`` one 0.9x on an H200).

    Parameters
    ----------
    m, k, n : int
        The shapes ``(m, k) @ (k, n)``.
    products : int
        How many such products (one call per slot, say).

    Returns
    -------
    torch.device or None
        The GPU, or None where the numba kernel should run.
    """
    macs = products * m * k * n
    words = products * (m * k + k * n + m * n)
    if _STATE.setting == "cpu" or macs < GPU_MIN_MACS or macs < MIN_INTENSITY * words:
        return None
    device = _decide()
    return None if isinstance(device, str) and device == "cpu" else device


def _check_operands(a: Any, b: Any, what: str) -> None:
    if (
        not isinstance(a, np.ndarray)
        or not isinstance(b, np.ndarray)
        or a.dtype != _U64
        or b.dtype != _U64
        or a.ndim != 2
        or b.ndim != 2
        or a.shape[1] != b.shape[0]
    ):
        raise ConfigurationError(f"{what} needs uint64 matrices (P, K) @ (K, O)")


def _on_device(m: NDArray[np.uint64], device: Any) -> Any:
    """``m`` as an ``int64`` tensor on ``device`` (the same 64 bits)."""
    import torch

    host = np.ascontiguousarray(m).view(np.int64)
    if not host.flags.writeable:  # a received message's read-only view: torch needs a copy
        host = host.copy()
    return torch.from_numpy(host).to(device)


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

    _check_operands(a, b, "limb_matmul")
    if a.shape[1] >= MAX_INNER:
        raise ConfigurationError(f"limb_matmul is exact for K < {MAX_INNER}, got {a.shape[1]}")

    def limbs(m: NDArray[np.uint64]) -> list[Any]:
        t = _on_device(m, device)
        # arithmetic >> then the mask: the limb's 16 bits whatever the sign extension
        return [((t >> (LIMB_BITS * i)) & _LIMB_MASK).to(torch.float64) for i in range(4)]

    la, lb = limbs(a), limbs(b)
    out = np.zeros((a.shape[0], b.shape[1]), dtype=_U64)
    for s in range(4):  # limb pairs of total shift 16 s (larger shifts vanish mod 2^64)
        g = la[0] @ lb[s]
        for i in range(1, s + 1):
            g += la[i] @ lb[s - i]
        exact = g.to(torch.int64).cpu().numpy().view(_U64)  # < 2^53: exact integers
        out += exact << _U64(LIMB_BITS * s)  # wraps mod 2^64
    return out


def field_limb_matmul(
    a: NDArray[np.uint64], b: NDArray[np.uint64], p: int, device: Any
) -> NDArray[np.uint64]:
    """Return ``a @ b mod p`` (``p < 2^32``) from float64 GEMMs of 16-bit limbs on ``device``.

    Parameters
    ----------
    a, b : numpy.ndarray
        ``uint64`` matrices ``(P, K)`` and ``(K, O)`` of canonical elements ``< p``,
        ``K < 2^20`` (:data:`MAX_INNER_FIELD`).
    p : int
        The modulus, ``2 <= p < 2^32``.
    device : torch.device or str
        Where the GEMMs run (``"cpu"`` works too: the tests prove exactness there).

    Returns
    -------
    numpy.ndarray
        ``(P, O)`` ``uint64`` in ``[0, p)``, bit-identical to
        :func:`flwr_fsl.kernels.field.matmul_mod`.

    Raises
    ------
    ConfigurationError
        If the operands are not ``uint64`` matrices of matching inner size, ``K`` is too large
        for exact float64 sums, ``p`` is out of range, or an entry is not below ``p``.
    """
    import torch

    _check_operands(a, b, "field_limb_matmul")
    if isinstance(p, bool) or not isinstance(p, int) or not 2 <= p < 1 << 32:
        raise ConfigurationError(f"field_limb_matmul needs a modulus 2 <= p < 2^32, got {p!r}")
    if a.shape[1] >= MAX_INNER_FIELD:
        raise ConfigurationError(
            f"field_limb_matmul is exact for K < {MAX_INNER_FIELD}, got {a.shape[1]}"
        )
    ta, tb = _on_device(a, device), _on_device(b, device)
    # The limb bound needs entries < 2^32; the CPU kernel needs them canonical: refuse others.
    for t in (ta, tb):
        if t.numel() and bool(((t < 0) | (t >= p)).any()):
            raise ConfigurationError(f"field_limb_matmul needs canonical elements < p = {p}")
    a0, a1 = (ta & _LIMB_MASK).to(torch.float64), (ta >> LIMB_BITS).to(torch.float64)
    b0, b1 = (tb & _LIMB_MASK).to(torch.float64), (tb >> LIMB_BITS).to(torch.float64)
    del ta, tb
    acc = (a1 @ b1).to(torch.int64) % p  # G_2 mod p
    g1 = a0 @ b1
    g1 += a1 @ b0  # < 2 K 2^32 < 2^53: still exact
    acc = ((acc << LIMB_BITS) + g1.to(torch.int64)) % p  # < 2^48 + 2^53
    del g1
    acc = ((acc << LIMB_BITS) + (a0 @ b0).to(torch.int64)) % p
    return np.ascontiguousarray(acc.cpu().numpy().view(_U64))
