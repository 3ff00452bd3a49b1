"""The batched twin of width-mnist's MLP arms equals the Flower arms round for round.

``width_mnist.batched`` trains the sampled clients side by side and aggregates with the
library's code, so the long accuracy runs of ``benchmarks/width_accuracy.py --engine
batched`` fit on this machine. Its figures stand for the Flower arms only if it computes
what they compute: these tests run the Flower arms (``WidthFedAvg`` / ``SesaFedAvg`` with the
example's ``ClientApp`` and mods on the in-process grid) and the twin on the same clients,
capacities and index sets, and compare the global models.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from flwr_fsl.families.sesa.mod import SesaNodeState
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.local import app_run_config
from tests.prepared_data import require_prepared

APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "width-mnist"
CLIENTS = 10
TINY: dict[str, Any] = {
    "num-server-rounds": 2,
    "max-client-samples": 32,  # batches of 10, 10, 10 and 2
    "test-size": 200,
}


@pytest.fixture(scope="module")
def app() -> Iterator[tuple[ModuleType, ...]]:
    require_prepared("mnist")
    sys.path.insert(0, str(APP_DIR))
    try:
        from width_mnist import batched, client_app, server_app, task

        yield batched, client_app, server_app, task
    finally:
        sys.path.remove(str(APP_DIR))


def _initial(task: ModuleType) -> dict[str, np.ndarray]:
    return {k: v.numpy().astype(np.float32) for k, v in task.initial_state("mlp", 42).items()}


def test_width_arms_equal_the_flower_arms(app: tuple[ModuleType, ...]) -> None:
    batched, client_app, server_app, task = app
    arms = ("full", "fedrolex", "heterofl", "random", "shards")
    config = {**app_run_config(APP_DIR), **TINY, "arms": ",".join(arms)}
    grid = InProcessGrid(client_app.app, CLIENTS, config)
    result = server_app.run_experiment(grid, config)
    settings = task.Settings.from_run_config(config)
    rates = task.CapacityMix.parse(settings.width_mix).fixed(CLIENTS)
    node_of = {int(grid.context(n).node_config["partition-id"]): n for n in grid.get_node_ids()}
    data = batched.Data.load(settings, CLIENTS)
    for name in arms:
        strategy = result.arm(name).strategy
        twin = batched.BatchedArm(
            name, settings, _initial(task), rates, client_key=node_of.__getitem__, chunk=3
        )
        for rnd in (1, 2):
            pids = sorted(p for p, n in node_of.items() if n in strategy.rates[rnd])
            assert len(pids) == 9
            twin.round(rnd, pids, data)
        got = result.arm(name).arrays
        for key, value in twin.model.items():
            # Batched and one-by-one float32 Adam differ in summation order only.
            np.testing.assert_allclose(value, got[key], atol=2e-6, err_msg=f"{name} {key}")
    # The arms differ from one another (the test compares something).
    a, b = result.arm("fedrolex").arrays, result.arm("heterofl").arrays
    assert np.abs(a["head.weight"] - b["head.weight"]).max() > 1e-4


def test_sesa_arm_equals_the_flower_sesa_arm(app: tuple[ModuleType, ...]) -> None:
    batched, client_app, server_app, task = app
    config = {**app_run_config(APP_DIR), **TINY, "arms": "sesa", "num-server-rounds": 1}
    grid = InProcessGrid(client_app.app, CLIENTS, config)
    result = server_app.run_experiment(grid, config)
    settings = task.Settings.from_run_config(config)
    rates = task.CapacityMix.parse(settings.width_mix).fixed(CLIENTS)
    choices: dict[int, object] = {}
    for node in grid.get_node_ids():
        context = grid.context(node)
        raw = context.state.config_records.get("fsl.sesa.client-state")
        if raw is None:
            continue  # not sampled
        state = SesaNodeState.from_bytes(raw["bytes"])
        choices[int(context.node_config["partition-id"])] = {
            k: list(v) for k, v in state.choice.items()
        }
    assert len(choices) == 9
    twin = batched.BatchedArm("sesa", settings, _initial(task), rates)
    twin.round(1, sorted(choices), batched.Data.load(settings, CLIENTS), choices=choices)
    got = result.arm("sesa").arrays
    for key, value in twin.model.items():
        # Each side rounds every delta stochastically to 2^-22 (~2.4e-7).
        np.testing.assert_allclose(value, got[key], atol=1e-6, err_msg=key)
    # The twin's own draws are per-client shard choices of the right size.
    drawn = twin.choices(2, list(range(CLIENTS)))
    for pid, choice in drawn.items():
        (shards,) = choice.values()  # type: ignore[attr-defined]
        assert len(shards) == round(4 * rates[pid])


def test_sampling_is_shared_by_the_arms_and_checks_its_input(
    app: tuple[ModuleType, ...],
) -> None:
    batched, _, _, task = app
    settings = task.Settings.from_run_config({**app_run_config(APP_DIR), **TINY})
    first = batched.sampled_clients(settings, 100, 1)
    assert len(first) == 90 and first == batched.sampled_clients(settings, 100, 1)
    assert first != batched.sampled_clients(settings, 100, 2)
    with pytest.raises(ValueError, match="arm must be one of"):
        batched.BatchedArm("fedavg", settings, _initial(task), [1.0] * 10)
    cnn = task.Settings.from_run_config({**app_run_config(APP_DIR), **TINY, "model": "cnn"})
    with pytest.raises(ValueError, match="MLP only"):
        batched.run_batched(cnn, 10, ["full"])
    with pytest.raises(ValueError, match="distinct names"):
        batched.run_batched(settings, 10, ["full", "full"])
