"""dpf-ssa-mnist: the ServerApp — S0 of two-server secure submodel aggregation.

The ServerApp trains the MNIST CNN with :class:`~flwr_fsl.strategies.SecureFedSubAvg`: every
round each sampled client uploads its top-k update as DPF keys, S0 (this ServerApp) and the
helper server S1 each expand their keys into an additive share of the count-weighted sum, and
only the aggregate is reconstructed. S1 is a running ``flwr-fsl-helper`` when
``ssa-helper-address`` is set (its key pinned by ``ssa-helper-fingerprint``), else an in-process
twin (:class:`~flwr_fsl.helper.InProcessHelper`, the same bytes as over gRPC) with the key pair
in ``ssa-helper-key-file``.

Accuracy is measured on the server (``evaluate_fn``: the MNIST test set); federated evaluation
is off (``fraction-evaluate = 0.0``) and the secure arm refuses it unless
``ssa-plaintext-evaluation = true``, since its replies carry each client's metrics and
``num-examples`` in the clear. Clients count 1 per coordinate they chose (unit weights);
``ssa-weighted = true`` weights them by ``num-examples`` instead.

With ``compare-plaintext = true`` it also trains the two plaintext baselines from the same
initial model and client sample (:class:`flwr_fsl.experiment.Experiment`): plaintext
:class:`~flwr_fsl.strategies.FedSubAvg` with the same top-k ``k`` and the same weighting (the
model secure aggregation must reproduce) and, with ``compare-dense = true``, dense FedAvg
(``FedSubAvg`` on the clients' unchanged dense replies, weighted by ``num-examples``:
``topk-ratio = 1.0`` in the train config). It prints the harness's
tables (accuracy, bytes per client per round and time per round and arm, the summary against
dense, what each party learns, the largest difference between the secure and plaintext top-k
models), then this app's two sections: **upload per client and round** of each arm, measured
on the messages the clients sent, with the upload relative to dense and to plaintext top-k;
and **what S0 saw** of the clients — recorded from the replies the plaintext server decoded
(each client's chosen coordinates, their values and its ``num-examples``) beside what the
secure aggregate gives S0. ``results-dir`` saves the histories (JSON, plot) and the final models
(``global-model-secure.npz`` / ``-plaintext.npz`` / ``-dense.npz``).

:func:`run_experiment` is the whole experiment on any :class:`~flwr.serverapp.Grid`; the
accuracy benchmark and the deployment test call it with an in-process grid.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from numpy.typing import NDArray

from dpf_ssa_mnist.task import Net, Settings
from flwr_fsl.core.engine import RoundState
from flwr_fsl.core.traffic import content_bytes
from flwr_fsl.data import mnist_test_split
from flwr_fsl.experiment import (
    Arm,
    ArmRecord,
    Experiment,
    ExperimentResult,
    Metric,
    sampling_kwargs,
)
from flwr_fsl.families.ssa.dp import dp_options
from flwr_fsl.helper import HelperConnection, secure_helper
from flwr_fsl.models import evaluate
from flwr_fsl.strategies import FedSubAvg, SecureFedSubAvg
from flwr_fsl.submodel.layout import FlatLayout
from flwr_fsl.submodel.update import SubmodelUpdate

ACCURACY = Metric("acc %", "accuracy", scale=100, digits=2)
SECURE_LEARNS = {
    "S0": "per coordinate the round's sum and how many clients chose it (not which)",
    "S1": "the round's public parameters and pseudorandom key material",
}
WEIGHTED_LEARNS = {
    **SECURE_LEARNS,
    "S0": "per coordinate the round's weighted sum and total weight: with ssa-weighted, "
    "every client's num-examples and who chose what (as subset sums)",
}
PLAIN_LEARNS = {"server": "each client's top-k coordinates, their values and num-examples"}
DENSE_LEARNS = {"server": "each client's whole update (every coordinate) and num-examples"}

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the secure training (and the plaintext comparison); print and save the results."""
    run_experiment(grid, context.run_config)


