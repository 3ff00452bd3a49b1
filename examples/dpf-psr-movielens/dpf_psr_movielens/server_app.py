"""dpf-psr-movielens: the ServerApp — S0 of private retrieval and secure aggregation of rows.

The ServerApp trains the item table of a matrix-factorisation recommender with
:class:`~flwr_fsl.strategies.index.SecureRowFedSubAvg` (index mode, Cui et al. §4–§6): every
round each client retrieves its item rows with two-server PSR, trains, and uploads the row
deltas as mega-elements (``dim + 1`` values and a count word) through SSA; from its second
round on, with an unchanged row set, only a U-DPF hint. S1 is

- a running ``flwr-fsl-helper`` when ``ssa-helper-address`` is set (S1's key pinned by
  ``ssa-helper-fingerprint`` or ``ssa-helper-key-file``), or
- an in-process twin (:class:`~flwr_fsl.helper.InProcessHelper`) with the key pair in
  ``ssa-helper-key-file`` (created if missing; by default ``$FLWR_HOME/fsl/...pem``).

With ``compare-plaintext = true`` it trains again from the same table with plaintext
:class:`~flwr_fsl.strategies.FedSubAvg` (the whole table down, the same rows' deltas up) and
prints RMSE on the users' held-out ratings per round, bytes per client per round for both,
the U-DPF rounds' upload against the fresh-key round, and the largest difference between the
two final tables. Evaluation is federated (the personal user parameters never leave the
clients): each round every sampled client reports its held-out squared error.

:func:`run_experiment` is the whole experiment on any :class:`~flwr.serverapp.Grid`; the tests
call it with :class:`~flwr_fsl.testing.InProcessGrid`.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result
from numpy.typing import NDArray

from dpf_psr_movielens.client_app import TRAINING_ID
from dpf_psr_movielens.task import TABLE, Settings, initial_table
from flwr_fsl.helper import HelperConnection, connect_helper, pinned_fingerprint, verify_helper
from flwr_fsl.strategies import FedSubAvg
from flwr_fsl.strategies.index import SecureRowFedSubAvg

SECURE_LABEL = "secure (PSR+SSA)"
PLAIN_LABEL = "plaintext"
HISTORY_FILE = "dpf-psr-movielens.json"

app = ServerApp()


@dataclass
class RoundStats:
    """One round of one training.

    Attributes
    ----------
    server_round : int
        The round (1-based).
    rmse : float | None
        RMSE on the evaluated clients' held-out ratings after the round.
    mean_only_rmse : float | None
        RMSE of predicting the global mean (the same clients and ratings).
    down_bytes, up_bytes : float
        Mean bytes per training client in the round's training phases (retrieval + train).
    train_up_bytes : float
        Mean bytes per client of the train reply alone (SSA keys or a U-DPF hint).
    eval_down_bytes : float
        Mean bytes per client of the evaluate message (the whole table, both runs).
    udpf_clients : int
        Clients that sent a U-DPF hint instead of fresh keys.
    clients : int
        Clients whose update was aggregated.
    """

    server_round: int
    rmse: float | None
    mean_only_rmse: float | None
    down_bytes: float
    up_bytes: float
    train_up_bytes: float
    eval_down_bytes: float
    udpf_clients: int
    clients: int


@dataclass
class TrainingRun:
    """One federated training of the experiment.

    Attributes
    ----------
    label : str
        ``"secure (PSR+SSA)"`` or ``"plaintext"``.
    rounds : list[RoundStats]
        Per-round RMSE and traffic.
    table : numpy.ndarray
        The final item table.
    seconds : float
        Wall time of the training.
    strategy : FedSubAvg
        The strategy after the run (``traffic``, ``dropped``, ``failed_rounds``).
    result : Result
        What ``strategy.start`` returned (per-round client metrics, final arrays).
    """

    label: str
    rounds: list[RoundStats] = field(default_factory=list)
    table: NDArray[np.float32] = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    seconds: float = 0.0
    strategy: FedSubAvg | None = None
    result: Result | None = None

    @property
    def final_rmse(self) -> float | None:
        """RMSE after the last evaluated round (None if never evaluated)."""
        values = [r.rmse for r in self.rounds if r.rmse is not None]
        return values[-1] if values else None

    def mean(self, name: str, rounds: Sequence[int] | None = None) -> float:
        """Return the mean of a :class:`RoundStats` field over ``rounds`` (default: all)."""
        values = [
            float(getattr(r, name))
            for r in self.rounds
            if rounds is None or r.server_round in rounds
        ]
        return sum(values) / len(values) if values else 0.0


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the secure training (and the plaintext comparison); print and save the results."""
    run_experiment(grid, context.run_config)


