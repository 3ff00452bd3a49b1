"""examples/dpf-psr-movielens on the in-process grid: secure rows == plaintext rows, U-DPF used.

Three MovieLens users, two rounds: the ServerApp's experiment trains the item table once
through PSR + SSA (in-process S1) and once with plaintext ``FedSubAvg`` row-sparse updates,
from the same table with the same client seeds, so the two final tables agree up to the
fixed-point rounding of SSA; from round 2 every client sends a U-DPF hint.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.experiment import ExperimentFailedError
from flwr_fsl.helper import InProcessHelper, default_key_file
from flwr_fsl.testing import InProcessGrid
from tests.prepared_data import require_prepared


def no_floor(nodes: int):  # type: ignore[no-untyped-def]
    """... and on the clients: node config accepting rounds without noise."""
    return lambda i: {"partition-id": i, "num-partitions": nodes, NODE_MIN_NOISE_KEY: 0.0}


APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "dpf-psr-movielens"
USERS = 3


@pytest.fixture(scope="module")
def example() -> Iterator[tuple[ModuleType, ModuleType, ModuleType]]:
    require_prepared("movielens")
    sys.path.insert(0, str(APP_DIR))
    try:
        from dpf_psr_movielens import client_app, server_app, task

        yield task, client_app, server_app
    finally:
        sys.path.remove(str(APP_DIR))


def test_secure_table_equals_plaintext_and_udpf_in_round_2(
    example: tuple[ModuleType, ModuleType, ModuleType],
) -> None:
    task, client_app, server_app = example
    key = SealingKeyPair.generate()
    config = {
        "num-server-rounds": 2,
        "local-epochs": 2,
        "max-rows": 32,
        "min-nodes": USERS,
        "ssa-helper-fingerprint": key.fingerprint,
        "ssa-frac-bits": 32,
        "ssa-dp-noise-multiplier": 0.0,  # exact tables: DP off on S0 ...
    }
    grid = InProcessGrid(client_app.app, USERS, config, node_config_fn=no_floor(USERS))
    result = server_app.run_experiment(grid, config, helper=InProcessHelper(keypair=key))
    secure, plain = result.arm("secure"), result.arm("plaintext")
    assert [r.arm.key for r in result.runs] == ["secure", "plaintext"]
    assert secure.strategy.failed_rounds == {}
    assert all(not d for d in secure.strategy.dropped.values())
    assert all(not d for d in plain.strategy.dropped.values())
    # The same count-weighted row average, up to SSA's fixed-point rounding.
    np.testing.assert_allclose(secure.arrays[task.TABLE], plain.arrays[task.TABLE], atol=1e-6)
    diff = float(np.max(np.abs(secure.arrays[task.TABLE] - plain.arrays[task.TABLE])))
    assert secure.record.max_abs_diff == pytest.approx(diff) and diff < 1e-6
    # Training changed exactly the rows of the three users' row sets.
    settings = task.Settings.from_run_config(config)
    initial = task.initial_table(settings)
    rows = np.unique(
        np.concatenate([task.user_data(u, 32, 0.2, settings.seed).rows for u in range(USERS)])
    )
    changed = np.flatnonzero(np.any(secure.arrays[task.TABLE] != initial, axis=1))
    assert set(changed) <= set(rows) and len(changed) > 0.9 * len(rows)
    # Round 1 uploads fresh keys, round 2 only U-DPF hints (the row sets are fixed).
    metrics = secure.result.train_metrics_clientapp
    assert metrics[1]["udpf-clients"] == 0
    assert metrics[2]["udpf-clients"] == USERS
    rounds = secure.record.rounds
    assert [server_app.UDPF.value(r) for r in rounds] == [0, USERS]
    assert rounds[1].phases["train"].up_bytes < rounds[0].phases["train"].up_bytes
    assert result.record.extra["udpf_upload"]["rounds"]["U-DPF hints"] == [2]
    # Both runs evaluate on the same held-out ratings and agree on the RMSE.
    rmse = server_app.RMSE
    assert secure.record.final(rmse) == pytest.approx(plain.record.final(rmse), abs=1e-5)
    # The plaintext run downloads the whole table; the secure one only its PSR answers.
    assert rounds[0].down_bytes < plain.record.rounds[0].down_bytes
    # Up = PSR query + SSA upload, summed per client.
    psr, train = rounds[0].phases["psr"], rounds[0].phases["train"]
    assert rounds[0].up_bytes == pytest.approx(psr.up_bytes + train.up_bytes)
    assert rounds[0].clients == USERS


def test_user_data_rows_are_fixed_and_capped(
    example: tuple[ModuleType, ModuleType, ModuleType],
) -> None:
    task, _, _ = example
    heavy = int(np.argmax([len(task.user_data(u, 10**6).train_items) for u in range(20)]))
    full = task.user_data(heavy, 10**6)
    capped = task.user_data(heavy, 16)
    assert full.rows.size > 16 and capped.rows.size == 16
    assert np.array_equal(capped.rows, task.user_data(heavy, 16).rows)
    assert set(capped.rows) <= set(full.rows)
    assert set(capped.train_items) == set(capped.rows)
    assert capped.dropped == full.train_items.size - capped.train_items.size
    assert np.array_equal(full.test_items, capped.test_items)
    assert not set(full.train_items) & set(full.test_items)


def test_training_moves_only_its_rows(example: tuple[ModuleType, ModuleType, ModuleType]) -> None:
    task, _, _ = example
    settings = task.Settings()
    table = task.initial_table(settings)
    data = task.user_data(0, settings.max_rows)
    trained, user, loss = task.train_user(
        table,
        task.initial_user(settings, 0),
        data.train_items,
        data.train_ratings,
        mean=settings.global_mean,
        epochs=3,
        lr=settings.lr,
        reg=settings.reg,
        seed=0,
    )
    moved = np.flatnonzero(np.any(trained != table, axis=1))
    assert set(moved) == set(data.rows)
    assert np.isfinite(loss) and user.shape == (settings.dim + 1,)


def test_settings_validation(example: tuple[ModuleType, ModuleType, ModuleType]) -> None:
    task, _, _ = example
    with pytest.raises(ValueError, match="max-rows"):
        task.Settings.from_run_config({"max-rows": 0})
    with pytest.raises(ValueError, match="must be true or false"):
        task.Settings.from_run_config({"ssa-udpf": 1})
    with pytest.raises(ValueError, match="user must be"):
        task.user_data(10**6, 8)


def test_default_helper_pin_without_run_config_keys(
    example: tuple[ModuleType, ModuleType, ModuleType],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # `flwr run` with the app's defaults: no S1 key pinned anywhere. The ServerApp creates the
    # key under $FLWR_HOME, the clients pin it from there, and nobody edits the run config
    # (Flower rejects a ClientApp that changes context.run_config).
    _, client_app, server_app = example
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    config = {"num-server-rounds": 1, "local-epochs": 1, "compare-plaintext": False}
    grid = InProcessGrid(client_app.app, 2, config)
    result = server_app.run_experiment(grid, config)
    assert default_key_file().is_file()
    secure = result.arm("secure")
    assert secure.result.train_metrics_clientapp[1]["udpf-clients"] == 0
    assert all(not d for d in secure.strategy.dropped.values())
    assert all(ctx.run_config == config for ctx in grid._contexts.values())


def test_a_training_without_any_update_fails_the_run(
    example: tuple[ModuleType, ModuleType, ModuleType],
) -> None:
    _, client_app, server_app = example
    key = SealingKeyPair.generate()
    pinned = {"num-server-rounds": 1, "compare-plaintext": False}
    wrong = {**pinned, "ssa-helper-fingerprint": SealingKeyPair.generate().fingerprint}
    grid = InProcessGrid(client_app.app, 2, wrong)  # clients pin another key: all refuse
    with pytest.raises(ExperimentFailedError, match=r"no round aggregated .*secure \(PSR\+SSA\)"):
        server_app.run_experiment(
            grid,
            {**pinned, "ssa-helper-fingerprint": key.fingerprint},
            helper=InProcessHelper(keypair=key),
        )
