"""recsys-movielens: the ServerApp — one DIN-like CTR model trained by several protocols.

:func:`run_experiment` trains the model of :mod:`recsys_movielens.task` once per arm, from the
same initial weights with the same users sampled each round
(:class:`flwr_fsl.experiment.Experiment`), evaluates the global model after every round on
the held-out samples (centralized AUC) and prints the harness's tables and one comparison
(:func:`comparison_table`): final and best AUC, upload and download bytes per client per
round, client and server seconds per round, and what each party learns. Arms (run-config
``arms``):

- ``fedavg``: FedAvg — the whole model down, every tensor's delta up
  (:class:`~flwr_fsl.strategies.FedSubAvg` on dense replies, sample-weighted);
- ``fedsubavg``: plaintext FedSubAvg — the whole model down, the user's item and genre rows'
  deltas (count-weighted per row) and the dense deltas up;
- ``secagg``: :class:`~flwr_fsl.strategies.SecAggFedAvg` — Bonawitz secure aggregation of the
  whole model's delta (unit weights);
- ``ssa``: Cui et al.'s two-server PSR + SSA on the mixed model
  (:class:`~flwr_fsl.strategies.SecureRowFedSubAvg` with the app's ``ModelTables``: the item
  rows, the genre rows derived from them and the dense tensors as three SSA parts of one
  round; S1 in-process unless ``ssa-helper-address`` names a running ``flwr-fsl-helper``),
  without DP as in the paper — its clients must accept noiseless rounds (node config
  ``fsl-min-noise-multiplier = 0``; the benchmark sets it); ``ssa-dp``: the same at the
  library's DP default (``ssa-dp-*`` keys; ``ssa-dp-budget-epsilon = 0`` accounts the run's
  ``(ε, δ)`` without stopping it);
- ``sfsl-cpp2`` / ``sfsl-cpp4``: Niu et al.'s SFSL as the paper specifies it
  (:class:`~flwr_fsl.strategies.SFSLFedSubAvg` with the app's ``ModelTables``, ``dp=None``,
  ``weighted=True``) at the client privacy preferences CPP2 / CPP4 (Table V): PSU of the item
  sets, randomized response, the genre rows derived from the perturbed item rows, one secure
  count-weighted aggregation of all tables and the dense tensors. Where this checkout lacks the
  several-table SFSL API the table prints them as "not run: <reason>".

Times come from the in-process grid: "client s" is the round's time inside the grid divided
by the clients of the round (clients run one after another in one process, so it is one
client's compute plus its share of the message handling); "server s" is the rest of the
round (S0's own work, including S1 where there is one).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.experiment import (
    Arm,
    ArmRecord,
    ArmSetup,
    Experiment,
    ExperimentResult,
    Metric,
    sampling_kwargs,
)
from flwr_fsl.families.ssa.dp import dp_options
from flwr_fsl.helper import HelperConnection, secure_helper
from flwr_fsl.models.din import auc, initial_arrays, predict
from flwr_fsl.strategies import FedSubAvg, SecAggFedAvg, SecureRowFedSubAvg, SFSLFedSubAvg
from recsys_movielens.client_app import CPP_KEY, SESSION_KEY, UPLOAD_KEY
from recsys_movielens.task import (
    CPPS,
    GENRE_TABLE,
    ITEM_TABLE,
    Settings,
    held_out_samples,
    model_tables,
    settings_config,
)

AUC = Metric("AUC", "auc", digits=4)
LOGLOSS = Metric("logloss", "logloss", digits=4)
LEARNS = {
    "fedavg": {"server": "each user's whole model delta: the rows that moved are its items"},
    "fedsubavg": {
        "server": "each user's item and genre row sets (the movies it rated) and all its deltas"
    },
    "secagg": {
        "server": "only the sum of the finishing users' whole-model deltas and how many "
        "finished; who finished each phase, message sizes"
    },
    "ssa": {
        "S0": "per row of each table the round's sum and count over the users that updated "
        "it, the dense sum; which users replied, message sizes (fixed by max-rows)",
        "S1": "the round's public parameters and pseudorandom key material",
    },
    "sfsl": {
        "server": "the union of the users' item sets; each user's perturbed item set S'' "
        "(eps-LDP randomized response; its genre rows follow from S'' by the public map); "
        "per row the exact sum and count over the users that uploaded it; the dense sum; who "
        "finished each phase"
    },
    "ssa-dp": {
        "S0": "the same sums and counts, each part noised by both servers ((eps, delta)-DP "
        "per the run's account); which users replied, message sizes",
        "S1": "the round's public parameters and pseudorandom key material",
    },
}

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run every arm; print and save the comparison."""
    run_experiment(grid, context.run_config)


