"""dpf-psr-movielens: the ServerApp — S0 of private retrieval and secure aggregation of rows.

The ServerApp trains the item table of a matrix-factorisation recommender with
:class:`~flwr_fsl.families.ssa.index_strategy.SecureRowFedSubAvg` (index mode, Cui et al. §4–§6):
every round each client retrieves its item rows with two-server PSR, trains, and uploads the row
deltas as mega-elements (``dim + 1`` values and a count word) through SSA; from its second
round on, with an unchanged row set, only a U-DPF hint. S1 is a running ``flwr-fsl-helper`` when
``ssa-helper-address`` is set (its key pinned by ``ssa-helper-fingerprint`` or
``ssa-helper-key-file``), else an in-process twin with the key pair in ``ssa-helper-key-file``
(created if missing; by default ``$FLWR_HOME/fsl/...pem``).

With ``compare-plaintext = true`` it also trains plaintext :class:`~flwr_fsl.strategies.FedSubAvg`
(the whole table down, the same rows' deltas up) from the same table and client sample
(:class:`flwr_fsl.experiment.Experiment`) and prints the harness's tables — RMSE on the users'
held-out ratings, U-DPF clients, bytes per client per round (PSR + train phases), time — the
summary, what each party learns, the largest difference between the final tables, and the
secure arm's train upload in fresh-key rounds vs U-DPF rounds, and the secure run's ``(ε, δ)``
(DP is on by default in index mode: ``ssa-dp-*`` keys; the run stops at its budget).
Evaluation is federated (the personal user parameters never leave the clients), which the
secure arm accepts only because the run config opts in (``ssa-plaintext-evaluation = true``):
each evaluated user's test MSE and rating count reach S0 in the clear. Each user counts 1 per
item row it updated (its per-row counts are 1 anyway: one rating per item).

:func:`run_experiment` is the whole experiment on any :class:`~flwr.serverapp.Grid`; the tests
call it with :class:`~flwr_fsl.testing.InProcessGrid`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import Array, ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from dpf_psr_movielens.client_app import TRAINING_ID
from dpf_psr_movielens.task import TABLE, Settings, initial_table
from flwr_fsl.experiment import (
    Arm,
    ArmRecord,
    Experiment,
    ExperimentResult,
    Metric,
    sampling_kwargs,
)
from flwr_fsl.families.ssa.dp import dp_options
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.helper import HelperConnection, secure_helper
from flwr_fsl.strategies import FedSubAvg

RMSE = Metric("RMSE", "mse", source="evaluate", sqrt=True)
UDPF = Metric("U-DPF", "udpf-clients", source="train", digits=0)  # clients that sent a hint
MEAN_ONLY = Metric("mean-only RMSE", "mean-only-mse", source="evaluate", sqrt=True)
SECURE_LEARNS = {
    "S0": "per row the round's sum and how many users updated it; each evaluated user's "
    "test MSE and rating count (client-side evaluation, opted in)",
    "S1": "the round's public parameters and pseudorandom key material",
}
PLAIN_LEARNS = {"server": "each user's row set (the items it rated) and its row deltas"}

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the secure training (and the plaintext comparison); print and save the results."""
    run_experiment(grid, context.run_config)


def udpf_upload(record: ArmRecord) -> dict[str, Any]:
    """Print and return the train upload per client: fresh-key rounds vs U-DPF-hint rounds."""
    kinds: dict[str, list[int]] = {"fresh SSA keys": [], "U-DPF hints": [], "mixed": []}
    upload = {}
    for r in record.rounds:
        train, hints = r.phases.get("train"), UDPF.value(r)
        if train is not None and hints is not None:
            every = hints == train.nodes
            kinds["fresh SSA keys" if hints == 0 else "U-DPF hints" if every else "mixed"].append(
                r.server_round
            )
            upload[r.server_round] = train.up_bytes
    mean = {k: sum(upload[n] for n in v) / len(v) for k, v in kinds.items() if v}
    print(f"\n{'secure train upload':<20}  {'rounds':>10}  {'B/client':>9}", flush=True)
    for kind, rounds in kinds.items():
        if kind == "mixed" and not rounds:
            continue
        run = len(rounds) > 2 and rounds == list(range(rounds[0], rounds[-1] + 1))
        text = f"{rounds[0]}-{rounds[-1]}" if run else ",".join(map(str, rounds))
        print(f"{kind:<20}  {text or '-':>10}  {_fmt(mean.get(kind)):>9}", flush=True)
    out: dict[str, Any] = {"rounds": kinds, "mean_up_bytes": mean}
    if "fresh SSA keys" in mean and "U-DPF hints" in mean:
        out["udpf_share"] = mean["U-DPF hints"] / mean["fresh SSA keys"]
        print(f"U-DPF upload = {out['udpf_share']:.1%} of a fresh-key upload", flush=True)
    return out


