"""dpf-ssa-mnist: the ServerApp — S0 of two-server secure submodel aggregation.

The ServerApp trains the MNIST CNN with :class:`~flwr_fsl.strategies.SecureFedSubAvg`: every
round each sampled client uploads its top-k update as DPF keys, S0 (this ServerApp) and the
helper server S1 each expand their keys into an additive share of the count-weighted sum, and
only the aggregate is reconstructed. S1 is

- a running ``flwr-fsl-helper`` process when ``ssa-helper-address`` is set (deployment; S1's
  key is pinned by ``ssa-helper-fingerprint``), or
- an in-process twin (:class:`~flwr_fsl.helper.InProcessHelper`, the same bytes as over
  gRPC) with the key pair in ``ssa-helper-key-file`` (simulation; created if missing).

With ``compare-plaintext = true`` it trains again from the same initial model and seed with
plaintext :class:`~flwr_fsl.strategies.FedSubAvg` and the same top-k, and prints accuracy per
round, final accuracy, upload bytes per client per round and the largest difference between
the two final global models. ``results-dir`` saves the histories (JSON, plot) and the final
global models (``.npz``).

:func:`run_experiment` is the whole experiment on any :class:`~flwr.serverapp.Grid`; the
accuracy benchmark and the deployment test call it with an in-process grid.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from numpy.typing import NDArray

from dpf_ssa_mnist.task import Net, Settings
from flwr_fsl.data import mnist_test_split
from flwr_fsl.helper import HelperConnection, connect_helper, pinned_fingerprint, verify_helper
from flwr_fsl.models import evaluate
from flwr_fsl.reporting import RunHistory, comparison_table, plot_histories, save_histories
from flwr_fsl.strategies import FedSubAvg, SecureFedSubAvg
from flwr_fsl.submodel.layout import FlatLayout

SECURE_LABEL = "secure (SSA)"
PLAIN_LABEL = "plaintext"
MODEL_FILE = "global-model-{}.npz"
HISTORY_FILE = "dpf-ssa-mnist.json"

app = ServerApp()


class _SameClients:
    """Strategy mixin: sample each round's clients from ``random`` seeded by (seed, round).

    Flower's ``FedAvg`` samples with the module-level :mod:`random`, which Flower's heartbeat
    and retry code in the ServerApp process draw from as well, so seeding it once does not fix
    the clients of later rounds. Re-seeding just before sampling makes the secure and the
    plaintext run train the same clients in every round.
    """

    sampling_seed: int = 0

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Re-seed ``random`` for this round, then sample and configure as the strategy does."""
        random.seed(self.sampling_seed * 1_000_003 + server_round)
        return super().configure_train(server_round, arrays, config, grid)  # type: ignore[misc]


class _SecureSameClients(_SameClients, SecureFedSubAvg):
    """:class:`SecureFedSubAvg` sampling reproducibly (see :class:`_SameClients`)."""


class _PlainSameClients(_SameClients, FedSubAvg):
    """:class:`FedSubAvg` sampling reproducibly (see :class:`_SameClients`)."""


@dataclass
class TrainingRun:
    """One federated training of the experiment.

    Attributes
    ----------
    label : str
        ``"secure (SSA)"`` or ``"plaintext"``.
    history : RunHistory
        Accuracy per round and upload bytes per client per round.
    arrays : dict[str, NDArray]
        The final global model.
    topk_count : int
        Coordinates each client uploaded per round.
    seconds : float
        Wall time of the training.
    strategy : FedSubAvg
        The strategy after the run (``dropped``, ``traffic``, ``failed_rounds``).
    """

    label: str
    history: RunHistory
    arrays: dict[str, NDArray[Any]]
    topk_count: int
    seconds: float
    strategy: FedSubAvg


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the secure training (and the plaintext comparison); print and save the results."""
    run_experiment(grid, context.run_config)


def topk_count(arrays: ArrayRecord, ratio: float) -> int:
    """Return ``ceil(ratio * m)`` over the model's ``m`` floating coordinates (as S0 does)."""
    size = FlatLayout.of({k: v.numpy() for k, v in arrays.items()}).size
    return min(size, math.ceil(ratio * size))