@dataclass(frozen=True)
class NotRun:
    """An arm of the run config that this checkout cannot run, and why."""

    key: str
    reason: str


ArmFactory = Callable[[Settings, Mapping[str, Any]], Arm]


def _plain_arms(settings: Settings, knobs: Mapping[str, Any]) -> dict[str, Arm]:
    def fedsubavg(setup: ArmSetup) -> FedSubAvg:
        return FedSubAvg(**knobs)

    def secagg(setup: ArmSetup) -> SecAggFedAvg:
        return SecAggFedAvg(
            **knobs,
            reconstruction_threshold=settings.secagg_threshold,
            clipping_range=settings.clipping_range,
        )

    shape = f"max-rows {settings.max_rows}, dim {settings.dim}, {settings.pooling} pooling"
    return {
        "fedavg": Arm(
            "fedavg",
            "FedAvg",
            fedsubavg,
            learns=LEARNS["fedavg"],
            train_config={UPLOAD_KEY: "dense"},
            description=shape,
        ),
        "fedsubavg": Arm(
            "fedsubavg",
            "FedSubAvg",
            fedsubavg,
            learns=LEARNS["fedsubavg"],
            train_config={UPLOAD_KEY: "rows"},
            description=shape,
        ),
        "secagg": Arm(
            "secagg",
            "SecAgg",
            secagg,
            learns=LEARNS["secagg"],
            train_config={UPLOAD_KEY: "model"},
            description=f"t = {settings.secagg_threshold:.0%} of the sampled users",
        ),
    }


def _ssa_arms(
    settings: Settings, knobs: Mapping[str, Any], helper: HelperConnection, fingerprint: str
) -> dict[str, Arm]:
    """Cui et al.'s PSR + SSA on the mixed model: the paper's (no DP) and the library default."""
    tables = model_tables(settings_config(settings), settings.max_rows)

    def make(dp: bool) -> Callable[[ArmSetup], SecureRowFedSubAvg]:
        noise = settings.ssa_dp_noise_multiplier if dp else 0.0
        options = dp_options(
            noise, settings.ssa_dp_clip_norm, budget_epsilon=settings.ssa_dp_budget_epsilon
        )

        def build(setup: ArmSetup) -> SecureRowFedSubAvg:
            return SecureRowFedSubAvg(  # each start() opens its own S1 session
                helper,
                tables,
                helper_fingerprint=fingerprint,
                frac_bits=settings.ssa_frac_bits,
                max_abs=settings.ssa_max_abs,
                **options,
                **knobs,
            )

        return build

    parts = f"PSR + SSA, parts: item rows <= {settings.max_rows}, genre rows, dense"
    return {
        "ssa": Arm(
            "ssa",
            "SSA/PSR",
            make(dp=False),
            learns=LEARNS["ssa"],
            train_config={UPLOAD_KEY: "model"},
            description=parts + ", no DP (the paper's setting)",
        ),
        "ssa-dp": Arm(
            "ssa-dp",
            "SSA/PSR+DP",
            make(dp=True),
            learns=LEARNS["ssa-dp"],
            train_config={UPLOAD_KEY: "model"},
            description=parts + f", DP z = {settings.ssa_dp_noise_multiplier:g} per part",
        ),
    }