def privacy_line(result: ExperimentResult) -> str:
    """Print and return the secure arm's ``(ε, δ)`` (or that it added no noise)."""
    strategy = result.arm("secure").strategy
    assert isinstance(strategy, SecureRowFedSubAvg)
    line = strategy.aggregation.describe_privacy()
    print(f"\nsecure arm, {line}", flush=True)
    return line


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def run_experiment(
    grid: Grid, run_config: Mapping[str, Any], helper: HelperConnection | None = None
) -> ExperimentResult:
    """Train through PSR + SSA and, with ``compare-plaintext``, in plaintext; print and save.

    Parameters
    ----------
    grid : Grid
        The grid (Flower's in a ServerApp, or :class:`flwr_fsl.testing.InProcessGrid`).
    run_config : Mapping[str, Any]
        The run config (``[tool.flwr.app.config]`` keys).
    helper : HelperConnection, optional
        S1 to use instead of the one the run config names (its key must still match the
        clients' pin); not closed here.

    Returns
    -------
    ExperimentResult
        Arms ``"secure"`` and (with ``compare-plaintext``) ``"plaintext"``.

    Raises
    ------
    ExperimentFailedError
        If an arm aggregated no client update in any round (e.g. every client failed).
    """
    settings = Settings.from_run_config(run_config)
    with secure_helper(run_config, helper) as (connection, fingerprint):
        knobs = sampling_kwargs(settings)
        compare = settings.compare_plaintext
        table = initial_table(settings)
        shape = f"max-rows {settings.max_rows}, table {table.shape}"
        arms = [
            Arm(
                "secure",
                "secure (PSR+SSA)",
                lambda setup: SecureRowFedSubAvg(
                    connection,
                    TABLE,
                    settings.max_rows,
                    helper_fingerprint=fingerprint,
                    udpf=settings.ssa_udpf,
                    frac_bits=settings.ssa_frac_bits,
                    max_abs=settings.ssa_max_abs,
                    plaintext_evaluation=settings.ssa_plaintext_evaluation,
                    **dp_options(
                        settings.ssa_dp_noise_multiplier,
                        settings.ssa_dp_clip_norm,
                        budget_epsilon=settings.ssa_dp_budget_epsilon,
                    ),
                    **knobs,
                ),
                learns=SECURE_LEARNS,
                equivalent_to="plaintext" if compare else None,
                description=shape,
            )
        ]
        if compare:
            arms.append(
                Arm(
                    "plaintext",
                    "plaintext",
                    lambda setup: FedSubAvg(**knobs),
                    learns=PLAIN_LEARNS,
                    description=shape,
                )
            )
        experiment = Experiment(
            name="dpf-psr-movielens",
            arms=arms,
            initial_arrays=ArrayRecord({TABLE: Array(table)}),
            num_rounds=settings.num_server_rounds,
            sampling_seed=settings.seed,
            run_config=run_config,
            metrics=[RMSE, UDPF, MEAN_ONLY],
            session_keys=[TRAINING_ID],  # clients start fresh personal parameters per arm
            baseline="plaintext" if compare else "secure",
            results_dir=settings.results_dir or None,
            extras=lambda result: {
                "udpf_upload": udpf_upload(result.record.arm("secure")),
                "privacy": privacy_line(result),
            },
        )
        return experiment.run(grid)
