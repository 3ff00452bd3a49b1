"""MovieLens-100k, read offline from the ``recbole`` wheel and cached as ``movielens.npz``.

The wheel ships ``ml-100k.inter``, a tab-separated file with the header
``user_id:token item_id:token rating:float timestamp:float`` and 100,000 ratings by 943
users of 1,682 movies. :func:`prepare_movielens` maps the raw user/item tokens to
0-based contiguous ids (sorted numerically) and keeps the mapping; users are the natural
clients of a federated recommender.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from ._cache import atomic_savez, cache_dir, fetch_wheel, read_wheel_member, require_cached

MOVIELENS_REQUIREMENT = "recbole==1.2.1"
MOVIELENS_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
MOVIELENS_FILE = "movielens.npz"
_HEADER = ("user_id:token", "item_id:token", "rating:float", "timestamp:float")


@dataclass(frozen=True)
class MovieLens:
    """MovieLens ratings with 0-based contiguous ids.

    Attributes
    ----------
    user_ids : NDArray[np.int64]
        User of each rating, in ``[0, num_users)``.
    item_ids : NDArray[np.int64]
        Item of each rating, in ``[0, num_items)``.
    ratings : NDArray[np.float32]
        The rating (1 to 5).
    timestamps : NDArray[np.int64]
        Unix time of each rating.
    user_tokens : NDArray[np.int64]
        Raw MovieLens user id of each contiguous user id (``user_tokens[u]``).
    item_tokens : NDArray[np.int64]
        Raw MovieLens item id of each contiguous item id.
    """

    user_ids: NDArray[np.int64]
    item_ids: NDArray[np.int64]
    ratings: NDArray[np.float32]
    timestamps: NDArray[np.int64]
    user_tokens: NDArray[np.int64]
    item_tokens: NDArray[np.int64]

    @property
    def num_users(self) -> int:
        """Number of distinct users."""
        return len(self.user_tokens)

    @property
    def num_items(self) -> int:
        """Number of distinct items."""
        return len(self.item_tokens)

    def __len__(self) -> int:
        return len(self.ratings)


def parse_inter(text: str) -> MovieLens:
    """Parse a RecBole ``.inter`` file of MovieLens ratings.

    Parameters
    ----------
    text : str
        The file's content: a header line, then ``user<TAB>item<TAB>rating<TAB>time``.

    Returns
    -------
    MovieLens
        The ratings with contiguous ids (raw tokens sorted numerically).

    Raises
    ------
    ValueError
        If the header or a row is malformed.
    """
    lines = text.splitlines()
    if not lines or tuple(lines[0].strip().split("\t")) != _HEADER:
        expected = "\t".join(_HEADER)
        raise ValueError(f"expected header {expected!r}, got {lines[:1]!r}")
    rows = [line for line in lines[1:] if line.strip()]
    try:
        table = np.array([row.split("\t") for row in rows], dtype=np.float64)
    except ValueError as err:
        raise ValueError(f"malformed .inter row: {err}") from None
    if table.ndim != 2 or table.shape[1] != 4:
        raise ValueError(f"every .inter row needs 4 tab-separated fields, got shape {table.shape}")
    users_raw = table[:, 0].astype(np.int64)
    items_raw = table[:, 1].astype(np.int64)
    user_tokens, user_ids = np.unique(users_raw, return_inverse=True)
    item_tokens, item_ids = np.unique(items_raw, return_inverse=True)
    return MovieLens(
        user_ids=user_ids.astype(np.int64),
        item_ids=item_ids.astype(np.int64),
        ratings=table[:, 2].astype(np.float32),
        timestamps=table[:, 3].astype(np.int64),
        user_tokens=user_tokens.astype(np.int64),
        item_tokens=item_tokens.astype(np.int64),
    )


def movielens_path(root: Path | None = None) -> Path:
    """Return the path of the cached ``movielens.npz``.

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    Path
        ``root / "movielens.npz"``.
    """
    return (root if root is not None else cache_dir()) / MOVIELENS_FILE


def prepare_movielens(root: Path | None = None, force: bool = False) -> Path:
    """Build ``movielens.npz`` from the ``recbole`` wheel (skipped if it exists).

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None. The wheel is kept in
        ``root / "wheels"``.
    force : bool
        Rebuild even if the ``.npz`` exists.

    Returns
    -------
    Path
        The ``.npz`` file.
    """
    root = root if root is not None else cache_dir()
    out = movielens_path(root)
    if out.is_file() and not force:
        return out
    wheel = fetch_wheel(MOVIELENS_REQUIREMENT, root / "wheels")
    data = parse_inter(read_wheel_member(wheel, MOVIELENS_MEMBER).decode("utf-8"))
    atomic_savez(
        out,
        user_ids=data.user_ids,
        item_ids=data.item_ids,
        ratings=data.ratings,
        timestamps=data.timestamps,
        user_tokens=data.user_tokens,
        item_tokens=data.item_tokens,
    )
    return out


def load_movielens(root: Path | None = None) -> MovieLens:
    """Load the prepared MovieLens-100k ratings.

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    MovieLens
        100,000 ratings, 943 users, 1,682 items.

    Raises
    ------
    DataNotPreparedError
        If ``python -m flwr_fsl.data prepare movielens`` has not been run.
    """
    path = require_cached(movielens_path(root), "movielens")
    with np.load(path, allow_pickle=False) as npz:
        return MovieLens(
            user_ids=npz["user_ids"],
            item_ids=npz["item_ids"],
            ratings=npz["ratings"],
            timestamps=npz["timestamps"],
            user_tokens=npz["user_tokens"],
            item_tokens=npz["item_tokens"],
        )
