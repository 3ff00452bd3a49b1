"""Issue 25, items 1-8: one test each (item 4, Flower's accountant, is in test_dp_wrappers.py).

Each test states FedAvg's behaviour it is checked against; where a drop-in differs on
purpose, the difference is in ``docs/dropin.md`` and the test asserts the documented
behaviour.
"""

from __future__ import annotations

import inspect
import logging
import re
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.mods import secagg_mod
from flwr_fsl.strategies import FedSubAvg, SecAggFedAvg
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import MODEL, make_app, model_record

from ._upstream_utils import create_mock_reply

ROOT = Path(__file__).resolve().parents[2]


def _reply_mod(train: bool, edit):  # type: ignore[no-untyped-def]
    """A mod (outermost) that edits node 0's train (or evaluate) reply content."""

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        reply = call_next(msg, context)
        kind = "train" if train else "evaluate"
        if msg.metadata.message_type == kind and reply.has_content():
            pid = int(context.node_config["partition-id"])
            return Message(edit(pid, reply.content), reply_to=msg)
        return reply

    return mod


def _add_metric(pid: int, content: RecordDict) -> RecordDict:
    if pid == 0:
        next(iter(content.metric_records.values()))["acc"] = 1.0
    return content


def _floats(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: a.numpy() for k, a in arrays.items() if np.issubdtype(MODEL[k].dtype, np.floating)}


# -- 1 -----------------------------------------------------------------------------------------
def test_1_a_metric_only_some_clients_report_is_not_averaged_over_everyone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # FedAvg raises InconsistentMessageReplies; the drop-ins report no client metric that round
    # (never 1.0 reported as 1/3) and warn, naming the key.
    grid = InProcessGrid(make_app([_reply_mod(True, _add_metric)]), 3)
    with caplog.at_level(logging.WARNING):
        result = FedSubAvg(min_available_nodes=3, fraction_evaluate=0.0).start(
            grid=grid, initial_arrays=model_record(), num_rounds=1
        )
    assert "acc" not in result.train_metrics_clientapp[1]
    assert "train-loss" not in result.train_metrics_clientapp[1]
    assert "['acc'] reported by some clients only" in caplog.text
    grid = InProcessGrid(make_app([_reply_mod(False, _add_metric), secagg_mod]), 3)
    secagg = SecAggFedAvg(min_available_nodes=3, fraction_evaluate=1.0, plaintext_evaluation=True)
    result = secagg.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert "acc" not in result.evaluate_metrics_clientapp[1]


# -- 2 -----------------------------------------------------------------------------------------
def _to_float64(_pid: int, content: RecordDict) -> RecordDict:
    key, record = next(iter(content.array_records.items()))
    arrays = {
        k: Array(a.numpy().astype(np.float64) if a.numpy().dtype == np.float32 else a.numpy())
        for k, a in record.items()
    }
    content[key] = ArrayRecord(arrays)
    return content


def test_2_float64_replies_to_a_float32_model_are_averaged_as_fedavg_does() -> None:
    runs = {}
    for cls in (FedAvg, FedSubAvg):
        grid = InProcessGrid(make_app([_reply_mod(True, _to_float64)]), 3)
        strategy = cls(min_available_nodes=3, fraction_evaluate=0.0)
        runs[cls] = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=2).arrays
    want, got = _floats(runs[FedAvg]), _floats(runs[FedSubAvg])
    for name, value in want.items():
        assert got[name].dtype == value.dtype == np.float64  # FedAvg's dtype
        np.testing.assert_allclose(got[name], value, rtol=1e-6)
        assert not np.array_equal(got[name], MODEL[name])  # the rounds did aggregate


# -- 3 -----------------------------------------------------------------------------------------
def test_3_aggregate_train_on_replies_it_did_not_ask_for_is_fedavg() -> None:
    rng = np.random.default_rng(3)
    replies = [
        create_mock_reply(ArrayRecord([rng.normal(size=(4, 3)), rng.normal(size=5)]), n)
        for n in (1, 4, 2)
    ]
    want, _ = FedAvg().aggregate_train(7, replies)
    got, _ = FedSubAvg().aggregate_train(7, replies)
    assert want is not None and got is not None
    for a, b in zip(want.to_numpy_ndarrays(), got.to_numpy_ndarrays(), strict=True):
        np.testing.assert_array_equal(a, b)  # the same arithmetic, bit for bit


