"""sfsl-movielens: the run settings, the CPPs and the AUC; the MovieLens MF task is shared.

The data split, row sets and model (:data:`TABLE`, :func:`user_data`, :func:`train_user`, ...)
are :mod:`flwr_fsl.models.mf`, shared with ``examples/dpf-psr-movielens``; re-exported here. The
recommender predicts user ``u``'s rating of item ``i`` as

    r_hat(u, i) = mu + b_u + b_i + p_u . q_i

with ``mu`` the global mean rating (a public constant from the run config), ``(p_u, b_u)`` the
user's **personal** parameters (kept in the client's ``Context.state``, never uploaded) and
``(q_i, b_i)`` the item's row of the **global** item table ``item_emb.weight``
(``num_items x (dim + 1)``: the embedding and the bias side by side, so one row is one
mega-element of the secure protocols). One Flower client is one MovieLens user.

A client's submodel is a fixed set of rows: the items of its training ratings, cut to the
public bound ``max-rows`` by a seeded choice that does not change between rounds. It trains
only on the ratings of those items (in Niu et al.'s SFSL: of those it kept in its perturbed
set ``S''``).

The arms' names (``sfsl-cpp1`` ... ``sfsl-cpp5``: Niu et al.'s protocol as the paper specifies
it, the library's default before issue 20; ``sfsl-dp``: the library's defaults since, with
distributed DP), the five client privacy preferences (CPPs) of Niu et al.'s Table V and the
AUC on held-out ratings (a rating of at least ``positive-rating`` is a positive, the predicted
rating is the score) are defined here too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.sfsl.perturb import RRParams
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
    "ARMS",
    "CPPS",
    "SFSL_ARMS",
    "TABLE",
    "Settings",
    "UserData",
    "auc",
    "initial_table",
    "initial_user",
    "mse",
    "num_items",
    "num_users",
    "predict",
    "rr_params",
    "train_user",
    "user_data",
]

# Niu et al.'s client privacy preferences (Table V): RRParams.symmetric(keep, flip), i.e.
# p1 = p3 = keep and p2 = p4 = flip.
CPPS: dict[str, tuple[float, float]] = {
    "cpp1": (1.0, 0.0),
    "cpp2": (15 / 16, 1 / 16),
    "cpp3": (7 / 8, 1 / 8),
    "cpp4": (3 / 4, 1 / 4),
    "cpp5": (1.0, 1.0),
}
SFSL_ARMS = (*(f"sfsl-{name}" for name in CPPS), "sfsl-dp")
ARMS = ("fedavg", "fedsubavg", *SFSL_ARMS, "ssa-psr", "secagg")


def rr_params(cpp: str) -> RRParams:
    """Return the randomized-response probabilities of a CPP (``"cpp1"`` ... ``"cpp5"``).

    Raises
    ------
    ValueError
        If ``cpp`` is not one of :data:`CPPS`.
    """
    if cpp not in CPPS:
        raise ValueError(f"unknown CPP {cpp!r}: one of {', '.join(CPPS)}")
    return RRParams.symmetric(*CPPS[cpp])


@dataclass(frozen=True)
class Settings:
    """The app's run config (``[tool.flwr.app.config]``), typed and checked.

    Missing keys take the defaults below (in-process tests pass a partial run config).
    """

    num_server_rounds: int = 5
    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    min_nodes: int = 2
    arms: str = ",".join(ARMS)
    dim: int = 16
    init_std: float = 0.1
    global_mean: float = 3.53
    local_epochs: int = 5
    lr: float = 0.05
    reg: float = 0.1
    max_rows: int = 64
    test_fraction: float = 0.2
    seed: int = 42
    positive_rating: float = 4.0
    clip: float = 8.0
    sfsl_threshold: float = 0.6
    sfsl_frac_bits: int = 24
    sfsl_cpp: str = "cpp2"
    sfsl_dp_noise_multiplier: float = 1.0
    sfsl_dp_clip_norm: float = 1.0
    sfsl_dp_max_rows: int = 32
    sfsl_dp_epsilon: float = 20.0
    secagg_threshold: float = 0.6
    secagg_frac_bits: int = 24
    ssa_udpf: bool = True
    ssa_helper_address: str = ""
    ssa_helper_fingerprint: str = ""
    ssa_helper_key_file: str = ""
    ssa_helper_token_file: str = ""
    ssa_helper_ca_file: str = ""
    ssa_frac_bits: int = 24
    ssa_max_abs: float = 1e4
    results_dir: str = ""

    def __post_init__(self) -> None:
        problems = []
        if self.num_server_rounds < 1:
            problems.append("num-server-rounds must be >= 1")
        if not 0.0 < self.fraction_train <= 1.0:
            problems.append("fraction-train must be in (0, 1]")
        if not 0.0 < self.fraction_evaluate <= 1.0:
            problems.append("fraction-evaluate must be in (0, 1] (MSE and AUC are federated)")
        if self.min_nodes < 2:
            problems.append("min-nodes must be >= 2 (secure aggregation needs two clients)")
        if self.dim < 1 or self.local_epochs < 1 or self.max_rows < 1:
            problems.append("dim, local-epochs and max-rows must be >= 1")
        if not (self.lr > 0 and self.reg >= 0 and self.init_std >= 0):
            problems.append("lr must be > 0, reg and init-std >= 0")
        if not 0.0 < self.test_fraction < 1.0:
            problems.append("test-fraction must be in (0, 1)")
        if not (math.isfinite(self.clip) and self.clip > 0):
            problems.append("clip must be finite and > 0")
        if not (0.0 < self.sfsl_threshold <= 1.0 and 0.0 < self.secagg_threshold <= 1.0):
            problems.append("sfsl-threshold and secagg-threshold must be in (0, 1]")
        for name, bits in (
            ("sfsl-frac-bits", self.sfsl_frac_bits),
            ("secagg-frac-bits", self.secagg_frac_bits),
            ("ssa-frac-bits", self.ssa_frac_bits),
        ):
            if not 1 <= bits <= 40:
                problems.append(f"{name} must be in [1, 40]")
        if not self.ssa_max_abs > 0:
            problems.append("ssa-max-abs must be > 0")
        if self.sfsl_cpp not in CPPS:
            problems.append(f"sfsl-cpp must be one of {', '.join(CPPS)}")
        for name, value in (
            ("sfsl-dp-noise-multiplier", self.sfsl_dp_noise_multiplier),
            ("sfsl-dp-clip-norm", self.sfsl_dp_clip_norm),
            ("sfsl-dp-max-rows", self.sfsl_dp_max_rows),
            ("sfsl-dp-epsilon", self.sfsl_dp_epsilon),
        ):
            if not value > 0:
                problems.append(f"{name} must be > 0")
        if self.seed < 0:
            problems.append("seed must be >= 0")
        arms = self.arm_list
        unknown = [a for a in arms if a not in ARMS]
        if not arms or unknown or len(set(arms)) != len(arms):
            problems.append(f"arms must be distinct names from {', '.join(ARMS)}")
        if problems:
            raise ConfigurationError("invalid run config: " + "; ".join(problems))

    @property
    def arm_list(self) -> list[str]:
        """The arms to run, in order (``arms`` split at commas)."""
        return [a.strip() for a in self.arms.split(",") if a.strip()]

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> Settings:
        """Read the settings from a run config (keys spelled with dashes; unknown ones ignored).

        Raises
        ------
        ConfigurationError
            If a value has the wrong type or is out of range (the message names the key).
        """
        return settings_from_run_config(cls, run_config)


def auc(scores: ArrayLike, labels: ArrayLike) -> float | None:
    """Return the ROC AUC of ``scores`` for binary ``labels`` (ties count one half).

    The Mann-Whitney statistic with average ranks: the probability that a random positive
    scores above a random negative. None when one class is missing.
    """
    s = np.asarray(scores, np.float64).reshape(-1)
    y = np.asarray(labels).reshape(-1).astype(bool)
    if s.shape != y.shape:
        raise ValueError("scores and labels must have one length")
    positives = int(np.count_nonzero(y))
    negatives = y.size - positives
    if positives == 0 or negatives == 0:
        return None
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based, ties share the mean rank
    rank_sum = float(np.sum(average_rank[inverse][y]))
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)
