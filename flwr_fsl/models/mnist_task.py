"""The MNIST task of the quickstart-shaped examples: model, a node's data, training, evaluation.

Shared by ``examples/topk-mnist`` and ``examples/secagg-mnist`` (each ``task.py`` re-exports
it, so their ``client_app.py`` and ``server_app.py`` keep Flower's quickstart shape):
:data:`Net` is :class:`~flwr_fsl.models.MnistCNN`; :func:`load_data` reads a node's partition
from its node config and the run config's ``partitioning``, ``dirichlet-alpha``, ``seed`` and
``max-client-samples``; :func:`train` and :func:`test` are the seeded loops of
:mod:`flwr_fsl.models.cnn`. Flower-free: ``load_data`` takes anything with a ``node_config`` and
a ``run_config`` (a Flower ``Context``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.data import MnistClientSplit, mnist_client_split, mnist_test_split

from .cnn import MnistCNN, evaluate, train_one

__all__ = ["Net", "load_data", "load_test_data", "test", "train"]

Net = MnistCNN


class NodeContext(Protocol):
    """What :func:`load_data` reads of a Flower ``Context``."""

    @property
    def node_config(self) -> Mapping[str, Any]:
        """The node's config (``partition-id``, ``num-partitions``)."""
        ...

    @property
    def run_config(self) -> Mapping[str, Any]:
        """The run config."""
        ...


def load_data(context: NodeContext) -> MnistClientSplit:
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