def _round_stats(result: Result, strategy: FedSubAvg) -> list[RoundStats]:
    phases: dict[tuple[int, str], Any] = {(t.server_round, t.phase): t for t in strategy.traffic}
    stats = []
    for rnd in sorted({t.server_round for t in strategy.traffic}):
        train = phases.get((rnd, "train"))
        psr = phases.get((rnd, "psr"))
        nodes = set(train.down_bytes) if train is not None else set()
        down = up = 0.0
        if nodes:
            for t in (psr, train):
                if t is not None:
                    down += sum(t.down_bytes.get(n, 0) for n in nodes) / len(nodes)
                    up += sum(t.up_bytes.get(n, 0) for n in nodes) / len(nodes)
        evaluate = phases.get((rnd, "evaluate"))
        metrics = result.evaluate_metrics_clientapp.get(rnd, {})
        train_metrics = result.train_metrics_clientapp.get(rnd, {})
        rmse = metrics.get("mse")
        base = metrics.get("mean-only-mse")
        stats.append(
            RoundStats(
                server_round=rnd,
                rmse=None if rmse is None else math.sqrt(float(rmse)),
                mean_only_rmse=None if base is None else math.sqrt(float(base)),
                down_bytes=down,
                up_bytes=up,
                train_up_bytes=train.mean_up_bytes if train is not None else 0.0,
                eval_down_bytes=evaluate.mean_down_bytes if evaluate is not None else 0.0,
                udpf_clients=int(train_metrics.get("udpf-clients", 0)),
                clients=len(train.up_bytes) if train is not None else 0,
            )
        )
    return stats


