"""MovieLens genres and click-through samples on small generated data (no wheel, no cache)."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.data import ctr_samples, load_movielens, load_movielens_genres
from flwr_fsl.data.movielens import parse_item_genres
from tests.prepared_data import require_prepared

HEADER = "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"


def test_parse_item_genres_csr_in_contiguous_item_order() -> None:
    text = HEADER + "10\tA\t1995\tDrama War\n2\tB\t1990\tComedy\n7\tC, The\t1980\t\n"
    genres = parse_item_genres(text, np.array([2, 7, 10, 11]))
    assert genres.names == ("Comedy", "Drama", "War")
    np.testing.assert_array_equal(genres.indptr, [0, 1, 1, 3, 3])  # 7: none; 11: not listed
    np.testing.assert_array_equal(genres.of(2), [1, 2])


@pytest.mark.parametrize(
    "text", ["", "item\tgenre\n", HEADER + "1\tA\t1995\n", HEADER + "1\tA\t1\tX\n1\tB\t2\tY\n"]
)
def test_parse_item_genres_rejects_malformed(text: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_item_genres(text, np.array([1]))


def test_ctr_samples_time_split_labels_and_histories() -> None:
    items = np.array([5, 3, 9, 1, 7, 2])
    ratings = np.array([5, 2, 4, 1, 5, 3], np.float32)
    times = np.array([60, 10, 30, 40, 50, 20])  # order: 3, 2, 9, 1, 7, 5
    user = ctr_samples(items, ratings, times, hist_len=2, test_fraction=0.34, max_train=3)
    # 2 test samples (the newest), 3 training ones before them, 1 older rating dropped.
    np.testing.assert_array_equal(user.train.items, [2, 9, 1])
    np.testing.assert_array_equal(user.test.items, [7, 5])
    np.testing.assert_array_equal(user.train.labels, [0, 1, 0])
    np.testing.assert_array_equal(user.test.labels, [1, 1])
    assert user.dropped == 1
    np.testing.assert_array_equal(user.rows, [1, 2, 9])
    # Histories: newest liked items before each sample, oldest first, left-padded with -1.
    np.testing.assert_array_equal(user.train.history, [[-1, -1], [-1, -1], [-1, 9]])
    np.testing.assert_array_equal(user.test.history, [[-1, 9], [9, 7]])
    # Every training history item is a training row.
    hist = user.train.history[user.train.history >= 0]
    assert set(hist) <= set(user.rows)


def test_ctr_samples_validates() -> None:
    one = np.array([1, 2])
    with pytest.raises(ConfigurationError):
        ctr_samples(one, np.ones(2, np.float32), one, hist_len=0)
    with pytest.raises(ConfigurationError):
        ctr_samples(np.array([1, 1]), np.ones(2, np.float32), one)
    with pytest.raises(ConfigurationError):
        ctr_samples(one[:1], np.ones(1, np.float32), one[:1])


def test_real_movielens_genres() -> None:
    require_prepared("movielens", "movielens-items")
    genres = load_movielens_genres()
    assert genres.num_genres == 19 and len(genres.indptr) == load_movielens().num_items + 1
    counts = np.diff(genres.indptr)
    assert counts.min() >= 1 and counts.max() <= 6
