"""width-mnist: the run settings, the width-scalable models, a client's data, training, evaluation.

The setting of Sami & Güler's SESA experiments (§VI and the authors' notebooks), on MNIST or
Fashion-MNIST (``dataset``):

- clients in three capacity groups of a third each, ``B = 1, 1/2, 1/4`` (``width-mix =
  "a1-b1-c1"``: HeteroFL's fixed blocks by ``partition-id``, the last group gets the
  remainder as in §VI);
- McMahan et al.'s non-IID split (``partitioning = "shards"``: the training set sorted by
  label, cut into ``2 N`` shards, two per client — flwr-datasets' ``ShardPartitioner``), 600
  samples per client at ``N = 100``;
- 10% of the clients drop out of each round (``fraction-train = 0.9``);
- the MLP 784-200-10 (``model = "mlp"``) or a small CNN (``"cnn"``: two 3x3 conv blocks of
  32 and 64 channels with HeteroFL's static batch norm), :mod:`flwr_fsl.models.width`;
- Adam, learning rate 5e-4, one local epoch, batch size 10, a fresh optimizer each round.

The global model is evaluated centrally on the test set (10,000 images) at full width. A CNN's
static batch norm keeps no running statistics; as in HeteroFL, the server first collects them
in one pass over training images (:func:`~flwr_fsl.models.width.calibrate_batch_norm`) — here
the first ``calibration-size`` images of a seeded permutation of the training set, a stand-in
for data the server may hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeAlias

import numpy as np
import torch
from flwr.app import Context
from numpy.typing import NDArray
from torch.nn import functional as F

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.data import load_fashion, load_mnist
from flwr_fsl.families.width.rules import CapacityMix
from flwr_fsl.models import evaluate, set_torch_threads
from flwr_fsl.models.width import WidthCNN, WidthMLP, calibrate_batch_norm
from flwr_fsl.run_config import settings_from_run_config

DATASETS = ("mnist", "fashion")
MODELS = ("mlp", "cnn")
PARTITIONINGS = ("shards", "iid", "dirichlet")
ARMS = ("full", "fedavg", "fedrolex", "heterofl", "random", "shards", "sesa", "sesa-weighted")
"""The arms: ``full`` (every client at rate 1, the target), ``fedavg`` (Flower's own
``FedAvg``, the twin of ``full``), ``fedrolex`` / ``heterofl`` / ``random`` / ``shards``
(width extraction in plaintext: rolling, static, random channels, server-drawn SESA shards),
``sesa`` (SESA's secure aggregation, shards chosen secretly by the clients; every client
counts 1, the default) and ``sesa-weighted`` (the same, weighted by ``num-examples``: the
option whose count words leak who chose which shard)."""

# Clients share few cores in simulation: one torch thread per ClientApp.
set_torch_threads(1)

Net: TypeAlias = WidthMLP | WidthCNN
Images: TypeAlias = NDArray[np.float32]
Labels: TypeAlias = NDArray[np.int64]


@dataclass(frozen=True)
class Settings:
    """The app's run config (``[tool.flwr.app.config]``), typed and checked.

    Missing keys take the defaults below (in-process tests pass a partial run config).
    """

    num_server_rounds: int = 5
    arms: str = "full,fedrolex,heterofl,random,sesa"
    dataset: str = "mnist"
    model: str = "mlp"
    width_mix: str = "a1-b1-c1"
    fraction_train: float = 0.9
    min_nodes: int = 2
    partitioning: str = "shards"
    dirichlet_alpha: float = 0.5
    local_epochs: int = 1
    lr: float = 5e-4
    batch_size: int = 10
    max_client_samples: int = 600
    seed: int = 42
    num_shards: int = 4
    sesa_privacy: float = 0.5
    sesa_clip: float = 1.0
    sesa_frac_bits: int = 22
    sesa_max_clients: int = 128
    test_size: int = 0
    calibration_size: int = 2000
    results_dir: str = ""

    def __post_init__(self) -> None:
        problems = []
        if self.num_server_rounds < 1:
            problems.append("num-server-rounds must be >= 1")
        if self.dataset not in DATASETS:
            problems.append(f"dataset must be one of {', '.join(DATASETS)}")
        if self.model not in MODELS:
            problems.append(f"model must be one of {', '.join(MODELS)}")
        if self.partitioning not in PARTITIONINGS:
            problems.append(f"partitioning must be one of {', '.join(PARTITIONINGS)}")
        try:
            mix = CapacityMix.parse(self.width_mix)
            if any(not float(r * self.num_shards).is_integer() for r in mix.rates):
                problems.append("width-mix rates times num-shards must be whole shard counts")
        except ValueError as err:
            problems.append(f"width-mix: {err}")
        if not 0.0 < self.fraction_train <= 1.0:
            problems.append("fraction-train must be in (0, 1]")
        if self.min_nodes < 2:
            problems.append("min-nodes must be >= 2")
        if not (math.isfinite(self.dirichlet_alpha) and self.dirichlet_alpha > 0):
            problems.append("dirichlet-alpha must be > 0")
        if self.local_epochs < 1 or self.batch_size < 1:
            problems.append("local-epochs and batch-size must be >= 1")
        if not (math.isfinite(self.lr) and self.lr > 0):
            problems.append("lr must be > 0")
        if self.max_client_samples < 0 or self.test_size < 0 or self.calibration_size < 1:
            problems.append("max-client-samples and test-size must be >= 0, calibration-size >= 1")
        if self.num_shards < 1:
            problems.append("num-shards must be >= 1")
        if not 0.0 < self.sesa_privacy < 1.0 and not (
            self.sesa_privacy >= 1 and float(self.sesa_privacy).is_integer()
        ):
            problems.append("sesa-privacy must be a fraction in (0, 1) or a whole number >= 1")
        if not (math.isfinite(self.sesa_clip) and self.sesa_clip > 0):
            problems.append("sesa-clip must be finite and > 0")
        if not 1 <= self.sesa_frac_bits <= 30 or self.sesa_max_clients < 2:
            problems.append("sesa-frac-bits must be in [1, 30], sesa-max-clients >= 2")
        arms = self.arm_list
        unknown = [a for a in arms if a not in ARMS]
        if not arms or unknown or len(set(arms)) != len(arms):
            problems.append(f"arms must be distinct names from {', '.join(ARMS)}")
        if self.seed < 0:
            problems.append("seed must be >= 0")
        if problems:
            raise ConfigurationError("invalid run config: " + "; ".join(problems))

    @property
    def arm_list(self) -> list[str]:
        """The arms to run, in order (``arms`` split at commas)."""
        return [a.strip() for a in self.arms.split(",") if a.strip()]

    @property
    def fraction_evaluate(self) -> float:
        """No federated evaluation: the server evaluates the global model on the test set."""
        return 0.0

    @property
    def privacy(self) -> int | float:
        """SESA's ``T``: a fraction of the sampled clients, or a count."""
        return self.sesa_privacy if self.sesa_privacy < 1 else int(self.sesa_privacy)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> Settings:
        """Read the settings from a run config (keys with dashes; unknown ones ignored).

        Raises
        ------
        ConfigurationError
            If a value has the wrong type or is out of range (the message names the key).
        """
        return settings_from_run_config(cls, run_config)


