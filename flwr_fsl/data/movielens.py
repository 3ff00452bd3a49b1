"""MovieLens-100k, read offline from the ``recbole`` wheel and cached as ``movielens.npz``.

The wheel ships ``ml-100k.inter``, a tab-separated file with the header
``user_id:token item_id:token rating:float timestamp:float`` and 100,000 ratings by 943
users of 1,682 movies. :func:`prepare_movielens` maps the raw user/item tokens to
0-based contiguous ids (sorted numerically) and keeps the mapping; users are the natural
clients of a federated recommender.

It also caches ``movielens-items.npz`` from the wheel's ``ml-100k.item`` (header
``item_id:token movie_title:token_seq release_year:token class:token_seq``): each item's
genres (the ``class`` field, 19 genres, 1 to 6 per movie) as a CSR item -> genre map
(:class:`MovieLensGenres`, :func:`load_movielens_genres`), the categories of a DIN-like CTR
model. :func:`ctr_samples` turns one user's ratings into click-through samples in time order
(see its docstring for the labels, histories and the split).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError

from ._cache import atomic_savez, cache_dir, fetch_wheel, read_wheel_member, require_cached

MOVIELENS_REQUIREMENT = "recbole==1.2.1"
MOVIELENS_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
MOVIELENS_FILE = "movielens.npz"
ITEMS_MEMBER = "recbole/dataset_example/ml-100k/ml-100k.item"
ITEMS_FILE = "movielens-items.npz"
_ITEM_HEADER = (
    "item_id:token",
    "movie_title:token_seq",
    "release_year:token",
    "class:token_seq",
)
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
    """Build ``movielens.npz`` and ``movielens-items.npz`` from the ``recbole`` wheel.

    Each file is skipped if it exists (unless ``force``).

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
    items = root / ITEMS_FILE
    if out.is_file() and items.is_file() and not force:
        return out
    wheel = fetch_wheel(MOVIELENS_REQUIREMENT, root / "wheels")
    data = parse_inter(read_wheel_member(wheel, MOVIELENS_MEMBER).decode("utf-8"))
    if force or not out.is_file():
        atomic_savez(
            out,
            user_ids=data.user_ids,
            item_ids=data.item_ids,
            ratings=data.ratings,
            timestamps=data.timestamps,
            user_tokens=data.user_tokens,
            item_tokens=data.item_tokens,
        )
    if force or not items.is_file():
        text = read_wheel_member(wheel, ITEMS_MEMBER).decode("utf-8")
        genres = parse_item_genres(text, data.item_tokens)
        atomic_savez(
            items, indptr=genres.indptr, indices=genres.indices, names=np.array(genres.names)
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


# -- genres -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MovieLensGenres:
    """Each item's genres as a CSR map: item ``i`` has genres ``indices[indptr[i]:indptr[i+1]]``.

    Attributes
    ----------
    indptr : NDArray[np.int64]
        ``num_items + 1`` offsets into ``indices``.
    indices : NDArray[np.int64]
        Genre ids in ``[0, len(names))``, sorted within each item.
    names : tuple[str, ...]
        Genre names sorted alphabetically (``names[g]`` is genre ``g``).
    """

    indptr: NDArray[np.int64]
    indices: NDArray[np.int64]
    names: tuple[str, ...]

    @property
    def num_genres(self) -> int:
        """Number of distinct genres."""
        return len(self.names)

    def of(self, item: int) -> NDArray[np.int64]:
        """Return the genre ids of one item."""
        return self.indices[self.indptr[item] : self.indptr[item + 1]]


def parse_item_genres(text: str, item_tokens: NDArray[np.int64]) -> MovieLensGenres:
    """Parse the genres of a RecBole ``ml-100k.item`` file.

    Parameters
    ----------
    text : str
        The file's content: a header line, then ``item<TAB>title<TAB>year<TAB>genres`` with
        the genres separated by spaces.
    item_tokens : NDArray[np.int64]
        Raw item id of each contiguous item id (:attr:`MovieLens.item_tokens`): the map's rows.

    Returns
    -------
    MovieLensGenres
        One row per entry of ``item_tokens``; an item absent from the file, or listed without
        a genre, gets no genre.

    Raises
    ------
    ConfigurationError
        If the header or a row is malformed, or an item is listed twice.
    """
    lines = text.splitlines()
    if not lines or tuple(lines[0].rstrip("\r").split("\t")) != _ITEM_HEADER:
        raise ConfigurationError(f"expected the ml-100k.item header, got {lines[:1]!r}")
    row_of = {int(token): i for i, token in enumerate(item_tokens)}
    per_item: dict[int, list[str]] = {}
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.rstrip("\r").split("\t")
        if len(fields) != len(_ITEM_HEADER) or not fields[0].strip().isdigit():
            raise ConfigurationError(f"ml-100k.item line {number} is malformed")
        token = int(fields[0])
        if token in per_item:
            raise ConfigurationError(f"ml-100k.item lists item {token} twice")
        per_item[token] = fields[3].split()
    names = tuple(sorted({g for genres in per_item.values() for g in genres}))
    genre_id = {name: g for g, name in enumerate(names)}
    counts = np.zeros(len(item_tokens) + 1, np.int64)
    rows: list[list[int]] = [[] for _ in item_tokens]
    for token, genres in per_item.items():
        if token in row_of:
            rows[row_of[token]] = sorted({genre_id[g] for g in genres})
    counts[1:] = [len(r) for r in rows]
    indices = np.array([g for r in rows for g in r], np.int64)
    return MovieLensGenres(np.cumsum(counts), indices, names)


def load_movielens_genres(root: Path | None = None) -> MovieLensGenres:
    """Load the prepared item -> genre map of MovieLens-100k.

    Parameters
    ----------
    root : Path | None
        The cache folder; :func:`~flwr_fsl.data.cache_dir` if None.

    Returns
    -------
    MovieLensGenres
        1,682 items, 19 genres.

    Raises
    ------
    DataNotPreparedError
        If ``python -m flwr_fsl.data prepare movielens`` has not been run since the genres
        were added (``--force`` rebuilds both files).
    """
    root = root if root is not None else cache_dir()
    path = require_cached(root / ITEMS_FILE, "movielens")
    with np.load(path, allow_pickle=False) as npz:
        names = tuple(str(n) for n in npz["names"])
        return MovieLensGenres(npz["indptr"], npz["indices"], names)


# -- click-through samples --------------------------------------------------------------------
@dataclass(frozen=True)
class CTRSamples:
    """Click-through samples: a target item, the user's earlier liked items, a click label.

    Attributes
    ----------
    items : NDArray[np.int64]
        Target item of each sample, ``(n,)``.
    history : NDArray[np.int64]
        ``(n, hist_len)`` earlier items the user liked, oldest first, left-padded with ``-1``.
    labels : NDArray[np.float32]
        1 for a "click" (rating >= the threshold), else 0.
    """

    items: NDArray[np.int64]
    history: NDArray[np.int64]
    labels: NDArray[np.float32]

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class UserCTR:
    """One user's click-through data, split by time.

    Attributes
    ----------
    rows : NDArray[np.int64]
        Sorted item ids of the training samples (targets; every history item of a training
        sample is one of them): the user's rows of the item table.
    train, test : CTRSamples
        The older and the newer samples.
    dropped : int
        Older ratings left out because the training part is capped at ``max_train``.
    """

    rows: NDArray[np.int64]
    train: CTRSamples
    test: CTRSamples
    dropped: int


def ctr_samples(
    items: NDArray[np.int64],
    ratings: NDArray[np.float32],
    timestamps: NDArray[np.int64],
    *,
    hist_len: int = 10,
    test_fraction: float = 0.2,
    max_train: int = 64,
    threshold: float = 4.0,
) -> UserCTR:
    """Turn one user's ratings into time-ordered click-through samples.

    Explicit feedback as CTR (DIN's setting without impressions): every rating is a sample
    of its item; the label is 1 iff ``rating >= threshold`` (MovieLens: 55% of ratings are 4
    or 5). The ratings are sorted by time (ties by item id); the newest ``test_fraction`` (at
    least one, and at least one left for training) are the test samples, and only the
    newest ``max_train`` older ones train (older ratings are dropped, also from histories).
    A sample's history is the ``hist_len`` newest *positive* items before it among the kept
    ratings, so every training history item is a training target (a user's training rows are
    its training items) and test histories may hold earlier test items.

    Parameters
    ----------
    items, ratings, timestamps : numpy.ndarray
        The user's ratings (one per item).
    hist_len : int
        History length, >= 1.
    test_fraction : float
        Share of the ratings held out, in ``(0, 1)``.
    max_train : int
        Most training samples (the public bound on the user's item rows), >= 1.
    threshold : float
        Smallest rating counted as a click.

    Returns
    -------
    UserCTR
        Rows, train and test samples.

    Raises
    ------
    ConfigurationError
        If an argument is out of range, the arrays differ in length, an item repeats or the
        user has fewer than two ratings.
    """
    if hist_len < 1 or max_train < 1 or not 0.0 < test_fraction < 1.0:
        raise ConfigurationError(
            "hist_len and max_train must be >= 1 and test_fraction in (0, 1), got "
            f"{hist_len}, {max_train}, {test_fraction}"
        )
    n = len(items)
    if len(ratings) != n or len(timestamps) != n or n < 2 or len(np.unique(items)) != n:
        raise ConfigurationError(
            "items, ratings and timestamps must have one length >= 2, items unique"
        )
    order = np.lexsort((items, timestamps))
    n_test = min(n - 1, max(1, round(test_fraction * n)))
    n_train = min(n - n_test, max_train)
    keep = order[n - n_test - n_train :]
    kept_items = np.asarray(items, np.int64)[keep]
    labels = (np.asarray(ratings)[keep] >= threshold).astype(np.float32)
    history = np.full((len(keep), hist_len), -1, np.int64)
    liked: list[int] = []
    for j, item in enumerate(kept_items):
        recent = liked[-hist_len:]
        if recent:
            history[j, hist_len - len(recent) :] = recent
        if labels[j]:
            liked.append(int(item))
    train = CTRSamples(kept_items[:n_train], history[:n_train], labels[:n_train])
    test = CTRSamples(kept_items[n_train:], history[n_train:], labels[n_train:])
    return UserCTR(np.sort(train.items), train, test, n - n_test - n_train)
