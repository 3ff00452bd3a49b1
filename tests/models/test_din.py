"""The DIN-like CTR model: row-sparse training, the table spec, AUC (tiny generated data)."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.data import CTRSamples, ctr_samples
from flwr_fsl.models import din
from flwr_fsl.submodel.tables import ModelTables, RowMap, TableSpec

ITEMS, GENRES = 30, 4


def config(pooling: str = "attention") -> din.DINConfig:
    lists = [[i % GENRES, (i * 7) % GENRES] for i in range(ITEMS)]
    indptr = np.cumsum([0] + [len(set(g)) for g in lists])
    indices = np.concatenate([sorted(set(g)) for g in lists])
    return din.DINConfig(ITEMS, GENRES, indptr, indices, dim=4, pooling=pooling)


def model_tables(cfg: din.DINConfig, max_rows: int) -> ModelTables:
    """The spec the recsys-movielens app builds (a utility module may not import tables)."""
    row_map = RowMap(cfg.genre_indptr, cfg.genre_indices)
    return ModelTables(
        (
            TableSpec(din.ITEM_TABLE, max_rows),
            TableSpec(din.GENRE_TABLE, GENRES, derived_from=din.ITEM_TABLE, row_map=row_map),
        )
    )


def user(seed: int) -> tuple[np.ndarray, CTRSamples]:
    rng = np.random.default_rng(seed)
    items = rng.choice(ITEMS // 2, 12, replace=False)
    ratings = rng.integers(1, 6, 12).astype(np.float32)
    data = ctr_samples(items, ratings, np.arange(12), hist_len=3)
    return data.rows, data.train


@pytest.mark.parametrize("pooling", ["attention", "mean"])
def test_training_moves_only_the_users_rows_and_their_genres(pooling: str) -> None:
    cfg = config(pooling)
    start = din.initial_arrays(cfg, seed=1)
    rows, samples = user(3)
    trained, loss = din.train_samples(cfg, start, samples, epochs=2, lr=0.05, batch_size=4, seed=0)
    assert loss > 0 and set(trained) == set(start)
    moved = np.flatnonzero(np.any(trained[din.ITEM_TABLE] != start[din.ITEM_TABLE], axis=1))
    assert set(moved) <= set(rows) and moved.size > 0
    genre_moved = np.flatnonzero(np.any(trained[din.GENRE_TABLE] != start[din.GENRE_TABLE], axis=1))
    assert set(genre_moved) <= set(din.genre_rows(cfg, rows))
    dense = model_tables(cfg, 12).dense_names(trained)
    assert din.ITEM_TABLE not in dense and din.GENRE_TABLE not in dense and len(dense) == 8


def test_model_tables_genre_table_derived_from_items() -> None:
    cfg = config()
    tables = model_tables(cfg, 12)
    tables.check(din.initial_arrays(cfg, seed=0))
    rows = tables.client_rows({din.ITEM_TABLE: np.array([1, 5])})
    np.testing.assert_array_equal(rows[din.GENRE_TABLE], din.genre_rows(cfg, np.array([1, 5])))
    np.testing.assert_array_equal(rows[din.GENRE_TABLE], [1, 3])
    for items in ([], [0], list(range(ITEMS))):
        np.testing.assert_array_equal(
            din.genre_rows(cfg, np.array(items, np.int64)),
            tables.client_rows({din.ITEM_TABLE: np.array(items, np.int64)})[din.GENRE_TABLE],
        )
    with pytest.raises(ConfigurationError):
        din.genre_rows(cfg, np.array([ITEMS]))


def test_map_and_sizes_validated() -> None:
    with pytest.raises(ConfigurationError, match="CSR"):
        din.DINConfig(2, 2, np.array([0, 1]), np.array([0]))
    with pytest.raises(ConfigurationError, match="pooling"):
        din.DINConfig(1, 1, np.array([0, 1]), np.array([0]), pooling="max")
    with pytest.raises(ConfigurationError, match="dim"):
        din.DINConfig(1, 1, np.array([0, 1]), np.array([0]), dim=0)


def test_predict_probabilities_and_learning_signal() -> None:
    cfg = config()
    arrays = din.initial_arrays(cfg, seed=2)
    # Items < 8 are always liked, the others never: a pure item effect the model can learn.
    rng = np.random.default_rng(0)
    items = rng.integers(0, 16, 400)
    samples = CTRSamples(items, np.full((400, 3), -1), (items < 8).astype(np.float32))
    before = din.auc(samples.labels, din.predict(cfg, arrays, samples))
    trained, _ = din.train_samples(cfg, arrays, samples, epochs=5, lr=0.05, batch_size=16, seed=1)
    p = din.predict(cfg, trained, samples)
    assert np.all((p >= 0) & (p <= 1))
    assert din.auc(samples.labels, p) > max(0.9, before)


def test_auc_matches_pairwise_definition_with_ties() -> None:
    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, 50)
    s = rng.integers(0, 5, 50).astype(float)
    pos, neg = s[y == 1], s[y == 0]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert din.auc(y, s) == pytest.approx(pairs / (pos.size * neg.size))
    with pytest.raises(ConfigurationError):
        din.auc(np.ones(3), np.arange(3.0))
