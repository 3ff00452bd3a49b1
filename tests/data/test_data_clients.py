"""mnist_client_split on a generated MNIST-format cache (no real data needed)."""

from pathlib import Path

import numpy as np
import pytest

from flwr_fsl.data import DataNotPreparedError, mnist_client_split
from flwr_fsl.data.mnist import mnist_path


@pytest.fixture()
def fake_cache(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    n = 400
    np.savez(
        mnist_path(tmp_path),
        x_train=rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
        y_train=np.arange(n) % 10,
        x_test=rng.integers(0, 256, (50, 28, 28), dtype=np.uint8),
        y_test=np.arange(50) % 10,
    )
    return tmp_path


def test_splits_are_disjoint_deterministic_and_capped(fake_cache: Path) -> None:
    parts = [mnist_client_split(i, 4, seed=3, root=fake_cache) for i in range(4)]
    assert sum(len(p.y_train) + len(p.y_val) for p in parts) == 400
    assert all(len(p.y_train) == 80 and len(p.y_val) == 20 for p in parts)
    again = mnist_client_split(2, 4, seed=3, root=fake_cache)
    np.testing.assert_array_equal(again.x_train, parts[2].x_train)
    capped = mnist_client_split(2, 4, seed=3, max_samples=10, root=fake_cache)
    assert len(capped.y_train) == 10 and len(capped.y_val) == 2
    np.testing.assert_array_equal(capped.x_train, parts[2].x_train[:10])
    with pytest.raises(ValueError):
        parts[0].x_train[0, 0, 0] = 1.0  # cached arrays are read-only


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"partition_id": 4, "num_partitions": 4}, "partition_id"),
        ({"partition_id": 0, "num_partitions": 0}, "num_partitions"),
        ({"partition_id": 0, "num_partitions": 2, "partitioning": "x"}, "partitioning"),
        ({"partition_id": 0, "num_partitions": 2, "max_samples": -1}, "max_samples"),
        ({"partition_id": 0, "num_partitions": 2, "val_fraction": 1.0}, "val_fraction"),
    ],
)
def test_argument_errors(fake_cache: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        mnist_client_split(root=fake_cache, **kwargs)


def test_missing_cache_says_how_to_prepare(tmp_path: Path) -> None:
    with pytest.raises(DataNotPreparedError, match="prepare"):
        mnist_client_split(0, 2, root=tmp_path)