# -- models -----------------------------------------------------------------------------------
def build_model(model: str, rate: float = 1.0) -> Net:
    """Return the width-scalable model ``model`` (``"mlp"`` or ``"cnn"``) built at ``rate``.

    Raises
    ------
    ValueError
        If ``model`` is unknown or ``rate`` is not in ``(0, 1]``.
    """
    if model == "mlp":
        return WidthMLP(rate)  # 784-200-10, no batch norm (SESA's MLP)
    if model == "cnn":
        return WidthCNN(rate)  # conv 32 -> conv 64 -> linear, static batch norm
    raise ValueError(f"model must be one of {MODELS}, got {model!r}")


def initial_state(model: str, seed: int) -> dict[str, torch.Tensor]:
    """Return the full-width initial model of every arm (torch's default init, seeded)."""
    torch.manual_seed(seed)
    return build_model(model).state_dict()


# -- data ------------------------------------------------------------------------------------
def load_dataset(name: str) -> tuple[Images, Labels, Images, Labels]:
    """Return ``(x_train, y_train, x_test, y_test)`` of ``"mnist"`` or ``"fashion"`` (cached).

    Raises
    ------
    ValueError
        If ``name`` is unknown.
    DataNotPreparedError
        If the data set has not been prepared (``python -m flwr_fsl.data prepare ...``).
    """
    if name == "mnist":
        return load_mnist()
    if name == "fashion":
        return load_fashion()
    raise ValueError(f"dataset must be one of {DATASETS}, got {name!r}")


