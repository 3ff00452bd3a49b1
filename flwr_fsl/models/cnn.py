"""A small MNIST CNN with plain, seeded training and evaluation loops.

The network (two 5x5 conv layers 1->16->32 with 2x2 max-pooling, then a linear layer to the
10 classes; about 18k parameters) is sized so that a 100-client, 50-round federated
benchmark runs in minutes on two CPU cores and still reaches ~98-99% test accuracy.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional as F

from flwr_fsl.core.errors import ConfigurationError


def set_torch_threads(num_threads: int = 1) -> None:
    """Limit torch's intra-op threads (clients share few cores in simulation).

    Parameters
    ----------
    num_threads : int
        Number of threads, >= 1.

    Raises
    ------
    ConfigurationError
        If ``num_threads < 1``.
    """
    if num_threads < 1:
        raise ConfigurationError(f"num_threads must be >= 1, got {num_threads}")
    if torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)


class MnistCNN(nn.Module):
    """Two conv layers and a linear classifier for 28x28 gray images.

    Parameters
    ----------
    channels : tuple[int, int]
        Output channels of the two 5x5 conv layers.
    num_classes : int
        Number of output classes.
    """

    def __init__(self, channels: tuple[int, int] = (16, 32), num_classes: int = 10) -> None:
        super().__init__()
        c1, c2 = channels
        if c1 < 1 or c2 < 1 or num_classes < 2:
            raise ConfigurationError(f"invalid channels {channels} / num_classes {num_classes}")
        self.conv1 = nn.Conv2d(1, c1, kernel_size=5)
        self.conv2 = nn.Conv2d(c1, c2, kernel_size=5)
        self.fc = nn.Linear(c2 * 4 * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return class logits.

        Parameters
        ----------
        x : torch.Tensor
            Images of shape ``(N, 28, 28)``, ``(N, 1, 28, 28)`` or ``(N, 784)``.

        Returns
        -------
        torch.Tensor
            Logits of shape ``(N, num_classes)``.
        """
        x = x.reshape(-1, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(x, 1))


def _to_tensor(array: NDArray, dtype: torch.dtype) -> torch.Tensor:
    """Wrap ``array`` as a tensor, copying read-only arrays (torch needs writable memory)."""
    a = np.asarray(array)
    if not a.flags.writeable:
        a = a.copy()
    return torch.as_tensor(a, dtype=dtype)


def _check_xy(x: NDArray, y: NDArray) -> None:
    if len(x) != len(y):
        raise ConfigurationError(f"x and y must have the same length, got {len(x)} and {len(y)}")
    if len(x) == 0:
        raise ConfigurationError("x and y must not be empty")


def train_one(
    model: nn.Module,
    x: NDArray,
    y: NDArray,
    epochs: int = 1,
    lr: float = 0.05,
    batch_size: int = 32,
    seed: int = 0,
    momentum: float = 0.0,
) -> float:
    """Train ``model`` in place with SGD on one client's data.

    Parameters
    ----------
    model : nn.Module
        The model (trained in place, on CPU).
    x : NDArray
        Float32 inputs, first axis the samples.
    y : NDArray
        Int64 labels.
    epochs : int
        Passes over the data, >= 1.
    lr : float
        Learning rate, > 0.
    batch_size : int
        Mini-batch size, >= 1.
    seed : int
        Seed of the shuffling, so a client's round is reproducible.
    momentum : float
        SGD momentum in ``[0, 1)`` (the optimizer is fresh every call).

    Returns
    -------
    float
        Mean training loss over the last epoch.

    Raises
    ------
    ConfigurationError
        If an argument is out of range or ``x``/``y`` do not match.
    """
    _check_xy(x, y)
    if epochs < 1 or batch_size < 1 or not lr > 0 or not 0 <= momentum < 1:
        raise ConfigurationError(
            f"need epochs >= 1, batch_size >= 1, lr > 0, 0 <= momentum < 1; got "
            f"epochs={epochs}, batch_size={batch_size}, lr={lr}, momentum={momentum}"
        )
    xt = _to_tensor(x, torch.float32)
    yt = _to_tensor(y, torch.long)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    model.train()
    n = len(xt)
    last = 0.0
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        total, count = 0.0, 0
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        last = total / count
    return last


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: NDArray,
    y: NDArray,
    batch_size: int = 1000,
) -> tuple[float, float]:
    """Return ``(mean cross-entropy loss, accuracy)`` of ``model`` on ``(x, y)``.

    Parameters
    ----------
    model : nn.Module
        The model (on CPU).
    x : NDArray
        Float32 inputs.
    y : NDArray
        Int64 labels.
    batch_size : int
        Evaluation batch size, >= 1.

    Returns
    -------
    tuple[float, float]
        Loss and accuracy in ``[0, 1]``.

    Raises
    ------
    ConfigurationError
        If ``x``/``y`` do not match or are empty.
    """
    _check_xy(x, y)
    if batch_size < 1:
        raise ConfigurationError(f"batch_size must be >= 1, got {batch_size}")
    model.eval()
    xt = _to_tensor(x, torch.float32)
    yt = _to_tensor(y, torch.long)
    loss_sum, correct = 0.0, 0
    for start in range(0, len(xt), batch_size):
        logits = model(xt[start : start + batch_size])
        target = yt[start : start + batch_size]
        loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(dim=1) == target).sum())
    return loss_sum / len(xt), correct / len(xt)
