"""dpf-psr-movielens: the run settings; the MovieLens matrix-factorisation task is shared.

The recommender predicts user ``u``'s rating of item ``i`` as

    r_hat(u, i) = mu + b_u + b_i + p_u . q_i

with ``mu`` the global mean rating (a public constant from the run config), ``(p_u, b_u)`` the
user's **personal** parameters (kept in the client's ``Context.state``, never uploaded) and
``(q_i, b_i)`` the item's row of the **global** item table ``item_emb.weight``
(``num_items x (dim + 1)``: the embedding and the bias side by side, so one row is one
mega-element of the secure protocols). One Flower client is one MovieLens user.

A client's submodel is a fixed set of rows: the items of its training ratings, cut to the
public bound ``max-rows`` by a seeded choice that does not change between rounds (so U-DPF
hints apply from the second round on). It trains only on the ratings of those items, in both
the secure and the plaintext run.

The data split, row sets and model (:data:`TABLE`, :func:`user_data`, :func:`train_user`, ...)
are :mod:`flwr_fsl.models.mf`, shared with ``examples/sfsl-movielens``; re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.models.mf import (
    TABLE,
    UserData,
    initial_table,
    initial_user,
    mse,
    num_items,
    num_users,
    predict,
    train_user,
    user_data,
)
from flwr_fsl.run_config import settings_from_run_config

__all__ = [
    "TABLE",
    "Settings",
    "UserData",
    "initial_table",
    "initial_user",
    "mse",
    "num_items",
    "num_users",
    "predict",
    "train_user",
    "user_data",
]


@dataclass(frozen=True)
class Settings:
    """The app's run config (``[tool.flwr.app.config]``), typed and checked.

    Missing keys take the defaults below (in-process tests pass a partial run config).
    """

    num_server_rounds: int = 10
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    min_nodes: int = 2
    dim: int = 16
    init_std: float = 0.1
    global_mean: float = 3.53
    local_epochs: int = 5
    lr: float = 0.05
    reg: float = 0.1
    max_rows: int = 64
    test_fraction: float = 0.2
    seed: int = 42
    ssa_udpf: bool = True
    ssa_helper_address: str = ""
    ssa_helper_fingerprint: str = ""
    ssa_helper_key_file: str = ""
    ssa_helper_token_file: str = ""
    ssa_helper_ca_file: str = ""
    ssa_frac_bits: int = 24
    ssa_max_abs: float = 1e4
    ssa_plaintext_evaluation: bool = True
    ssa_dp_noise_multiplier: float = 1.0
    ssa_dp_clip_norm: float = 1.0
    ssa_dp_budget_epsilon: float = 20.0
    compare_plaintext: bool = True
    results_dir: str = ""

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
        if self.dim < 1 or self.local_epochs < 1 or self.max_rows < 1:
            problems.append("dim, local-epochs and max-rows must be >= 1")
        if not (self.lr > 0 and self.reg >= 0 and self.init_std >= 0):
            problems.append("lr must be > 0, reg and init-std >= 0")
        if not 0.0 < self.test_fraction < 1.0:
            problems.append("test-fraction must be in (0, 1)")
        if not 1 <= self.ssa_frac_bits <= 40 or not self.ssa_max_abs > 0:
            problems.append("ssa-frac-bits must be in [1, 40], ssa-max-abs > 0")
        if not (self.ssa_dp_noise_multiplier >= 0 and self.ssa_dp_budget_epsilon >= 0):
            problems.append("ssa-dp-noise-multiplier and ssa-dp-budget-epsilon must be >= 0")
        if not self.ssa_dp_clip_norm > 0:
            problems.append("ssa-dp-clip-norm must be > 0")
        if self.seed < 0:
            problems.append("seed must be >= 0")
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
        return settings_from_run_config(cls, run_config)
