"""The MNIST task of the quickstart-shaped examples: model, a node's data, training, evaluation.

Shared by ``examples/topk-mnist`` and ``examples/secagg-mnist`` (each ``task.py`` re-exports
it, so their ``client_app.py`` and ``server_app.py`` keep Flower's quickstart shape):
:data:`Net` is :class:`~flwr_fsl.models.MnistCNN`; :func:`load_data` reads a node's partition
from its node config and the run config's ``partitioning``, ``dirichlet-alpha``, ``seed`` and
``max-client-samples``; :func:`train` and :func:`test` are the seeded loops of
:mod:`flwr_fsl.models.cnn`. :func:`task_settings` reads (and checks, naming the key) every
run-config key of the task, so a server app can refuse a bad one before round 1.
Flower-free: ``load_data`` takes anything with a ``node_config`` and a ``run_config`` (a
Flower ``Context``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.data import MnistClientSplit, mnist_client_split, mnist_test_split
from flwr_fsl.data.partition import SCHEMES
from flwr_fsl.run_config import config_value

from .cnn import MnistCNN, evaluate, train_one

__all__ = ["Net", "TaskSettings", "load_data", "load_test_data", "task_settings", "test", "train"]

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


@dataclass(frozen=True)
class TaskSettings:
    """The MNIST task's run-config keys (dashed in the run config), checked.

    Attributes
    ----------
    local_epochs, lr, batch_size : int, float, int
        Local training (``local-epochs`` >= 1, ``lr`` > 0, ``batch-size`` >= 1).
    partitioning : str
        ``"iid"`` or ``"dirichlet"``.
    dirichlet_alpha : float
        Dirichlet concentration (> 0).
    seed : int
        Data and training seed (>= 0).
    max_client_samples, test_size : int
        At most this many training samples per client / test images (0: all).
    """

    local_epochs: int = 1
    lr: float = 0.05
    batch_size: int = 32
    partitioning: str = "iid"
    dirichlet_alpha: float = 0.5
    seed: int = 42
    max_client_samples: int = 0
    test_size: int = 0


def task_settings(run_config: Mapping[str, Any]) -> TaskSettings:
    """Read the task's keys from ``run_config`` (defaults for absent ones).

    Raises
    ------
    ConfigurationError
        If a key has the wrong type or range (the message names the key).
    """
    cfg = run_config
    return TaskSettings(
        local_epochs=config_value(cfg, "local-epochs", 1, low=1),
        lr=config_value(cfg, "lr", 0.05, low=0.0, low_open=True),
        batch_size=config_value(cfg, "batch-size", 32, low=1),
        partitioning=config_value(cfg, "partitioning", "iid", choices=SCHEMES),
        dirichlet_alpha=config_value(cfg, "dirichlet-alpha", 0.5, low=0.0, low_open=True),
        seed=config_value(cfg, "seed", 42, low=0),
        max_client_samples=config_value(cfg, "max-client-samples", 0, low=0),
        test_size=config_value(cfg, "test-size", 0, low=0),
    )


def load_data(context: NodeContext) -> MnistClientSplit:
    """Return this node's ``(x_train, y_train, x_val, y_val)`` (partition from its node config).

    Raises
    ------
    ConfigurationError
        If a task key of the run config is bad (:func:`task_settings`).
    """
    task = task_settings(context.run_config)
    return mnist_client_split(
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
        partitioning=task.partitioning,
        alpha=task.dirichlet_alpha,
        seed=task.seed,
        max_samples=task.max_client_samples,
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
