"""A DIN-like click-through-rate model (Zhou et al., KDD 2018) for MovieLens-100k, in torch.

The model of Cui et al. §7 and Niu et al. §VI at CPU scale: two embedding tables and dense
layers on top.

- ``item_emb.weight`` (:data:`ITEM_TABLE`, ``num_items x dim``) and ``genre_emb.weight``
  (:data:`GENRE_TABLE`, ``num_genres x dim``). An item's representation is its embedding
  beside the mean of its genres' embeddings (``2 dim``; MovieLens movies have 1 to 6 genres).
- A user's history (its ``hist_len`` newest liked items before the sample,
  :func:`flwr_fsl.data.ctr_samples`) is pooled by DIN's **activation unit**: a small MLP on
  ``[h, t, h - t, h * t]`` gives each history item ``h`` a weight against the target ``t``, and
  the pooled vector is the weighted sum (DIN's un-normalised weights, padding masked out).
  ``pooling="mean"`` replaces it by the mean of the history (no attention weights).
- An MLP on ``[pooled, t, pooled * t]`` gives the click logit.

**As a submodel.** :data:`ITEM_TABLE` is the primary table: a client's rows are its training
items (:attr:`flwr_fsl.data.UserCTR.rows`). :data:`GENRE_TABLE` is derived: its rows are the
genres of those items, through the public item -> genre map (:func:`genre_rows`; the
``recsys-movielens`` app states it as a :class:`flwr_fsl.submodel.tables.ModelTables`, which a
utility module may not import). Every other
tensor (attention and MLP weights) is dense. Training is Adam with fresh state each call and no
weight decay: a row whose gradient is zero in every step keeps its value bit for bit, so a
client changes only the rows of its items and their genres and row-sparse uploads lose
nothing.

Weights travel as a ``{name: numpy array}`` dict (``ArrayRecord(model.state_dict())`` names);
:func:`train_samples` trains a copy, :func:`predict` scores samples and :func:`auc` is the
area under the ROC curve (ties counted one half).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.data import CTRSamples

__all__ = [
    "GENRE_TABLE",
    "ITEM_TABLE",
    "DINConfig",
    "DINModel",
    "auc",
    "genre_rows",
    "initial_arrays",
    "predict",
    "train_samples",
]

ITEM_TABLE = "item_emb.weight"
"""The primary table: one row per item."""
GENRE_TABLE = "genre_emb.weight"
"""The derived table: one row per genre (category)."""


@dataclass(frozen=True)
class DINConfig:
    """The model's shape.

    Attributes
    ----------
    num_items, num_genres : int
        Rows of the two tables.
    genre_indptr, genre_indices : numpy.ndarray
        The public item -> genre map (CSR: item ``i`` has genres
        ``genre_indices[genre_indptr[i]:genre_indptr[i+1]]``).
    dim : int
        Embedding size of both tables.
    att_hidden, mlp_hidden : int
        Hidden units of the activation unit and of the output MLP.
    pooling : str
        ``"attention"`` (DIN) or ``"mean"``.

    Raises
    ------
    ConfigurationError
        If a size is < 1, the map does not fit the tables, or ``pooling`` is unknown.
    """

    num_items: int
    num_genres: int
    genre_indptr: NDArray[np.int64]
    genre_indices: NDArray[np.int64]
    dim: int = 8
    att_hidden: int = 16
    mlp_hidden: int = 32
    pooling: str = "attention"

    def __post_init__(self) -> None:
        sizes = {
            "num_items": self.num_items,
            "num_genres": self.num_genres,
            "dim": self.dim,
            "att_hidden": self.att_hidden,
            "mlp_hidden": self.mlp_hidden,
        }
        for key, value in sizes.items():
            if value < 1:
                raise ConfigurationError(f"{key} must be >= 1, got {value}")
        if self.pooling not in ("attention", "mean"):
            raise ConfigurationError(f"pooling must be 'attention' or 'mean', got {self.pooling!r}")
        indptr, indices = self.genre_indptr, self.genre_indices
        if (
            indptr.shape != (self.num_items + 1,)
            or indptr[0] != 0
            or np.any(np.diff(indptr) < 0)
            or indptr[-1] != indices.size
            or (indices.size and not 0 <= indices.min() <= indices.max() < self.num_genres)
        ):
            raise ConfigurationError("genre_indptr/genre_indices are not a CSR item -> genre map")


class DINModel(nn.Module):
    """The DIN-like CTR model (see the module docstring).

    Parameters
    ----------
    config : DINConfig
        The shape and the item -> genre map (kept as non-persistent buffers: the map is
        public task data, not a weight, and never enters ``state_dict``).
    """

    def __init__(self, config: DINConfig) -> None:
        super().__init__()
        self.config = config
        d = config.dim
        self.item_emb = nn.Embedding(config.num_items, d)
        self.genre_emb = nn.Embedding(config.num_genres, d)
        self.att = nn.Sequential(
            nn.Linear(8 * d, config.att_hidden), nn.ReLU(), nn.Linear(config.att_hidden, 1)
        )
        self.mlp = nn.Sequential(
            nn.Linear(6 * d, config.mlp_hidden), nn.ReLU(), nn.Linear(config.mlp_hidden, 1)
        )
        counts = np.diff(config.genre_indptr)
        width = max(1, int(counts.max(initial=1)))
        pad = np.zeros((config.num_items, width), np.int64)
        mask = np.zeros((config.num_items, width), np.float32)
        for i in range(config.num_items):
            genres = config.genre_indices[config.genre_indptr[i] : config.genre_indptr[i + 1]]
            pad[i, : genres.size] = genres
            mask[i, : genres.size] = 1.0 / max(1, genres.size)
        self.genre_pad: torch.Tensor
        self.genre_weight: torch.Tensor
        self.register_buffer("genre_pad", torch.from_numpy(pad), persistent=False)
        self.register_buffer("genre_weight", torch.from_numpy(mask), persistent=False)

    def represent(self, items: torch.Tensor) -> torch.Tensor:
        """Return ``[item embedding, mean genre embedding]`` of item ids (any shape, >= 0)."""
        genres = self.genre_emb(self.genre_pad[items])  # (..., width, d)
        mean = (genres * self.genre_weight[items].unsqueeze(-1)).sum(-2)
        return torch.cat([self.item_emb(items), mean], dim=-1)

    def forward(self, items: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        """Return click logits of ``items`` ``(n,)`` given ``history`` ``(n, L)`` (-1 = none)."""
        mask = (history >= 0).to(torch.float32).unsqueeze(-1)  # (n, L, 1)
        target = self.represent(items)  # (n, 2d)
        hist = self.represent(history.clamp(min=0)) * mask  # (n, L, 2d)
        if self.config.pooling == "attention":
            t = target.unsqueeze(1).expand_as(hist)
            weights = self.att(torch.cat([hist, t, hist - t, hist * t], dim=-1)) * mask
            pooled = (weights * hist).sum(1)
        else:
            pooled = hist.sum(1) / mask.sum(1).clamp(min=1.0)
        out: torch.Tensor = self.mlp(torch.cat([pooled, target, pooled * target], dim=-1))
        return out.squeeze(-1)


def _model(config: DINConfig, arrays: Mapping[str, NDArray[Any]]) -> DINModel:
    model = DINModel(config)
    state = {k: torch.from_numpy(np.array(v, np.float32, copy=True)) for k, v in arrays.items()}
    model.load_state_dict(state, strict=True)
    return model


def initial_arrays(config: DINConfig, seed: int, init_std: float = 0.1) -> dict[str, NDArray[Any]]:
    """Return the initial weights (torch's default layers, N(0, init_std) tables; seeded).

    Parameters
    ----------
    config : DINConfig
        The shape.
    seed : int
        Seed of the initialisation.
    init_std : float
        Standard deviation of both embedding tables.

    Returns
    -------
    dict[str, numpy.ndarray]
        ``state_dict`` names -> float32 arrays.
    """
    torch.manual_seed(seed)
    model = DINModel(config)
    with torch.no_grad():
        model.item_emb.weight.normal_(0.0, init_std)
        model.genre_emb.weight.normal_(0.0, init_std)
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def train_samples(
    config: DINConfig,
    arrays: Mapping[str, NDArray[Any]],
    samples: CTRSamples,
    *,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
) -> tuple[dict[str, NDArray[Any]], float]:
    """Train a copy of the model with SGD on binary cross-entropy; return it and the loss.

    Parameters
    ----------
    config : DINConfig
        The shape.
    arrays : Mapping[str, numpy.ndarray]
        The model received (not modified).
    samples : CTRSamples
        The client's training samples.
    epochs, lr, batch_size, seed
        Local epochs, SGD step size, mini-batch size and the shuffle seed.

    Returns
    -------
    tuple[dict[str, numpy.ndarray], float]
        The trained weights and the mean loss of the last epoch (0.0 without samples).

    Raises
    ------
    ConfigurationError
        If ``epochs``, ``batch_size`` < 1 or ``lr`` <= 0.
    """
    if epochs < 1 or batch_size < 1 or not lr > 0:
        raise ConfigurationError(
            f"epochs and batch_size must be >= 1 and lr > 0, got {epochs}, {batch_size}, {lr}"
        )
    model = _model(config, arrays)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()
    items = torch.from_numpy(samples.items)
    history = torch.from_numpy(samples.history)
    labels = torch.from_numpy(samples.labels)
    generator = torch.Generator().manual_seed(int(seed))
    last = 0.0
    for _ in range(epochs):
        total = 0.0
        order = torch.randperm(len(samples), generator=generator)
        for start in range(0, len(samples), batch_size):
            batch = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(items[batch], history[batch]), labels[batch])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(batch)
        last = total / max(1, len(samples))
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}, last


def predict(
    config: DINConfig, arrays: Mapping[str, NDArray[Any]], samples: CTRSamples
) -> NDArray[np.float64]:
    """Return the click probability of each sample."""
    model = _model(config, arrays)
    with torch.no_grad():
        logits = model(torch.from_numpy(samples.items), torch.from_numpy(samples.history))
    return torch.sigmoid(logits).numpy().astype(np.float64)


def auc(labels: NDArray[Any], scores: NDArray[Any]) -> float:
    """Return the area under the ROC curve (Mann-Whitney; tied scores count one half).

    Raises
    ------
    ConfigurationError
        If the shapes differ or one class is missing.
    """
    labels = np.asarray(labels) > 0.5
    scores = np.asarray(scores, np.float64)
    if labels.shape != scores.shape or labels.ndim != 1:
        raise ConfigurationError(f"labels {labels.shape} and scores {scores.shape} must be 1-D")
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if not positives or not negatives:
        raise ConfigurationError("AUC needs both positive and negative samples")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(scores.size, np.float64)
    sorted_scores = scores[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    mid = first + (counts - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(mid, counts)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def genre_rows(config: DINConfig, item_rows: NDArray[np.int64]) -> NDArray[np.int64]:
    """Return the sorted genre rows derived from item rows (the public map; many-to-many).

    The same rows as ``RowMap(config.genre_indptr, config.genre_indices).derive(item_rows)``
    (:mod:`flwr_fsl.submodel.tables`; the app's ``model_tables`` builds that spec).

    Raises
    ------
    ConfigurationError
        If an item row is out of range.
    """
    rows = np.asarray(item_rows, np.int64)
    if rows.size and not 0 <= rows.min() <= rows.max() < config.num_items:
        raise ConfigurationError(f"item rows must be in [0, {config.num_items})")
    parts = [
        config.genre_indices[config.genre_indptr[i] : config.genre_indptr[i + 1]] for i in rows
    ]
    return np.unique(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64)
