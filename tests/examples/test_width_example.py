"""examples/width-mnist on the in-process grid: every arm, tiny, against independent references.

Ten clients in three capacity groups (``width-mix = "a1-b1-c1"``: rates 1, 1/2, 1/4 by
``partition-id``), nine sampled per round (``fraction-train = 0.9``), 32 MNIST images each,
MLP 784-200-10. Every client trains with a seed of its own (run seed, round, partition) on one
torch thread, so a client's training is reproducible outside the app:

- the ServerApp's ``main`` runs all seven arms; each aggregates every round with nobody
  dropped, the ``full`` arm (``WidthFedAvg`` at rate 1) equals Flower's own ``FedAvg`` on the
  same clients, and SESA runs its four phases;
- the plaintext extraction arms (rolling, static, random, shards) equal a reference that
  re-derives every client's channels (``torch.roll`` for FedRolex, the prefix for HeteroFL,
  the seeded draws for random and shards), slices the global model with ``np.ix_``, trains the
  slice with the example's own ``train`` and seed, and averages every coordinate over its
  holders with plain loops;
- the SESA arm equals the plaintext per-shard average of what the clients trained on the
  shards they chose secretly (read back from each client's ``Context.state``), up to the
  fixed point.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from flwr_fsl.experiment import load_experiment
from flwr_fsl.families.sesa.layout import SesaLayout
from flwr_fsl.families.sesa.mod import SesaNodeState
from flwr_fsl.families.width.rules import WidthRule
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.local import app_run_config
from tests.prepared_data import require_prepared

APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "width-mnist"
CLIENTS = 10
SAMPLED = 9  # fraction-train 0.9
HIDDEN = 200
RATES = [1.0] * 3 + [0.5] * 3 + [0.25] * 4  # a1-b1-c1 over 10 partitions: the rest to c
TINY: dict[str, Any] = {
    "num-server-rounds": 2,
    "max-client-samples": 32,
    "test-size": 200,
}
ALL_ARMS = "full,fedavg,fedrolex,heterofl,random,shards,sesa"

Example = tuple[ModuleType, ModuleType, ModuleType]


@pytest.fixture(scope="module")
def example() -> Iterator[Example]:
    require_prepared("mnist")
    sys.path.insert(0, str(APP_DIR))
    try:
        from width_mnist import client_app, server_app, task

        yield client_app, server_app, task
    finally:
        sys.path.remove(str(APP_DIR))


def _config(**overrides: Any) -> dict[str, Any]:
    return {**app_run_config(APP_DIR), **TINY, **overrides}


def test_main_runs_every_arm_and_full_equals_flower_fedavg(
    example: Example, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client_app, server_app, _ = example
    config = _config(arms=ALL_ARMS, **{"results-dir": str(tmp_path)})
    grid = InProcessGrid(client_app.app, CLIENTS, config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    server_app.main(grid, context)
    out = capsys.readouterr().out

    record = load_experiment(tmp_path / "width-mnist-mlp.json")
    assert [a.key for a in record.arms] == ALL_ARMS.split(",")
    for arm in record.arms:
        assert arm.aggregated_rounds == [1, 2], arm.key
        assert all(r.failed is None and not r.dropped for r in arm.rounds), arm.key
        if arm.key != "fedavg":  # Flower's FedAvg keeps no byte log
            assert all(r.clients == SAMPLED for r in arm.rounds), arm.key
    # The width path at rate 1 is FedAvg: the same model as Flower's own, to float rounding.
    fedavg = record.arm("fedavg")
    assert fedavg.equivalent_to == "full"
    assert fedavg.max_abs_diff is not None and fedavg.max_abs_diff < 1e-5
    # SESA: the four phases, each with every sampled client; narrow clients upload less in the
    # plaintext arms, SESA clients upload masked vectors (never their arrays).
    sesa = record.arm("sesa")
    for r in sesa.rounds:
        assert set(r.phases) == {"advertise", "offline", "train", "decode"}
        assert all(p.nodes == SAMPLED for p in r.phases.values())
    full, rolling = record.arm("full"), record.arm("fedrolex")
    assert rolling.rounds[0].up_bytes < 0.7 * full.rounds[0].up_bytes
    # The tables, the accuracy summary and the saved models.
    assert "final acc %" in out and "order by max accuracy:" in out
    assert "max |Flower FedAvg - full (target)|" in out
    assert "not which shards a client chose" in " ".join(out.split())  # wrapped at 120
    extra = record.extra["accuracy"]
    assert [row["arm"] for row in extra] == ALL_ARMS.split(",")
    assert all(len(row["curve"]) == 2 and row["max"] is not None for row in extra)
    for key in ALL_ARMS.split(","):
        assert (tmp_path / f"global-model-{key}.npz").exists()


# -- the plaintext extraction arms vs an independent computation -------------------------------


def _channels(arm: str, rate: float, rnd: int, node: int, seed: int) -> np.ndarray:
    k = math.ceil(HIDDEN * rate)
    if arm == "fedrolex":  # FedRolex's official rule, restated in torch
        return torch.roll(torch.arange(HIDDEN), (rnd - 1) % HIDDEN, -1)[:k].numpy()
    if arm == "heterofl":
        return np.arange(k)
    extraction = "random" if arm == "random" else "shards"
    rule = WidthRule(extraction, num_shards=4 if arm == "shards" else None, seed=seed)
    return np.asarray(rule.indices({"blocks.0.layer": HIDDEN}, rate, rnd, node)["blocks.0.layer"])


def _slices(hidden: np.ndarray) -> dict[str, tuple[np.ndarray, ...]]:
    return {
        "blocks.0.layer.weight": (hidden, np.arange(784)),
        "blocks.0.layer.bias": (hidden,),
        "head.weight": (np.arange(10), hidden),
        "head.bias": (np.arange(10),),
    }


def _train_slice(task: ModuleType, client_app: ModuleType, settings: Any, sub: dict, rate: float,
                 rnd: int, pid: int) -> dict[str, np.ndarray]:  # fmt: skip
    net = task.build_model("mlp", rate)
    net.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sub.items()})
    x, y = task.client_data(settings, pid, CLIENTS)
    seed = client_app.train_seed(settings, rnd, pid)
    task.train(net, x, y, settings.local_epochs, settings.lr, settings.batch_size, seed)
    return {k: v.detach().numpy().astype(np.float64) for k, v in net.state_dict().items()}


def test_extraction_arms_equal_an_independent_plaintext_computation(example: Example) -> None:
    client_app, server_app, task = example
    arms = ("fedrolex", "heterofl", "random", "shards")
    config = _config(arms=",".join(arms), **{"test-size": 50})
    grid = InProcessGrid(client_app.app, CLIENTS, config)
    result = server_app.run_experiment(grid, config)
    settings = task.Settings.from_run_config(config)
    initial = {k: v.numpy().astype(np.float32) for k, v in task.initial_state("mlp", 42).items()}
    for arm in arms:
        strategy = result.arm(arm).strategy
        model = {k: v.copy() for k, v in initial.items()}
        for rnd in (1, 2):
            nodes = strategy.rates[rnd]
            assert len(nodes) == SAMPLED
            total = {k: np.zeros(v.shape) for k, v in model.items()}
            count = {k: np.zeros(v.shape) for k, v in model.items()}
            for node, rate in nodes.items():
                pid = int(grid.context(node).node_config["partition-id"])
                assert rate == RATES[pid]
                slices = _slices(_channels(arm, rate, rnd, node, settings.seed))
                sub = {name: model[name][np.ix_(*idx)] for name, idx in slices.items()}
                trained = _train_slice(task, client_app, settings, sub, rate, rnd, pid)
                for name, idx in slices.items():
                    total[name][np.ix_(*idx)] += trained[name]
                    count[name][np.ix_(*idx)] += 1
            for name in model:
                held = count[name] > 0
                model[name][held] = (total[name][held] / count[name][held]).astype(np.float32)
        got = result.arm(arm).arrays
        for name in model:
            np.testing.assert_allclose(got[name], model[name], atol=2e-6, err_msg=f"{arm} {name}")
    # Rolling and static differ from round 2 on (the window moved one channel).
    diff = np.abs(
        result.arm("fedrolex").arrays["head.weight"] - result.arm("heterofl").arrays["head.weight"]
    )
    assert diff.max() > 0


def test_sesa_arm_equals_the_plaintext_average_over_the_secretly_chosen_shards(
    example: Example,
) -> None:
    client_app, server_app, task = example
    config = _config(arms="sesa", **{"num-server-rounds": 1, "test-size": 50})
    grid = InProcessGrid(client_app.app, CLIENTS, config)
    result = server_app.run_experiment(grid, config)
    settings = task.Settings.from_run_config(config)
    strategy = result.arm("sesa").strategy
    train = next(t for t in strategy.traffic if t.phase == "train")
    nodes = sorted(train.up_bytes)
    assert len(nodes) == SAMPLED and strategy.dropped == {1: {}}

    model = {k: v.numpy().astype(np.float32) for k, v in task.initial_state("mlp", 42).items()}
    layout = SesaLayout.of(model, 4)
    total = {k: np.zeros(v.shape) for k, v in model.items()}
    count = {k: np.zeros(v.shape) for k, v in model.items()}
    chosen: list[tuple[int, ...]] = []
    for node in nodes:
        context = grid.context(node)
        state = SesaNodeState.from_bytes(
            context.state.config_records["fsl.sesa.client-state"]["bytes"]
        )
        pid = int(context.node_config["partition-id"])
        (shards,) = state.choice.values()
        assert len(shards) == round(4 * RATES[pid])  # B·S shards of the hidden layer
        chosen.append(tuple(shards))
        hidden = np.concatenate([np.arange(50 * s, 50 * s + 50) for s in sorted(shards)])
        slices = _slices(hidden)
        sub = {name: model[name][np.ix_(*idx)] for name, idx in slices.items()}
        # The mod hands the client the same narrow model the layout cuts out.
        narrow = layout.width_layout(model, state.choice).extract(model)
        for name in sub:
            np.testing.assert_array_equal(narrow[name], sub[name])
        trained = _train_slice(task, client_app, settings, sub, RATES[pid], 1, pid)
        for name, idx in slices.items():
            total[name][np.ix_(*idx)] += trained[name] - sub[name]
            count[name][np.ix_(*idx)] += 1
    expected = {}
    for name, value in model.items():
        held = count[name] > 0
        new = value.astype(np.float64)
        new[held] += total[name][held] / count[name][held]
        expected[name] = new
    got = result.arm("sesa").arrays
    for name in model:
        # 22 fractional bits: each client's delta is rounded to 2^-22 (~2.4e-7).
        np.testing.assert_allclose(got[name], expected[name], atol=1e-6, err_msg=name)
    # The choices were the clients' own (not all alike).
    assert len(set(chosen)) > 1


def test_settings_are_checked_with_the_key_named(example: Example) -> None:
    _, _, task = example
    for key, value, words in (
        ("dataset", "cifar", "dataset must be one of"),
        ("model", "resnet", "model must be one of"),
        ("arms", "full,nope", "arms must be distinct names"),
        ("arms", "full,full", "arms must be distinct names"),
        ("width-mix", "a1-x2", "width-mix"),
        ("width-mix", "a1-e1", "whole shard counts"),  # 1/16 of 4 shards
        ("fraction-train", 0.0, "fraction-train"),
        ("sesa-privacy", 1.5, "sesa-privacy"),
        ("partitioning", "pathological", "partitioning must be one of"),
    ):
        with pytest.raises(ValueError, match=words):
            task.Settings.from_run_config({key: value})
    with pytest.raises(ValueError, match="must be an integer"):
        task.Settings.from_run_config({"num-server-rounds": 2.5})
    assert task.Settings.from_run_config({"sesa-privacy": 3}).privacy == 3
    assert task.Settings.from_run_config({}).privacy == 0.5


def test_shard_partition_is_mcmahans_non_iid_split(example: Example) -> None:
    _, _, task = example
    settings = task.Settings.from_run_config({"max-client-samples": 0})
    parts = [task.client_data(settings, pid, CLIENTS) for pid in range(CLIENTS)]
    sizes = [len(y) for _, y in parts]
    assert sizes == [60_000 // CLIENTS] * CLIENTS
    # Two label-sorted shards of 3,000: at most two labels each, up to boundary straddling.
    labels = [np.unique(y).size for _, y in parts]
    assert max(labels) <= 4 and np.mean(labels) < 3.5
    capped = task.client_data(task.Settings.from_run_config({}), 0, CLIENTS)
    assert len(capped[1]) == 600 and not capped[0].flags.writeable
    with pytest.raises(ValueError, match="partition-id"):
        task.client_data(settings, CLIENTS, CLIENTS)
