"""The experiment harness on the in-process grid: same clients and start, tables, failure, JSON."""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.clientapp.typing import ClientAppCallable
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.traffic import RoundTraffic
from flwr_fsl.experiment import (
    Arm,
    ArmSetup,
    Experiment,
    ExperimentFailedError,
    ExperimentRecord,
    Metric,
    PhaseBytes,
    RoundRecord,
    load_experiment,
    max_abs_difference,
    round_bytes,
    sampling_kwargs,
)
from flwr_fsl.reporting import load_histories
from flwr_fsl.strategies import FedSubAvg
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import MODEL, make_app, model_record

NODES = 8
ROUNDS = 3
KNOBS: dict[str, Any] = {
    "fraction_train": 0.5,
    "fraction_evaluate": 0.5,
    "min_train_nodes": 2,
    "min_evaluate_nodes": 2,
    "min_available_nodes": NODES,
}


class Recording(FedSubAvg):
    """FedSubAvg that remembers its initial arrays and every train config it was given."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.initial: dict[str, np.ndarray] = {}
        self.configs: list[dict[str, Any]] = []

    def start(self, grid: Grid, initial_arrays: ArrayRecord, *args, **kwargs) -> Result:  # type: ignore[no-untyped-def]
        self.initial = {k: v.numpy().copy() for k, v in initial_arrays.items()}
        return super().start(grid, initial_arrays, *args, **kwargs)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self.configs.append(dict(config))
        return super().configure_train(server_round, arrays, config, grid)


class NeverAggregates(FedSubAvg):
    """Receives every reply and never produces an aggregate."""

    def aggregate_train(self, server_round, replies):  # type: ignore[no-untyped-def]
        super().aggregate_train(server_round, replies)  # traffic and drops as usual
        return None, None


def _accuracy_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    # A deterministic function of the model: equal models give equal "accuracy".
    total = sum(float(np.sum(v.numpy())) for v in arrays.values())
    return MetricRecord({"accuracy": (total % 1.0), "loss": abs(total)})


ACC = Metric("acc %", "accuracy", scale=100, digits=2)


def _experiment(arms: list[Arm], **kwargs: Any) -> Experiment:
    values: dict[str, Any] = {
        "name": "toy",
        "arms": arms,
        "initial_arrays": model_record(),
        "num_rounds": ROUNDS,
        "sampling_seed": 7,
        "metrics": [ACC],
        "evaluate_fn": _accuracy_fn,
    }
    values.update(kwargs)
    return Experiment(**values)


def _train_nodes(strategy: FedSubAvg) -> list[frozenset[int]]:
    return [frozenset(t.down_bytes) for t in strategy.traffic if t.phase == "train"]


def _eval_nodes(strategy: FedSubAvg) -> list[frozenset[int]]:
    return [frozenset(t.down_bytes) for t in strategy.traffic if t.phase == "evaluate"]


def test_arms_sample_the_same_clients_from_the_same_arrays() -> None:
    def noisy(setup: ArmSetup) -> Recording:
        # Other code in the ServerApp process draws from `random` between the arms.
        for _ in range(17):
            random.random()
        return Recording(**KNOBS)

    arms = [
        Arm("a", "arm A", lambda setup: Recording(**KNOBS)),
        Arm("b", "arm B", noisy),
    ]
    result = _experiment(arms).run(InProcessGrid(make_app(), NODES))
    a, b = (result.arm(k).strategy for k in ("a", "b"))
    assert isinstance(a, Recording) and isinstance(b, Recording)
    assert _train_nodes(a) == _train_nodes(b)
    assert _eval_nodes(a) == _eval_nodes(b)
    assert all(len(nodes) == NODES // 2 for nodes in _train_nodes(a))
    assert len(set(_train_nodes(a))) > 1  # sampling really varies between rounds
    for name, value in MODEL.items():
        np.testing.assert_array_equal(a.initial[name], value)
        np.testing.assert_array_equal(b.initial[name], value)
    # Same clients, same start, same deterministic clients: the same final model.
    assert max_abs_difference(result.arm("a").arrays, result.arm("b").arrays) == 0.0

    # Another seed samples other clients (the assertion above is not vacuous).
    other = _experiment([arms[0]], sampling_seed=8).run(InProcessGrid(make_app(), NODES))
    strategy = other.arm("a").strategy
    assert isinstance(strategy, Recording)
    assert _train_nodes(strategy) != _train_nodes(a)


def test_table_has_every_arm_and_round(capsys: pytest.CaptureFixture[str]) -> None:
    arms = [
        Arm(
            "sub",
            "FedSubAvg",
            lambda setup: FedSubAvg(**KNOBS),
            learns={"server": "every update"},
        ),
        Arm(
            "flower",
            "Flower FedAvg",
            lambda setup: FedAvg(**KNOBS),
            learns={"server": "every update", "clients": "the model"},
            equivalent_to="sub",
        ),
        Arm("quiet", "no learns", lambda setup: FedSubAvg(**KNOBS)),
    ]
    result = _experiment(arms, baseline="sub").run(InProcessGrid(make_app(), NODES))
    out = capsys.readouterr().out
    for arm in arms:
        assert f"=== {arm.label}: {ROUNDS} rounds ===" in out
        assert re.search(rf"^\s+0  {re.escape(arm.label)}\s+\d", out, re.M), arm.label
        for rnd in range(1, ROUNDS + 1):
            assert re.search(rf"^\s+{rnd}  {re.escape(arm.label)}\s", out, re.M), (arm, rnd)
        assert re.search(rf"^{re.escape(arm.label)}\s", out, re.M), arm.label  # summary row
    assert "final acc %" in out and "d acc %" in out and "up vs sub" in out
    assert "server: every update" in out and "clients: the model" in out
    assert "(not stated)" in out
    assert re.search(r"max \|Flower FedAvg - FedSubAvg\| over the final models: \S+", out)
    # Flower's FedAvg keeps no traffic log: its byte columns say so; FedSubAvg's are counted.
    flower = result.arm("flower").record
    assert all(r.up_bytes is r.down_bytes is r.clients is None for r in flower.rounds)
    sub = result.arm("sub").record
    assert all(r.up_bytes and r.down_bytes and r.clients == NODES // 2 for r in sub.rounds)
    arrays = {k: result.arm(k).arrays for k in ("flower", "sub")}
    assert flower.max_abs_diff == max_abs_difference(arrays["flower"], arrays["sub"])
    for name in ("conv.weight", "emb.weight", "fc.bias"):  # FedAvg == FedSubAvg on floats
        np.testing.assert_allclose(arrays["flower"][name], arrays["sub"][name], atol=1e-6)
    row = next(line for line in out.splitlines() if line.startswith("Flower FedAvg"))
    assert row.count("n/a") == 4  # down, up, up vs baseline, evaluation down
    # Every number in the table comes from the record: the headline metric's final value.
    final = sub.final(ACC)
    assert final is not None and f"{final:.2f}" in next(
        line for line in out.splitlines() if line.startswith("FedSubAvg ")
    )


def test_an_arm_that_never_aggregates_fails_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arms = [
        Arm("ok", "trains", lambda setup: FedSubAvg(**KNOBS)),
        Arm("idle", "never aggregates", lambda setup: NeverAggregates(**KNOBS)),
    ]
    with pytest.raises(ExperimentFailedError, match=r"no round aggregated .* never aggregates"):
        _experiment(arms, results_dir=tmp_path).run(InProcessGrid(make_app(), NODES))
    out = capsys.readouterr().out
    assert out.count("no aggregate") == ROUNDS
    # The comparison was still printed and saved before the run failed.
    record = load_experiment(tmp_path / "toy.json")
    assert record.arm("ok").aggregated_rounds == [1, 2, 3]
    assert record.arm("idle").aggregated_rounds == []


def test_clients_that_all_fail_fail_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    def broken(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if msg.metadata.message_type == "train":
            raise RuntimeError("this client cannot train")
        return call_next(msg, context)

    arms = [Arm("only", "only arm", lambda setup: FedSubAvg(**KNOBS))]
    with pytest.raises(ExperimentFailedError, match="only arm"):
        _experiment(arms).run(InProcessGrid(make_app([broken]), NODES))
    out = capsys.readouterr().out
    assert "replies dropped (first: train: client error" in out


def test_results_json_round_trips(tmp_path: Path) -> None:
    arms = [
        Arm("a", "arm A", lambda setup: FedSubAvg(**KNOBS), learns={"server": "x"}),
        Arm(
            "b",
            "arm B",
            lambda setup: FedSubAvg(**KNOBS),
            overrides={"lr": 0.5},
            equivalent_to="a",
        ),
    ]
    experiment = _experiment(
        arms, results_dir=tmp_path, save_models=True, run_config={"lr": 0.1, "name": "x"}
    )
    result = experiment.run(InProcessGrid(make_app(), NODES))
    loaded = load_experiment(tmp_path / "toy.json")
    assert loaded == result.record
    assert loaded.arm("b").overrides == {"lr": 0.5}
    assert loaded.arm("a").rounds[0].phases["train"].nodes == NODES // 2
    assert ExperimentRecord.from_dict(result.record.to_dict()) == result.record
    histories = load_histories(tmp_path / "toy.json")
    assert [h.label for h in histories] == ["arm A", "arm B"]
    assert histories[0].rounds == [0, 1, 2, 3]
    assert histories[0].traffic_rounds == [1, 2, 3]
    assert histories[0].up_bytes_per_client == [r.up_bytes for r in loaded.arm("a").rounds]
    for key in ("a", "b"):
        with np.load(tmp_path / f"global-model-{key}.npz", allow_pickle=False) as npz:
            for name, value in result.arm(key).arrays.items():
                np.testing.assert_array_equal(npz[name], value)
    pytest.importorskip("matplotlib")
    assert (tmp_path / "toy.png").is_file()


def test_load_experiment_rejects_other_files(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"format": "flwr_fsl.history/1", "meta": {}, "runs": []}')
    with pytest.raises(ValueError, match="no experiment record"):
        load_experiment(path)
    with pytest.raises(ValueError, match=r"not a flwr_fsl\.experiment/1 record"):
        ExperimentRecord.from_dict({"format": "other"})
    with pytest.raises(ValueError, match="malformed arm record"):
        ExperimentRecord.from_dict(
            {"format": "flwr_fsl.experiment/1", "name": "x", "arms": [{"key": "a"}]}
        )


def test_overrides_configs_and_sessions_reach_their_places() -> None:
    seen: dict[str, ArmSetup] = {}

    def factory(key: str):  # type: ignore[no-untyped-def]
        def build(setup: ArmSetup) -> Recording:
            seen[key] = setup
            return Recording(**KNOBS)

        return build

    arms = [
        Arm("a", "A", factory("a"), train_config={"lr": 0.5}),
        Arm("b", "B", factory("b"), overrides={"seed": 9, "extra": "x"}),
    ]
    experiment = _experiment(
        arms,
        run_config={"seed": 1, "lr": 0.1},
        train_config={"lr": 0.1, "common": 3},
        session_keys=("topk-session", "training-id"),
    )
    result = experiment.run(InProcessGrid(make_app(), NODES))
    assert seen["a"].run_config == {"seed": 1, "lr": 0.1}
    assert seen["b"].run_config == {"seed": 9, "lr": 0.1, "extra": "x"}
    assert seen["a"].sampling_seed == seen["b"].sampling_seed == 7
    a, b = (result.arm(k).strategy for k in ("a", "b"))
    assert isinstance(a, Recording) and isinstance(b, Recording)
    assert a.configs[0]["lr"] == 0.5 and b.configs[0]["lr"] == 0.1
    assert a.configs[0]["common"] == b.configs[0]["common"] == 3
    sessions = {k: result.arm(k).strategy.configs[0]["topk-session"] for k in "ab"}  # type: ignore[attr-defined]
    assert sessions == {"a": seen["a"].session, "b": seen["b"].session}
    assert sessions["a"] != sessions["b"]
    assert all(c["training-id"] == c["topk-session"] for c in a.configs + b.configs)


def test_round_bytes_adds_phases_per_client() -> None:
    traffic = [
        RoundTraffic(1, "psr", {1: 100, 2: 100, 3: 100}, {1: 10, 2: 10, 3: 10}),
        # Node 3 was dropped after retrieval: no train message.
        RoundTraffic(1, "train", {1: 1000, 2: 1000}, {1: 50, 2: 70}),
        RoundTraffic(1, "evaluate", {1: 5000, 4: 5000}, {1: 1}),
        RoundTraffic(2, "train", {1: 9}, {}),
        RoundTraffic(2, "evaluate", {}, {}),  # fraction_evaluate = 0: nothing sent
    ]
    phases, clients, down, up = round_bytes(traffic, 1)
    assert clients == 3
    assert down == pytest.approx((1100 + 1100 + 100) / 3)
    assert up == pytest.approx((60 + 80 + 10) / 3)
    assert phases == {
        "psr": PhaseBytes(3, 100.0, 10.0),
        "train": PhaseBytes(2, 1000.0, 60.0),
        "evaluate": PhaseBytes(2, 5000.0, 1.0),
    }
    assert round_bytes(traffic, 2) == ({"train": PhaseBytes(1, 9.0, 0.0)}, 1, 9.0, None)
    assert round_bytes(traffic, 3) == ({}, 0, None, None)


def test_rounds_are_timed() -> None:
    result = _experiment([Arm("a", "A", lambda setup: FedSubAvg(**KNOBS))]).run(
        InProcessGrid(make_app(), NODES)
    )
    for r in result.arm("a").record.rounds:
        assert r.seconds is not None and r.grid_seconds is not None and r.eval_seconds is not None
        assert 0.0 <= r.grid_seconds <= r.seconds
        assert r.server_seconds == pytest.approx(r.seconds - r.grid_seconds)


def test_metric_values() -> None:
    record = RoundRecord(
        1, server_metrics={"accuracy": 0.5}, evaluate_metrics={"mse": 4.0}, train_metrics={}
    )
    assert Metric("acc %", "accuracy", scale=100).value(record) == 50.0
    assert Metric("RMSE", "mse", source="evaluate", sqrt=True).value(record) == 2.0
    assert Metric("x", "missing", source="train").value(record) is None
    with pytest.raises(ConfigurationError, match="source"):
        Metric("x", "y", source="clients")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arms", "kwargs", "match"),
    [
        ([], {}, "no arms"),
        ([("a", "A"), ("a", "B")], {}, "keys must be unique"),
        ([("a", "A"), ("b", "A")], {}, "labels must be unique"),
        ([("A b", "A")], {}, "lowercase"),
        ([("a", "A")], {"num_rounds": 0}, "num_rounds"),
        ([("a", "A")], {"baseline": "z"}, "baseline 'z'"),
    ],
)
def test_configuration_errors(
    arms: list[tuple[str, str]], kwargs: dict[str, Any], match: str
) -> None:
    definitions = [Arm(k, label, lambda setup: FedSubAvg()) for k, label in arms]
    with pytest.raises(ConfigurationError, match=match):
        _experiment(definitions, **kwargs)


def test_equivalence_must_name_another_arm() -> None:
    with pytest.raises(ConfigurationError, match="equivalent_to 'z'"):
        _experiment([Arm("a", "A", lambda setup: FedSubAvg(), equivalent_to="z")])
    with pytest.raises(ConfigurationError, match="itself"):
        _experiment([Arm("a", "A", lambda setup: FedSubAvg(), equivalent_to="a")])


def test_max_abs_difference_checks_the_models() -> None:
    a = {"w": np.zeros(3, np.float32)}
    assert max_abs_difference(a, {"w": np.array([0, -2, 1], np.float32)}) == 2.0
    with pytest.raises(ValueError, match="different tensors"):
        max_abs_difference(a, {"v": np.zeros(3)})
    with pytest.raises(ValueError, match="shapes"):
        max_abs_difference(a, {"w": np.zeros(4)})


def test_sampling_kwargs() -> None:
    class S:
        fraction_train, fraction_evaluate, min_nodes = 0.5, 0.0, 3

    assert sampling_kwargs(S()) == {
        "fraction_train": 0.5,
        "fraction_evaluate": 0.0,
        "min_train_nodes": 3,
        "min_evaluate_nodes": 0,
        "min_available_nodes": 3,
    }


_phase = st.sampled_from(["psr", "train", "evaluate", "unmask"])
_sizes = st.dictionaries(st.integers(1, 6), st.integers(0, 10_000), max_size=6)
_entries = st.lists(st.tuples(st.integers(1, 2), _phase, _sizes, _sizes), max_size=8)


@given(entries=_entries, data=st.data())
def test_round_bytes_conserves_bytes_and_ignores_how_the_log_is_split(
    entries: list[tuple[int, str, dict[int, int], dict[int, int]]], data: st.DataObject
) -> None:
    traffic = [RoundTraffic(r, phase, down, up) for r, phase, down, up in entries]
    phases, clients, down, up = round_bytes(traffic, 1)
    mine = [t for t in traffic if t.server_round == 1 and (t.down_bytes or t.up_bytes)]
    training = [t for t in mine if t.phase != "evaluate"]
    sent = {n for t in training for n in t.down_bytes}
    replied = {n for t in training for n in t.up_bytes}
    assert clients == len(sent)
    if not training:
        assert (down, up) == (None, None)
    else:
        assert down == pytest.approx(
            sum(sum(t.down_bytes.values()) for t in training) / len(sent) if sent else 0.0
        )
        total_up = sum(sum(t.up_bytes.values()) for t in training)
        assert up == (pytest.approx(total_up / len(replied)) if replied else None)
    assert set(phases) == {t.phase for t in mine}
    # The same log shuffled, or with one entry split in two, summarizes the same.
    shuffled = data.draw(st.permutations(traffic))
    assert round_bytes(shuffled, 1) == (phases, clients, down, up)
    if traffic:
        first = traffic[0]
        half = {n: b // 2 for n, b in first.down_bytes.items()}
        rest = {n: b - half[n] for n, b in first.down_bytes.items()}
        split = [
            RoundTraffic(first.server_round, first.phase, half, first.up_bytes),
            RoundTraffic(first.server_round, first.phase, rest, {}),
            *traffic[1:],
        ]
        assert round_bytes(split, 1) == (phases, clients, down, up)  # integer sums: exact


def test_tables_fit_120_columns_with_long_labels_and_three_metrics() -> None:
    from flwr_fsl.experiment import ArmRecord, ExperimentRecord, Metric, RoundRecord
    from flwr_fsl.experiment.tables import learns_text, round_table, summary_table

    metrics = [
        Metric("acc %", "accuracy", scale=100),
        Metric("loss", "loss"),
        Metric("f1", "f1"),
        Metric("client s", "f1"),
    ]
    server = {"accuracy": 0.9, "loss": 0.3, "f1": 0.8}
    rounds = [
        RoundRecord(r, server_metrics=server, clients=100, down_bytes=123_456_789.0,
                    up_bytes=9_876_543.0, eval_down_bytes=1e9, aggregated=r % 2 == 0,
                    seconds=1234.5, grid_seconds=12.0)
        for r in range(1, 4)
    ]  # fmt: skip
    arms = [
        ArmRecord(key, f"{key}: a rather long arm label, weighted", rounds=rounds, seconds=9e3,
                  learns={"server": "the sum of every update " * 8}, initial_metrics=server)
        for key in ("dense", "plaintext-top-k")
    ]  # fmt: skip
    for baseline in ("dense", "plaintext-top-k"):
        record = ExperimentRecord("wide", arms, baseline=baseline)
        for text in (
            round_table(record, metrics),
            summary_table(record, metrics),
            learns_text(record),
        ):
            widest = max(map(len, text.splitlines()))
            assert widest <= 120, text
        assert f"up vs {baseline[:9]}" in summary_table(record, metrics)


def test_log_level_quiets_flower_inside_the_run_and_restores_it() -> None:
    import logging

    from flwr_fsl.core.errors import ConfigurationError
    from flwr_fsl.experiment import flower_log_level

    flwr_logger = logging.getLogger("flwr")
    before = flwr_logger.level
    with flower_log_level({"log-level": "warning"}):
        assert flwr_logger.level == logging.WARNING
        assert logging.getLogger("ray").level == logging.WARNING
    assert flwr_logger.level == before
    with flower_log_level({}):  # no key, no default: unchanged
        assert flwr_logger.level == before
    with pytest.raises(ConfigurationError, match="log-level"), flower_log_level({"log-level": 5}):
        pass
