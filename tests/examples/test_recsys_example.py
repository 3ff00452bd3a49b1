"""examples/recsys-movielens on the in-process grid, its benchmark's quick mode and notebook 08.

Four MovieLens users, two rounds: FedAvg, FedSubAvg and SecAgg train the DIN-like model from the
same weights; FedSubAvg's uploads are row-sparse (its item rows + genre rows + dense tensors),
training moves only rows some sampled user holds, and arms this build lacks are reported as
"not run", never as numbers.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY as NO_FLOOR
from flwr_fsl.testing import InProcessGrid
from tests.examples.test_notebooks import NOTEBOOKS, run_notebook
from tests.examples.test_notebooks import kernel_name as kernel_name  # the fixture
from tests.prepared_data import require_prepared

REPO = Path(__file__).resolve().parents[2]
APP_DIR = REPO / "examples" / "recsys-movielens"
USERS = 4


@pytest.fixture(scope="module")
def example() -> Iterator[tuple[ModuleType, ModuleType, ModuleType]]:
    require_prepared("movielens", "movielens-items")
    sys.path.insert(0, str(APP_DIR))
    try:
        from recsys_movielens import client_app, server_app, task

        yield task, client_app, server_app
    finally:
        sys.path.remove(str(APP_DIR))


def test_arms_train_and_touch_only_held_rows(
    example: tuple[ModuleType, ModuleType, ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    task, client_app, server_app = example
    config = {
        "num-users": USERS,
        "num-server-rounds": 2,
        "fraction-train": 1.0,
        "arms": "fedavg,fedsubavg,secagg,ssa,sfsl-cpp2,sfsl-cpp4",  # ssa-dp: nothing passes at 4
    }
    grid = InProcessGrid(
        client_app.app,
        USERS,
        config,
        node_config_fn=lambda i: {"partition-id": i, "num-partitions": USERS, NO_FLOOR: 0.0},
    )
    result = server_app.run_experiment(grid, config)
    keys = [r.arm.key for r in result.runs]
    assert keys[:4] == ["fedavg", "fedsubavg", "secagg", "ssa"]
    settings = task.Settings.from_run_config(config)
    held = [task.user_rows(settings, u) for u in range(USERS)]
    initial = result.runs[0].record  # the same start for every arm
    assert initial.initial_metrics["auc"] > 0
    for run in result.runs:
        assert all(r.aggregated for r in run.record.rounds), run.arm.key
        assert run.record.rounds[-1].server_metrics["auc"] > 0.5
    start = server_app.initial_arrays(task.settings_config(settings), settings.seed)
    for arm in ("fedsubavg", "ssa", "sfsl-cpp2"):
        for table in (task.ITEM_TABLE, task.GENRE_TABLE):
            rows = set(np.concatenate([h[table] for h in held]).tolist())
            moved = np.flatnonzero(np.any(result.arm(arm).arrays[table] != start[table], axis=1))
            assert set(moved.tolist()) <= rows and moved.size > 0, (arm, table)
    rows = {r["key"]: r for r in result.record.extra["comparison"]}
    # Row-sparse uploads are a fraction of the dense ones; SecAgg's words are 64-bit.
    assert rows["fedsubavg"]["up_bytes"] < 0.5 * rows["fedavg"]["up_bytes"]
    assert rows["secagg"]["up_bytes"] > rows["fedavg"]["up_bytes"]
    # The two-server arm downloads only its rows (PSR answers) and the dense tensors.
    assert rows["ssa"]["down_bytes"] < rows["fedavg"]["down_bytes"]
    # SFSL sends each user only the rows of its perturbed set and the dense tensors.
    for cpp in ("sfsl-cpp2", "sfsl-cpp4"):
        assert rows[cpp]["down_bytes"] < rows["secagg"]["down_bytes"], cpp
    assert {"sfsl-cpp2", "sfsl-cpp4"} <= set(keys)
    out = capsys.readouterr().out
    for skipped in result.record.extra["not_run"]:
        assert f"{skipped['key']:<12} not run: " in out
        assert skipped["key"] not in keys


def test_settings_refuse_bad_keys(example: tuple[ModuleType, ModuleType, ModuleType]) -> None:
    task, _, _ = example
    with pytest.raises(ValueError, match="arms"):
        task.Settings.from_run_config({"arms": "fedavg,nope"})
    with pytest.raises(ValueError, match="fraction-evaluate"):
        task.Settings.from_run_config({"fraction-evaluate": 0.5})


def test_benchmark_quick(tmp_path: Path) -> None:
    require_prepared("movielens", "movielens-items")
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import recsys_compare
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    assert recsys_compare.main(["--quick", "--out", str(tmp_path), "--no-plot"]) == 0
    saved = json.loads((tmp_path / "recsys_compare_quick.json").read_text())
    assert {r["key"] for r in saved["comparison"]} >= {"fedavg", "fedsubavg", "secagg"}
    ran = {r["key"] for r in saved["comparison"]}
    assert all(n["key"] not in ran for n in saved["not_run"])
    assert len(saved["claims"]) == 5


def test_recsys_notebook_runs(kernel_name: str) -> None:
    require_prepared("movielens", "movielens-items")
    _, text = run_notebook("08_recsys.ipynb", kernel_name)
    assert "tiny=True" in text
    assert "genre rows derived by the spec == the user's genre rows: True" in text
    assert re.search(r"FedSubAvg\s+0\.\d{4}", text)
    assert (NOTEBOOKS / "08_recsys.ipynb").is_file()
