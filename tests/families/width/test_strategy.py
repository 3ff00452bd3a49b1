"""WidthFedAvg + width_mod end to end on the in-process grid, against a plaintext reference.

The reference re-derives every client's channels (FedRolex's ``torch.roll`` window, HeteroFL's
prefix; the seeded random draws from ``WidthRule``), slices the global model with ``np.ix_``,
applies the same deterministic "training" and averages each coordinate over its holders with
plain loops.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable, Mod

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.families.width.mod import capacity_of
from flwr_fsl.families.width.records import RATE_CONFIG_KEY, WIDTH_KEY
from flwr_fsl.families.width.rules import CapacityMix, WidthAssignment, WidthRule
from flwr_fsl.families.width.settings import WidthSettings
from flwr_fsl.models.width import WidthMLP
from flwr_fsl.mods import width_mod
from flwr_fsl.strategies import WidthFedAvg
from flwr_fsl.testing import InProcessGrid

HIDDEN = (12, 8)
GROUP_RATES = [1.0, 0.5, 0.25]  # three capacity groups


def _net(rate: float = 1.0) -> WidthMLP:
    return WidthMLP(rate, hidden=HIDDEN, in_features=6, num_classes=3)


def _initial() -> dict[str, np.ndarray]:
    torch.manual_seed(0)
    return {k: v.numpy().copy() for k, v in _net().state_dict().items()}


def _record(model: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(v.copy()) for k, v in model.items()})


def _delta(pid: int, rnd: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([pid, rnd, sum(map(ord, name))])
    return rng.normal(size=shape).astype(np.float32)


def _make_app(mods: list[Mod] | None = None, full_width: bool = False) -> ClientApp:
    app = ClientApp(mods=[*(mods or []), width_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        config = msg.content["config"]
        rnd = int(config["server-round"])
        rate = 1.0 if full_width else float(config.get(RATE_CONFIG_KEY, 1.0))
        net = _net(rate)
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())  # strict shapes
        new = {
            k: Array(v.numpy() + _delta(pid, rnd, k, tuple(v.shape)))
            for k, v in net.state_dict().items()
        }
        metrics = MetricRecord({"num-examples": 10 * (pid + 1), "train-loss": float(pid)})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        _net().load_state_dict(msg.content["arrays"].to_torch_state_dict())  # the full model
        return Message(
            RecordDict({"metrics": MetricRecord({"num-examples": 5, "eval-loss": 1.0})}),
            reply_to=msg,
        )

    return app


def _node_config(i: int, n: int) -> dict:  # type: ignore[type-arg]
    return {"partition-id": i, "num-partitions": n, "width-rate": GROUP_RATES[i % 3]}


def _grid(n: int = 6, mods: list[Mod] | None = None, **kwargs) -> InProcessGrid:  # type: ignore[no-untyped-def]
    kwargs.setdefault("node_config_fn", lambda i: _node_config(i, n))
    return InProcessGrid(_make_app(mods), n, **kwargs)


# -- the independent reference -------------------------------------------------------------


def _channels(extraction: str, width: int, rate: float, rnd: int, node: int, layer: str):  # type: ignore[no-untyped-def]
    k = int(np.ceil(width * rate))
    if extraction == "rolling":
        return torch.roll(torch.arange(width), (rnd - 1) % width, -1)[:k].numpy()
    if extraction == "static":
        return np.arange(k)
    widths = {"blocks.0.layer": HIDDEN[0], "blocks.1.layer": HIDDEN[1]}
    return WidthRule("random", seed=0).indices(widths, rate, rnd, node)[layer]


def _slices(h0: np.ndarray, h1: np.ndarray) -> dict[str, tuple[np.ndarray, ...]]:
    return {
        "blocks.0.layer.weight": (h0, np.arange(6)),
        "blocks.0.layer.bias": (h0,),
        "blocks.1.layer.weight": (h1, h0),
        "blocks.1.layer.bias": (h1,),
        "head.weight": (np.arange(3), h1),
        "head.bias": (np.arange(3),),
    }


def _reference_round(
    model: dict[str, np.ndarray],
    rnd: int,
    clients: dict[int, tuple[int, float]],  # node -> (pid, rate)
    extraction: str = "rolling",
    weighted: bool = False,
    skip: frozenset[int] = frozenset(),  # pids that did not count this round
) -> dict[str, np.ndarray]:
    total = {k: np.zeros(v.shape) for k, v in model.items()}
    count = {k: np.zeros(v.shape) for k, v in model.items()}
    for node, (pid, rate) in clients.items():
        if pid in skip:
            continue
        h0 = _channels(extraction, HIDDEN[0], rate, rnd, node, "blocks.0.layer")
        h1 = _channels(extraction, HIDDEN[1], rate, rnd, node, "blocks.1.layer")
        c = 10.0 * (pid + 1) if weighted else 1.0
        for name, idx in _slices(h0, h1).items():
            where = np.ix_(*idx)
            trained = model[name][where] + _delta(pid, rnd, name, model[name][where].shape)
            total[name][where] += c * trained.astype(np.float64)
            count[name][where] += c
    new = {k: v.copy() for k, v in model.items()}
    for name in model:
        held = count[name] > 0
        new[name][held] = (total[name][held] / count[name][held]).astype(np.float32)
    return new


def _reference(
    model: dict[str, np.ndarray],
    rounds: int,
    clients: dict[int, tuple[int, float]],
    extraction: str,
    weighted: bool = False,
    skip: frozenset[int] = frozenset(),
) -> dict[str, np.ndarray]:
    for rnd in range(1, rounds + 1):
        model = _reference_round(model, rnd, clients, extraction, weighted, skip)
    return model


def _arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def _clients(grid: InProcessGrid, n: int) -> dict[int, tuple[int, float]]:
    return {node: (i, GROUP_RATES[i % 3]) for i, node in enumerate(grid.get_node_ids())}


# -- end to end ---------------------------------------------------------------------------


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("extraction", ["rolling", "static", "random"])
def test_three_capacity_groups_equal_the_plaintext_reference(extraction: str, weighted) -> None:  # type: ignore[no-untyped-def]
    grid = _grid(6)
    strategy = WidthFedAvg(
        min_available_nodes=6,
        extraction=extraction,
        weighted=weighted,  # type: ignore[arg-type]
    )
    result = strategy.start(grid, _record(_initial()), num_rounds=3)
    expected = _reference(_initial(), 3, _clients(grid, 6), extraction, weighted)
    got = _arrays(result.arrays)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5)
    assert strategy.dropped == {1: {}, 2: {}, 3: {}}
    assert strategy.capacities == {n: r for n, (_, r) in _clients(grid, 6).items()}
    metrics = result.train_metrics_clientapp[3]
    assert metrics["mean-rate"] == pytest.approx(np.mean(GROUP_RATES * 2))
    assert metrics["train-loss"] == pytest.approx(
        sum(10 * (p + 1) * p for p in range(6)) / sum(10 * (p + 1) for p in range(6))
    )


def test_capacity_is_asked_once_and_narrow_clients_download_less() -> None:
    grid = _grid(6)
    strategy = WidthFedAvg(min_available_nodes=6)
    strategy.start(grid, _record(_initial()), num_rounds=2)
    phases = [(t.server_round, t.phase) for t in strategy.traffic]
    assert (1, "capacity") in phases and (2, "capacity") not in phases
    train = next(t for t in strategy.traffic if (t.server_round, t.phase) == (1, "train"))
    by_rate: dict[float, set[int]] = {}
    for node, (_, rate) in _clients(grid, 6).items():
        by_rate.setdefault(rate, set()).add(train.down_bytes[node])
        assert train.up_bytes[node] < train.down_bytes[node] + 2000
    assert all(len(v) == 1 for v in by_rate.values())  # same rate, same bytes
    full, half, quarter = (by_rate[r].pop() for r in GROUP_RATES)
    assert full > half > quarter
    # The slice's floats dominate: ~(6*12+12+12*8+8+8*3+3) * rate^... floats of 4 bytes.
    assert full - quarter > 4 * (6 * 9 + 9 + 12 * 8 - 3 * 2 + 8 * 3 - 2 * 3)


def test_dynamic_capacity_draws_each_round_from_the_mix() -> None:
    mix = CapacityMix.parse("a1-b1-c2")
    grid = _grid(5)
    strategy = WidthFedAvg(min_available_nodes=5, capacity="dynamic", capacity_mix=mix, seed=3)
    result = strategy.start(grid, _record(_initial()), num_rounds=3)
    assert not any(t.phase == "capacity" for t in strategy.traffic)
    nodes = list(grid.get_node_ids())
    for rnd in (1, 2, 3):
        assert strategy.rates[rnd] == {n: mix.draw(3, rnd, n) for n in nodes}
    assert len({tuple(r.values()) for r in strategy.rates.values()}) > 1
    # Reference with each round's drawn rates.
    model = _initial()
    for rnd in (1, 2, 3):
        clients = {n: (i, strategy.rates[rnd][n]) for i, n in enumerate(nodes)}
        model = _reference_round(model, rnd, clients)
    for name, value in _arrays(result.arrays).items():
        np.testing.assert_allclose(value, model[name], rtol=1e-5, atol=1e-5)


def test_sesa_shards_as_a_plaintext_baseline() -> None:
    grid = _grid(6, node_config_fn=lambda i: {"partition-id": i, "width-rate": [1.0, 0.5][i % 2]})
    strategy = WidthFedAvg(min_available_nodes=6, extraction="shards", num_shards=4, seed=1)
    result = strategy.start(grid, _record(_initial()), num_rounds=2)
    assert strategy.dropped == {1: {}, 2: {}}
    rule = WidthRule("shards", num_shards=4, seed=1)
    model = _initial()
    nodes = list(grid.get_node_ids())
    for rnd in (1, 2):
        total = {k: np.zeros(v.shape) for k, v in model.items()}
        count = {k: np.zeros(v.shape) for k, v in model.items()}
        for i, node in enumerate(nodes):
            idx = rule.indices(
                {"blocks.0.layer": 12, "blocks.1.layer": 8}, [1.0, 0.5][i % 2], rnd, node
            )
            h0, h1 = idx["blocks.0.layer"], idx["blocks.1.layer"]
            assert h0.size == 12 * [1.0, 0.5][i % 2] and set(h1 // 2) <= set(range(4))
            for name, sl in _slices(h0, h1).items():
                where = np.ix_(*sl)
                total[name][where] += model[name][where] + _delta(
                    i, rnd, name, model[name][where].shape
                )
                count[name][where] += 1
        for name in model:
            held = count[name] > 0
            model[name][held] = (total[name][held] / count[name][held]).astype(np.float32)
    for name, value in _arrays(result.arrays).items():
        np.testing.assert_allclose(value, model[name], rtol=1e-5, atol=1e-5)


# -- malformed replies ---------------------------------------------------------------------


def _corrupt(target_pid: int, corrupt) -> Mod:  # type: ignore[no-untyped-def]
    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        is_train = WIDTH_KEY in msg.content and msg.content[WIDTH_KEY]["phase"] == "train"
        reply = call_next(msg, context)
        if is_train and int(context.node_config["partition-id"]) == target_pid:
            return Message(corrupt(reply.content), reply_to=msg)
        return reply

    return mod


def _set(name: str, fn):  # type: ignore[no-untyped-def]
    def corrupt(c: RecordDict) -> RecordDict:
        arrays = next(iter(c.array_records.values()))
        if fn is None:
            del arrays[name]
        else:
            arrays[name] = Array(fn(arrays[name].numpy()))
        return c

    return corrupt


def _replace_record(key: str, value):  # type: ignore[no-untyped-def]
    def corrupt(c: RecordDict) -> RecordDict:
        if value is None:
            del c[key]
        else:
            c[key] = value
        return c

    return corrupt


def _second_arrays(c: RecordDict) -> RecordDict:
    c["extra"] = ArrayRecord({"x": Array(np.zeros(2, np.float32))})
    return c


def _weight(value):  # type: ignore[no-untyped-def]
    def corrupt(c: RecordDict) -> RecordDict:
        if value is None:
            del c["metrics"]["num-examples"]
        else:
            c["metrics"]["num-examples"] = value
        return c

    return corrupt


def _other_digest(c: RecordDict) -> RecordDict:
    other = WidthAssignment(9, 0.5, "rolling", {"h": np.array([1])})
    c[WIDTH_KEY] = ConfigRecord({"phase": "train", "digest": other.digest})
    return c


def _extra_tensor(c: RecordDict) -> RecordDict:
    next(iter(c.array_records.values()))["evil"] = Array(np.zeros(3, np.float32))
    return c


MALFORMED = {
    "wrong shape": (_set("blocks.0.layer.weight", lambda v: v[:, :3].copy()), "shape"),
    "nan": (_set("head.bias", lambda v: v * np.nan), "NaN"),
    "huge": (_set("head.bias", lambda v: np.full(v.shape, 1e307)), "too large"),
    "int values": (_set("head.bias", lambda v: v.astype(np.int64)), "floating"),
    "missing tensor": (_set("head.bias", None), "lacks"),
    "extra tensor": (_extra_tensor, "unknown"),
    "no width record": (_replace_record(WIDTH_KEY, None), "width assignment"),
    "other digest": (_other_digest, "width assignment"),
    "two array records": (_second_arrays, "one ArrayRecord"),
    "no weight": (_weight(None), "num-examples"),
    "nan weight": (_weight(float("nan")), "num-examples"),
    "negative weight": (_weight(-1), "num-examples"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_reply_drops_that_client_only(case: str) -> None:
    corrupt, reason = MALFORMED[case]
    grid = _grid(6, mods=[_corrupt(4, corrupt)])
    # Finite huge values are clipped to clipping_range (test_bounds.py); without a range the
    # overflow guard drops them.
    clip = None if case == "huge" else 8.0
    strategy = WidthFedAvg(min_available_nodes=6, clipping_range=clip)
    result = strategy.start(grid, _record(_initial()), num_rounds=2)
    node4 = list(grid.get_node_ids())[4]
    for rnd in (1, 2):
        assert list(strategy.dropped[rnd]) == [node4]
        assert reason in strategy.dropped[rnd][node4], strategy.dropped[rnd][node4]
    expected = _reference(_initial(), 2, _clients(grid, 6), "rolling", skip=frozenset({4}))
    for name, value in _arrays(result.arrays).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-5)


def test_full_width_train_function_is_reported_by_the_mod() -> None:
    app = _make_app(full_width=True)
    grid = InProcessGrid(app, 3, node_config_fn=lambda i: _node_config(i, 3))
    strategy = WidthFedAvg(min_available_nodes=3)
    strategy.start(grid, _record(_initial()), num_rounds=1)
    nodes = list(grid.get_node_ids())
    # The full-rate node trains fine; narrower ones fail to load (or to match) the slice.
    assert set(strategy.dropped[1]) == set(nodes[1:])
    assert all("client error" in r for r in strategy.dropped[1].values())


def test_bad_capacities_drop_the_node_and_are_not_cached() -> None:
    configs = {
        0: {"width-rate": 1.0},
        1: {"width-rate": "zzz"},
        2: {"width-rate": 1.5},
        3: {},  # no capacity at all
        4: {"width-rate": "c"},
    }
    grid = InProcessGrid(_make_app(), 5, node_config_fn=lambda i: {"partition-id": i, **configs[i]})
    strategy = WidthFedAvg(min_available_nodes=5)
    strategy.start(grid, _record(_initial()), num_rounds=2)
    nodes = list(grid.get_node_ids())
    assert strategy.capacities == {nodes[0]: 1.0, nodes[4]: 0.25}
    for rnd in (1, 2):  # asked again in round 2, dropped again
        assert set(strategy.dropped[rnd]) == {nodes[1], nodes[2], nodes[3]}
        assert "capacity" in strategy.dropped[rnd][nodes[1]]
        assert "no capacity" in strategy.dropped[rnd][nodes[3]]


def _capacity_rewrite(fields):  # type: ignore[no-untyped-def]
    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        reply = call_next(msg, context)
        asks = WIDTH_KEY in msg.content and msg.content[WIDTH_KEY]["phase"] == "capacity"
        if asks and int(context.node_config["partition-id"]) == 1:
            content = RecordDict() if fields is None else RecordDict({WIDTH_KEY: fields})
            return Message(content, reply_to=msg)
        return reply

    return mod


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (None, "no width record"),
        (ConfigRecord({"phase": "train", "rate": 0.5}), "no width record"),
        (ConfigRecord({"phase": "capacity"}), "numeric rate"),
        (ConfigRecord({"phase": "capacity", "rate": "0.5"}), "numeric rate"),
        (ConfigRecord({"phase": "capacity", "rate": True}), "numeric rate"),
        (ConfigRecord({"phase": "capacity", "rate": 2.0}), "capacity: rate"),
        (ConfigRecord({"phase": "capacity", "rate": float("nan")}), "capacity: rate"),
        (ConfigRecord({"phase": "capacity", "rate": 0.0}), "capacity: rate"),
    ],
)
def test_malformed_capacity_replies_are_checked_by_the_server(fields, reason) -> None:  # type: ignore[no-untyped-def]
    grid = _grid(3, mods=[_capacity_rewrite(fields)])
    strategy = WidthFedAvg(min_available_nodes=3)
    strategy.start(grid, _record(_initial()), num_rounds=1)
    node = list(grid.get_node_ids())[1]
    assert list(strategy.dropped[1]) == [node]
    assert reason in strategy.dropped[1][node], strategy.dropped[1][node]
    assert node not in strategy.capacities


def test_shard_capacity_must_be_a_multiple_of_bmin() -> None:
    grid = InProcessGrid(
        _make_app(), 3, node_config_fn=lambda i: {"partition-id": i, "width-rate": [1, 0.3, 0.5][i]}
    )
    strategy = WidthFedAvg(min_available_nodes=3, extraction="shards", num_shards=4)
    strategy.start(grid, _record(_initial()), num_rounds=1)
    node = list(grid.get_node_ids())[1]
    assert list(strategy.dropped[1]) == [node]
    assert "multiple of 1/num_shards" in strategy.dropped[1][node]


def test_fixed_mix_from_the_run_config_by_partition_id() -> None:
    grid = InProcessGrid(_make_app(), 6, run_config={"width-mix": "a1-b1-c1"})
    strategy = WidthFedAvg(min_available_nodes=6)
    result = strategy.start(grid, _record(_initial()), num_rounds=2)
    nodes = list(grid.get_node_ids())
    assert strategy.capacities == dict(zip(nodes, [1.0, 1.0, 0.5, 0.5, 0.25, 0.25], strict=True))
    clients = {n: (i, strategy.capacities[n]) for i, n in enumerate(nodes)}
    expected = _reference(_initial(), 2, clients, "rolling")
    for name, value in _arrays(result.arrays).items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-5, atol=1e-5)


# -- configuration -----------------------------------------------------------------------


class _NoGrid(InProcessGrid):
    def push_messages(self, messages):  # type: ignore[no-untyped-def]
        raise AssertionError("a message was sent before the configuration was checked")


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"extraction": "roll"}, "extraction"),
        ({"capacity": "node"}, "capacity"),
        ({"capacity": "dynamic"}, "capacity_mix"),
        ({"capacity": "dynamic", "capacity_mix": "a1-z2"}, "capacity_mix"),
        ({"capacity_mix": "a1-b1"}, "capacity_mix"),
        ({"extraction": "shards"}, "num_shards"),
        ({"num_shards": 4}, "num_shards"),
        ({"global_rate": 0.0}, "global_rate"),
        ({"global_rate": 0.5, "capacity": "dynamic", "capacity_mix": "a1"}, "capacity_mix"),
        (
            {"extraction": "shards", "num_shards": 2, "capacity": "dynamic", "capacity_mix": "c1"},
            "capacity_mix",
        ),
        ({"seed": -1}, "seed"),
        ({"weighted": 1}, "weighted"),
        ({"spec": "mlp"}, "spec"),
        ({"fraction_train": 2.0}, "fraction_train"),
    ],
)
def test_settings_are_checked_in_the_constructor(kwargs, key) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError, match=key):
        WidthFedAvg(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "model", "train_config", "key"),
    [
        ({}, {"w": np.zeros(3, np.float32)}, None, "spec"),
        ({}, {"a": np.zeros((4, 3)), "b": np.zeros((2, 5))}, None, "spec"),
        ({"extraction": "shards", "num_shards": 5}, None, None, "num_shards"),
        ({}, None, ConfigRecord({"width-rate": 0.5}), "width-rate"),
    ],
)
def test_model_and_train_config_are_checked_before_round_1(
    kwargs, model, train_config, key
) -> None:  # type: ignore[no-untyped-def]
    grid = _NoGrid(_make_app(), 3, node_config_fn=lambda i: _node_config(i, 3))
    strategy = WidthFedAvg(min_available_nodes=3, **kwargs)
    arrays = _record(model if model is not None else _initial())
    with pytest.raises(ConfigurationError, match=key):
        strategy.start(grid, arrays, num_rounds=1, train_config=train_config)


def test_flower_pair_is_not_available() -> None:
    with pytest.raises(ConfigurationError, match=r"WidthFedAvg\.configure_train"):
        WidthFedAvg().configure_train(1, ArrayRecord(), ConfigRecord(), None)
    with pytest.raises(ConfigurationError, match=r"WidthFedAvg\.aggregate_train"):
        WidthFedAvg().aggregate_train(1, [])


# -- the mod alone -------------------------------------------------------------------------


def _context(**node_config) -> Context:  # type: ignore[no-untyped-def]
    return Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(), run_config={})


def test_mod_passes_other_messages_through_and_answers_capacity() -> None:
    calls = []

    def inner(msg: Message, context: Context) -> Message:
        calls.append(msg.metadata.message_type)
        return Message(RecordDict(), reply_to=msg)

    plain = Message(RecordDict({"config": ConfigRecord()}), dst_node_id=5, message_type="train")
    width_mod(plain, _context(**{"width-rate": 0.5}), inner)
    evaluate = Message(
        RecordDict({WIDTH_KEY: ConfigRecord({"phase": "capacity"})}),
        dst_node_id=5,
        message_type="evaluate",
    )
    width_mod(evaluate, _context(), inner)
    assert calls == ["train", "evaluate"]
    ask = Message(
        RecordDict({WIDTH_KEY: ConfigRecord({"phase": "capacity"})}),
        dst_node_id=5,
        message_type="train",
    )
    reply = width_mod(ask, _context(**{"width-rate": "d"}), inner)
    assert calls == ["train", "evaluate"]  # the train function was not called
    assert reply.content[WIDTH_KEY]["rate"] == 0.125
    assert capacity_of(_context(**{"width-rate": 0.25})) == 0.25


def test_mod_rejects_malformed_width_records() -> None:
    def inner(msg: Message, context: Context) -> Message:
        raise AssertionError("not reached")

    good = WidthAssignment(1, 0.5, "rolling", {"h": np.array([0])}).to_bytes()
    settings = WidthSettings("config").to_bytes()
    cases = [
        ({"phase": "other"}, "unknown width phase"),
        ({"phase": "train", "assignment": b"junk", "settings": settings}, "truncated"),
        ({"phase": "train", "assignment": "text", "settings": settings}, "must be bytes"),
        ({"phase": "train", "assignment": good[:-2], "settings": settings}, "truncated"),
        ({"phase": "train", "assignment": good}, "width settings must be bytes"),
        ({"phase": "train", "assignment": good, "settings": settings[:-1]}, "truncated"),
        ({"phase": "train", "assignment": good, "settings": settings + b"x"}, "trailing"),
        (
            {"phase": "train", "assignment": good, "settings": WidthSettings("nope").to_bytes()},
            "config record",
        ),
    ]
    for fields, reason in cases:
        msg = Message(
            RecordDict({"config": ConfigRecord(), WIDTH_KEY: ConfigRecord(fields)}),
            dst_node_id=5,
            message_type="train",
        )
        with pytest.raises(ClientInputError, match=reason):
            width_mod(msg, _context(), inner)
