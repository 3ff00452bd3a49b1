"""Every run-config key an example reads is checked before round 1, naming the key.

For each example app and each key of its ``[tool.flwr.app.config]``, a value of the wrong type
(and, where the key has a range or a set of choices, one outside it) makes the ServerApp's
``main`` raise :class:`~flwr_fsl.core.errors.ConfigurationError` whose message names the key,
and no client is ever called (the grid's ClientApp records every call and fails it).
"""

from __future__ import annotations

import importlib
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.local import app_run_config
from tests.prepared_data import require_prepared

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
APPS: dict[str, tuple[str, str]] = {  # example -> (package, dataset it needs prepared)
    "secagg-mnist": ("secagg_mnist", "mnist"),
    "topk-mnist": ("topk_mnist", "mnist"),
    "dpf-ssa-mnist": ("dpf_ssa_mnist", "mnist"),
    "width-mnist": ("width_mnist", "mnist"),
    "privhfl-fmnist": ("privhfl_fmnist", "fashion"),
    "dpf-psr-movielens": ("dpf_psr_movielens", "movielens"),
    "dpf-psr-newsgroups": ("dpf_psr_newsgroups", "newsgroups"),
    "sfsl-movielens": ("sfsl_movielens", "movielens"),
    "recsys-movielens": ("recsys_movielens", "movielens"),
}
NODES = 3

# Values outside a key's range or choices (the wrong types are generated from the default).
RANGE: dict[str, list[Any]] = {
    "num-server-rounds": [0],
    "fraction-train": [1.5, -0.1],
    "fraction-evaluate": [1.5],
    "min-nodes": [0],
    "local-epochs": [0],
    "lr": [0.0],
    "local-lr": [-1.0],
    "batch-size": [0],
    "partitioning": ["no-such-scheme"],
    "dirichlet-alpha": [0.0],
    "alpha": [0.0],
    "seed": [-1],
    "max-client-samples": [-1],
    "test-size": [-1],
    "topk-ratio": [0.0, 1.5],
    "reconstruction-threshold": [1, 0.0],
    "clipping-range": [-1.0],
    "dim": [0],
    "init-std": [-1.0],
    "reg": [-1.0],
    "max-rows": [0],
    "test-fraction": [0.0, 1.0],
    "ssa-frac-bits": [-1, 200],
    "ssa-max-abs": [0.0],
    "ssa-dp-noise-multiplier": [-1.0],
    "ssa-dp-clip-norm": [0.0],
    "ssa-dp-budget-epsilon": [-1.0],
    "dataset": ["no-such-data"],
    "model": ["no-such-model"],
    "arms": ["no-such-arm"],
    "width-mix": ["z9"],
    "num-shards": [0],
    "sesa-privacy": [0.0, 1.5],
    "sesa-clip": [0.0],
    "sesa-frac-bits": [0],
    "sesa-max-clients": [1],
    "calibration-size": [0],
    "archs": ["no-such-arch"],
    "samples-per-client": [0],
    "local-optimizer": ["rmsprop"],
    "expansion": ["no-such-expansion"],
    "selection": ["no-such-selection"],
    "pool-size": [0],
    "num-queries": [0],
    "answering": ["magic"],
    "comparison": ["magic"],
    "secure-queries": [-1],
    "fraction-answer": [0.0],
    "retrain-epochs": [-1],
    "temperature": [0.0],
    "vocab-size": [-1],
    "stop-words": [-1],
    "test-docs": [-1],
    "clip": [0.0],
    "sfsl-threshold": [0.0, 1.5],
    "sfsl-frac-bits": [-1],
    "sfsl-cpp": ["cpp9"],
    "sfsl-dp-noise-multiplier": [-1.0],
    "sfsl-dp-clip-norm": [0.0],
    "sfsl-dp-max-rows": [0],
    "sfsl-dp-epsilon": [-1.0],
    "secagg-threshold": [0.0, 1.5],
    "secagg-frac-bits": [-1],
    "global-mean": [math.inf],
    "log-level": ["loud"],
}
# Per example, where a key's range differs (PrivHFL may skip local training).
RANGE_FOR: dict[str, dict[str, list[Any]]] = {"privhfl-fmnist": {"local-epochs": [-1]}}
# String keys that take any text (a path, an address: checked where they are used).
FREE_TEXT = {
    "results-dir",
    "ssa-helper-address",
    "ssa-helper-fingerprint",
    "ssa-helper-key-file",
    "ssa-helper-token-file",
    "ssa-helper-ca-file",
}


def _wrong_types(default: Any) -> list[Any]:
    if isinstance(default, bool):
        return ["yes", 1]
    if isinstance(default, int):
        return [1.5, "x"]
    if isinstance(default, float):
        return ["x", math.nan]
    return [5]


def _cases() -> Iterator[Any]:
    for example in APPS:
        for key, default in app_run_config(EXAMPLES / example).items():
            values = _wrong_types(default)
            if key not in FREE_TEXT:
                values += RANGE_FOR.get(example, {}).get(key, RANGE.get(key, []))
            for value in values:
                yield pytest.param(example, key, value, id=f"{example}-{key}={value!r}")


def _refusing_app(calls: list[int]) -> ClientApp:
    app = ClientApp()

    def handle(msg: Message, context: Context) -> Message:
        calls.append(context.node_id)
        raise RuntimeError("a client was called: the run config was not refused up front")

    app.train()(handle)
    app.evaluate()(handle)
    app.query()(handle)
    return app


@pytest.fixture(scope="module")
def server_apps() -> Iterator[dict[str, Any]]:
    added = [str(EXAMPLES / e) for e in APPS]
    sys.path[:0] = added
    try:
        yield {e: importlib.import_module(f"{pkg}.server_app") for e, (pkg, _) in APPS.items()}
    finally:
        for path in added:
            sys.path.remove(path)


@pytest.mark.parametrize(("example", "key", "value"), list(_cases()))
def test_bad_run_config_value_is_refused_before_any_client(
    server_apps: dict[str, Any], example: str, key: str, value: Any
) -> None:
    require_prepared(APPS[example][1])
    config = {**app_run_config(EXAMPLES / example), key: value}
    calls: list[int] = []
    grid = InProcessGrid(_refusing_app(calls), NODES, config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    pattern = re.escape(key).replace(r"\-", "[-_ ]")
    with pytest.raises(ConfigurationError, match=pattern):
        server_apps[example].main(grid, context)
    assert calls == []


def test_every_example_is_covered() -> None:
    found = {p.parent.name for p in EXAMPLES.glob("*/pyproject.toml")}
    assert found == set(APPS)


def test_width_mnist_at_six_nodes_fails_before_any_arm_trains_naming_the_minimum(
    server_apps: dict[str, Any],
) -> None:
    # Issue 23: SESA needs K_max + T = 4 + 2 = 6 of the 5 clients a round samples (0.9 x 6);
    # it used to fail after four other arms had trained.
    require_prepared("mnist")
    config = app_run_config(EXAMPLES / "width-mnist")
    calls: list[int] = []
    grid = InProcessGrid(_refusing_app(calls), 6, config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    with pytest.raises(ConfigurationError, match=r"arm 'sesa'.*at least 6 clients.*5 of 6 nodes"):
        server_apps["width-mnist"].main(grid, context)
    assert calls == []
