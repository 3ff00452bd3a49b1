"""sfsl-movielens: the ServerApp — one recommender, every aggregation, one comparison.

The same matrix-factorisation recommender on MovieLens-100k (one client per user; the item
table's rows private) is trained once per arm by :class:`flwr_fsl.experiment.Experiment`:
the same initial table, the same clients each round, fresh personal parameters per arm.

- ``fedavg``: :class:`~flwr_fsl.strategies.FedSubAvg` on dense replies (whole table down and
  up) — exactly FedAvg (every coordinate averaged over every client by ``num-examples``), with
  the round engine's byte log, which Flower's ``FedAvg`` does not keep;
- ``fedsubavg``: the same strategy on row-sparse replies of the user's rows (count 1 each);
- ``sfsl-cpp1`` ... ``sfsl-cpp5``: Niu et al.'s secure federated submodel learning as the
  paper specifies it (``SFSLFedSubAvg(dp=None, weighted=True)``, the library's default before
  issue 20), + ``PerturbedRows`` on the clients; the arm's train config names its CPP
  (``sfsl-cpp``), which the strategy sends with the perturb phase;
- ``sfsl-dp``: :class:`~flwr_fsl.strategies.SFSLFedSubAvg` at its defaults since issue 20
  (distributed DP, unit weights, a run budget; the run config's ``sfsl-dp-*`` settings) with
  the run config's CPP;
- ``ssa-psr``: Cui et al.'s two-server index mode, ``SecureRowFedSubAvg`` + ``PrivateRows``
  (S1 in-process unless ``ssa-helper-address`` names a running ``flwr-fsl-helper``);
- ``secagg``: dense Bonawitz secure aggregation, ``SecAggFedAvg`` + ``secagg_mod``.

Evaluation is federated (``plaintext_evaluation=True`` on the secure strategies: a measurement
channel, the same in every arm), since the personal parameters stay on the clients: every round each
client reports its held-out MSE and the predicted and true ratings of its held-out ratings;
:func:`evaluate_metrics` pools them into the rating-weighted MSE and one AUC over all of them
(a rating >= ``positive-rating`` is a positive). After the harness's tables it prints
:func:`comparison_table`: metric, bytes, time, the randomized response's ε, the DP ``(ε, δ)`` of
the aggregates and what the server learns, one row per arm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from flwr_fsl.core.privacy import PrivacyBudget
from flwr_fsl.experiment import (
    Arm,
    ArmRun,
    ArmSetup,
    Experiment,
    ExperimentResult,
    Metric,
    sampling_kwargs,
)
from flwr_fsl.families.sfsl.dp import SFSLDP
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.helper import HelperConnection, secure_helper
from flwr_fsl.strategies import FedSubAvg, SecAggFedAvg, SFSLFedSubAvg
from sfsl_movielens.client_app import CPP_KEY, REPLY_KEY, TRAINING_ID
from sfsl_movielens.task import TABLE, Settings, auc, initial_table, rr_params

AUC = Metric("AUC", "auc", source="evaluate")
MSE = Metric("MSE", "mse", source="evaluate")
CLIENT_S = Metric("client s", "client-s", source="evaluate", digits=3)
UNION = Metric("union", "union-size", source="train", digits=0)

LABELS = {
    "fedavg": "fedavg (dense)",
    "fedsubavg": "fedsubavg (rows)",
    "ssa-psr": "ssa-psr (2 servers)",
    "secagg": "secagg (dense)",
}
SERVER_LEARNS = {
    "fedavg": "each client's update (and row set)",
    "fedsubavg": "each client's update (and row set)",
    "sfsl": "union, each client's ε-LDP perturbed set, exact per-row aggregates",
    "sfsl-dp": "each client's ε-LDP perturbed set, (ε, δ)-DP noisy union and per-row sums",
    "ssa-psr": "aggregate only (two non-colluding servers)",
    "secagg": "aggregate only",
}
LEARNS = {
    "fedavg": {
        "server": "each client's whole trained table: its update, and from the rows that "
        "moved its row set"
    },
    "fedsubavg": {"server": "each user's row set (the items it rated) and its row deltas"},
    "sfsl": {
        "server": "the union of the clients' row sets; each client's perturbed set S'' "
        "(ε-LDP: ε1 per round, ε∞ over its memo's lifetime); per row its participants and the "
        "exact count-weighted aggregate over them, which over rounds with changing participants "
        "decodes every client's rows (tests/attacks/test_sfsl_*)",
        "clients": "the union; for their own rows of S'', which other clients hold them too",
    },
    "sfsl-dp": {
        "server": "each client's perturbed set S'' (ε-LDP); who took part; the noisy union and "
        "per-row noisy sums, (ε, δ)-DP over the run (logged every round, stopped at its budget)",
        "clients": "the noisy union; for their own rows of S'', which other clients hold them too",
    },
    "ssa-psr": {
        "S0": "per row the round's weighted sum and total weight (no client weight)",
        "S1": "the round's public parameters and pseudorandom key material",
    },
    "secagg": {
        "server": "the sum over the clients that finished (the new model; with weighted=True "
        "their total num-examples, each client's over rounds)"
    },
}

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train every arm and print the comparison."""
    run_experiment(grid, context.run_config)


