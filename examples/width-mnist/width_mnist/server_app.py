"""width-mnist: a Flower ServerApp comparing width extraction for heterogeneous clients.

One model (MLP 784-200-10 or a small CNN) is trained once per arm by
:class:`flwr_fsl.experiment.Experiment` — the same initial model, the same clients sampled
each round (``fraction-train = 0.9``: 10% drop out), the same client data and training:

- ``full``: the target — every client trains the whole model
  (:class:`~flwr_fsl.strategies.WidthFedAvg` with every rate 1, weighted by
  ``num-examples``: FedAvg);
- ``fedavg``: Flower's own :class:`~flwr.serverapp.strategy.FedAvg` (not in the default arms):
  the same model as ``full``, a check that the width path changes nothing at rate 1;
- ``fedrolex``, ``heterofl``, ``random``: ``WidthFedAvg(extraction="rolling" | "static" |
  "random")``, clients in the capacity groups of ``width-mix``, FedRolex's unweighted mean;
- ``shards``: ``WidthFedAvg(extraction="shards")``, SESA's random shards drawn by the server, in
  the clear (the plaintext twin of SESA's selection);
- ``sesa``: :class:`~flwr_fsl.strategies.SesaFedAvg` — each client picks its shards secretly,
  and the server decodes only per-shard sums (Lagrange-coded secure aggregation over
  ``F_p``, ``T`` = ``sesa-privacy`` of the sampled clients); every client counts 1 (the
  default);
- ``sesa-weighted`` (not in the default arms): the same with ``weighted=True`` (each client
  weighted by ``num-examples``), the option that leaks who chose which shard
  (``tests/attacks/test_sesa_weights_subset_sum.py``), for its accuracy beside ``sesa``.

After the harness's tables it prints :func:`accuracy_table` (final and best accuracy per arm,
the order of the arms).
:func:`run_experiment` is the whole experiment on any :class:`~flwr.serverapp.Grid`;
``python -m flwr_fsl.testing.local`` (through ``main``), the test, the notebook and
``benchmarks/width_accuracy.py`` call it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, Strategy

from flwr_fsl.experiment import (
    Arm,
    ArmSetup,
    Experiment,
    ExperimentRecord,
    ExperimentResult,
    Metric,
    sampling_kwargs,
)
from flwr_fsl.families.width.rules import CapacityMix
from flwr_fsl.strategies import SesaFedAvg, WidthFedAvg
from width_mnist.task import (
    Settings,
    build_model,
    calibration_data,
    initial_state,
    test_data,
)
from width_mnist.task import test as test_fn

ACCURACY = Metric("acc %", "accuracy", scale=100, digits=2)

LABELS = {
    "full": "full (target)",
    "fedavg": "Flower FedAvg",
    "fedrolex": "FedRolex (rolling)",
    "heterofl": "HeteroFL (static)",
    "random": "random",
    "shards": "shards (plaintext)",
    "sesa": "SESA (secure)",
    "sesa-weighted": "SESA weighted (leaks)",
}
EXTRACTION = {"fedrolex": "rolling", "heterofl": "static", "random": "random", "shards": "shards"}
PLAINTEXT = "each client's rate, channels (the server chose them) and trained slice"
LEARNS = {
    "full": {"server": "each client's whole trained model"},
    "fedavg": {"server": "each client's whole trained model"},
    "fedrolex": {"server": PLAINTEXT},
    "heterofl": {"server": PLAINTEXT},
    "random": {"server": PLAINTEXT},
    "shards": {"server": PLAINTEXT},
    "sesa": {
        "server": "per shard, the sum and the count of the survivors' updates that chose it "
        "(a shard one survivor chose is that client's update); each client's number of shards "
        "(message sizes); not which shards a client chose",
        "T colluding clients": "nothing about an honest client's choice or update",
    },
    "sesa-weighted": {
        "server": "every client's num-examples (least squares over rounds) and, through "
        "subset sums of the per-shard weights, who chose which shard in most rounds",
        "T colluding clients": "nothing about an honest client's choice or update",
    },
}

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train every arm of the run config's ``arms`` and print the comparison."""
    run_experiment(grid, context.run_config)


def best(values: list[float | None]) -> tuple[float | None, int | None]:
    """Return the largest reported value and its 1-based round (None, None when none)."""
    known = [(v, i + 1) for i, v in enumerate(values) if v is not None]
    if not known:
        return None, None
    value, rnd = max(known, key=lambda t: (t[0], -t[1]))
    return value, rnd


def accuracy_rows(record: ExperimentRecord) -> list[dict[str, Any]]:
    """Per arm: key, label, final and best accuracy (%), the best's round, rounds aggregated."""
    rows = []
    for arm in record.arms:
        values = [ACCURACY.value(r) for r in arm.rounds]
        top, at = best(values)
        rows.append(
            {
                "arm": arm.key,
                "label": arm.label,
                "final": arm.final(ACCURACY),
                "max": top,
                "max_round": at,
                "aggregated": len(arm.aggregated_rounds),
                "curve": values,
            }
        )
    return rows


def ordering(rows: list[dict[str, Any]], key: str) -> str:
    """Return the arms ordered by ``key`` (``"final"`` or ``"max"``), highest first."""
    known = sorted((r for r in rows if r[key] is not None), key=lambda r: -r[key])
    return " > ".join(f"{r['arm']} {r[key]:.2f}" for r in known)


