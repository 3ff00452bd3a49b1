"""secagg-mnist: the model, the data of a partition, training and evaluation."""

from __future__ import annotations

import numpy as np
from flwr.app import Context
from numpy.typing import NDArray

from flwr_fsl.data import MnistClientSplit, mnist_client_split, mnist_test_split
from flwr_fsl.models import MnistCNN, evaluate, set_torch_threads, train_one

Net = MnistCNN

# Clients share few cores in simulation: one torch thread per ClientApp.
set_torch_threads(1)


def load_data(context: Context) -> MnistClientSplit:
    """Return this node's ``(x_train, y_train, x_val, y_val)`` (partition from its node config)."""
    return mnist_client_split(
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
        partitioning=str(context.run_config.get("partitioning", "iid")),
        alpha=float(context.run_config.get("dirichlet-alpha", 0.5)),
        seed=int(context.run_config.get("seed", 42)),
        max_samples=int(context.run_config.get("max-client-samples", 0)),
    )


def load_test_data(size: int = 0) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Return the MNIST test set (its first ``size`` images if ``size > 0``)."""
    return mnist_test_split(size)


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
