"""examples/privhfl-fmnist on the in-process grid, tiny: both answering arms complete.

- The ServerApp's ``run_experiment`` with the app's own run config (three architectures by
  ``partition-id``, mixup queries) on a few Fashion-MNIST images per client, with
  ``answering = "plaintext"`` named (the app's default is ``"secure"``; a secure query costs
  each CNN answerer tens of MB, and this test's point is the report): one round, nobody
  dropped, every node's accuracy recorded before (after its local training) and after
  re-training, the architectures told apart, the report printed.
- The app's default arm (secure answering, DCF comparison), and the paper's DReLU, against its
  plaintext arm with the same seeds (so the same local models; the same queries because each
  node has its own ``privhfl-query-key`` in its node config): each querier's
  opened soft labels equal softmax of the plaintext logit sums within the fixed-point error.
  MLP clients keep this seconds-fast; every layer type and the CNNs through the secure flow,
  and the views of each party, are covered by ``tests/families/privhfl/test_strategy.py``
  (``-k secure``, and ``test_the_server_view_at_default``) and ``tests/families/privhfl/``,
  not repeated here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from flwr.app import Context

from flwr_fsl.families.privhfl.mod import PrivHFLClient
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.local import app_run_config
from tests.prepared_data import require_prepared

APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "privhfl-fmnist"
TINY: dict[str, Any] = {
    "samples-per-client": 40,
    "test-size": 100,
    "local-epochs": 1,
    "retrain-epochs": 1,
    "pool-size": 60,
    "num-queries": 4,
    "secure-queries": 4,
}

Example = tuple[ModuleType, ModuleType, ModuleType]


@pytest.fixture(scope="module")
def example() -> Iterator[Example]:
    require_prepared("fashion")
    sys.path.insert(0, str(APP_DIR))
    try:
        from privhfl_fmnist import client_app, server_app, task

        yield client_app, server_app, task
    finally:
        sys.path.remove(str(APP_DIR))


def _config(**overrides: Any) -> dict[str, Any]:
    return {**app_run_config(APP_DIR), **TINY, **overrides}


def _keyed_node(i: int) -> dict[str, Any]:
    """Node ``i``'s config with a query-seed key of its own (the server never sees it)."""
    return {"partition-id": i, "num-partitions": 3, "privhfl-query-key": f"{i + 1:032x}"}


def test_main_runs_and_records_accuracy_before_and_after(
    example: Example, capsys: pytest.CaptureFixture[str]
) -> None:
    client_app, server_app, _ = example
    config = _config(answering="plaintext")  # not the default (docstring)
    assert callable(server_app.main)
    assert config["expansion"] == "mixup"
    grid = InProcessGrid(client_app.app, 3, config)
    report = server_app.run_experiment(grid, config)
    out = capsys.readouterr().out
    strategy = report.strategy
    assert not strategy.failed_rounds and not strategy.dropped.get(1)
    assert set(report.before) == set(report.after) == set(grid.get_node_ids())
    assert all(0.0 <= a <= 1.0 for a in report.before.values())
    assert sorted(report.arch.values()) == ["resnet10", "resnet8", "vgg7"]
    assert all(0.0 <= a <= 1.0 for a in report.after.values())
    phases = [t.phase for t in strategy.rounds[1].traffic]
    assert {"generate", "answer", "retrain", "evaluate"} <= set(phases)
    assert {"local", "evaluate-local"} <= set(phases)  # round 1 starts with local training
    assert "vgg7" in out and "resnet8" in out and "resnet10" in out
    assert "mean all" in out and "what each party learned (plaintext answering)" in out
    assert "every query image" in out and "dropped: none" in out


def test_the_app_defaults_to_secure_answering(example: Example) -> None:
    _, _, task = example
    defaults = app_run_config(APP_DIR)
    assert defaults["answering"] == "secure" and defaults["comparison"] == "dcf"
    settings = task.Settings.from_run_config(defaults)
    assert settings == task.Settings()  # pyproject and the dataclass agree
    assert settings.queries == settings.secure_queries


def test_settings_are_validated(example: Example) -> None:
    _, _, task = example
    for bad in ({"archs": "vgg7,lenet"}, {"answering": "fhe"}, {"num-queries": 10_000},
                {"dataset": "cifar"}, {"fraction-answer": 0.0}):  # fmt: skip
        with pytest.raises(ValueError, match="invalid run config"):
            task.Settings.from_run_config(_config(**bad))
    with pytest.raises(ValueError):
        app_run_config(APP_DIR, ["no-such-key=1"])


@pytest.mark.parametrize("comparison", ["dcf", "drelu"])
def test_secure_arm_soft_labels_equal_the_plaintext_arm(
    example: Example, monkeypatch: pytest.MonkeyPatch, comparison: str
) -> None:
    client_app, server_app, _ = example
    opened: dict[str, dict[int, np.ndarray]] = {"plaintext": {}, "secure": {}}

    def spy(name: str, arm: str) -> None:
        original = getattr(PrivHFLClient, name)

        def wrapped(self: PrivHFLClient, msg: Any, context: Context, config: Any) -> Any:
            x, soft = original(self, msg, context, config)
            if soft is not None:
                opened[arm][context.node_id] = soft
            return x, soft

        monkeypatch.setattr(PrivHFLClient, name, wrapped)

    spy("_soft_labels", "plaintext")
    spy("_secure_soft_labels", "secure")
    reports = {}
    for arm in ("plaintext", "secure"):
        # the secure arm with DCF is the app's default run config (tiny sizes, MLP clients)
        arm_settings = {"answering": arm} if arm == "plaintext" else {}
        config = _config(archs="mlp", comparison=comparison, **arm_settings)
        assert config["answering"] == arm
        grid = InProcessGrid(client_app.app, 3, config, node_config_fn=_keyed_node)
        reports[arm] = server_app.run_experiment(grid, config)
        assert not reports[arm].strategy.dropped.get(1), arm
    assert set(reports["secure"].before) == set(reports["plaintext"].before)
    # the same local models (same seeds, no answering yet)
    assert reports["secure"].before == reports["plaintext"].before
    # fraction-train = 0.2 and min_train_nodes = 2: two of the three nodes query
    assert sorted(opened["secure"]) == sorted(opened["plaintext"]) and len(opened["secure"]) == 2
    for node, soft in opened["secure"].items():
        plain = opened["plaintext"][node]
        assert soft.shape == plain.shape == (4, 10)
        np.testing.assert_allclose(soft, plain, atol=1e-4)
    secure_phases = {t.phase for t in reports["secure"].strategy.rounds[1].traffic}
    assert {"keys", "generate", "step-1", "retrain"} <= secure_phases
    assert "answer" not in secure_phases
