"""The model and data of the quickstart app (small synthetic data: no download in tests)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class Net(nn.Module):
    """A small MLP with an embedding-like first layer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(20, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def load_data(partition_id: int, num_partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return this partition's slice of a fixed synthetic 3-class problem."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60 * num_partitions, 20)).astype(np.float32)
    y = (x[:, :3].argmax(axis=1)).astype(np.int64)
    part = slice(60 * partition_id, 60 * (partition_id + 1))
    return torch.from_numpy(x[part]), torch.from_numpy(y[part])


def train(net: Net, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float) -> float:
    """Train with SGD; return the last loss."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
    return float(loss)


def test(net: Net, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Return loss and accuracy."""
    with torch.no_grad():
        out = net(x)
        loss = float(nn.functional.cross_entropy(out, y))
        acc = float((out.argmax(dim=1) == y).float().mean())
    return loss, acc