class ObservedFedSubAvg(FedSubAvg):
    """Plaintext ``FedSubAvg`` that keeps what the server read of each client's update.

    Parameters
    ----------
    unit_weights : bool
        Average as the secure arm does by default: every client counts 1 (its
        ``num-examples`` is still read and recorded, as a plaintext server would).
    **kwargs
        ``FedSubAvg``'s arguments.

    Attributes
    ----------
    seen : dict[int, dict[int, tuple[numpy.ndarray, float]]]
        Round -> node -> the flat coordinates of the node's accepted update (ascending) and
        the ``num-examples`` it sent: what a plaintext server holds about that client.
    """

    def __init__(self, *, unit_weights: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.unit_weights = unit_weights
        self.seen: dict[int, dict[int, tuple[NDArray[np.int64], float]]] = {}

    def weight_of(self, content: RecordDict) -> float:
        """Return the reply's ``num-examples`` (checked), or 1 with ``unit_weights``."""
        weight = super().weight_of(content)
        return 1.0 if self.unit_weights else weight

    def receive(
        self,
        state: RoundState,
        phase: str,
        replies: Iterable[Message],
        parse: Callable[[int, RecordDict], Any] | None = None,
        *,
        shrink: bool = True,
    ) -> dict[int, Any]:
        """Validate as ``FedSubAvg`` does; record every accepted update's coordinates."""
        valid = super().receive(state, phase, replies, parse, shrink=shrink)
        if phase == "train":
            layout = FlatLayout.of(state.model)
            seen = self.seen.setdefault(state.server_round, {})
            for node, (update, content) in valid.items():
                assert isinstance(update, SubmodelUpdate)
                sent = super().weight_of(content)  # what the reply told the server
                seen[node] = (layout.elements(update).indices.copy(), sent)
        return valid


def _numpy(arrays: ArrayRecord) -> dict[str, NDArray[Any]]:
    return {k: v.numpy() for k, v in arrays.items()}


def topk_count(arrays: ArrayRecord, ratio: float) -> int:
    """Return ``ceil(ratio * m)`` over the model's ``m`` floating coordinates (as S0 does)."""
    size = FlatLayout.of(_numpy(arrays)).size
    return min(size, math.ceil(ratio * size))


def dense_reply_bytes(arrays: ArrayRecord) -> int:
    """Return the wire bytes of one dense FedAvg reply of this model (arrays + two metrics).

    What a client of a dense run uploads per round, sized with Flower's encoding
    (:func:`flwr_fsl.core.traffic.content_bytes`) exactly as the round engine counts a reply; used
    for the dense row when the dense arm is not trained (``compare-dense = false``).
    """
    metrics = MetricRecord({"train_loss": 0.0, "num-examples": 1})
    return content_bytes(RecordDict({"arrays": arrays, "metrics": metrics}))


def _share(value: float | None, base: float | None) -> str:
    return "n/a" if value is None or not base else f"{value / base:.1%}"


def _bytes(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def upload_table(
    secure: ArmRecord,
    plain: ArmRecord | None,
    dense: ArmRecord | None,
    dense_sized: int,
) -> dict[str, Any]:
    """Print and return each arm's upload per client and round, vs dense and vs plaintext top-k.

    Every figure is the mean over the arm's rounds of the bytes the clients' train replies
    had on the wire (the round engine's traffic log). Without a dense arm, the dense row is
    ``dense_sized``: one dense reply of this model, encoded the same way.
    """
    dense_up = dense.mean("up_bytes") if dense is not None else float(dense_sized)
    plain_up = plain.mean("up_bytes") if plain is not None else None
    rows: list[tuple[str, float | None, float | None]] = [
        ("secure (SSA): DPF keys of the top-k", secure.mean("up_bytes"), secure.mean("down_bytes"))
    ]
    if plain is not None:
        rows.append(("plaintext top-k: sparse update", plain_up, plain.mean("down_bytes")))
    if dense is not None:
        rows.append(("dense FedAvg: the whole model", dense_up, dense.mean("down_bytes")))
    else:
        rows.append(("dense FedAvg (one reply, sized)", dense_up, None))
    title = "upload per client and round"
    print(
        f"\n{title:<36}  {'up B':>10}  {'down B':>10}  {'up vs dense':>11}"
        f"  {'up vs plaintext top-k':>21}",
        flush=True,
    )
    out: dict[str, Any] = {}
    for label, up, down in rows:
        print(
            f"{label:<36}  {_bytes(up):>10}  {_bytes(down):>10}  {_share(up, dense_up):>11}"
            f"  {_share(up, plain_up):>21}",
            flush=True,
        )
        out[label] = {"up_bytes": up, "down_bytes": down}
    return out


def _say(label: str, text: str) -> None:
    """Print ``text`` wrapped to 100 columns under a 13-column label."""
    print(
        textwrap.fill(text, 100, initial_indent=f"  {label:<11}", subsequent_indent=" " * 13),
        flush=True,
    )


def s0_view(result: ExperimentResult, layout: FlatLayout) -> dict[str, Any]:
    """Print and return what S0 saw of the clients in round 1: dense, plaintext and secure.

    The plaintext lines come from the replies the plaintext server decoded
    (:class:`ObservedFedSubAvg`); the secure line from the secure arm's round metrics (the
    coordinates the aggregate touched) and its traffic log (the size of each client's keys).
    """
    out: dict[str, Any] = {}
    print("\nwhat S0 saw of the clients in round 1:", flush=True)
    runs = {run.arm.key: run for run in result.runs}
    if "dense" in runs:
        dense_clients = runs["dense"].record.rounds[0].clients
        _say(
            "dense",
            f"every client's whole update ({layout.size:,} values) and its num-examples "
            f"({dense_clients} clients)",
        )
    plain = runs.get("plaintext")
    if plain is not None and isinstance(plain.strategy, ObservedFedSubAvg):
        seen = plain.strategy.seen.get(1, {})
        chosen = [indices for indices, _ in seen.values()]
        _, times = np.unique(np.concatenate(chosen or [np.zeros(0, np.int64)]), return_counts=True)
        alone = int(np.count_nonzero(times == 1))
        _say(
            "plaintext",
            f"every client's top-k coordinates, their values and its num-examples: "
            f"{times.size:,} coordinates touched, {alone:,} of them by one client only (that "
            "client's value, and who sent it). For example:",
        )
        clients: dict[str, Any] = {}
        for node in sorted(seen):
            indices, weight = seen[node]
            tensor = np.searchsorted(layout.offsets, indices, side="right") - 1
            ids, sizes = np.unique(tensor, return_counts=True)
            per_tensor = {layout.names[t]: int(n) for t, n in zip(ids, sizes, strict=True)}
            clients[str(node)] = {
                "coordinates": int(indices.size),
                "per_tensor": per_tensor,
                "num_examples": weight,
            }
            if len(clients) <= 3:
                parts = ", ".join(f"{name} {n:,}" for name, n in per_tensor.items())
                _say(
                    "",
                    f"node {node}: {indices.size:,} coordinates ({parts}), "
                    f"num-examples {weight:,.0f}",
                )
        out["plaintext"] = {
            "touched": int(times.size),
            "touched_by_one_client": alone,
            "clients": clients,
        }
    first = result.record.arm("secure").rounds[0]
    fraction = first.train_metrics.get("touched-fraction")
    touched = None if fraction is None else round(fraction * layout.size)
    _say(
        "secure",
        f"per coordinate only the round's sum and how many clients chose it: "
        f"{_bytes(touched)} of {layout.size:,} coordinates touched. From each client "
        f"{_bytes(first.up_bytes)} B of pseudorandom DPF keys, of a size fixed by the round's "
        "public parameters: no client's coordinates, values or num-examples (a coordinate "
        "only one client chose reveals that client's value, not which client it is)",
    )
    out["secure"] = {"touched": touched, "up_bytes_per_client": first.up_bytes}
    return out


def privacy_line(result: ExperimentResult) -> str:
    """Print and return the secure arm's ``(ε, δ)``, or that it added no noise at all.

    Top-k mode keeps DP opt-in (``ssa-dp-noise-multiplier``): without it the line says that no
    noise is added and both servers see every coordinate's exact sum and count (weighted sum and
    total weight with ``ssa-weighted = true``).
    """
    strategy = result.arm("secure").strategy
    assert isinstance(strategy, SecureFedSubAvg)
    line = strategy.aggregation.describe_privacy()
    print(f"\nsecure arm, {line}", flush=True)
    return line


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
        Arms ``"secure"`` and, with ``compare-plaintext``, ``"plaintext"`` and (with
        ``compare-dense``) ``"dense"``; the record's ``extra`` holds the upload table and
        what S0 saw.
    """
    settings = Settings.from_run_config(run_config)
    with secure_helper(run_config, helper) as (connection, fingerprint):
        x_test, y_test = mnist_test_split(settings.task.test_size)

        def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            model = Net()
            model.load_state_dict(arrays.to_torch_state_dict())
            loss, accuracy = evaluate(model, x_test, y_test)
            return MetricRecord({"accuracy": accuracy, "loss": loss})

        torch.manual_seed(settings.task.seed)  # the initial model of every arm
        initial = ArrayRecord(Net().state_dict())
        layout = FlatLayout.of(_numpy(initial))
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
                    weighted=settings.ssa_weighted,
                    plaintext_evaluation=settings.ssa_plaintext_evaluation,
                    **dp_options(
                        settings.ssa_dp_noise_multiplier,
                        settings.ssa_dp_clip_norm,
                        budget_epsilon=settings.ssa_dp_budget_epsilon,
                    ),
                    **knobs,
                ),
                learns=SECURE_LEARNS if not settings.ssa_weighted else WEIGHTED_LEARNS,
                equivalent_to="plaintext" if compare else None,
                description=f"top-k {k} coordinates",
            )
        ]
        if compare:
            arms.append(
                Arm(
                    "plaintext",
                    "plaintext top-k",
                    lambda setup: ObservedFedSubAvg(
                        unit_weights=not settings.ssa_weighted, **knobs
                    ),
                    learns=PLAIN_LEARNS,
                    train_config={"topk-count": k},  # the same k the secure arm uploads
                    description=f"top-k {k} coordinates",
                )
            )
        dense = compare and settings.compare_dense
        if dense:
            arms.append(
                Arm(
                    "dense",
                    "dense FedAvg",
                    lambda setup: FedSubAvg(**knobs),  # on dense replies: exactly FedAvg
                    learns=DENSE_LEARNS,
                    train_config={"topk-ratio": 1.0},  # topk_mod passes the dense reply through
                    description=f"all {layout.size} coordinates",
                )
            )
        sized = dense_reply_bytes(initial)

        def extras(result: ExperimentResult) -> dict[str, Any]:
            record = result.record
            return {
                "upload": upload_table(
                    record.arm("secure"),
                    record.arm("plaintext") if compare else None,
                    record.arm("dense") if dense else None,
                    sized,
                ),
                "dense_reply_bytes": sized,
                "s0_view": s0_view(result, layout),
                "privacy": privacy_line(result),
            }

        experiment = Experiment(
            name="dpf-ssa-mnist",
            arms=arms,
            initial_arrays=initial,
            num_rounds=settings.num_server_rounds,
            sampling_seed=settings.task.seed,
            run_config=run_config,
            metrics=[ACCURACY],
            evaluate_fn=global_evaluate,
            train_config={"lr": settings.task.lr},
            session_keys=["topk-session"],  # topk_mod's error feedback starts afresh per arm
            baseline="dense" if dense else "plaintext" if compare else "secure",
            results_dir=settings.results_dir or None,
            save_models=True,
            extras=extras,
        )
        return experiment.run(grid)
