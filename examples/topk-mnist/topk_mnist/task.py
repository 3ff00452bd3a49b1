"""topk-mnist: the model, the data of a partition, training and evaluation."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.data import load_mnist, partition_indices
from flwr_fsl.models import MnistCNN, evaluate, set_torch_threads, train_one

Net = MnistCNN

# Clients share few cores in simulation: one torch thread per ClientApp.
set_torch_threads(1)


@lru_cache(maxsize=16)
def load_data(
    partition_id: int,
    num_partitions: int,
    partitioning: str = "iid",
    alpha: float = 0.5,
    seed: int = 42,
) -> tuple[NDArray[np.float32], NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]:
    """Return ``(x_train, y_train, x_val, y_val)`` of one client: its partition, 80/20."""
    x, y, _, _ = load_mnist()
    parts = _partitions(num_partitions, partitioning, alpha, seed)
    idx = np.random.default_rng(seed + partition_id).permutation(parts[partition_id])
    cut = int(0.8 * len(idx))
    return x[idx[:cut]], y[idx[:cut]], x[idx[cut:]], y[idx[cut:]]


@lru_cache(maxsize=4)
def _partitions(
    num_partitions: int, partitioning: str, alpha: float, seed: int
) -> list[NDArray[np.int64]]:
    _, y, _, _ = load_mnist()
    return partition_indices(y, num_partitions, scheme=partitioning, alpha=alpha, seed=seed)  # type: ignore[arg-type]


def load_test_data(size: int = 0) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Return the MNIST test set (its first ``size`` images if ``size > 0``)."""
    _, _, x_test, y_test = load_mnist()
    if size > 0:
        return x_test[:size], y_test[:size]
    return x_test, y_test


def train(
    net: MnistCNN,
    x: NDArray[np.float32],
    y: NDArray[np.int64],
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
) -> float:
    """Train the model on the client's data; return the mean loss of the last epoch."""
    return train_one(net, x, y, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)


def test(net: MnistCNN, x: NDArray[np.float32], y: NDArray[np.int64]) -> tuple[float, float]:
    """Return ``(loss, accuracy)`` of the model on ``(x, y)``."""
    return evaluate(net, x, y)