@lru_cache(maxsize=4)
def _partitions(
    dataset: str, num_partitions: int, partitioning: str, alpha: float, seed: int
) -> tuple[NDArray[np.int64], ...]:
    """Split the training set among ``num_partitions`` clients once per process and setting."""
    from datasets import Dataset
    from flwr_datasets.partitioner import ShardPartitioner

    from flwr_fsl.data import partition_indices

    _, y, _, _ = load_dataset(dataset)
    if partitioning != "shards":
        return tuple(partition_indices(y, num_partitions, partitioning, alpha, seed))
    # McMahan et al.'s non-IID split: sorted by label, two shards per client.
    partitioner = ShardPartitioner(
        num_partitions=num_partitions,
        partition_by="label",
        num_shards_per_partition=2,
        shuffle=True,
        seed=seed,
    )
    partitioner.dataset = Dataset.from_dict({"index": np.arange(len(y)), "label": y})
    parts = []
    for pid in range(num_partitions):
        column = partitioner.load_partition(pid).with_format("numpy")["index"][:]
        parts.append(np.sort(np.asarray(column, dtype=np.int64)))
    return tuple(parts)


@lru_cache(maxsize=256)
def _client_data(
    dataset: str,
    partition_id: int,
    num_partitions: int,
    partitioning: str,
    alpha: float,
    seed: int,
    max_samples: int,
) -> tuple[Images, Labels]:
    x, y, _, _ = load_dataset(dataset)
    part = _partitions(dataset, num_partitions, partitioning, alpha, seed)[partition_id]
    idx = np.random.default_rng(seed + partition_id).permutation(part)
    if max_samples > 0:
        idx = idx[:max_samples]
    xs, ys = x[idx], y[idx]
    xs.setflags(write=False)
    ys.setflags(write=False)
    return xs, ys


def client_data(
    settings: Settings, partition_id: int, num_partitions: int
) -> tuple[Images, Labels]:
    """Return one client's training images and labels (deterministic, cached, read-only).

    Its partition of the training set (``partitioning``), shuffled with
    ``default_rng(seed + partition_id)`` and cut to ``max-client-samples`` (0: all of it).

    Raises
    ------
    ValueError
        If ``partition_id`` is not in ``[0, num_partitions)``.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id must be in [0, {num_partitions}), got {partition_id}")
    return _client_data(
        settings.dataset,
        partition_id,
        num_partitions,
        settings.partitioning,
        float(settings.dirichlet_alpha),
        settings.seed,
        settings.max_client_samples,
    )


def node_data(context: Context) -> tuple[Images, Labels]:
    """Return the node's training data (partition from its node config)."""
    settings = Settings.from_run_config(context.run_config)
    return client_data(
        settings,
        int(context.node_config["partition-id"]),
        int(context.node_config["num-partitions"]),
    )


def test_data(dataset: str, size: int = 0) -> tuple[Images, Labels]:
    """Return the test set (its first ``size`` images if ``size > 0``)."""
    _, _, x, y = load_dataset(dataset)
    return (x[:size], y[:size]) if size > 0 else (x, y)


def calibration_data(dataset: str, size: int, seed: int) -> Images:
    """Return training images the server uses for a CNN's batch-norm statistics (module doc)."""
    x, _, _, _ = load_dataset(dataset)
    return x[np.random.default_rng(seed).permutation(len(x))[:size]]


# -- training and evaluation -----------------------------------------------------------------
def train(
    net: Net, x: Images, y: Labels, epochs: int, lr: float, batch_size: int, seed: int
) -> float:
    """Train ``net`` in place with a fresh Adam; return the mean loss of the last epoch.

    Raises
    ------
    ValueError
        If ``x`` is empty or does not match ``y``.
    """
    if len(x) == 0 or len(x) != len(y):
        raise ValueError(f"need matching non-empty x and y, got {len(x)} and {len(y)}")
    xt = torch.as_tensor(np.array(x, dtype=np.float32, copy=True))
    yt = torch.as_tensor(np.array(y, dtype=np.int64, copy=True))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    net.train()
    last = 0.0
    for _ in range(epochs):
        order = torch.randperm(len(xt), generator=generator)
        total = 0.0
        for start in range(0, len(xt), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(xt[idx]), yt[idx])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
        last = total / len(xt)
    return last


def test(net: Net, x: Images, y: Labels, calibration: Images | None = None) -> tuple[float, float]:
    """Return ``(loss, accuracy)`` of ``net`` on ``(x, y)``.

    With batch norm (the CNN) the statistics are first collected on ``calibration``
    (HeteroFL's test-time step); without it the model is evaluated as is.
    """
    if calibration is not None and any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in net.modules()
    ):
        net = calibrate_batch_norm(net, calibration)
    return evaluate(net, x, y)
