"""SecAggFedAvg + secagg_mod on the in-process grid: equals Flower's FedAvg on the survivors,
dropouts at every phase, a clean failure beyond the threshold, and what the server sees."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp.strategy import FedAvg

from flwr_fsl.core.errors import ConfigurationError, RunFailedError
from flwr_fsl.families.secagg.records import SECAGG_KEY
from flwr_fsl.mods import secagg_mod
from flwr_fsl.strategies import SecAggFedAvg
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import MODEL, make_app, model_record

FLOATS = [k for k, v in MODEL.items() if v.dtype == np.float32]


def _phase(msg: Message) -> str | None:
    record = msg.content.config_records.get(SECAGG_KEY)
    return None if record is None else str(record["phase"])


def _unit_weight(msg, context, call_next):  # type: ignore[no-untyped-def]
    # Flower's FedAvg with every client's weight 1: what SecAggFedAvg computes by default.
    reply = call_next(msg, context)
    if reply.has_content() and reply.content.metric_records:
        for record in reply.content.metric_records.values():
            record["num-examples"] = 1
    return reply


def _fedavg(num_nodes: int, rounds: int = 1, drop=None, unit: bool = True):  # type: ignore[no-untyped-def]
    grid = InProcessGrid(make_app([_unit_weight] if unit else []), num_nodes, drop_nodes=drop)
    return FedAvg(min_available_nodes=num_nodes, fraction_evaluate=0.0).start(
        grid=grid, initial_arrays=model_record(), num_rounds=rounds
    )


def _secagg(num_nodes: int, rounds: int = 1, drop=None, mods=(), node_config=None, **kwargs):  # type: ignore[no-untyped-def]
    grid = InProcessGrid(
        make_app([*mods, secagg_mod]), num_nodes, drop_nodes=drop, node_config_fn=node_config
    )
    kwargs.setdefault("train_metrics", ("train-loss",))
    strategy = SecAggFedAvg(min_available_nodes=num_nodes, **kwargs)
    try:
        result = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=rounds)
    except RunFailedError as err:  # every round failed: the run fails; callers assert the rounds
        result = err.result
    return strategy, result, grid


def test_weighted_equals_flower_fedavg_with_the_same_train_function() -> None:
    strategy, secure, _ = _secagg(5, rounds=2, weighted=True)
    plain = _fedavg(5, rounds=2, unit=False)
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}, 2: {}}
    for name in FLOATS:
        np.testing.assert_allclose(
            secure.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
        )
    # Flower averages the int buffer as floats; SecAggFedAvg rounds it back to its dtype.
    assert secure.arrays["bn.num_batches_tracked"].numpy() == 5
    # Train metrics: the same weighted mean FedAvg computes, without a clear weight.
    for rnd in (1, 2):
        assert secure.train_metrics_clientapp[rnd]["train-loss"] == pytest.approx(
            plain.train_metrics_clientapp[rnd]["train-loss"], abs=1e-6
        )
        assert secure.train_metrics_clientapp[rnd]["secagg-clients"] == 5


def test_default_is_the_plain_mean_of_the_survivors_updates() -> None:
    # Unit weights: FedAvg with every num-examples set to 1 (the clients' are 10, 20, ...).
    strategy, secure, _ = _secagg(5, rounds=2)
    plain = _fedavg(5, rounds=2)
    weighted = _fedavg(5, rounds=2, unit=False)
    assert strategy.failed_rounds == {} and not strategy.weighted
    for name in FLOATS:
        np.testing.assert_allclose(
            secure.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
        )
    assert not np.allclose(secure.arrays["fc.bias"].numpy(), weighted.arrays["fc.bias"].numpy())
    for rnd in (1, 2):  # the plain mean of the train losses 0..4
        assert secure.train_metrics_clientapp[rnd]["train-loss"] == pytest.approx(2.0, abs=1e-6)


@pytest.mark.parametrize(
    "phase, lost",
    [("share", 1), ("train", 1), ("train", 2), ("unmask", 1)],
)
def test_dropouts_at_each_phase_equal_fedavg_on_the_survivors(phase: str, lost: int) -> None:
    # 6 clients, t = 0.6 * 6 -> 4: up to 2 may drop. A client lost in Unmask still counts
    # (its masked input is in the sum); one lost in share or train is left out.
    gone = {1000 + i for i in range(lost)}

    def drop(node: int, msg: Message) -> bool:
        return node in gone and _phase(msg) == phase

    strategy, secure, _ = _secagg(6, drop=drop)
    assert strategy.failed_rounds == {}
    assert set(strategy.dropped[1]) == gone
    kept_out = gone if phase != "unmask" else set()
    plain = _fedavg(6, drop=lambda node, msg: node in kept_out)
    for name in FLOATS:
        np.testing.assert_allclose(
            secure.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
        )


def test_too_many_dropouts_fail_the_round_and_keep_the_model() -> None:
    gone = {1000, 1001, 1002}
    strategy, secure, _ = _secagg(6, drop=lambda node, msg: node in gone and _phase(msg) == "train")
    assert "threshold" in strategy.failed_rounds[1]
    for name, value in MODEL.items():
        np.testing.assert_array_equal(secure.arrays[name].numpy(), value)


def test_a_malformed_masked_input_drops_only_that_client() -> None:
    def garble(content: RecordDict) -> RecordDict:
        record = content.array_records[SECAGG_KEY]
        from flwr.app import Array, ArrayRecord

        short = record["masked"].numpy()[:-1]
        return RecordDict({SECAGG_KEY: ArrayRecord({"masked": Array(short)})})

    from tests.flower_apps import corrupt_mod

    def only_masked(content: RecordDict) -> RecordDict:
        return garble(content) if SECAGG_KEY in content.array_records else content

    strategy, secure, _ = _secagg(5, mods=(corrupt_mod(2, only_masked),))
    assert set(strategy.dropped[1]) == {1002}
    assert "uint64 words" in strategy.dropped[1][1002]
    plain = _fedavg(5, drop=lambda node, msg: node == 1002)
    for name in FLOATS:
        np.testing.assert_allclose(
            secure.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
        )


def test_replies_carry_no_update_weight_or_metric_in_the_clear() -> None:
    seen: list[RecordDict] = []

    def spy(msg, context, call_next):  # type: ignore[no-untyped-def]
        reply = call_next(msg, context)
        if reply.has_content():
            seen.append(reply.content)
        return reply

    _secagg(3, mods=(spy,))
    kinds = set()
    for content in seen:
        assert not content.metric_records
        assert set(content.keys()) == {SECAGG_KEY}
        kinds.add(tuple(sorted(content.keys())))
    assert kinds == {(SECAGG_KEY,)}
    # The masked vectors are uint64 words only; the secret weights (10, 20, 30) and losses
    # appear nowhere as float64 or int64 bytes.
    blob = b"".join(
        bytes(a.data) for c in seen for r in c.array_records.values() for a in r.values()
    )
    for w in (10.0, 20.0, 30.0):
        assert np.float64(w).tobytes() not in blob


def test_settings_are_validated_before_round_one() -> None:
    with pytest.raises(ConfigurationError, match="reconstruction_threshold"):
        SecAggFedAvg(reconstruction_threshold=1)
    with pytest.raises(ConfigurationError, match="reconstruction_threshold"):
        SecAggFedAvg(reconstruction_threshold=1.5)
    with pytest.raises(ConfigurationError, match="max_clients"):
        SecAggFedAvg(max_weight=1e12, frac_bits=30, weighted=True)
    SecAggFedAvg(max_weight=1e12, frac_bits=30)  # unit weights: max_weight sizes nothing
    with pytest.raises(ConfigurationError, match="train_metrics"):
        SecAggFedAvg(train_metrics=("num-examples",))
    with pytest.raises(ConfigurationError, match=r"advertise, share, train, unmask.*start"):
        SecAggFedAvg().configure_train(1, model_record(), ConfigRecord(), None)


def test_a_client_that_lost_its_state_is_dropped_and_unmasked_away() -> None:
    # A restarted node (Context.state lost between sharing and training) cannot mask: it
    # refuses with a text that names no value, the server drops it and removes its pair masks
    # from the others' inputs; the round equals FedAvg without it.
    def forget(msg, context, call_next):  # type: ignore[no-untyped-def]
        if context.node_id == 1001 and _phase(msg) == "train":
            for key in list(context.state.keys()):
                del context.state[key]
        return call_next(msg, context)

    strategy, secure, _ = _secagg(5, mods=(forget,))
    assert set(strategy.dropped[1]) == {1001}
    assert "no SecAgg state" in strategy.dropped[1][1001]
    plain = _fedavg(5, drop=lambda node, msg: node == 1001)
    for name in FLOATS:
        np.testing.assert_allclose(
            secure.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
        )


def test_a_control_message_replayed_from_an_earlier_round_is_refused() -> None:
    # The relay replays round 1's share request in round 2: the client's state is round 2's,
    # so it refuses; the round goes on without it.
    kept: dict[int, Message] = {}

    def replay(msg, context, call_next):  # type: ignore[no-untyped-def]
        if _phase(msg) == "share":
            if msg.metadata.group_id == "1":
                kept[int(context.node_id)] = msg
            elif context.node_id == 1000:
                return call_next(kept[1000], context)
        return call_next(msg, context)

    strategy, _, _ = _secagg(5, rounds=2, mods=(replay,))
    assert strategy.failed_rounds == {}
    assert set(strategy.dropped[2]) == {1000}
    assert "no SecAgg state for this round" in strategy.dropped[2][1000]  # the client refused


@pytest.mark.parametrize("lost", [0, 1])
def test_neighbours_give_fedavg_over_a_sparse_mask_graph(lost: int) -> None:
    # 9 clients, neighbours=4 (sparse: 4 < 8), t = ceil(0.6 * 5) = 3 over each neighbourhood;
    # one client lost after sharing is recovered from its neighbours' shares.
    gone = {1000 + i for i in range(lost)}

    def drop(node: int, msg: Message) -> bool:
        return node in gone and _phase(msg) == "train"

    strategy, secure, _ = _secagg(9, drop=drop, neighbours=4)
    assert strategy.failed_rounds == {} and strategy.neighbours == 4
    plain = _fedavg(9, drop=lambda node, msg: node in gone)
    for name in FLOATS:
        np.testing.assert_allclose(
            secure.arrays[name].numpy(), plain.arrays[name].numpy(), atol=1e-6
        )
    # (The server refuses any share bundle not addressed to exactly the 4 neighbours.)
    assert strategy.threshold_for(9) == 3