def accuracy_table(rows: list[dict[str, Any]]) -> str:
    """Return the table of final and best accuracy per arm, and the two orders."""
    width = max(len("arm"), *(len(r["label"]) for r in rows))
    header = f"{'arm':<{width}}  {'final acc %':>11}  {'max acc %':>9}  {'at round':>8}"
    lines = [header, "-" * len(header)]
    for r in rows:
        final = "n/a" if r["final"] is None else f"{r['final']:.2f}"
        top = "n/a" if r["max"] is None else f"{r['max']:.2f}"
        lines.append(f"{r['label']:<{width}}  {final:>11}  {top:>9}  {r['max_round'] or '':>8}")
    lines.append(f"order by final accuracy: {ordering(rows, 'final')}")
    lines.append(f"order by max accuracy:   {ordering(rows, 'max')}")
    return "\n".join(lines)


def run_experiment(grid: Grid, run_config: Mapping[str, Any]) -> ExperimentResult:
    """Train every arm of ``arms`` from one initial model; print and save the comparison.

    Parameters
    ----------
    grid : Grid
        The grid (Flower's in a ServerApp, or :class:`flwr_fsl.testing.InProcessGrid`).
    run_config : Mapping[str, Any]
        The run config (``[tool.flwr.app.config]`` keys).

    Returns
    -------
    ExperimentResult
        One run per arm, keyed by the arm's name.

    Raises
    ------
    ValueError
        If the run config is invalid.
    ExperimentFailedError
        If an arm aggregated no round.
    """
    settings = Settings.from_run_config(run_config)
    knobs = sampling_kwargs(settings)
    seed = settings.seed
    x_test, y_test = test_data(settings.dataset, settings.test_size)
    calibration = (
        calibration_data(settings.dataset, settings.calibration_size, seed)
        if settings.model == "cnn"
        else None
    )

    def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Evaluate the full-width global model on the test set."""
        net = build_model(settings.model)
        net.load_state_dict(arrays.to_torch_state_dict())
        loss, accuracy = test_fn(net, x_test, y_test, calibration)
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    def full(setup: ArmSetup) -> Strategy:
        # Every client at rate 1 (a one-level "dynamic" mix), weighted like FedAvg.
        return WidthFedAvg(
            **knobs, extraction="static", capacity="dynamic", capacity_mix="a1", weighted=True
        )

    def fedavg(setup: ArmSetup) -> Strategy:
        return FedAvg(**knobs)

    def width(extraction: str) -> Callable[[ArmSetup], Strategy]:
        def factory(setup: ArmSetup) -> Strategy:
            return WidthFedAvg(
                **knobs,
                extraction=extraction,
                num_shards=settings.num_shards if extraction == "shards" else None,
                seed=seed,
            )

        return factory

    def secure(weighted: bool) -> Callable[[ArmSetup], Strategy]:
        def factory(setup: ArmSetup) -> Strategy:
            return SesaFedAvg(
                **knobs,
                num_shards=settings.num_shards,
                privacy=settings.privacy,
                # False (the default): FedRolex's unweighted mean, as the plaintext arms.
                weighted=weighted,
                clipping_range=settings.sesa_clip,
                frac_bits=settings.sesa_frac_bits,
                max_clients=settings.sesa_max_clients,
            )

        return factory

    mix = CapacityMix.parse(settings.width_mix)
    groups = "/".join(f"{r:g}" for r in mix.rates)
    t = settings.privacy
    t_text = f"{t:.0%} of the sampled" if isinstance(t, float) else f"{t}"
    descriptions = {
        "full": "every client at rate 1",
        "fedavg": "Flower's FedAvg, every client at rate 1",
        "sesa": f"rates {groups} ({settings.width_mix}), S = {settings.num_shards}, "
        f"T = {t_text}, {settings.sesa_frac_bits} fractional bits in F_p",
    }
    descriptions["sesa-weighted"] = descriptions["sesa"] + ", weighted by num-examples"
    factories: dict[str, Callable[[ArmSetup], Strategy]] = {
        "full": full,
        "fedavg": fedavg,
        "sesa": secure(weighted=False),
        "sesa-weighted": secure(weighted=True),
        **{key: width(rule) for key, rule in EXTRACTION.items()},
    }
    arms = []
    for name in settings.arm_list:
        description = descriptions.get(
            name, f"{EXTRACTION.get(name, '')} extraction, rates {groups} ({settings.width_mix})"
        )
        arms.append(
            Arm(
                name,
                LABELS[name],
                factories[name],
                learns=LEARNS[name],
                equivalent_to="full" if name == "fedavg" and "full" in settings.arm_list else None,
                description=f"{settings.dataset} {settings.model}, {description}",
            )
        )

    def extras(result: ExperimentResult) -> dict[str, Any]:
        rows = accuracy_rows(result.record)
        print("\n" + accuracy_table(rows), flush=True)
        return {"accuracy": rows}

    initial = ArrayRecord(initial_state(settings.model, seed))
    return Experiment(
        name=f"width-{settings.dataset}-{settings.model}",
        arms=arms,
        initial_arrays=initial,
        num_rounds=settings.num_server_rounds,
        sampling_seed=seed,
        run_config=run_config,
        metrics=[ACCURACY],
        evaluate_fn=global_evaluate,
        train_config={"lr": settings.lr},
        results_dir=settings.results_dir or None,
        save_models=True,
        extras=extras,
    ).run(grid)
