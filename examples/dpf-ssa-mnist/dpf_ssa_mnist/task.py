"""dpf-ssa-mnist: the model, the run settings and a client's data.

The MNIST task (its training and data keys, the partitioning, the CNN and its training loop) is
:mod:`flwr_fsl.models.mnist_task`, shared with ``topk-mnist`` and ``secagg-mnist``; this module
reads only this app's own keys (rounds, sampling, top-k, SSA) and nests the task's
:class:`~flwr_fsl.models.mnist_task.TaskSettings` as ``Settings.task``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from flwr.app import Context

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.data import MnistClientSplit, mnist_client_split
from flwr_fsl.models import MnistCNN, set_torch_threads
from flwr_fsl.models.mnist_task import TaskSettings, task_settings
from flwr_fsl.run_config import settings_from_run_config

Net = MnistCNN

# Clients share few cores in simulation: one torch thread per ClientApp (also deterministic).
set_torch_threads(1)


@dataclass(frozen=True)
class Settings:
    """The app's run config (``[tool.flwr.app.config]``), typed and checked.

    Missing keys take the defaults below (``flwr.simulation.run_simulation`` and in-process
    tests pass a partial run config). The task's keys (``local-epochs``, ``lr``, ``batch-size``,
    ``partitioning``, ``dirichlet-alpha``, ``seed``, ``max-client-samples``, ``test-size``) are
    read and checked by :func:`~flwr_fsl.models.mnist_task.task_settings` into :attr:`task`.
    """

    num_server_rounds: int = 5
    fraction_train: float = 0.5
    fraction_evaluate: float = 0.0
    min_nodes: int = 2
    topk_ratio: float = 0.1
    topk_error_feedback: bool = True  # read by topk_mod on the clients; checked here too
    ssa_helper_address: str = ""
    ssa_helper_fingerprint: str = ""
    ssa_helper_key_file: str = ""
    ssa_helper_token_file: str = ""
    ssa_helper_ca_file: str = ""
    ssa_frac_bits: int = 24
    ssa_max_abs: float = 1e5
    ssa_weighted: bool = False
    ssa_plaintext_evaluation: bool = False
    ssa_dp_noise_multiplier: float = 0.0
    ssa_dp_clip_norm: float = 1.0
    ssa_dp_budget_epsilon: float = 20.0
    compare_plaintext: bool = True
    compare_dense: bool = True
    results_dir: str = ""
    task: TaskSettings = field(default_factory=TaskSettings)

    def __post_init__(self) -> None:
        problems = []
        if self.num_server_rounds < 1:
            problems.append("num-server-rounds must be >= 1")
        if not 0.0 < self.fraction_train <= 1.0:
            problems.append("fraction-train must be in (0, 1]")
        if not 0.0 <= self.fraction_evaluate <= 1.0:
            problems.append("fraction-evaluate must be in [0, 1]")
        if self.min_nodes < 1:
            problems.append("min-nodes must be >= 1")
        if not 0.0 < self.topk_ratio <= 1.0:
            problems.append("topk-ratio must be in (0, 1]")
        if not (self.ssa_dp_noise_multiplier >= 0 and self.ssa_dp_budget_epsilon >= 0):
            problems.append("ssa-dp-noise-multiplier and ssa-dp-budget-epsilon must be >= 0")
        if not self.ssa_dp_clip_norm > 0:
            problems.append("ssa-dp-clip-norm must be > 0")
        if not 1 <= self.ssa_frac_bits <= 40:
            problems.append("ssa-frac-bits must be in [1, 40]")
        if not self.ssa_max_abs > 0:
            problems.append("ssa-max-abs must be > 0")
        if problems:
            raise ConfigurationError("invalid run config: " + "; ".join(problems))

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> Settings:
        """Read the settings from a run config (keys spelled with dashes; unknown ones ignored).

        Raises
        ------
        ConfigurationError
            If a value has the wrong type or is out of range (the message names the key).
        """
        return replace(settings_from_run_config(cls, run_config), task=task_settings(run_config))


def client_data(context: Context) -> MnistClientSplit:
    """Return this node's MNIST train/validation data.

    Parameters
    ----------
    context : Context
        The node's context: ``node_config`` has ``partition-id`` and ``num-partitions``.

    Returns
    -------
    MnistClientSplit
        ``(x_train, y_train, x_val, y_val)``.

    Raises
    ------
    ConfigurationError
        If the node config lacks the partition keys or a task key is invalid (named).
    """
    try:
        partition_id = int(context.node_config["partition-id"])
        num_partitions = int(context.node_config["num-partitions"])
    except KeyError as err:
        raise ConfigurationError(
            f"node config needs partition-id and num-partitions (missing {err}); start the "
            'SuperNode with --node-config "partition-id=0 num-partitions=2"'
        ) from None
    task = task_settings(context.run_config)
    return mnist_client_split(
        partition_id,
        num_partitions,
        partitioning=task.partitioning,
        alpha=task.dirichlet_alpha,
        seed=task.seed,
        max_samples=task.max_client_samples,
    )


def client_seed(seed: int, server_round: int, partition_id: int) -> int:
    """Return the training seed of one client in one round (reproducible runs)."""
    return seed + 1000 * server_round + partition_id