def train_federated(
    grid: Grid,
    settings: Settings,
    helper: HelperConnection | None = None,
    fingerprint: str | None = None,
) -> TrainingRun:
    """Train once: through PSR + SSA if ``helper`` is given, else plaintext row-sparse.

    Both kinds start from the same table and sample the same clients each round (Flower
    samples with :mod:`random`, seeded here).

    Parameters
    ----------
    grid : Grid
        The grid of ClientApps (they must run this app's ClientApp).
    settings : Settings
        The run settings.
    helper : HelperConnection, optional
        S1; None trains with plaintext :class:`~flwr_fsl.strategies.FedSubAvg`.
    fingerprint : str, optional
        S1's pinned fingerprint (checked by S0 once more).

    Returns
    -------
    TrainingRun
        Per-round RMSE and traffic, the final table, timing.
    """
    common: dict[str, Any] = {
        "fraction_train": settings.fraction_train,
        "fraction_evaluate": settings.fraction_evaluate,
        "min_train_nodes": settings.min_nodes,
        "min_evaluate_nodes": settings.min_nodes if settings.fraction_evaluate > 0 else 0,
        "min_available_nodes": settings.min_nodes,
    }
    strategy: FedSubAvg
    if helper is not None:
        label = SECURE_LABEL
        strategy = SecureRowFedSubAvg(
            helper,
            TABLE,
            settings.max_rows,
            helper_fingerprint=fingerprint,
            udpf=settings.ssa_udpf,
            frac_bits=settings.ssa_frac_bits,
            max_abs=settings.ssa_max_abs,
            **common,
        )
    else:
        label = PLAIN_LABEL
        strategy = FedSubAvg(**common)
    training = f"{label}@{time.time_ns()}"  # clients start fresh personal parameters for it
    config = ConfigRecord({TRAINING_ID: training})
    initial = ArrayRecord({TABLE: Array(initial_table(settings))})
    print(
        f"\n=== {label}: {settings.num_server_rounds} rounds, "
        f"max-rows {settings.max_rows}, table {initial[TABLE].shape} ===",
        flush=True,
    )
    random.seed(settings.seed)  # the same clients in the same rounds for every run
    started = time.perf_counter()
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=settings.num_server_rounds,
        train_config=config,
        evaluate_config=config,
    )
    seconds = time.perf_counter() - started
    run = TrainingRun(label, seconds=seconds, strategy=strategy, result=result)
    failed = getattr(strategy, "failed_rounds", {})
    if failed:
        print(f"WARNING: secure aggregation failed in rounds {failed}", flush=True)
    for rnd, reasons in sorted(strategy.dropped.items()):
        if reasons:
            first = next(iter(reasons.values()))
            print(
                f"WARNING: round {rnd}: {len(reasons)} replies dropped (first: {first})",
                flush=True,
            )
    run.rounds = _round_stats(result, strategy)
    run.table = np.array(result.arrays[TABLE].numpy(), copy=True)
    return run


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def round_table(runs: Sequence[TrainingRun]) -> str:
    """Return a text table: per round, RMSE and bytes per client (down/up) of each run."""
    header = f"{'round':>5}"
    for r in runs:
        short = "secure" if r.label == SECURE_LABEL else "plain"
        header += f"  {short + ' RMSE':>11}  {short + ' down B':>13}  {short + ' up B':>11}"
    if runs and runs[0].label == SECURE_LABEL:
        header += f"  {'U-DPF':>5}"
    lines = [header, "-" * len(header)]
    by_round = [{s.server_round: s for s in r.rounds} for r in runs]
    for rnd in sorted({k for b in by_round for k in b}):
        row = f"{rnd:>5}"
        for stats in by_round:
            s = stats.get(rnd)
            if s is None:
                row += f"  {'n/a':>11}  {'n/a':>13}  {'n/a':>11}"
                continue
            row += f"  {_fmt(s.rmse, '.4f'):>11}  {s.down_bytes:>13,.0f}  {s.up_bytes:>11,.0f}"
        if runs and runs[0].label == SECURE_LABEL and rnd in by_round[0]:
            s0 = by_round[0][rnd]
            row += f"  {f'{s0.udpf_clients}/{s0.clients}':>5}"
        lines.append(row)
    return "\n".join(lines)


