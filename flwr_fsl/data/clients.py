"""Per-client MNIST data for Flower apps: one partition, split into train and validation.

Every MNIST example and benchmark needs the same client glue: partition the 60,000 training
images among ``num_partitions`` clients with a flwr-datasets partitioner
(:func:`~flwr_fsl.data.partition_indices`), shuffle the client's partition with a seed, cut it
into train and validation parts, and optionally cap the sample count for quick runs::

    split = mnist_client_split(
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
        partitioning="iid",
        seed=42,
        max_samples=500,
    )
    train_one(model, split.x_train, split.y_train)

The result is deterministic for given arguments, so a client trains on the same data in
simulation, on the deployment engine and in an in-process test. Results are cached per
process and read-only (copy before modifying).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import NamedTuple, cast

import numpy as np
from numpy.typing import NDArray

from .mnist import load_mnist, mnist_path
from .partition import SCHEMES, Scheme, partition_indices

__all__ = ["MnistClientSplit", "mnist_client_split", "mnist_test_split"]


class MnistClientSplit(NamedTuple):
    """One client's MNIST data (a named tuple: ``x_train, y_train, x_val, y_val = split``).

    Attributes
    ----------
    x_train, y_train : numpy.ndarray
        Training images (float32, ``(n, 28, 28)`` in ``[0, 1)``) and int64 labels.
    x_val, y_val : numpy.ndarray
        Validation images and labels.
    """

    x_train: NDArray[np.float32]
    y_train: NDArray[np.int64]
    x_val: NDArray[np.float32]
    y_val: NDArray[np.int64]


@lru_cache(maxsize=4)
def _partitions(
    path: str, num_partitions: int, partitioning: str, alpha: float, seed: int
) -> tuple[NDArray[np.int64], ...]:
    """Partition the MNIST training labels once per process and setting."""
    _, y, _, _ = load_mnist(Path(path).parent)
    scheme = cast(Scheme, partitioning)  # checked against SCHEMES by the caller
    parts = partition_indices(y, num_partitions, scheme=scheme, alpha=alpha, seed=seed)
    for part in parts:
        part.setflags(write=False)
    return tuple(parts)


def mnist_client_split(
    partition_id: int,
    num_partitions: int,
    *,
    partitioning: str = "iid",
    alpha: float = 0.5,
    seed: int = 42,
    max_samples: int = 0,
    val_fraction: float = 0.2,
    root: Path | None = None,
) -> MnistClientSplit:
    """Return one client's MNIST train/validation data.

    The client's partition (from :func:`~flwr_fsl.data.partition_indices`) is shuffled with
    ``numpy.random.default_rng(seed + partition_id)``; its first ``1 - val_fraction`` part
    is for training, the rest for validation. With ``max_samples > 0`` the training part is
    cut to its first ``max_samples`` images and the validation part to
    ``max(1, max_samples // 4)``.

    Parameters
    ----------
    partition_id : int
        The client's partition, in ``[0, num_partitions)`` (a SuperNode's
        ``node_config["partition-id"]``).
    num_partitions : int
        Number of partitions (``node_config["num-partitions"]``), >= 1.
    partitioning : {"iid", "dirichlet"}
        Partitioner (see :func:`~flwr_fsl.data.partition_indices`).
    alpha : float
        Dirichlet concentration (``"dirichlet"`` only), > 0.
    seed : int
        Seed of the partitioning and of the client's shuffle.
    max_samples : int
        Cap on the training samples (0 = the whole training part), >= 0.
    val_fraction : float
        Share of the partition held out for validation, in ``[0, 1)``.
    root : Path | None
        The data cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    MnistClientSplit
        ``(x_train, y_train, x_val, y_val)``, cached per process and read-only.

    Raises
    ------
    ValueError
        If an argument is out of range or ``partitioning`` is unknown.
    DataNotPreparedError
        If MNIST has not been prepared (``python -m flwr_fsl.data prepare mnist``).
    """
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if not 0 <= partition_id < num_partitions:
        raise ValueError(
            f"partition_id must be in [0, {num_partitions}) (num_partitions), got {partition_id}"
        )
    if partitioning not in SCHEMES:
        raise ValueError(f"partitioning must be one of {SCHEMES}, got {partitioning!r}")
    if max_samples < 0:
        raise ValueError(f"max_samples must be >= 0, got {max_samples}")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    load_mnist(root)  # a clear DataNotPreparedError before anything is cached
    path = str(mnist_path(root).resolve())
    return _split(
        path,
        partition_id,
        num_partitions,
        partitioning,
        float(alpha),
        seed,
        max_samples,
        float(val_fraction),
    )


@lru_cache(maxsize=16)
def _split(
    path: str,
    partition_id: int,
    num_partitions: int,
    partitioning: str,
    alpha: float,
    seed: int,
    max_samples: int,
    val_fraction: float,
) -> MnistClientSplit:
    """Cut one client's split (cached: a node asks for it every round)."""
    x, y, _, _ = load_mnist(Path(path).parent)
    parts = _partitions(path, num_partitions, partitioning, alpha, seed)
    idx = np.random.default_rng(seed + partition_id).permutation(parts[partition_id])
    cut = int((1.0 - val_fraction) * len(idx))
    train_idx, val_idx = idx[:cut], idx[cut:]
    if max_samples > 0:
        train_idx, val_idx = train_idx[:max_samples], val_idx[: max(1, max_samples // 4)]
    split = MnistClientSplit(x[train_idx], y[train_idx], x[val_idx], y[val_idx])
    for array in split:
        array.setflags(write=False)
    return split


def mnist_test_split(
    size: int = 0, root: Path | None = None
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Return the MNIST test set for centralized evaluation.

    Parameters
    ----------
    size : int
        Use the first ``size`` test images (0 = all 10,000), >= 0.
    root : Path | None
        The data cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    tuple
        ``(x_test, y_test)``, read-only.

    Raises
    ------
    ValueError
        If ``size`` is negative.
    DataNotPreparedError
        If MNIST has not been prepared.
    """
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    _, _, x_test, y_test = load_mnist(root)
    if size > 0:
        return x_test[:size], y_test[:size]
    return x_test, y_test
