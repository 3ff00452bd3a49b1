"""Matrix factorisation on MovieLens-100k: a user's ratings and the model, one client per user.

Shared by ``examples/dpf-psr-movielens`` and ``examples/sfsl-movielens`` (each keeps its own
run settings). The recommender predicts user ``u``'s rating of item ``i`` as

    r_hat(u, i) = mu + b_u + b_i + p_u . q_i

with ``mu`` the global mean rating (a public constant from the run config), ``(p_u, b_u)`` the
user's **personal** parameters (kept in the client's ``Context.state``, never uploaded) and
``(q_i, b_i)`` the item's row of the **global** item table ``item_emb.weight`` (:data:`TABLE`,
``num_items x (dim + 1)``: the embedding and the bias side by side, so one row is one
mega-element of the secure protocols).

A client's submodel is a fixed set of rows: the items of its training ratings, cut to the
public bound ``max_rows`` by a seeded choice that does not change between rounds
(:func:`user_data`). It trains only on the ratings of those items.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple, Protocol

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.data import load_movielens

__all__ = [
    "TABLE",
    "MFSettings",
    "UserData",
    "initial_table",
    "initial_user",
    "mse",
    "num_items",
    "num_users",
    "predict",
    "train_user",
    "user_data",
]

TABLE = "item_emb.weight"
"""Name of the global item table in the model's ``ArrayRecord``."""


class MFSettings(Protocol):
    """What :func:`initial_table` and :func:`initial_user` read of an app's settings."""

    @property
    def dim(self) -> int:
        """Embedding size: the table has ``dim + 1`` columns (the item bias last)."""
        ...

    @property
    def init_std(self) -> float:
        """Standard deviation of the initial embeddings (biases start at 0)."""
        ...

    @property
    def seed(self) -> int:
        """Seed of the initial table and the users' initial parameters."""
        ...


class UserData(NamedTuple):
    """One user's ratings, split into training and held-out parts.

    Attributes
    ----------
    rows : numpy.ndarray
        The user's submodel: sorted item ids it trains (at most ``max_rows``), int64.
    train_items, train_ratings : numpy.ndarray
        Training ratings restricted to ``rows`` (int64 item ids, float32 ratings).
    test_items, test_ratings : numpy.ndarray
        Held-out ratings (any item: evaluation uses the full downloaded table).
    dropped : int
        Training ratings left out because their item is beyond ``max_rows``.
    """

    rows: NDArray[np.int64]
    train_items: NDArray[np.int64]
    train_ratings: NDArray[np.float32]
    test_items: NDArray[np.int64]
    test_ratings: NDArray[np.float32]
    dropped: int


@lru_cache(maxsize=1)
def _ratings_by_user() -> tuple[
    tuple[NDArray[np.int64], ...], tuple[NDArray[np.float32], ...], int
]:
    data = load_movielens()
    order = np.argsort(data.user_ids, kind="stable")
    cuts = np.cumsum(np.bincount(data.user_ids, minlength=data.num_users))[:-1]
    items = tuple(np.split(data.item_ids[order], cuts))
    ratings = tuple(np.split(data.ratings[order], cuts))
    return items, ratings, data.num_items


def num_items() -> int:
    """Return the number of MovieLens-100k items (rows of the item table)."""
    return _ratings_by_user()[2]


def num_users() -> int:
    """Return the number of MovieLens-100k users (the most clients a run can have)."""
    return len(_ratings_by_user()[0])


@lru_cache(maxsize=4096)
def user_data(user: int, max_rows: int, test_fraction: float = 0.2, seed: int = 42) -> UserData:
    """Return one user's train/held-out split and its fixed row set.

    The user's ratings are shuffled with ``numpy.random.default_rng([seed, user])``; the last
    ``test_fraction`` (at least one rating) are held out. If the training ratings touch more
    than ``max_rows`` items, a seeded choice of ``max_rows`` of them is the row set (the same
    every round) and the other training ratings are not used.

    Parameters
    ----------
    user : int
        Contiguous MovieLens user id (the client's ``partition-id``).
    max_rows : int
        Public bound on the row-set size, >= 1.
    test_fraction : float
        Share of the user's ratings held out, in ``(0, 1)``.
    seed : int
        Seed of the split and of the row choice.

    Returns
    -------
    UserData
        The user's data (arrays are read-only and cached per process).

    Raises
    ------
    ConfigurationError
        If ``user`` is not a MovieLens user or an argument is out of range.
    DataNotPreparedError
        If MovieLens has not been prepared (``python -m flwr_fsl.data prepare movielens``).
    """
    all_items, all_ratings, _ = _ratings_by_user()
    if not 0 <= user < len(all_items):
        raise ConfigurationError(f"user must be in [0, {len(all_items)}), got {user}")
    if max_rows < 1:
        raise ConfigurationError(f"max_rows must be >= 1, got {max_rows}")
    if not 0.0 < test_fraction < 1.0:
        raise ConfigurationError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng([seed, user])
    order = rng.permutation(len(all_items[user]))
    items, ratings = all_items[user][order], all_ratings[user][order]
    n_test = max(1, round(test_fraction * len(items)))
    train_items, train_ratings = items[:-n_test], ratings[:-n_test]
    rows = np.sort(train_items)  # a user rates an item at most once: unique already
    if rows.size > max_rows:
        rows = np.sort(rng.choice(rows, max_rows, replace=False))
    keep = np.isin(train_items, rows)
    out = UserData(
        rows=rows.astype(np.int64),
        train_items=train_items[keep].astype(np.int64),
        train_ratings=train_ratings[keep].astype(np.float32),
        test_items=items[-n_test:].astype(np.int64),
        test_ratings=ratings[-n_test:].astype(np.float32),
        dropped=int(np.count_nonzero(~keep)),
    )
    for array in out[:5]:
        array.setflags(write=False)
    return out


