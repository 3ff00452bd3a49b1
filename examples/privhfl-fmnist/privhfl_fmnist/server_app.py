"""privhfl-fmnist: the ServerApp — PrivHFL's rounds and a per-client before/after report.

:class:`~flwr_fsl.families.privhfl.strategy.PrivHFL` drives the phases of each round (the message
types ``train.privhfl``, ``query.privhfl``, ``evaluate.privhfl``):

1. ``local``: every node trains its own architecture on its private images, then evaluates it
   (the *before* column: round 0 of
   :attr:`~flwr_fsl.families.privhfl.strategy.PrivHFL.node_metrics`);
2. ``generate``: each querier expands its private images into a pool (``expansion``: mixup by
   default) and selects ``num-queries`` (``secure-queries`` in the secure arm);
3. answering: secure, the default (``keys``, ``generate``, ``step-1`` ... ``step-K``: the
   server is the third computing party of the 3-party protocol, comparisons by DCF keys or
   the paper's DReLU), or, with ``answering = "plaintext"``, in the clear (``answer``: the
   queries go to the other nodes, their logits come back through the server, which sums them
   per querier — the server sees every query image and every answer);
4. ``retrain``: each querier re-trains on ``softmax(sum of the answerers' logits / T)`` plus
   its private data, then every node evaluates its model (the *after* column).

:func:`run_experiment` runs it on any :class:`~flwr.serverapp.Grid` and prints each client's
accuracy before and after, the bytes per phase, and what each party learned;
``python -m flwr_fsl.testing.local`` (through ``main``) and the test call it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from flwr_fsl.experiment import flower_log_level
from flwr_fsl.families.privhfl.strategy import PrivHFL
from flwr_fsl.models.privhfl import build_model
from privhfl_fmnist.task import Settings

LEARNS: dict[str, dict[str, str]] = {
    "plaintext": {
        "server": "every query image (a mixup image shows its two source images), every "
        "answerer's logits on it and each querier's logit sum",
        "answerer": "the querier's query images",
        "querier": "the sum of its answerers' logits on its queries",
    },
    "secure": {
        "server": "the architectures, batch sizes and who answers whom; protocol words each "
        "masked by randomness it does not hold (no query, no logit, no soft label)",
        "answerer": "masked words only (not the queries, not its own logits)",
        "querier": "the sum of its answerers' logits on its queries (DCF); with comparison = "
        "'drelu' also r*x for every hidden activation of every answerer's model (every sign, "
        "and the magnitude up to a divisor of r*x)",
    },
}

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run ``num-server-rounds`` PrivHFL iterations and print the report."""
    with flower_log_level(context.run_config):  # quiet unless log-level asks for more
        run_experiment(grid, context.run_config)


@dataclass
class PrivHFLReport:
    """What a run measured.

    Attributes
    ----------
    settings : Settings
        The run's settings.
    strategy : PrivHFL
        The strategy after the run (its rounds, traffic, drops and per-node metrics).
    before, after : dict[int, float]
        Node id -> test accuracy after local training / after the last round.
    arch : dict[int, str]
        Node id -> architecture (told apart by the parameter count each node reports).
    seconds : float
        Wall-clock time of the run.
    """

    settings: Settings
    strategy: PrivHFL
    before: dict[int, float] = field(default_factory=dict)
    after: dict[int, float] = field(default_factory=dict)
    arch: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0

    def mean(self, which: dict[int, float], arch: str | None = None) -> float:
        """Return the mean accuracy over the nodes (of architecture ``arch``; nan if none)."""
        values = [v for n, v in which.items() if arch is None or self.arch.get(n) == arch]
        return sum(values) / len(values) if values else float("nan")


def make_strategy(settings: Settings) -> PrivHFL:
    """Return the :class:`PrivHFL` strategy of ``settings``."""
    return PrivHFL(
        fraction_train=settings.fraction_train,
        fraction_evaluate=1.0,
        min_train_nodes=2,
        min_evaluate_nodes=2,
        min_available_nodes=2,
        expansion=settings.expansion,
        pool_size=settings.pool_size,
        num_queries=settings.queries,
        selection=settings.selection,
        fraction_answer=settings.fraction_answer,
        temperature=settings.temperature,
        local_epochs=settings.local_epochs,
        local_optimizer=settings.local_optimizer,
        local_lr=settings.local_lr,
        retrain_epochs=settings.retrain_epochs,
        answering=settings.answering,
        comparison=settings.comparison,
        seed=settings.seed,
        sampling_seed=settings.seed,
    )