def train_federated(
    grid: Grid,
    settings: Settings,
    helper: HelperConnection | None = None,
    fingerprint: str | None = None,
) -> TrainingRun:
    """Train once: securely through S1 if ``helper`` is given, else plaintext top-k.

    Both kinds start from the same initial model (``torch.manual_seed(seed)``) and sample
    the same clients each round (:class:`_SameClients`).

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
        History, final model, timing.
    """
    x_test, y_test = mnist_test_split(settings.test_size)

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, x_test, y_test)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    torch.manual_seed(settings.seed)  # the same initial model for every run
    initial = ArrayRecord(Net().state_dict())
    k = topk_count(initial, settings.topk_ratio)
    common: dict[str, Any] = {
        "fraction_train": settings.fraction_train,
        "fraction_evaluate": settings.fraction_evaluate,
        "min_train_nodes": settings.min_nodes,
        "min_evaluate_nodes": settings.min_nodes if settings.fraction_evaluate > 0 else 0,
        "min_available_nodes": settings.min_nodes,
    }
    label = SECURE_LABEL if helper is not None else PLAIN_LABEL
    # A new top-k session tells topk_mod to start without an error-feedback remainder.
    train_config: dict[str, Any] = {"lr": settings.lr, "topk-session": label}
    strategy: _SecureSameClients | _PlainSameClients
    if helper is not None:
        strategy = _SecureSameClients(
            helper,
            topk_ratio=settings.topk_ratio,
            helper_fingerprint=fingerprint,
            frac_bits=settings.ssa_frac_bits,
            max_abs=settings.ssa_max_abs,
            **common,
        )
        # SecureFedSubAvg sets topk-count = k itself.
    else:
        strategy = _PlainSameClients(**common)
        train_config["topk-count"] = k  # the same k the secure run uploads
    strategy.sampling_seed = settings.seed
    print(f"\n=== {label}: {settings.num_server_rounds} rounds, top-k {k} ===", flush=True)
    started = time.perf_counter()
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=settings.num_server_rounds,
        train_config=ConfigRecord(train_config),
        evaluate_fn=global_evaluate,
    )
    seconds = time.perf_counter() - started
    failed = getattr(strategy, "failed_rounds", {})
    if failed:
        print(f"WARNING: secure aggregation failed in rounds {failed}", flush=True)
    history = RunHistory.from_result(
        label, result, strategy.traffic, config={"topk-count": k, "secure": helper is not None}
    )
    arrays = {name: np.array(a.numpy(), copy=True) for name, a in result.arrays.items()}
    return TrainingRun(label, history, arrays, k, seconds, strategy)


def max_model_difference(a: Mapping[str, NDArray[Any]], b: Mapping[str, NDArray[Any]]) -> float:
    """Return ``max |a - b|`` over all tensors of two models with the same names and shapes."""
    if set(a) != set(b):
        raise ValueError(f"the models have different tensors: {sorted(a)} vs {sorted(b)}")
    return max(
        (float(np.max(np.abs(a[n].astype(np.float64) - b[n]), initial=0.0)) for n in a),
        default=0.0,
    )


def curve_table(histories: Sequence[RunHistory]) -> str:
    """Return a text table of test accuracy per round, one column per run.

    With two runs, a last column gives the first minus the second in points.
    """
    rounds = sorted({r for h in histories for r in h.rounds})
    width = max(12, *(len(h.label) + 2 for h in histories))
    header = f"{'round':>5}" + "".join(f"  {h.label + ' %':>{width}}" for h in histories)
    if len(histories) == 2:
        header += f"  {'diff (pts)':>10}"
    lines = [header, "-" * len(header)]
    for r in rounds:
        accs = [dict(zip(h.rounds, h.accuracy, strict=True)).get(r) for h in histories]
        row = f"{r:>5}" + "".join(
            f"  {'n/a' if a is None else f'{a * 100:.2f}':>{width}}" for a in accs
        )
        if len(accs) == 2 and None not in accs:
            row += f"  {(accs[0] - accs[1]) * 100:>+10.2f}"  # type: ignore[operator]
        lines.append(row)
    return "\n".join(lines)


def report(runs: Sequence[TrainingRun], settings: Settings) -> dict[str, Any]:
    """Print the comparison of the runs and save it if ``results-dir`` is set.

    Returns
    -------
    dict[str, Any]
        Summary: final accuracies, bytes per client per round, and (with two runs) the
        accuracy difference and the max |difference| of the final global models.
    """
    histories = [r.history for r in runs]
    summary: dict[str, Any] = {
        "runs": {
            r.label: {
                "final_accuracy": r.history.final_accuracy,
                "up_bytes_per_client_round": r.history.mean_up_mb * 1e6,
                "topk_count": r.topk_count,
                "seconds": r.seconds,
            }
            for r in runs
        }
    }
    print("\n" + curve_table(histories), flush=True)
    print("\n" + comparison_table(histories, baseline=len(histories) - 1), flush=True)
    for r in runs:
        print(
            f"{r.label}: upload {r.history.mean_up_mb * 1e6:,.0f} bytes/client/round "
            f"(top-k {r.topk_count} coordinates), {r.seconds:.1f} s",
            flush=True,
        )
    if len(runs) == 2:
        secure, plain = runs
        diff = max_model_difference(secure.arrays, plain.arrays)
        acc_s, acc_p = secure.history.final_accuracy, plain.history.final_accuracy
        points = None if acc_s is None or acc_p is None else (acc_s - acc_p) * 100
        summary.update({"final_accuracy_difference_points": points, "max_abs_model_diff": diff})
        print(f"max |secure - plaintext| over the final global models: {diff:.3g}", flush=True)
        if points is not None:
            print(f"final accuracy difference: {points:+.2f} points", flush=True)
    if settings.results_dir:
        out = Path(settings.results_dir)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"settings": settings.__dict__, "summary": summary}
        save_histories(histories, out / HISTORY_FILE, meta=meta)
        for r in runs:
            kind = "secure" if r.label == SECURE_LABEL else "plaintext"
            arrays: dict[str, Any] = r.arrays
            np.savez(out / MODEL_FILE.format(kind), **arrays)
        try:
            plot_histories(histories, out / "dpf-ssa-mnist.png", title="dpf-ssa-mnist")
        except ImportError as err:
            print(f"(no plot: {err})", flush=True)
        print(f"results written to {out.resolve()}", flush=True)
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
        pinned fingerprint or key file); not closed here.

    Returns
    -------
    tuple[list[TrainingRun], dict[str, Any]]
        The runs (secure first) and the printed summary.
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
    return runs, report(runs, settings)
