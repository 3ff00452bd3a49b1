"""privhfl-fmnist: the run settings, each node's architecture and private data.

Every node owns an architecture of :mod:`flwr_fsl.models.privhfl` chosen by its
``partition-id`` (``archs``: VGG-7, ResNet-8 and ResNet-10 by default, widths for 28x28
grey images), an IID slice of ``samples-per-client`` training images of Fashion-MNIST or MNIST
(``dataset``; the prepared files of :mod:`flwr_fsl.data`) and the first ``test-size`` images
of a seeded permutation of the test set for evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import Context
from numpy.typing import NDArray
from torch import nn

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.data import load_fashion, load_mnist, partition_indices
from flwr_fsl.families.privhfl.mod import PrivateData
from flwr_fsl.families.privhfl.queries import EXPANSIONS, STRATEGIES
from flwr_fsl.families.privhfl.strategy import ANSWERING, COMPARISONS
from flwr_fsl.models.privhfl import ARCHITECTURES, build_model
from flwr_fsl.run_config import settings_from_run_config

DATASETS = ("fashion", "mnist")


@dataclass(frozen=True)
class Settings:
    """The app's run config (``[tool.flwr.app.config]``), typed and checked.

    Missing keys take the defaults below (in-process tests pass a partial run config).
    """

    num_server_rounds: int = 1
    dataset: str = "fashion"
    archs: str = "vgg7,resnet8,resnet10"
    samples_per_client: int = 500
    test_size: int = 1000
    local_epochs: int = 5
    local_optimizer: str = "adam"
    local_lr: float = 3e-3
    expansion: str = "mixup"
    selection: str = "random"
    pool_size: int = 2000
    num_queries: int = 500
    answering: str = "secure"
    comparison: str = "dcf"
    secure_queries: int = 2
    fraction_train: float = 0.2
    fraction_answer: float = 1.0
    retrain_epochs: int = 3
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if self.num_server_rounds < 1:
            problems.append("num-server-rounds must be >= 1")
        if self.dataset not in DATASETS:
            problems.append(f"dataset must be one of {', '.join(DATASETS)}")
        unknown = [a for a in self.arch_list if a not in ARCHITECTURES]
        if not self.arch_list or unknown:
            problems.append(f"archs must be names from {', '.join(sorted(ARCHITECTURES))}")
        if self.samples_per_client < 2 or self.test_size < 1:
            problems.append("samples-per-client must be >= 2 and test-size >= 1")
        if self.local_epochs < 0 or self.retrain_epochs < 0:
            problems.append("local-epochs and retrain-epochs must be >= 0")
        if self.local_optimizer not in ("sgd", "adam"):
            problems.append("local-optimizer must be sgd or adam")
        if not (math.isfinite(self.local_lr) and self.local_lr > 0):
            problems.append("local-lr must be > 0")
        if self.expansion not in EXPANSIONS:
            problems.append(f"expansion must be one of {', '.join(EXPANSIONS)}")
        if self.selection not in STRATEGIES:
            problems.append(f"selection must be one of {', '.join(STRATEGIES)}")
        if not all(1 <= q <= self.pool_size for q in (self.num_queries, self.secure_queries)):
            problems.append("num-queries / secure-queries must be in [1, pool-size]")
        if self.answering not in ANSWERING:
            problems.append(f"answering must be one of {', '.join(ANSWERING)}")
        if self.comparison not in COMPARISONS:
            problems.append(f"comparison must be one of {', '.join(COMPARISONS)}")
        for name, value in (
            ("fraction-train", self.fraction_train),
            ("fraction-answer", self.fraction_answer),
        ):
            if not 0.0 < value <= 1.0:
                problems.append(f"{name} must be in (0, 1]")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            problems.append("temperature must be > 0")
        if self.seed < 0:
            problems.append("seed must be >= 0")
        if problems:
            raise ConfigurationError("invalid run config: " + "; ".join(problems))

    @property
    def arch_list(self) -> list[str]:
        """The architectures (``archs`` split at commas)."""
        return [a.strip() for a in self.archs.split(",") if a.strip()]

    @property
    def queries(self) -> int:
        """Queries per querier: ``secure-queries`` when answering securely, else ``num-queries``."""
        return self.secure_queries if self.answering == "secure" else self.num_queries

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> Settings:
        """Read the settings from a run config (keys with dashes; unknown ones ignored).

        Raises
        ------
        ConfigurationError
            If a value has the wrong type or is out of range (the message names the key).
        """
        return settings_from_run_config(cls, run_config)


@lru_cache(maxsize=2)
def _dataset(
    name: str,
) -> tuple[NDArray[np.float32], NDArray[np.int64], NDArray[Any], NDArray[Any]]:
    return load_fashion() if name == "fashion" else load_mnist()


@lru_cache(maxsize=4)
def _partitions(name: str, per_client: int, seed: int) -> list[NDArray[np.int64]]:
    _, y_train, _, _ = _dataset(name)
    parts = partition_indices(y_train, len(y_train) // per_client, "iid", seed=seed)
    return [np.asarray(p[:per_client], dtype=np.int64) for p in parts]


def test_data(settings: Settings) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Return the evaluation images ``(n, 1, 28, 28)`` and labels every node uses."""
    _, _, x_test, y_test = _dataset(settings.dataset)
    idx = np.random.default_rng(settings.seed).permutation(len(x_test))[: settings.test_size]
    return x_test[idx].reshape(-1, 1, 28, 28).astype(np.float32), y_test[idx].astype(np.int64)


def partition_id(context: Context) -> int:
    """Return the node's ``partition-id`` (node config)."""
    return int(context.node_config["partition-id"])


def arch_of(settings: Settings, pid: int) -> str:
    """Return the architecture of partition ``pid`` (round robin over ``archs``)."""
    archs = settings.arch_list
    return archs[pid % len(archs)]


def node_data(settings: Settings, pid: int) -> PrivateData:
    """Return partition ``pid``'s private images and labels, and the evaluation data.

    Raises
    ------
    ValueError
        If there are fewer partitions of ``samples-per-client`` images than ``pid + 1``.
    """
    x_train, y_train, _, _ = _dataset(settings.dataset)
    parts = _partitions(settings.dataset, settings.samples_per_client, settings.seed)
    if not 0 <= pid < len(parts):
        raise ValueError(f"partition-id {pid} out of range: {len(parts)} partitions")
    idx = parts[pid]
    x_eval, y_eval = test_data(settings)
    return PrivateData(x_train[idx].reshape(-1, 1, 28, 28), y_train[idx], x_eval, y_eval)


def model_for(settings: Settings, pid: int) -> nn.Module:
    """Return partition ``pid``'s untrained model (its architecture, a seed of its own)."""
    return build_model(arch_of(settings, pid), seed=settings.seed * 1000 + pid)