# -- 5 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [FedSubAvg, SecAggFedAvg])
def test_5_constructor_has_fedavgs_positional_order_and_keyword_only_extras(cls: type) -> None:
    fedavg = list(inspect.signature(FedAvg.__init__).parameters.values())[1:]
    ours = list(inspect.signature(cls.__init__).parameters.values())[1:]
    positional = [p for p in ours if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [p.name for p in positional] == [p.name for p in fedavg]
    assert all(p.kind is p.KEYWORD_ONLY for p in ours[len(positional) :])
    # Defaults as FedAvg's, except SecAgg's documented privacy default (S2).
    differ = {p.name for p, q in zip(positional, fedavg, strict=True) if p.default != q.default}
    assert differ == (set() if cls is FedSubAvg else {"fraction_evaluate"})


def test_5_secagg_refuses_train_metrics_aggr_fn_by_keyword_and_by_position() -> None:
    def fn(records: list[RecordDict], key: str) -> MetricRecord:
        return MetricRecord()

    with pytest.raises(ConfigurationError, match="train_metrics_aggr_fn"):
        SecAggFedAvg(train_metrics_aggr_fn=fn)
    with pytest.raises(ConfigurationError, match="train_metrics_aggr_fn"):  # FedAvg's 9th
        SecAggFedAvg(1.0, 0.0, 2, 2, 2, "num-examples", "arrays", "config", fn)
    assert SecAggFedAvg(1.0, 0.0, 2, 2, 2, "num-examples", "arrays", "config", None, fn) \
        .evaluate_metrics_aggr_fn is fn  # fmt: skip


# -- 6 -----------------------------------------------------------------------------------------
def _list_metric(pid: int, content: RecordDict) -> RecordDict:
    if pid == 0:
        next(iter(content.metric_records.values()))["train-loss"] = [0.1, 0.2]
    return content


def test_6_secagg_metric_defaults_limits_and_list_metrics_are_loud(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Default train_metrics=() (privacy default S3): no client metric in Result; named: its mean.
    grid = InProcessGrid(make_app([secagg_mod]), 3)
    result = SecAggFedAvg(min_available_nodes=3).start(grid, model_record(), num_rounds=1)
    assert set(result.train_metrics_clientapp[1]) == {"secagg-clients"}
    named = SecAggFedAvg(min_available_nodes=3, train_metrics=("train-loss",))
    result = named.start(InProcessGrid(make_app([secagg_mod]), 3), model_record(), num_rounds=1)
    assert result.train_metrics_clientapp[1]["train-loss"] == pytest.approx(1.0, abs=1e-6)
    # A named metric sent as a list drops that client with a reason naming the metric.
    listed = SecAggFedAvg(min_available_nodes=3, train_metrics=("train-loss",))
    grid = InProcessGrid(make_app([secagg_mod, _reply_mod(True, _list_metric)]), 3)
    listed.start(grid, model_record(), num_rounds=1)
    (reason,) = listed.dropped[1].values()
    assert "train metric 'train-loss' is not a number" in reason
    # A weight above max_weight drops the client with a reason naming the limit (no value).
    heavy = SecAggFedAvg(min_available_nodes=3, weighted=True, max_weight=25.0)
    node_config = {"fsl-weight-keys": "num-examples"}
    grid = InProcessGrid(
        make_app([secagg_mod]), 3, node_config_fn=lambda i: {**node_config, "partition-id": i}
    )
    with caplog.at_level(logging.INFO):
        heavy.start(grid, model_record(), num_rounds=1)  # weights 10, 20, 30
    (reason,) = heavy.dropped[1].values()
    assert "exceeds max_weight = 25" in reason and "30" not in reason
    assert "a client is dropped whole if a named metric is not a number" in caplog.text


# -- 7 -----------------------------------------------------------------------------------------
def test_7_secagg_subclass_overriding_configure_or_aggregate_train_is_refused() -> None:
    class Custom(SecAggFedAvg):
        def configure_train(  # type: ignore[override]
            self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
        ) -> list[Message]:
            config["lr"] = 0.1
            return list(super().configure_train(server_round, arrays, config, grid))

    class Agg(SecAggFedAvg):
        def aggregate_train(self, server_round, replies):  # type: ignore[no-untyped-def]
            return super().aggregate_train(server_round, replies)

    for cls, method in ((Custom, "configure_train"), (Agg, "aggregate_train")):
        with pytest.raises(ConfigurationError, match=f"overrides {method}, which a .* never"):
            cls()
    SecAggFedAvg()  # the class itself, and subclasses overriding train_round, are fine


# -- 8 -----------------------------------------------------------------------------------------
def _drop_fc_bias(pid: int, content: RecordDict) -> RecordDict:
    if pid == 0:
        key, record = next(iter(content.array_records.items()))
        content[key] = ArrayRecord({k: a for k, a in record.items() if k != "fc.bias"})
    return content


def test_8_a_reply_missing_one_tensor_is_kept() -> None:
    # FedAvg takes the reply too (it drops the tensor from the model when every reply lacks it,
    # raises when replies disagree); FedSubAvg averages the tensor over the replies that have it.
    grid = InProcessGrid(make_app([_reply_mod(True, _drop_fc_bias)]), 3)
    strategy = FedSubAvg(min_available_nodes=3, fraction_evaluate=0.0)
    new = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1).arrays
    assert strategy.dropped[1] == {}
    plain = InProcessGrid(make_app(), 3)
    full = FedAvg(min_available_nodes=3, fraction_evaluate=0.0)
    ref = full.start(grid=plain, initial_arrays=model_record(), num_rounds=1).arrays
    assert not np.allclose(new["fc.bias"].numpy(), ref["fc.bias"].numpy())  # node 0 left out
    np.testing.assert_allclose(new["conv.weight"].numpy(), ref["conv.weight"].numpy(), rtol=1e-5)


def test_8_traffic_keys_join_the_default_metrics_only() -> None:
    def mine(records: list[RecordDict], key: str) -> MetricRecord:
        return MetricRecord({"mine": len(records)})

    grid = InProcessGrid(make_app(), 3)
    custom = FedSubAvg(min_available_nodes=3, fraction_evaluate=0.0, train_metrics_aggr_fn=mine)
    result = custom.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert dict(result.train_metrics_clientapp[1]) == {"mine": 3}
    default = FedSubAvg(min_available_nodes=3, fraction_evaluate=0.0)
    result = default.start(
        grid=InProcessGrid(make_app(), 3), initial_arrays=model_record(), num_rounds=1
    )
    assert {"up-bytes-per-client", "touched-fraction", "train-loss"} <= set(
        result.train_metrics_clientapp[1]
    )


def test_8_start_logs_flowers_start_up_lines(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        FedSubAvg(min_available_nodes=3, fraction_evaluate=0.0).start(
            InProcessGrid(make_app(), 3), model_record(), num_rounds=1
        )
    for line in (
        "Starting FedSubAvg strategy:",
        "Number of rounds: 1",
        "ConfigRecord (train)",
        "Final results:",
    ):
        assert line in caplog.text


def test_8_readme_and_pyproject_name_the_installed_flower() -> None:
    installed = version("flwr")
    major_minor = ".".join(installed.split(".")[:2])
    readme = (ROOT / "README.md").read_text()
    stated = re.search(r"\[Flower\]\(https://flower\.ai\) \(([^,]+), Message API\)", readme)
    assert stated is not None and major_minor in stated.group(1)
    pin = re.search(r'"flwr\[simulation\]([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert pin is not None
    from packaging.specifiers import SpecifierSet

    assert installed in SpecifierSet(pin.group(1))