def initial_table(settings: MFSettings) -> NDArray[np.float32]:
    """Return the initial item table: N(0, init_std) embeddings, zero biases (seeded)."""
    rng = np.random.default_rng([settings.seed, 0])
    table = np.zeros((num_items(), settings.dim + 1), np.float32)
    table[:, : settings.dim] = rng.normal(0.0, settings.init_std, (num_items(), settings.dim))
    return table


def initial_user(settings: MFSettings, user: int) -> NDArray[np.float32]:
    """Return a user's initial personal parameters ``[p_u (dim), b_u]`` (seeded per user)."""
    rng = np.random.default_rng([settings.seed, 1, user])
    params = np.zeros(settings.dim + 1, np.float32)
    params[: settings.dim] = rng.normal(0.0, settings.init_std, settings.dim)
    return params


def predict(
    table: NDArray[np.float32], user: NDArray[np.float32], items: NDArray[np.int64], mean: float
) -> NDArray[np.float64]:
    """Return predicted ratings ``mu + b_u + b_i + p_u . q_i`` of one user for ``items``."""
    rows = table[items].astype(np.float64)
    u = user.astype(np.float64)
    return np.asarray(mean + u[-1] + rows[:, -1] + rows[:, :-1] @ u[:-1], np.float64)


def mse(
    table: NDArray[np.float32],
    user: NDArray[np.float32],
    items: NDArray[np.int64],
    ratings: NDArray[np.float32],
    mean: float,
) -> float:
    """Return the mean squared error of the predictions (predictions clipped to [1, 5])."""
    pred = np.clip(predict(table, user, items, mean), 1.0, 5.0)
    return float(np.mean((pred - ratings) ** 2))


def train_user(  # noqa: PLR0913
    table: NDArray[np.float32],
    user: NDArray[np.float32],
    items: NDArray[np.int64],
    ratings: NDArray[np.float32],
    *,
    mean: float,
    epochs: int,
    lr: float,
    reg: float,
    seed: int,
) -> tuple[NDArray[np.float32], NDArray[np.float32], float]:
    """Train item rows and the user's parameters with SGD on the user's ratings (Funk SVD).

    Per rating, in a seeded shuffled order each epoch, with ``e = r_hat - r``::

        q_i -= lr * (e * p_u + reg * q_i);   b_i -= lr * (e + reg * b_i)
        p_u -= lr * (e * q_i + reg * p_u);   b_u -= lr * (e + reg * b_u)

    Only the rows of ``items`` change.

    Parameters
    ----------
    table : numpy.ndarray
        Item table ``(num_items, dim + 1)`` (not modified; a trained copy is returned).
    user : numpy.ndarray
        The user's ``[p_u, b_u]`` (not modified).
    items, ratings : numpy.ndarray
        The user's training ratings.
    mean, epochs, lr, reg, seed
        Global mean rating, local epochs, step size, L2 weight, shuffle seed.

    Returns
    -------
    tuple
        ``(trained_table, trained_user, mse_of_last_epoch)``.

    Raises
    ------
    ConfigurationError
        If shapes disagree or an item is out of range.
    """
    if table.ndim != 2 or user.shape != (table.shape[1],):
        raise ConfigurationError(
            f"user parameters {user.shape} do not match the table {table.shape}"
        )
    if items.shape != ratings.shape or (
        items.size and not 0 <= items.min() <= items.max() < len(table)
    ):
        raise ConfigurationError(
            "items and ratings must have one shape and items must index the table"
        )
    out = table.copy()
    rows = table[items].astype(np.float64)  # the user rates an item once: rows are distinct
    u = user.astype(np.float64)
    rng = np.random.default_rng(seed)
    loss = 0.0
    for _ in range(epochs):
        loss = 0.0
        for j in rng.permutation(items.size):
            q = rows[j]
            e = mean + u[-1] + q[-1] + q[:-1] @ u[:-1] - ratings[j]
            loss += e * e
            gq = e * u[:-1] + reg * q[:-1]
            gu = e * q[:-1] + reg * u[:-1]
            q[:-1] -= lr * gq
            q[-1] -= lr * (e + reg * q[-1])
            u[:-1] -= lr * gu
            u[-1] -= lr * (e + reg * u[-1])
        loss /= max(1, items.size)
    out[items] = rows.astype(np.float32)
    return out, u.astype(np.float32), float(loss)
