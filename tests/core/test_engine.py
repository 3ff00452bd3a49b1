"""The round engine: one ``send`` validates every phase, seeded sampling, failed rounds.

A toy two-phase protocol (advertise, then a different message to each survivor) runs on the
in-process grid; unit tests feed ``receive`` hand-made replies for every way a reply can be
bad; a property test checks that survivors and dropped partition the asked nodes.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.strategies import FedSubAvg, PhasedStrategy, RoundState
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import make_app, model_record

ARRAYS = ArrayRecord({"w": Array(np.zeros(3, np.float32))})


def _number(content: RecordDict) -> int:
    value = content["m"]["x"]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ClientInputError("x must be an int")
    return value


def toy_app(bad_share_node: int | None = None) -> ClientApp:
    """Clients answer ``query.advertise`` with their id and ``query.share`` with 2 * the
    number the server sent them (the node at ``bad_share_node`` sends a string instead)."""
    app = ClientApp()

    @app.query("advertise")
    def advertise(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"m": MetricRecord({"x": int(context.node_id)})}), reply_to=msg)

    @app.query("share")
    def share(msg: Message, context: Context) -> Message:
        x = int(msg.content["m"]["x"])  # type: ignore[arg-type]
        record = ConfigRecord({"x": "oops" if context.node_id == bad_share_node else 2 * x})
        return Message(RecordDict({"m": record}), reply_to=msg)

    return app


class ToyTwoPhase(PhasedStrategy):
    """advertise -> per-node share -> the sum of the shares as the new model."""

    def train_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        nodes = self.sample(state, grid)
        ads = self.send(
            grid,
            state,
            "advertise",
            dict.fromkeys(nodes, RecordDict({"c": ConfigRecord()})),
            "query.advertise",
            parse=lambda _n, c: _number(c),
        )
        # A different message to each node: its own advertised number plus one.
        shares = self.send(
            grid,
            state,
            "share",
            {n: RecordDict({"m": MetricRecord({"x": ad + 1})}) for n, ad in ads.items()},
            "query.share",
            parse=lambda _n, c: _number(c),
        )
        total = float(sum(shares.values()))
        return ArrayRecord({"w": Array(np.full(3, total, np.float32))}), MetricRecord(
            {"n": len(shares)}
        )

    def configure_train(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def aggregate_train(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError


def test_two_phases_with_per_node_messages_and_a_bad_survivor() -> None:
    grid = InProcessGrid(toy_app(bad_share_node=1001), 4)
    strategy = ToyTwoPhase(min_available_nodes=4, fraction_evaluate=0.0)
    result = strategy.start(grid=grid, initial_arrays=ARRAYS, num_rounds=1)
    state = strategy.rounds[1]
    assert sorted(state.sampled) == [1000, 1001, 1002, 1003]
    assert sorted(state.survivors) == [1000, 1002, 1003]
    assert set(state.dropped) == {1001} and "share: x must be an int" in state.dropped[1001]
    expected = sum(2 * (n + 1) for n in (1000, 1002, 1003))
    np.testing.assert_array_equal(result.arrays["w"].numpy(), np.full(3, expected, np.float32))
    assert [t.phase for t in state.traffic] == ["advertise", "share"]
    share = state.traffic[1]
    assert set(share.down_bytes) == {1000, 1001, 1002, 1003}  # 1001 was asked, then dropped
    assert strategy.dropped == {1: {1001: state.dropped[1001]}}


def _state_with(strategy: PhasedStrategy, nodes: list[int]) -> tuple[RoundState, list[Message]]:
    state = strategy.round_state(5)
    state.sampled, state.survivors = list(nodes), list(nodes)
    content = RecordDict({"c": ConfigRecord({"x": 1})})
    messages = strategy.prepare(state, "p", dict.fromkeys(nodes, content), "query.p")
    return state, messages


def _reply(request: Message, x: object = 1, *, src: int | None = None) -> Message:
    reply = Message(RecordDict({"m": ConfigRecord({"x": x})}), reply_to=request)  # type: ignore[dict-item]
    if src is not None:
        reply.metadata.__dict__["_src_node_id"] = src
    return reply


def test_receive_drops_each_kind_of_bad_reply_with_its_reason() -> None:
    strategy = FedSubAvg()
    nodes = [11, 12, 13, 14, 15, 16, 17, 18]
    state, sent = _state_with(strategy, nodes)
    by_node = {m.metadata.dst_node_id: m for m in sent}
    late = _reply(by_node[11])
    late.metadata.group_id = "4"
    other_phase = _reply(by_node[12])
    other_phase.metadata.__dict__["_message_type"] = "train"
    stale = _reply(by_node[18], 5)
    stale.metadata.group_id = "4"
    replies = [
        late,
        other_phase,
        _reply(by_node[13]),
        _reply(by_node[13]),  # a duplicate (the same content twice): taken once
        _reply(by_node[14], "not an int"),
        _reply(by_node[15], src=999),  # a node nobody asked
        # node 16 never answers
        _reply(by_node[17], 1),
        _reply(by_node[17], 2),  # two different answers: node 17 is dropped whole
        stale,  # another round's reply first does not block node 18's valid one
        _reply(by_node[18], 3),
    ]
    got = strategy.receive(state, "p", replies, lambda _n, c: _number(c))
    assert got == {13: 1, 18: 3}
    reasons = state.dropped
    assert "late reply" in reasons[11]
    assert "type 'train'" in reasons[12]
    assert "x must be an int" in reasons[14]
    assert "not asked" in reasons[999]
    assert "no reply" in reasons[15] and "no reply" in reasons[16]
    assert "2 different replies" in reasons[17]
    assert set(reasons) == {11, 12, 14, 15, 16, 17, 999}
    assert state.survivors == [13, 18]


def test_a_bug_in_parse_is_not_mistaken_for_a_bad_client() -> None:
    strategy = FedSubAvg()
    state, sent = _state_with(strategy, [1, 2])

    def parse(_node: int, _content: RecordDict) -> int:
        raise KeyError("a bug in the strategy")

    with pytest.raises(KeyError):
        strategy.receive(state, "p", [_reply(m) for m in sent], parse)


def test_error_reply_reason_reaches_dropped() -> None:
    grid = InProcessGrid(toy_app(), 2)
    strategy = FedSubAvg()
    state = strategy.round_state(1)
    state.sampled = state.survivors = [1000, 1001]
    # toy_app has no train function: Flower's ClientApp raises, the grid returns an error.
    got = strategy.send(grid, state, "train", dict.fromkeys([1000, 1001], RecordDict()), "train")
    assert got == {} and all("client error" in r for r in state.dropped.values())


@given(
    st.lists(
        st.sampled_from(["ok", "bad", "missing", "duplicate", "equivocate", "error"]),
        min_size=1,
        max_size=12,
    )
)
def test_survivors_and_dropped_partition_the_asked_nodes(kinds: list[str]) -> None:
    strategy = FedSubAvg()
    nodes = list(range(100, 100 + len(kinds)))
    state, sent = _state_with(strategy, nodes)
    replies: list[Message] = []
    for msg, kind in zip(sent, kinds, strict=True):
        if kind == "missing":
            continue
        if kind == "error":
            replies.append(Message(Error(code=1, reason="boom"), reply_to=msg))
            continue
        replies.append(_reply(msg, "x" if kind == "bad" else 7))
        if kind in ("duplicate", "equivocate"):
            replies.append(_reply(msg, 7 if kind == "duplicate" else 8))
    random.Random(len(kinds)).shuffle(replies)  # order of arrival must not matter
    got = strategy.receive(state, "p", replies, lambda _n, c: _number(c))
    good = {n for n, k in zip(nodes, kinds, strict=True) if k in ("ok", "duplicate")}
    assert set(got) == good == set(state.survivors)
    assert set(state.dropped) == set(nodes) - good
    assert all(v == 7 for v in got.values())


def test_seeded_sampling_is_reproducible_and_matches_the_documented_rule() -> None:
    grid = InProcessGrid(make_app(), 10)
    picks = []
    for _ in range(2):
        strategy = FedSubAvg(fraction_train=0.3, min_available_nodes=2, sampling_seed=7)
        random.seed(12345)  # the module RNG must not matter
        picks.append([strategy.sample(strategy.round_state(r), grid) for r in (1, 2, 3)])
        random.random()
    assert picks[0] == picks[1]
    assert len({tuple(p) for p in picks[0]}) > 1  # rounds differ
    nodes = list(grid.get_node_ids())
    assert picks[0][1] == random.Random(7 * 1_000_003 + 2).sample(nodes, 3)
    other = FedSubAvg(fraction_train=0.3, sampling_seed=8)
    assert [other.sample(other.round_state(r), grid) for r in (1, 2, 3)] != picks[0]


def test_seeded_flwr_fsl_strategy_samples_what_reseeded_flower_fedavg_samples() -> None:
    # The experiment harness reseeds Flower's own strategies with the same rule.
    grid = InProcessGrid(make_app(), 8)
    ours = FedSubAvg(fraction_train=0.5, sampling_seed=3)
    theirs = FedAvg(fraction_train=0.5)
    for r in (1, 2):
        random.seed(3 * 1_000_003 + r)
        flower = [
            m.metadata.dst_node_id for m in theirs.configure_train(r, ARRAYS, ConfigRecord(), grid)
        ]
        assert ours.sample(ours.round_state(r), grid) == flower


class _FailsRoundTwo(FedSubAvg):
    released: list[int]

    def train_round(self, grid, state, arrays, config):  # type: ignore[no-untyped-def]
        if state.server_round == 2:
            raise RoundFailedError("the second server is gone")
        return super().train_round(grid, state, arrays, config)

    def round_failed(self, state: RoundState, error: RoundFailedError) -> None:
        self.released = [*getattr(self, "released", []), state.server_round]


def test_a_failed_round_leaves_the_model_unchanged_and_the_run_goes_on() -> None:
    grid = InProcessGrid(make_app(), 3)
    strategy = _FailsRoundTwo(min_available_nodes=3)
    seen: dict[int, dict[str, np.ndarray]] = {}

    def evaluate_fn(rnd: int, arrays: ArrayRecord) -> MetricRecord | None:
        seen[rnd] = {k: v.numpy().copy() for k, v in arrays.items()}
        return None

    result = strategy.start(
        grid=grid, initial_arrays=model_record(), num_rounds=3, evaluate_fn=evaluate_fn
    )
    assert list(strategy.failed_rounds) == [2] and "second server" in strategy.failed_rounds[2]
    assert strategy.released == [2]
    for name in seen[1]:
        np.testing.assert_array_equal(seen[2][name], seen[1][name])
    assert 2 not in result.train_metrics_clientapp and 3 in result.train_metrics_clientapp


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fraction_train": 1.5},
        {"fraction_evaluate": -0.1},
        {"min_train_nodes": -1},
        {"weighted_by_key": ""},
    ],
)
def test_bad_settings_are_configuration_errors_naming_the_key(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError, match=next(iter(kwargs))):
        FedSubAvg(**kwargs)  # type: ignore[arg-type]


def test_start_keeps_flowers_signature_and_result() -> None:
    import inspect

    ours = inspect.signature(PhasedStrategy.start)
    flower = inspect.signature(FedAvg.start)
    assert list(ours.parameters) == list(flower.parameters)
    grid = InProcessGrid(make_app(), 2)
    result = FedSubAvg().start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert set(result.arrays.keys()) == set(model_record().keys())


def test_inconsistent_client_metrics_do_not_end_the_run() -> None:
    # One client reports a list where the others report a number: Flower's metric
    # aggregation raises on that; the round still aggregates the model.
    def list_metric(msg: Message, context: Context, call_next):  # type: ignore[no-untyped-def]
        reply = call_next(msg, context)
        if context.node_id == 1000 and reply.has_content():
            next(iter(reply.content.metric_records.values()))["train-loss"] = [1.0, 2.0]
        return reply

    grid = InProcessGrid(make_app([list_metric]), 3)
    strategy = FedSubAvg(min_available_nodes=3)
    result = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert strategy.dropped == {1: {}}
    metrics = result.train_metrics_clientapp[1]
    assert "train-loss" not in metrics and "up-bytes-per-client" in metrics