def _sfsl_arms(settings: Settings, knobs: Mapping[str, Any]) -> dict[str, Arm]:
    """Niu et al.'s SFSL on the mixed model, as the paper specifies it, at CPP2 and CPP4."""
    tables = model_tables(settings_config(settings), settings.max_rows)

    def build(setup: ArmSetup) -> SFSLFedSubAvg:
        return SFSLFedSubAvg(
            tables,
            reconstruction_threshold=settings.secagg_threshold,
            clip=settings.clipping_range,
            dp=None,  # the paper's protocol (the library's default adds distributed DP)
            weighted=True,
            **knobs,
        )

    arms = {}
    for cpp, (keep, flip) in CPPS.items():
        arms[f"sfsl-{cpp}"] = Arm(
            f"sfsl-{cpp}",
            f"SFSL {cpp.upper()}",
            build,
            learns=LEARNS["sfsl"],
            train_config={UPLOAD_KEY: "model", CPP_KEY: cpp},
            description=f"randomized response keep {keep:g}, flip {flip:g}; no DP (the paper)",
        )
    return arms


def missing_arms(settings: Settings) -> list[NotRun]:
    """Return the requested arms of protocols this checkout lacks, with the reason."""
    try:
        importlib.import_module("flwr_fsl.families.sfsl.tables")
    except ImportError:
        return [
            NotRun(k, "Niu SFSL on a mixed model (two tables + dense) is not in this build")
            for k in settings.arm_keys
            if k.startswith("sfsl-")
        ]
    return []


def run_experiment(
    grid: Grid, run_config: Mapping[str, Any], helper: HelperConnection | None = None
) -> ExperimentResult:
    """Train every arm of ``arms``; print the harness's tables and :func:`comparison_table`.

    Parameters
    ----------
    grid : Grid
        The grid (Flower's in a ServerApp, or :class:`flwr_fsl.testing.InProcessGrid`).
    run_config : Mapping[str, Any]
        The run config (``[tool.flwr.app.config]`` keys).
    helper : HelperConnection, optional
        S1 of the ``ssa`` arms instead of the one the run config names (its key must match
        the clients' pin); not closed here.

    Returns
    -------
    ExperimentResult
        One arm per runnable key of ``arms``; ``record.extra["comparison"]`` holds the table
        and ``record.extra["not_run"]`` the arms skipped with their reasons.

    Raises
    ------
    ConfigurationError
        If a run-config key is bad (named) or no requested arm can run.
    ExperimentFailedError
        If an arm aggregated no client update in any round.
    """
    settings = Settings.from_run_config(run_config)
    knobs = sampling_kwargs(settings)
    available = _plain_arms(settings, knobs)
    not_run = missing_arms(settings)
    if not not_run:
        available.update(_sfsl_arms(settings, knobs))
    needs_helper = any(k.startswith("ssa") for k in settings.arm_keys)
    with secure_helper(run_config, helper) if needs_helper else nullcontext() as pair:
        if pair is not None:
            available.update(_ssa_arms(settings, knobs, *pair))
        arms = [available[k] for k in settings.arm_keys if k in available]
        if not arms:
            raise ConfigurationError("arms: none of the requested arms can run in this build")
        return _experiment(settings, run_config, arms, not_run).run(grid)


def _experiment(
    settings: Settings, run_config: Mapping[str, Any], arms: list[Arm], not_run: list[NotRun]
) -> Experiment:
    config = settings_config(settings)
    held_out = held_out_samples(settings)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        weights = {k: v.numpy() for k, v in arrays.items()}
        p = np.clip(predict(config, weights, held_out), 1e-7, 1 - 1e-7)
        y = held_out.labels
        logloss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
        return MetricRecord({"auc": auc(y, p), "logloss": logloss})

    initial = initial_arrays(config, settings.seed, settings.init_std)
    return Experiment(
        name="recsys-movielens",
        arms=arms,
        initial_arrays=ArrayRecord({k: Array(v) for k, v in initial.items()}),
        num_rounds=settings.num_server_rounds,
        sampling_seed=settings.seed,
        run_config=run_config,
        metrics=[AUC, LOGLOSS],
        session_keys=[SESSION_KEY],  # SFSL's memo of permanent answers: one per arm
        evaluate_fn=evaluate,
        baseline=arms[0].key,
        results_dir=settings.results_dir or None,
        extras=lambda result: _extras(result, not_run),
    )