def _arch_by_size(settings: Settings) -> dict[int, str]:
    sizes: dict[int, str] = {}
    for name in settings.arch_list:
        count = sum(p.numel() for p in build_model(name).parameters())
        sizes[count] = f"{sizes[count]}|{name}" if count in sizes else name
    return sizes


def report_text(report: PrivHFLReport) -> str:
    """Return the printed report: per-client accuracy, means per architecture, bytes, views."""
    s, strategy = report.settings, report.strategy
    lines = [f"{'node':>20}  {'architecture':<12} {'before %':>8} {'after %':>8} {'change':>7}"]
    for node in sorted(report.before):
        before, after = report.before[node], report.after.get(node, float("nan"))
        lines.append(
            f"{node:>20}  {report.arch.get(node, '?'):<12} {100 * before:>8.2f} "
            f"{100 * after:>8.2f} {100 * (after - before):>+7.2f}"
        )
    for arch in [*s.arch_list, None]:
        label = arch or "all"
        lines.append(
            f"mean {label:<10} before {100 * report.mean(report.before, arch):.2f}%  after "
            f"{100 * report.mean(report.after, arch):.2f}%"
        )
    lines.append("bytes per phase (mean per node that took part, summed over rounds and steps):")
    per_phase: dict[str, list[float]] = {}
    for state in strategy.rounds.values():
        for t in state.traffic:
            # The secure arm's step-1 ... step-K (and sign-k) phases: one line each kind.
            phase = "step-*" if t.phase.startswith("step-") else t.phase
            phase = "sign-*" if phase.startswith("sign-") else phase
            acc = per_phase.setdefault(phase, [0.0, 0.0, 0.0])
            acc[0] += t.mean_down_bytes
            acc[1] += t.mean_up_bytes
            acc[2] = max(acc[2], len(t.down_bytes))
    for phase, (down, up, nodes) in per_phase.items():
        lines.append(f"  {phase:<14} down {down:>14,.0f} B  up {up:>14,.0f} B  ({nodes:.0f} nodes)")
    total_down = sum(
        sum(t.down_bytes.values()) for r in strategy.rounds.values() for t in r.traffic
    )
    total_up = sum(sum(t.up_bytes.values()) for r in strategy.rounds.values() for t in r.traffic)
    lines.append(f"total: {total_down:,} B down, {total_up:,} B up")
    dropped = {r: d for r, d in strategy.dropped.items() if d}
    lines.append(f"dropped: {dropped or 'none'}; failed rounds: {strategy.failed_rounds or 'none'}")
    lines.append(f"what each party learned ({s.answering} answering):")
    for party, text in LEARNS[s.answering].items():
        if s.answering == "secure" and party == "querier" and s.comparison == "dcf":
            text = "the sum of its answerers' logits on its queries (DCF: nothing else)"
        lines.append(f"  {party}: {text}")
    lines.append(f"time: {report.seconds:.1f} s")
    return "\n".join(lines)


def run_experiment(grid: Grid, run_config: Mapping[str, Any]) -> PrivHFLReport:
    """Run PrivHFL with the run config's settings on ``grid``; print and return the report.

    Parameters
    ----------
    grid : Grid
        The grid (Flower's in a ServerApp, or :class:`flwr_fsl.testing.InProcessGrid`).
    run_config : Mapping[str, Any]
        The run config (``[tool.flwr.app.config]`` keys).

    Returns
    -------
    PrivHFLReport
        Per-node accuracy before and after, the strategy (traffic, drops).

    Raises
    ------
    ValueError
        If the run config is invalid.
    """
    settings = Settings.from_run_config(run_config)
    strategy = make_strategy(settings)
    queries = f"{settings.queries} {settings.expansion} queries (pool {settings.pool_size})"
    answering = settings.answering + (
        f" ({settings.comparison} comparison)" if settings.answering == "secure" else ""
    )
    print(
        f"PrivHFL on {settings.dataset}: architectures {settings.arch_list} by partition id, "
        f"{settings.samples_per_client} private images per client, {queries} per querier, "
        f"{answering} answering, {settings.num_server_rounds} round(s)",
        flush=True,
    )
    t0 = time.perf_counter()
    strategy.run(grid, num_rounds=settings.num_server_rounds)
    report = PrivHFLReport(settings, strategy, seconds=time.perf_counter() - t0)
    sizes = _arch_by_size(settings)
    local = strategy.node_metrics.get(0, {})
    last = strategy.node_metrics.get(settings.num_server_rounds, {})
    for node, metrics in local.items():
        report.before[node] = float(metrics["accuracy"])
        report.arch[node] = sizes.get(int(metrics.get("num-parameters", -1)), "?")
    for node, metrics in last.items():
        report.after[node] = float(metrics["accuracy"])
    print(report_text(report), flush=True)
    return report