def evaluate_metrics(contents: list[RecordDict], weight_key: str) -> MetricRecord:
    """Pool the clients' evaluate replies: weighted MSE, one AUC, mean client seconds."""
    weights, mses, baselines, seconds = [], [], [], []
    scores: list[float] = []
    labels: list[int] = []
    for content in contents:
        record = next(iter(content.metric_records.values()))
        weights.append(float(record[weight_key]))  # type: ignore[arg-type]
        mses.append(float(record["mse"]))  # type: ignore[arg-type]
        baselines.append(float(record["mean-only-mse"]))  # type: ignore[arg-type]
        scores.extend(record["scores"])  # type: ignore[arg-type]
        labels.extend(record["labels"])  # type: ignore[arg-type]
        if "client-s" in record:
            seconds.append(float(record["client-s"]))  # type: ignore[arg-type]
    w = np.asarray(weights)
    out = MetricRecord(
        {
            "mse": float(np.dot(w, mses) / w.sum()),
            "mean-only-mse": float(np.dot(w, baselines) / w.sum()),
            "ratings": len(scores),
        }
    )
    area = auc(scores, labels)
    if area is not None:
        out["auc"] = area
    if seconds:
        out["client-s"] = float(np.mean(seconds))
    return out


def _family(arm: str) -> str:
    """Return the key of an arm's LEARNS entry: ``sfsl`` for the paper's CPP arms."""
    return arm if arm == "sfsl-dp" or not arm.startswith("sfsl-") else "sfsl"


def _epsilons(run: ArmRun) -> tuple[float | None, float | None]:
    """Return the randomized response's ``ε1, ε∞`` of an SFSL arm (its train config's CPP)."""
    if not run.arm.key.startswith("sfsl-"):
        return None, None
    rr = rr_params(str(run.arm.train_config[CPP_KEY]))
    return rr.epsilon_one_round, rr.epsilon_permanent


def _dp_epsilon(run: ArmRun) -> str:
    """Return the DP ``ε`` the aggregates of an SFSL arm spent (``inf`` without noise)."""
    if not run.arm.key.startswith("sfsl-"):
        return "n/a"
    account = getattr(run.strategy, "privacy_account", None)
    return "inf" if account is None else f"{account.epsilon():.2f}"


