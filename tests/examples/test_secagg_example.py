"""examples/secagg-mnist on the in-process grid: SecAggFedAvg == Flower's FedAvg, every round.

The ServerApp's ``main`` and the ClientApp, three clients, two rounds, 64 MNIST images each:
the experiment trains once with Flower's ``FedAvg`` and once with ``SecAggFedAvg`` from the
same initial model with the same clients. Every client trains with a seed of its own (run seed,
round, partition), on one torch thread, on CPU, so in round 1 both arms average the very same
trained models; from round 2 the inputs differ by SecAgg's fixed-point rounding (24 fractional
bits, ~1e-8), so the final models agree to ~1e-7 — well within 1e-5. A client lost in the
SecAgg train phase is unmasked away and the round still aggregates.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.experiment import load_experiment
from flwr_fsl.families.secagg.records import SECAGG_KEY
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.local import app_run_config
from tests.prepared_data import require_prepared

APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "secagg-mnist"
CLIENTS = 3
ROUNDS = 2
TINY: dict[str, Any] = {
    "num-server-rounds": ROUNDS,
    "fraction-train": 1.0,
    "max-client-samples": 64,
    "test-size": 300,
}
SECAGG_PHASES = {"advertise", "share", "train", "unmask"}

Example = tuple[ModuleType, ModuleType]


@pytest.fixture(scope="module")
def example() -> Iterator[Example]:
    require_prepared("mnist")
    sys.path.insert(0, str(APP_DIR))
    try:
        from secagg_mnist import client_app, server_app

        yield client_app, server_app
    finally:
        sys.path.remove(str(APP_DIR))


def test_main_secagg_equals_fedavg_every_round(
    example: Example, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client_app, server_app = example
    # The app's own defaults (pyproject.toml) with the tiny setting on top, as `flwr run` does.
    # With compare-weighted, SecAggFedAvg(weighted=True) trains too: the partitions have equal
    # sizes (64 images each), so unit and sample weights give the same model.
    config = {
        **app_run_config(APP_DIR), **TINY, "results-dir": str(tmp_path), "compare-weighted": True,
    }  # fmt: skip
    grid = InProcessGrid(client_app.app, CLIENTS, config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    server_app.main(grid, context)
    out = capsys.readouterr().out

    record = load_experiment(tmp_path / "secagg-mnist.json")
    fedavg, secagg = record.arm("fedavg"), record.arm("secagg")
    assert [a.key for a in record.arms] == ["fedavg", "secagg", "secagg-weighted"]
    weighted = record.arm("secagg-weighted")
    assert weighted.max_abs_diff is not None and weighted.max_abs_diff < 1e-5
    for arm in (fedavg, secagg):
        assert arm.aggregated_rounds == list(range(1, ROUNDS + 1))
        assert all(r.failed is None and not r.dropped for r in arm.rounds)
        assert all(r.clients == CLIENTS for r in arm.rounds)
    # SecAgg: four phases per round, each with every client.
    for r in secagg.rounds:
        assert set(r.phases) == SECAGG_PHASES
        assert all(p.nodes == CLIENTS for p in r.phases.values())
        # A masked vector is one uint64 word per parameter: about twice FedAvg's float32 upload.
        assert 1.9 < r.up_bytes / fedavg.rounds[0].up_bytes < 2.1
    # The same model up to the fixed point, hence the same accuracy in every round.
    models = {k: np.load(tmp_path / f"global-model-{k}.npz") for k in ("fedavg", "secagg")}
    for name in models["fedavg"].files:
        np.testing.assert_allclose(models["secagg"][name], models["fedavg"][name], atol=1e-5)
    assert secagg.max_abs_diff is not None and secagg.max_abs_diff < 1e-5
    for a, b in zip(fedavg.rounds, secagg.rounds, strict=True):
        assert a.server_metrics["accuracy"] == pytest.approx(
            b.server_metrics["accuracy"], abs=0.005
        )
        # FedAvg reads every client's train_loss; SecAggFedAvg asks for no train metric.
        assert "train_loss" in a.train_metrics and "train_loss" not in b.train_metrics
    assert secagg.rounds[-1].train_metrics["secagg-clients"] == CLIENTS
    # The harness printed its tables.
    assert "final acc %" in out and "SecAggFedAvg" in out and "max |SecAggFedAvg - FedAvg|" in out
    assert "only the sum over the clients that finished" in out


def test_a_client_lost_in_the_secagg_train_phase_is_unmasked_away(example: Example) -> None:
    client_app, server_app = example
    # 4 clients, t = ceil(0.6 * 4) = 3: one may drop. Node 1001 trains, then its masked input
    # is lost on the way (FedAvg's plain train messages reach it as usual).
    config = {**TINY, "num-server-rounds": 1}

    def lost(node: int, msg: Message) -> bool:
        record = msg.content.config_records.get(SECAGG_KEY)
        return node == 1001 and record is not None and record["phase"] == "train"

    grid = InProcessGrid(client_app.app, 4, config, drop_nodes=lost)
    result = server_app.run_experiment(grid, config)
    secagg = result.arm("secagg")
    assert secagg.strategy.failed_rounds == {}
    assert set(secagg.strategy.dropped[1]) == {1001}
    assert secagg.record.aggregated_rounds == [1]
    assert secagg.result.train_metrics_clientapp[1]["secagg-clients"] == 3
    # FedAvg averaged four clients, SecAgg three: not the same model.
    assert secagg.record.max_abs_diff is not None and secagg.record.max_abs_diff > 1e-4


def test_federated_evaluation_needs_the_run_configs_opt_in(example: Example) -> None:
    client_app, server_app = example
    config = {**TINY, "num-server-rounds": 1, "fraction-evaluate": 1.0, "compare-fedavg": False}
    grid = InProcessGrid(client_app.app, 3, config)
    with pytest.raises(ConfigurationError, match="plaintext_evaluation=True"):
        server_app.run_experiment(grid, config)
    result = server_app.run_experiment(grid, {**config, "plaintext-evaluation": True})
    secagg = result.arm("secagg")
    assert secagg.result.evaluate_metrics_clientapp  # the clients' metrics, in the clear
