"""recsys-movielens: the run settings, each user's click-through data and the model.

One Flower client is one MovieLens-100k user (``partition-id`` = user id). A rating is a
click-through sample of its item, labelled 1 iff the rating is 4 or 5
(:func:`flwr_fsl.data.ctr_samples`: explicit feedback read as CTR, so every sample is a real
interaction and no negatives are sampled); the history of a sample is the user's newest liked
items before it; each user's newest ratings are its test samples (a split by time), the
older ones (at most ``max-rows``) train. The model is :mod:`flwr_fsl.models.din`: an item
table (the user's rows: its training items), a genre table (rows derived from the items
through the public item -> genre map) and dense attention/MLP weights.

Evaluation is centralized: S0 scores the test samples of users ``0 .. num-users - 1`` with the
global model and reports the AUC (a simulation shortcut — in a deployment S0 holds no user's
data; the clients could evaluate locally instead, at the cost of revealing their metrics).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.data import (
    CTRSamples,
    UserCTR,
    ctr_samples,
    load_movielens,
    load_movielens_genres,
)
from flwr_fsl.models.din import GENRE_TABLE, ITEM_TABLE, DINConfig, genre_rows
from flwr_fsl.run_config import settings_from_run_config
from flwr_fsl.submodel.tables import ModelTables, RowMap, TableSpec

__all__ = [
    "ALL_ARMS",
    "CPPS",
    "GENRE_TABLE",
    "ITEM_TABLE",
    "Settings",
    "din_config",
    "held_out_samples",
    "model_tables",
    "settings_config",
    "settings_ctr",
    "user_ctr",
    "user_rows",
]

ALL_ARMS = ("fedavg", "fedsubavg", "secagg", "ssa", "ssa-dp", "sfsl-cpp2", "sfsl-cpp4")
"""Every arm :func:`recsys_movielens.server_app.run_experiment` knows, in its order."""

CPPS: dict[str, tuple[float, float]] = {"cpp2": (15 / 16, 1 / 16), "cpp4": (3 / 4, 1 / 4)}
"""Niu et al.'s client privacy preferences (Table V) of the SFSL arms: ``(keep, flip)`` of
``RRParams.symmetric`` (``p1 = p3 = keep``, ``p2 = p4 = flip``)."""


@dataclass(frozen=True)
class Settings:
    """The app's run config (``[tool.flwr.app.config]``), typed and checked.

    Missing keys take the defaults below (in-process tests pass a partial run config).
    """

    num_server_rounds: int = 10
    fraction_train: float = 0.3
    fraction_evaluate: float = 0.0
    min_nodes: int = 2
    num_users: int = 100
    arms: str = ",".join(ALL_ARMS)
    dim: int = 8
    att_hidden: int = 16
    mlp_hidden: int = 32
    pooling: str = "attention"
    init_std: float = 0.1
    hist_len: int = 10
    max_rows: int = 64
    test_fraction: float = 0.2
    local_epochs: int = 3
    lr: float = 0.01
    batch_size: int = 32
    seed: int = 42
    secagg_threshold: float = 0.6
    clipping_range: float = 8.0
    ssa_helper_address: str = ""
    ssa_helper_fingerprint: str = ""
    ssa_helper_key_file: str = ""
    ssa_helper_token_file: str = ""
    ssa_helper_ca_file: str = ""
    ssa_frac_bits: int = 24
    ssa_max_abs: float = 1e4
    ssa_dp_noise_multiplier: float = 1.0
    ssa_dp_clip_norm: float = 1.0
    ssa_dp_budget_epsilon: float = 0.0
    results_dir: str = ""

    def __post_init__(self) -> None:
        problems = []
        if self.num_server_rounds < 1 or self.min_nodes < 1 or self.num_users < 2:
            problems.append("num-server-rounds and min-nodes must be >= 1, num-users >= 2")
        if not 0.0 < self.fraction_train <= 1.0:
            problems.append("fraction-train must be in (0, 1]")
        if self.fraction_evaluate != 0.0:
            problems.append("fraction-evaluate must be 0 (evaluation is centralized)")
        unknown = sorted(set(self.arm_keys) - set(ALL_ARMS))
        if unknown or not self.arm_keys:
            problems.append(f"arms must be a comma list of {', '.join(ALL_ARMS)}")
        if min(self.dim, self.att_hidden, self.mlp_hidden, self.hist_len, self.max_rows) < 1:
            problems.append("dim, att-hidden, mlp-hidden, hist-len and max-rows must be >= 1")
        if self.pooling not in ("attention", "mean"):
            problems.append("pooling must be 'attention' or 'mean'")
        if self.local_epochs < 1 or self.batch_size < 1 or not self.lr > 0:
            problems.append("local-epochs and batch-size must be >= 1, lr > 0")
        if not 0.0 < self.test_fraction < 1.0 or self.init_std < 0 or self.seed < 0:
            problems.append("test-fraction must be in (0, 1), init-std and seed >= 0")
        if not 0.0 < self.secagg_threshold <= 1.0 or not self.clipping_range > 0:
            problems.append("secagg-threshold must be in (0, 1], clipping-range > 0")
        if not 1 <= self.ssa_frac_bits <= 40 or not self.ssa_max_abs > 0:
            problems.append("ssa-frac-bits must be in [1, 40], ssa-max-abs > 0")
        if not (self.ssa_dp_noise_multiplier >= 0 and self.ssa_dp_budget_epsilon >= 0):
            problems.append("ssa-dp-noise-multiplier and ssa-dp-budget-epsilon must be >= 0")
        if not self.ssa_dp_clip_norm > 0:
            problems.append("ssa-dp-clip-norm must be > 0")
        if problems:
            raise ConfigurationError("invalid run config: " + "; ".join(problems))

    @property
    def arm_keys(self) -> tuple[str, ...]:
        """The arms to run, in :data:`ALL_ARMS` order."""
        chosen = {a.strip() for a in self.arms.split(",") if a.strip()}
        return tuple(a for a in ALL_ARMS if a in chosen) + tuple(sorted(chosen - set(ALL_ARMS)))

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> Settings:
        """Read the settings from a run config (keys spelled with dashes; unknown ones ignored).

        Raises
        ------
        ConfigurationError
            If a value has the wrong type or is out of range (the message names the key).
        """
        return settings_from_run_config(cls, run_config)


@lru_cache(maxsize=1)
def _by_user() -> tuple[tuple[NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]], ...]:
    data = load_movielens()
    order = np.argsort(data.user_ids, kind="stable")
    cuts = np.cumsum(np.bincount(data.user_ids, minlength=data.num_users))[:-1]
    items = np.split(data.item_ids[order], cuts)
    ratings = np.split(data.ratings[order], cuts)
    times = np.split(data.timestamps[order], cuts)
    return tuple(zip(items, ratings, times, strict=True))


@lru_cache(maxsize=4)
def din_config(dim: int, att_hidden: int, mlp_hidden: int, pooling: str) -> DINConfig:
    """Return the model shape on MovieLens-100k (1,682 items, 19 genres)."""
    genres = load_movielens_genres()
    return DINConfig(
        num_items=load_movielens().num_items,
        num_genres=genres.num_genres,
        genre_indptr=genres.indptr,
        genre_indices=genres.indices,
        dim=dim,
        att_hidden=att_hidden,
        mlp_hidden=mlp_hidden,
        pooling=pooling,
    )


def settings_config(settings: Settings) -> DINConfig:
    """Return :func:`din_config` for these settings."""
    return din_config(settings.dim, settings.att_hidden, settings.mlp_hidden, settings.pooling)


@lru_cache(maxsize=4096)
def user_ctr(user: int, hist_len: int, test_fraction: float, max_rows: int) -> UserCTR:
    """Return one user's click-through data (cached per process).

    Raises
    ------
    ConfigurationError
        If ``user`` is not a MovieLens user.
    """
    users = _by_user()
    if not 0 <= user < len(users):
        raise ConfigurationError(f"user must be in [0, {len(users)}), got {user}")
    items, ratings, times = users[user]
    return ctr_samples(
        items,
        ratings,
        times,
        hist_len=hist_len,
        test_fraction=test_fraction,
        max_train=max_rows,
    )


def settings_ctr(settings: Settings, user: int) -> UserCTR:
    """Return :func:`user_ctr` for these settings."""
    return user_ctr(user, settings.hist_len, settings.test_fraction, settings.max_rows)


def user_rows(settings: Settings, user: int) -> dict[str, NDArray[np.int64]]:
    """Return the user's rows of both tables: its training items and their genres."""
    rows = settings_ctr(settings, user).rows
    return {ITEM_TABLE: rows, GENRE_TABLE: genre_rows(settings_config(settings), rows)}


def held_out_samples(settings: Settings) -> CTRSamples:
    """Return the test samples of users ``0 .. num-users - 1``, concatenated."""
    parts = [settings_ctr(settings, u).test for u in range(settings.num_users)]
    return CTRSamples(
        np.concatenate([p.items for p in parts]),
        np.concatenate([p.history for p in parts]),
        np.concatenate([p.labels for p in parts]),
    )


def model_tables(config: DINConfig, max_rows: int) -> ModelTables:
    """Return the model as :class:`~flwr_fsl.submodel.tables.ModelTables`.

    The item table is primary (at most ``max_rows`` rows per client); the genre table is
    derived from it through the public item -> genre map (at most every genre); the attention
    and MLP weights are dense.

    Raises
    ------
    ConfigurationError
        If ``max_rows`` < 1.
    """
    row_map = RowMap(
        np.asarray(config.genre_indptr, np.int64), np.asarray(config.genre_indices, np.int64)
    )
    return ModelTables(
        (
            TableSpec(ITEM_TABLE, max_rows),
            TableSpec(GENRE_TABLE, config.num_genres, derived_from=ITEM_TABLE, row_map=row_map),
        )
    )