def _eps(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "inf" if math.isinf(value) else f"{value:.2f}"


def _num(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def comparison_table(result: ExperimentResult) -> tuple[str, list[dict[str, Any]]]:
    """Return the one-row-per-arm comparison (text) and its rows (JSON-serializable).

    Columns: final AUC and MSE, bytes per client per round of the training phases (down, up;
    evaluation's download of the whole table, the same in every arm, is not included),
    server seconds per round (outside the grid: S0's own work, and S1's for ``ssa-psr``),
    client seconds per round (mean per client, every training message of the round, mods
    included), ε1 and ε∞ of the CPP, the ε (at δ = 1e-5) of the aggregates' DP over the run
    (``inf``: no noise, the per-row sums are exact) and what the server learns.
    """
    rows = []
    for run in result.runs:
        record, key = run.record, run.arm.key
        eps1, eps_inf = _epsilons(run)
        server = [s for r in record.rounds if (s := r.server_seconds) is not None]
        rows.append(
            {
                "arm": key,
                "auc": record.final(AUC),
                "mse": record.final(MSE),
                "down_bytes": record.mean("down_bytes"),
                "up_bytes": record.mean("up_bytes"),
                "server_s": sum(server) / len(server) if server else None,
                "client_s": _mean([CLIENT_S.value(r) for r in record.rounds]),
                "eps1": eps1,
                "eps_inf": eps_inf,
                "dp_eps": _dp_epsilon(run),
                "learns": SERVER_LEARNS[_family(key)],
            }
        )
    width = max(len("arm"), *(len(r["arm"]) for r in rows))
    header = (
        f"{'arm':<{width}}  {'AUC':>6}  {'MSE':>6}  {'down B/cl/rd':>12}  {'up B/cl/rd':>12}"
        f"  {'server s/rd':>11}  {'client s/rd':>11}  {'ε1':>5}  {'ε∞':>5}  {'DP ε':>5}"
        "  server learns"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['arm']:<{width}}  {_num(r['auc'], '.4f'):>6}  {_num(r['mse'], '.4f'):>6}"
            f"  {_num(r['down_bytes'], ',.0f'):>12}  {_num(r['up_bytes'], ',.0f'):>12}"
            f"  {_num(r['server_s'], '.3f'):>11}  {_num(r['client_s'], '.3f'):>11}"
            f"  {_eps(r['eps1']):>5}  {_eps(r['eps_inf']):>5}  {r['dp_eps']:>5}  {r['learns']}"
        )
    # JSON has no infinity: the epsilons are saved as their printed text.
    saved = [{**r, "eps1": _eps(r["eps1"]), "eps_inf": _eps(r["eps_inf"])} for r in rows]
    return "\n".join(lines), saved


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _extras(result: ExperimentResult) -> dict[str, Any]:
    table, rows = comparison_table(result)
    print("\ncomparison (bytes per client per round, training phases):", flush=True)
    print(table, flush=True)
    return {"comparison": rows}


def run_experiment(
    grid: Grid, run_config: Mapping[str, Any], helper: HelperConnection | None = None
) -> ExperimentResult:
    """Train every arm of the run config's ``arms`` and print the comparison.

    Parameters
    ----------
    grid : Grid
        The grid (Flower's in a ServerApp, or :class:`flwr_fsl.testing.InProcessGrid`).
    run_config : Mapping[str, Any]
        The run config (``[tool.flwr.app.config]`` keys).
    helper : HelperConnection, optional
        S1 for ``ssa-psr`` instead of the one the run config names (its key must still match
        the clients' pin); not closed here.

    Returns
    -------
    ExperimentResult
        One run per arm, keyed by the arm's name.

    Raises
    ------
    ExperimentFailedError
        If an arm aggregated no client update in any round.
    """
    settings = Settings.from_run_config(run_config)
    names = settings.arm_list
    s1: AbstractContextManager[tuple[HelperConnection | None, str]] = (
        secure_helper(run_config, helper) if "ssa-psr" in names else nullcontext((None, ""))
    )
    with s1 as (connection, fingerprint):
        return _run(grid, run_config, settings, connection, fingerprint)


def _run(
    grid: Grid,
    run_config: Mapping[str, Any],
    settings: Settings,
    connection: HelperConnection | None,
    fingerprint: str,
) -> ExperimentResult:
    """Build the arms (``ssa-psr`` on ``connection``) and run the experiment."""
    names = settings.arm_list
    knobs = sampling_kwargs(settings)
    table = initial_table(settings)
    shape = f"table {table.shape}, max-rows {settings.max_rows}"

    def fedsubavg(setup: ArmSetup) -> Strategy:
        return FedSubAvg(evaluate_metrics_aggr_fn=evaluate_metrics, **knobs)

    def sfsl(setup: ArmSetup, paper: bool = True) -> Strategy:
        # The paper's protocol (the library's default before issue 20), or today's defaults.
        privacy: dict[str, Any] = {"dp": None, "weighted": True}
        if not paper:
            privacy = {
                "dp": SFSLDP(
                    noise_multiplier=settings.sfsl_dp_noise_multiplier,
                    clip_norm=settings.sfsl_dp_clip_norm,
                    max_rows=settings.sfsl_dp_max_rows,
                ),
                "privacy_budget": PrivacyBudget(settings.sfsl_dp_epsilon, 1e-5),
            }
        strategy = SFSLFedSubAvg(
            TABLE,
            reconstruction_threshold=settings.sfsl_threshold,
            clip=settings.clip,
            frac_bits=settings.sfsl_frac_bits,
            plaintext_evaluation=True,  # the pooled AUC needs the clients' evaluate replies
            **privacy,
            **knobs,
        )
        # SFSLFedSubAvg takes no evaluate_metrics_aggr_fn argument; FedAvg keeps it here.
        strategy.evaluate_metrics_aggr_fn = evaluate_metrics
        return strategy

    def sfsl_dp(setup: ArmSetup) -> Strategy:
        return sfsl(setup, paper=False)

    def ssa_psr(setup: ArmSetup) -> Strategy:
        assert connection is not None
        return SecureRowFedSubAvg(
            connection,
            TABLE,
            settings.max_rows,
            helper_fingerprint=fingerprint,
            udpf=settings.ssa_udpf,
            frac_bits=settings.ssa_frac_bits,
            max_abs=settings.ssa_max_abs,
            evaluate_metrics_aggr_fn=evaluate_metrics,
            # Every arm is compared on federated evaluation (the personal parameters stay on
            # the clients): the secure arm opts in, its evaluate replies reach S0 in the clear.
            plaintext_evaluation=settings.fraction_evaluate > 0,
            **knobs,
        )

    def secagg(setup: ArmSetup) -> Strategy:
        # Sample weights (to equal the fedavg arm) and federated evaluation (every arm's AUC)
        # are SecAggFedAvg's two documented opt-in leaks; its defaults are unit weights and
        # no federated evaluation.
        return SecAggFedAvg(
            weighted=True,
            plaintext_evaluation=knobs["fraction_evaluate"] > 0,
            evaluate_metrics_aggr_fn=evaluate_metrics,
            reconstruction_threshold=settings.secagg_threshold,
            clipping_range=settings.clip,
            train_metrics=("train-mse",),
            frac_bits=settings.secagg_frac_bits,
            **knobs,
        )

    arms = []
    for name in names:
        factory: Callable[[ArmSetup], Strategy]
        config: dict[str, str] = {}
        equivalent: str | None = None
        description = shape
        if name == "fedavg":
            factory, config = fedsubavg, {REPLY_KEY: "dense"}
        elif name == "fedsubavg":
            factory, config = fedsubavg, {REPLY_KEY: "rows"}
        elif name == "sfsl-dp":
            rr = rr_params(settings.sfsl_cpp)
            factory, config = sfsl_dp, {CPP_KEY: settings.sfsl_cpp}
            description = (
                f"{shape}, RR keep {rr.p1:g}, flip {rr.p2:g}, DP z "
                f"{settings.sfsl_dp_noise_multiplier:g}, epsilon <= {settings.sfsl_dp_epsilon:g}"
            )
        elif name.startswith("sfsl-"):
            cpp = name.removeprefix("sfsl-")
            keep, flip = rr_params(cpp).p1, rr_params(cpp).p2
            factory, config = sfsl, {CPP_KEY: cpp}
            description = f"{shape}, RR keep {keep:g}, flip {flip:g}"
            # With keep = 1 every real row is uploaded (S'' \ S adds zero rows with count 0).
            equivalent = "fedsubavg" if keep == 1.0 else None
        elif name == "ssa-psr":
            factory, equivalent = ssa_psr, "fedsubavg"
        else:
            factory, equivalent = secagg, "fedavg"
        arms.append(
            Arm(
                name,
                LABELS.get(name, name),
                factory,
                learns=LEARNS[_family(name)],
                train_config=config,
                equivalent_to=equivalent if equivalent in names else None,
                description=description,
            )
        )
    experiment = Experiment(
        name="sfsl-movielens",
        arms=arms,
        initial_arrays=ArrayRecord({TABLE: Array(table)}),
        num_rounds=settings.num_server_rounds,
        sampling_seed=settings.seed,
        run_config=run_config,
        metrics=[AUC, MSE, CLIENT_S, UNION],
        session_keys=[TRAINING_ID],  # fresh personal parameters and RR memo per arm
        baseline="fedavg" if "fedavg" in names else names[0],
        results_dir=settings.results_dir or None,
        extras=_extras,
    )
    return experiment.run(grid)
