"""The model and data of the index-mode app: item and genre embeddings plus an MLP.

Small synthetic ratings (no download in tests): each user rates a few of ``ITEMS`` items; an
item's genres come from the public map :data:`GENRES`.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Context
from torch import nn

from flwr_fsl.submodel import RowMap

ITEMS, NUM_GENRES, WIDTH = 80, 19, 8


def item_genres(item: int) -> list[int]:
    """An item's genres (public): one or two of the ``NUM_GENRES``."""
    return [item % NUM_GENRES, (3 * item + 1) % NUM_GENRES][: 1 + item % 2]


GENRES = RowMap.from_lists([item_genres(i) for i in range(ITEMS)])


class Net(nn.Module):
    """A rating model: the item's embedding and its genres' mean embedding, then an MLP."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.get_rng_state()
        torch.manual_seed(0)  # every party starts from the same model
        self.item_emb = nn.Embedding(ITEMS, WIDTH)
        self.genre_emb = nn.EmbeddingBag(NUM_GENRES, WIDTH, mode="mean")
        self.mlp = nn.Linear(2 * WIDTH, 1)
        torch.set_rng_state(generator)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        indptr = torch.tensor(GENRES.indptr)
        genres = torch.tensor(GENRES.indices)
        bags = [genres[indptr[i] : indptr[i + 1]] for i in items.tolist()]
        offsets = torch.tensor([0, *np.cumsum([len(b) for b in bags])[:-1].tolist()])
        features = torch.cat([self.item_emb(items), self.genre_emb(torch.cat(bags), offsets)], 1)
        return self.mlp(features).squeeze(1)


def load_data(partition_id: int, num_partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return this user's rated items and ratings (fixed synthetic data)."""
    rng = np.random.default_rng([0, partition_id, num_partitions])
    items = np.sort(rng.choice(ITEMS, 6, replace=False))
    ratings = rng.uniform(1, 5, size=items.size).astype(np.float32)
    return torch.from_numpy(items.astype(np.int64)), torch.from_numpy(ratings)


def my_item_ids(context: Context) -> np.ndarray:
    """This user's private rows of the item table: the items it rated."""
    items, _ = load_data(context.node_config["partition-id"], context.node_config["num-partitions"])
    return items.numpy()


def train(net: Net, items: torch.Tensor, ratings: torch.Tensor, epochs: int, lr: float) -> float:
    """Train with SGD on the user's ratings; return the last loss."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    loss = torch.tensor(0.0)
    for _ in range(epochs):
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(items), ratings)
        loss.backward()
        opt.step()
    return loss.item()
