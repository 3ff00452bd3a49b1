"""dpf-ssa-mnist: the ServerApp — S0 of two-server secure submodel aggregation.

The ServerApp trains the MNIST CNN with :class:`~flwr_fsl.strategies.SecureFedSubAvg`: every
round each sampled client uploads its top-k update as DPF keys, S0 (this ServerApp) and the
helper server S1 each expand their keys into an additive share of the count-weighted sum, and
only the aggregate is reconstructed. S1 is a running ``flwr-fsl-helper`` when
``ssa-helper-address`` is set (its key pinned by ``ssa-helper-fingerprint``), else an in-process
twin (:class:`~flwr_fsl.helper.InProcessHelper`, the same bytes as over gRPC) with the key pair
in ``ssa-helper-key-file``.

With ``compare-plaintext = true`` it also trains plaintext
:class:`~flwr_fsl.strategies.FedSubAvg` with the same top-k ``k``, from the same initial model
and client sample (:class:`flwr_fsl.experiment.Experiment`), and prints the harness's tables:
accuracy, bytes per client per round and time per round and arm, the summary, what each party
learns, and the largest difference between the two final models. ``results-dir`` saves the
histories (JSON, plot) and the final models (``global-model-secure.npz`` / ``-plaintext.npz``).

:func:`run_experiment` is the whole experiment on any :class:`~flwr.serverapp.Grid`; the
accuracy benchmark and the deployment test call it with an in-process grid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from dpf_ssa_mnist.task import Net, Settings
from flwr_fsl.data import mnist_test_split
from flwr_fsl.experiment import Arm, Experiment, ExperimentResult, Metric, sampling_kwargs
from flwr_fsl.helper import (
    HelperConnection,
    connect_helper,
    describe_helper,
    pinned_fingerprint,
    verify_helper,
)
from flwr_fsl.models import evaluate
from flwr_fsl.strategies import FedSubAvg, SecureFedSubAvg
from flwr_fsl.submodel.layout import FlatLayout

ACCURACY = Metric("acc %", "accuracy", scale=100, digits=2)
SECURE_LEARNS = {
    "S0": "per coordinate the round's weighted sum and total weight (no client weight)",
    "S1": "the round's public parameters and pseudorandom key material",
}
PLAIN_LEARNS = {"server": "each client's top-k coordinates, their values and num-examples"}

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the secure training (and the plaintext comparison); print and save the results."""
    run_experiment(grid, context.run_config)


def topk_count(arrays: ArrayRecord, ratio: float) -> int:
    """Return ``ceil(ratio * m)`` over the model's ``m`` floating coordinates (as S0 does)."""
    size = FlatLayout.of({k: v.numpy() for k, v in arrays.items()}).size
    return min(size, math.ceil(ratio * size))


def run_experiment(
    grid: Grid, run_config: Mapping[str, Any], helper: HelperConnection | None = None
) -> ExperimentResult:
    """Train securely and, with ``compare-plaintext``, in plaintext; print and save both.

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
    ExperimentResult
        Arms ``"secure"`` and (with ``compare-plaintext``) ``"plaintext"``.
    """
    settings = Settings.from_run_config(run_config)
    if helper is None:
        connection, fingerprint = connect_helper(run_config)
        print(describe_helper(run_config), flush=True)
    else:
        connection, fingerprint = helper, pinned_fingerprint(run_config)
        verify_helper(connection, fingerprint)
    print(f"S1: public key fingerprint {fingerprint} (pinned, verified)", flush=True)
    x_test, y_test = mnist_test_split(settings.test_size)

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = evaluate(model, x_test, y_test)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    torch.manual_seed(settings.seed)  # the initial model of every arm
    initial = ArrayRecord(Net().state_dict())
    k = topk_count(initial, settings.topk_ratio)
    knobs = sampling_kwargs(settings)
    compare = settings.compare_plaintext
    arms = [
        Arm(
            "secure",
            "secure (SSA)",
            lambda setup: SecureFedSubAvg(
                connection,
                topk_ratio=settings.topk_ratio,  # it sets topk-count = k itself
                helper_fingerprint=fingerprint,
                frac_bits=settings.ssa_frac_bits,
                max_abs=settings.ssa_max_abs,
                **knobs,
            ),
            learns=SECURE_LEARNS,
            equivalent_to="plaintext" if compare else None,
            description=f"top-k {k} coordinates",
        )
    ]
    if compare:
        arms.append(
            Arm(
                "plaintext",
                "plaintext",
                lambda setup: FedSubAvg(**knobs),
                learns=PLAIN_LEARNS,
                train_config={"topk-count": k},  # the same k the secure arm uploads
                description=f"top-k {k} coordinates",
            )
        )
    experiment = Experiment(
        name="dpf-ssa-mnist",
        arms=arms,
        initial_arrays=initial,
        num_rounds=settings.num_server_rounds,
        sampling_seed=settings.seed,
        run_config=run_config,
        metrics=[ACCURACY],
        evaluate_fn=global_evaluate,
        train_config={"lr": settings.lr},
        session_keys=["topk-session"],  # topk_mod's error feedback starts afresh per arm
        baseline="plaintext" if compare else "secure",
        results_dir=settings.results_dir or None,
        save_models=True,
    )
    try:
        return experiment.run(grid)
    finally:
        if helper is None:
            connection.close()