def _extras(result: ExperimentResult, not_run: list[NotRun]) -> dict[str, Any]:
    rows = comparison_rows(result)
    for row, run in zip(rows, result.runs, strict=True):
        if isinstance(run.strategy, SecureRowFedSubAvg):
            row["privacy"] = run.strategy.aggregation.describe_privacy()
    print("\n" + comparison_table(rows, not_run), flush=True)
    return {"comparison": rows, "not_run": [{"key": n.key, "reason": n.reason} for n in not_run]}


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def arm_row(record: ArmRecord) -> dict[str, Any]:
    """Return one arm's line of the comparison (JSON-serializable)."""
    rounds = [r for r in record.rounds if r.aggregated]
    aucs = [AUC.value(r) for r in record.rounds]
    scored = [a for a in aucs if a is not None]
    client_s = [
        r.grid_seconds / r.clients for r in rounds if r.grid_seconds is not None and r.clients
    ]
    server_s = [
        r.seconds - r.grid_seconds
        for r in rounds
        if r.seconds is not None and r.grid_seconds is not None
    ]
    return {
        "key": record.key,
        "label": record.label,
        "final_auc": scored[-1] if scored else None,
        "best_auc": max(scored) if scored else None,
        "up_bytes": _mean([r.up_bytes for r in rounds if r.up_bytes is not None]),
        "down_bytes": _mean([r.down_bytes for r in rounds if r.down_bytes is not None]),
        "client_seconds": _mean(client_s),
        "server_seconds": _mean(server_s),
        "clients": _mean([float(r.clients) for r in rounds if r.clients]),
        "learns": "; ".join(f"{party}: {text}" for party, text in record.learns.items()),
    }


def comparison_rows(result: ExperimentResult) -> list[dict[str, Any]]:
    """Return :func:`arm_row` of every arm that ran."""
    return [arm_row(r) for r in result.record.arms]


def _num(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def comparison_table(rows: list[dict[str, Any]], not_run: list[NotRun]) -> str:
    """Return the comparison as text: one line per arm, then what each party learns.

    Parameters
    ----------
    rows : list[dict]
        :func:`comparison_rows`.
    not_run : list[NotRun]
        Arms requested but not runnable here (printed as "not run: <reason>").

    Returns
    -------
    str
        The table.
    """
    head = (
        f"{'arm':<12} {'final AUC':>9} {'best AUC':>9} {'up B/cl/rd':>11} {'down B/cl/rd':>13}"
        f" {'client s':>9} {'server s':>9}"
    )
    lines = ["comparison (per client per round; means over the rounds)", head, "-" * len(head)]
    for row in rows:
        lines.append(
            f"{row['label']:<12} {_num(row['final_auc'], '.4f'):>9} "
            f"{_num(row['best_auc'], '.4f'):>9} {_num(row['up_bytes'], ',.0f'):>11} "
            f"{_num(row['down_bytes'], ',.0f'):>13} {_num(row['client_seconds'], '.3f'):>9} "
            f"{_num(row['server_seconds'], '.3f'):>9}"
        )
    for skipped in not_run:
        lines.append(f"{skipped.key:<12} not run: {skipped.reason}")
    lines.append("")
    lines.append("what each party learns:")
    for row in rows:
        lines.append(f"  {row['label']}: {row['learns']}")
        if row.get("privacy"):
            lines.append(f"    {row['privacy']}")
    return "\n".join(lines)


__all__ = [
    "AUC",
    "GENRE_TABLE",
    "ITEM_TABLE",
    "NotRun",
    "app",
    "arm_row",
    "comparison_rows",
    "comparison_table",
    "missing_arms",
    "run_experiment",
]