def summary_table(runs: Sequence[TrainingRun]) -> str:
    """Return a text table: final RMSE and mean bytes per client per round of each run."""
    width = max(len("run"), *(len(r.label) for r in runs))
    header = (
        f"{'run':<{width}}  {'final RMSE':>10}  {'down B/cl/rd':>12}  {'up B/cl/rd':>10}  "
        f"{'eval down B':>11}  {'seconds':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in runs:
        lines.append(
            f"{r.label:<{width}}  {_fmt(r.final_rmse, '.4f'):>10}  "
            f"{r.mean('down_bytes'):>12,.0f}  {r.mean('up_bytes'):>10,.0f}  "
            f"{r.mean('eval_down_bytes'):>11,.0f}  {r.seconds:>7.1f}"
        )
    base = next((s.mean_only_rmse for r in runs for s in r.rounds if s.mean_only_rmse), None)
    if base is not None:
        lines.append(f"{'(global mean only)':<{width}}  {base:>10.4f}")
    return "\n".join(lines)


def udpf_table(run: TrainingRun) -> str:
    """Return the secure run's train upload per client: fresh-key rounds vs U-DPF rounds."""
    fresh = [s.server_round for s in run.rounds if s.clients and s.udpf_clients == 0]
    hint = [s.server_round for s in run.rounds if s.clients and s.udpf_clients == s.clients]
    lines = [f"{'secure train upload':<28}  {'rounds':>10}  {'B/client':>9}"]
    lines.append("-" * len(lines[0]))
    for name, rounds in (("fresh SSA keys", fresh), ("U-DPF hints", hint)):
        text = _rounds_text(rounds)
        value = f"{run.mean('train_up_bytes', rounds):>9,.0f}" if rounds else f"{'n/a':>9}"
        lines.append(f"{name:<28}  {text:>10}  {value}")
    mixed = [s.server_round for s in run.rounds if 0 < s.udpf_clients < s.clients]
    if mixed:
        lines.append(f"(rounds {_rounds_text(mixed)} mixed fresh keys and hints)")
    if fresh and hint:
        ratio = run.mean("train_up_bytes", hint) / run.mean("train_up_bytes", fresh)
        lines.append(f"U-DPF upload = {ratio:.1%} of a fresh-key upload")
    return "\n".join(lines)


def _rounds_text(rounds: Sequence[int]) -> str:
    if not rounds:
        return "-"
    if list(rounds) == list(range(rounds[0], rounds[-1] + 1)) and len(rounds) > 1:
        return f"{rounds[0]}-{rounds[-1]}"
    return ",".join(map(str, rounds))


def report(runs: Sequence[TrainingRun], settings: Settings) -> dict[str, Any]:
    """Print the comparison of the runs and save it if ``results-dir`` is set.

    Returns
    -------
    dict[str, Any]
        Summary: per run the final RMSE, mean bytes per client per round and the per-round
        stats; with two runs the max |difference| of the final tables.
    """
    summary: dict[str, Any] = {
        "runs": {
            r.label: {
                "final_rmse": r.final_rmse,
                "down_bytes_per_client_round": r.mean("down_bytes"),
                "up_bytes_per_client_round": r.mean("up_bytes"),
                "seconds": r.seconds,
                "rounds": [asdict(s) for s in r.rounds],
            }
            for r in runs
        }
    }
    print("\n" + round_table(runs), flush=True)
    print("\n" + summary_table(runs), flush=True)
    secure = next((r for r in runs if r.label == SECURE_LABEL), None)
    if secure is not None:
        print("\n" + udpf_table(secure), flush=True)
    if len(runs) == 2:
        diff = float(np.max(np.abs(runs[0].table.astype(np.float64) - runs[1].table)))
        summary["max_abs_table_diff"] = diff
        print(f"\nmax |secure - plaintext| over the final item tables: {diff:.3g}", flush=True)
    if settings.results_dir:
        out = Path(settings.results_dir)
        out.mkdir(parents=True, exist_ok=True)
        doc = {"settings": asdict(settings), "summary": summary}
        (out / HISTORY_FILE).write_text(json.dumps(doc, indent=2))
        print(f"results written to {(out / HISTORY_FILE).resolve()}", flush=True)
    return summary


def run_experiment(
    grid: Grid, run_config: Mapping[str, Any], helper: HelperConnection | None = None
) -> tuple[list[TrainingRun], dict[str, Any]]:
    """Run the secure training and, with ``compare-plaintext``, the plaintext one.

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
    tuple[list[TrainingRun], dict[str, Any]]
        The runs (secure first) and the printed summary.

    Raises
    ------
    RuntimeError
        If a training aggregated no client update in any round (e.g. every client failed).
    """
    settings = Settings.from_run_config(run_config)
    if helper is None:
        connection, fingerprint = connect_helper(run_config)
        where = settings.ssa_helper_address
        print(f"S1: {'flwr-fsl-helper at ' + where if where else 'in-process helper'}", flush=True)
    else:
        connection = helper
        fingerprint = pinned_fingerprint(run_config)
        verify_helper(connection, fingerprint)
    print(f"S1: public key fingerprint {fingerprint} (pinned, verified)", flush=True)
    try:
        runs = [train_federated(grid, settings, connection, fingerprint)]
    finally:
        if helper is None:
            connection.close()
    if settings.compare_plaintext:
        runs.append(train_federated(grid, settings))
    summary = report(runs, settings)
    idle = [r.label for r in runs if r.result is None or not r.result.train_metrics_clientapp]
    if idle:
        # Flower would still mark the run completed: fail it visibly instead.
        raise RuntimeError(f"no round aggregated any client update in: {', '.join(idle)}")
    return runs, summary
