"""Split a labelled data set among clients with flwr-datasets partitioners.

:func:`partition_indices` wraps the labels in a ``datasets.Dataset`` (offline, no hub
access) and asks Flower's own partitioners for each partition, so the splits are the ones a
Flower user gets from ``FederatedDataset``. It returns index arrays into the original data,
deterministic for a given seed.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

Scheme = Literal["iid", "dirichlet"]
SCHEMES: tuple[str, ...] = ("iid", "dirichlet")


def partition_indices(
    labels: ArrayLike,
    num_partitions: int,
    scheme: Scheme = "iid",
    alpha: float = 0.5,
    seed: int = 42,
    min_partition_size: int = 0,
) -> list[NDArray[np.int64]]:
    """Split sample indices into ``num_partitions`` client partitions.

    Parameters
    ----------
    labels : ArrayLike
        One integer label per sample (1-D).
    num_partitions : int
        Number of partitions (clients), at least 1 and at most ``len(labels)``.
    scheme : {"iid", "dirichlet"}
        ``"iid"``: shuffle with ``seed``, then ``IidPartitioner`` (equal sizes up to one).
        ``"dirichlet"``: ``DirichletPartitioner`` over the labels with concentration
        ``alpha`` (smaller is more skewed).
    alpha : float
        Dirichlet concentration, > 0 (used by ``"dirichlet"`` only).
    seed : int
        Seed of the shuffle / Dirichlet draws; the same seed gives the same partitions.
    min_partition_size : int
        ``"dirichlet"`` only: redraw until every partition has at least this many samples.

    Returns
    -------
    list[NDArray[np.int64]]
        ``num_partitions`` index arrays into ``labels``, pairwise disjoint and covering
        every sample, each sorted ascending.

    Raises
    ------
    ValueError
        If an argument is out of range or ``scheme`` is unknown.
    """
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, Partitioner

    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {y.dtype}")
    if not 1 <= num_partitions <= len(y):
        raise ValueError(
            f"num_partitions must be in [1, {len(y)}] (the number of samples), got {num_partitions}"
        )
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
    if scheme == "dirichlet" and not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if min_partition_size < 0:
        raise ValueError(f"min_partition_size must be >= 0, got {min_partition_size}")

    index = np.arange(len(y), dtype=np.int64)
    partitioner: Partitioner
    if scheme == "iid":
        # IidPartitioner shards contiguously: shuffle the rows first (seeded, in numpy).
        index = np.random.default_rng(seed).permutation(len(y)).astype(np.int64)
        partitioner = IidPartitioner(num_partitions=num_partitions)
    else:
        partitioner = DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            alpha=alpha,
            min_partition_size=min_partition_size,
            self_balancing=False,
            shuffle=True,
            seed=seed,
        )
    partitioner.dataset = Dataset.from_dict({"index": index, "label": y[index]})
    parts: list[NDArray[np.int64]] = []
    for pid in range(num_partitions):
        column = partitioner.load_partition(pid).with_format("numpy")["index"][:]
        parts.append(np.sort(np.asarray(column, dtype=np.int64)))
    return parts
