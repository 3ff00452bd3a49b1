"""SesaFedAvg + sesa_mod on the in-process grid: one SESA round equals the plaintext
shard-wise count-weighted average of what the clients trained (fixed-point error only), with
clients dropping at each phase, a clean failure beyond N - (K + T), malformed replies dropped,
replies that carry nothing in the clear, and the shard groups of MLP/CNN layouts."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RunFailedError
from flwr_fsl.families.sesa.layout import SesaLayout
from flwr_fsl.families.sesa.mod import SesaNodeState, sesa_mod
from flwr_fsl.families.sesa.records import SESA_KEY
from flwr_fsl.families.sesa.strategy import SesaFedAvg
from flwr_fsl.testing import InProcessGrid

HIDDEN, INPUTS, OUTPUTS = 8, 6, 3
MODEL = {
    "fc1.weight": np.linspace(-1, 1, HIDDEN * INPUTS, dtype=np.float32).reshape(HIDDEN, INPUTS),
    "fc1.bias": np.zeros(HIDDEN, np.float32),
    "fc2.weight": np.linspace(1, -1, OUTPUTS * HIDDEN, dtype=np.float32).reshape(OUTPUTS, HIDDEN),
    "fc2.bias": np.full(OUTPUTS, 0.5, np.float32),
}
RATES = [1.0, 0.5, 0.25, 0.5, 0.25, 1.0, 0.25, 0.5, 0.25, 0.5]


DEEP = {  # two hidden layers: fc2 is a pair group (S^2 blocks), fc2.bias fc2's node group
    "fc1.weight": np.linspace(-1, 1, HIDDEN * INPUTS, dtype=np.float32).reshape(HIDDEN, INPUTS),
    "fc1.bias": np.zeros(HIDDEN, np.float32),
    "fc2.weight": np.linspace(1, -1, HIDDEN * HIDDEN, dtype=np.float32).reshape(HIDDEN, HIDDEN),
    "fc2.bias": np.full(HIDDEN, 0.1, np.float32),
    "fc3.weight": np.linspace(-1, 1, OUTPUTS * HIDDEN, dtype=np.float32).reshape(OUTPUTS, HIDDEN),
    "fc3.bias": np.full(OUTPUTS, 0.5, np.float32),
}


def _record(model: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(v.copy()) for k, v in model.items()})


def _delta(pid: int, rnd: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([pid, rnd, sum(map(ord, name))])
    return (0.1 * rng.normal(size=shape)).astype(np.float32)


def _examples(pid: int) -> int:
    return 20 + 7 * (pid % 10)  # <= 83 < max_weight = 100


def _app() -> ClientApp:
    app = ClientApp(mods=[sesa_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        rate = float(msg.content["config"]["width-rate"])
        arrays = msg.content["arrays"]
        assert arrays["fc1.weight"].shape == (round(rate * HIDDEN), INPUTS)  # the narrow model
        new = {k: a.numpy() + _delta(pid, rnd, k, a.shape) for k, a in arrays.items()}
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v) for k, v in new.items()}),
                    "metrics": MetricRecord({"num-examples": _examples(pid)}),
                }
            ),
            reply_to=msg,
        )

    return app


def _phase(msg: Message) -> str | None:
    record = msg.content.config_records.get(SESA_KEY)
    return None if record is None else str(record["phase"])


def _run(n: int, drop=None, mods=(), rounds: int = 1, model=None, **kwargs):  # type: ignore[no-untyped-def]
    app = _app()
    if mods:
        inner = app
        app = ClientApp(mods=[*mods])

        @app.train()
        def outer(msg: Message, context: Context) -> Message:
            return inner(msg, context)

    grid = InProcessGrid(
        app,
        n,
        node_config_fn=lambda i: {
            "partition-id": i,
            "num-partitions": n,
            "width-rate": RATES[i % len(RATES)],
        },
        drop_nodes=drop,
    )
    kwargs.setdefault("frac_bits", 20)
    kwargs.setdefault("max_clients", 50)
    kwargs.setdefault("max_weight", 100.0)
    strategy = SesaFedAvg(
        num_shards=4, min_available_nodes=n, fraction_evaluate=0.0, sampling_seed=1, **kwargs
    )
    initial = _record(MODEL if model is None else model)
    try:
        result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds)
    except RunFailedError as err:  # every round failed: the run fails; callers assert the rounds
        result = err.result
    return strategy, result, grid


def _reference(grid: InProcessGrid, nodes: list[int], weighted: bool = False, model=None) -> dict:  # type: ignore[no-untyped-def]
    """Plaintext count-weighted average over each coordinate's holders, from each client's
    (secret) choice read out of its Context.state and its deterministic delta."""
    model = MODEL if model is None else model
    layout = SesaLayout.of(model, 4)
    total = {k: np.zeros(v.shape) for k, v in model.items()}
    count = {k: np.zeros(v.shape) for k, v in model.items()}
    for node in nodes:
        context = grid.context(node)
        state = SesaNodeState.from_bytes(
            context.state.config_records["fsl.sesa.client-state"]["bytes"]
        )
        pid = int(context.node_config["partition-id"])
        width = layout.width_layout(model, state.choice)
        c = _examples(pid) / 100.0 if weighted else 1.0
        for name in model:
            out_idx, in_idx = width.slices.get(name, (None, None))
            rows = np.arange(model[name].shape[0]) if out_idx is None else out_idx
            d = _delta(pid, 1, name, width.sub_shape(name)).astype(np.float64)
            if model[name].ndim == 1:
                total[name][rows] += c * d
                count[name][rows] += c
            else:
                cols = np.arange(model[name].shape[1]) if in_idx is None else in_idx
                total[name][np.ix_(rows, cols)] += c * d
                count[name][np.ix_(rows, cols)] += c
    out = {}
    for name, value in model.items():
        held = count[name] > 0
        new = value.astype(np.float64).copy()
        new[held] += total[name][held] / count[name][held]
        out[name] = new
    return out


def _assert_close(result, reference, atol: float = 2e-5) -> None:  # type: ignore[no-untyped-def]
    for name in reference:
        np.testing.assert_allclose(result.arrays[name].numpy(), reference[name], atol=atol)


def test_one_round_equals_the_plaintext_shard_wise_count_weighted_average() -> None:
    strategy, result, grid = _run(8)
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}}
    nodes = list(grid.get_node_ids())
    _assert_close(result, _reference(grid, nodes))
    metrics = result.train_metrics_clientapp[1]
    assert metrics["sesa-clients"] == 8 and metrics["sesa-T"] == 4
    # The model moved where some client trained (every shard was chosen by someone here).
    assert not np.allclose(result.arrays["fc1.weight"].numpy(), MODEL["fc1.weight"])


def test_two_hidden_layers_pair_blocks_equal_the_plaintext_average() -> None:
    # fc2's weight is split into S^2 = 16 blocks (shard a of fc2's outputs x shard b of fc1's):
    # a client of capacity B holds (B S)^2 of them; each block averages over its holders.
    # K_max = 16, so a round needs K_max + T = 18 clients.
    layout = SesaLayout.of(DEEP, 4)
    assert layout.descriptors == ("node:fc1", "node:fc2", "pair:fc2/fc1", "common")
    strategy, result, grid = _run(20, model=DEEP, privacy=2)
    assert strategy.failed_rounds == {}
    _assert_close(result, _reference(grid, list(grid.get_node_ids()), model=DEEP))


def test_weighted_mean_over_each_shards_clients_when_asked() -> None:
    # Not the default (a documented leak: tests/attacks/test_sesa_weights_subset_sum.py).
    strategy, result, grid = _run(6, weighted=True, privacy=2)
    assert strategy.failed_rounds == {}
    _assert_close(result, _reference(grid, list(grid.get_node_ids()), weighted=True))


def test_defaults_are_unit_weights_and_no_federated_evaluation() -> None:
    strategy = SesaFedAvg()
    assert strategy.weighted is False and strategy.settings.weighted is False
    assert strategy.fraction_evaluate == 0.0
    with pytest.raises(ConfigurationError, match="evaluate_fn"):
        SesaFedAvg(fraction_evaluate=0.5)
    assert SesaFedAvg(fraction_evaluate=0.5, plaintext_evaluation=True).fraction_evaluate == 0.5


def test_a_weight_key_the_node_does_not_allow_makes_it_refuse_the_round() -> None:
    # The train replies carry "num-examples" only; a server asking for "train_loss" is refused
    # by every client at advertise (naming the key), and the round fails with the model kept.
    strategy, result, _ = _run(6, weighted=True, weighted_by_key="train_loss", privacy=2)
    assert strategy.failed_rounds
    assert set(strategy.dropped[1]) == set(range(1000, 1006))
    assert all("train_loss" in why and "advertise" in why for why in strategy.dropped[1].values())
    for name, value in MODEL.items():
        np.testing.assert_array_equal(result.arrays[name].numpy(), value)


def test_a_weight_key_the_node_config_allows_is_used() -> None:
    app = _app()
    grid = InProcessGrid(
        app,
        6,
        node_config_fn=lambda i: {
            "partition-id": i,
            "num-partitions": 6,
            "width-rate": RATES[i],
            "fsl-weight-keys": "num-examples, samples",
        },
    )
    strategy = SesaFedAvg(
        num_shards=4, min_available_nodes=6, sampling_seed=1, weighted=True,
        weighted_by_key="samples", max_weight=100.0, frac_bits=20, max_clients=50, privacy=2,
    )  # fmt: skip
    # The reply has no "samples" metric: the clients accept the key, then drop at train.
    with pytest.raises(RunFailedError):  # no round produced a result
        strategy.start(grid=grid, initial_arrays=_record(MODEL), num_rounds=1)
    reasons = strategy.dropped[1].values()
    assert reasons and all("train:" in why and "samples" in why for why in reasons)


@pytest.mark.parametrize(
    "phase, lost, aggregated",
    [("offline", {1001}, False), ("train", {1002}, False), ("decode", {1003, 1004}, True)],
)
def test_a_client_dropping_at_each_phase(phase: str, lost: set[int], aggregated: bool) -> None:
    # N = 10, K = 4, T = 3: up to D = 3 may drop.
    def drop(node: int, msg: Message) -> bool:
        return node in lost and _phase(msg) == phase

    strategy, result, grid = _run(10, drop=drop, privacy=3)
    assert strategy.failed_rounds == {}
    assert set(strategy.dropped[1]) == lost
    nodes = [n for n in grid.get_node_ids() if aggregated or n not in lost]
    _assert_close(result, _reference(grid, nodes))
    assert result.train_metrics_clientapp[1]["sesa-clients"] == len(nodes)


def test_dropouts_beyond_n_minus_k_plus_t_fail_the_round_and_keep_the_model() -> None:
    lost = {1000, 1001, 1002}  # N = 8, K + T = 4 + 2: D = 2 tolerated
    strategy, result, _ = _run(
        8, drop=lambda node, msg: node in lost and _phase(msg) == "train", privacy=2
    )
    assert "K_max + T = 6" in strategy.failed_rounds[1]
    for name, value in MODEL.items():
        np.testing.assert_array_equal(result.arrays[name].numpy(), value)


def test_a_malformed_masked_update_drops_only_that_client() -> None:
    def garble(msg: Message, context: Context, call_next):  # type: ignore[no-untyped-def]
        reply = call_next(msg, context)
        if _phase(msg) == "train" and context.node_config["partition-id"] == 2:
            masked = reply.content.config_records[SESA_KEY]["masked"]
            return Message(
                RecordDict({SESA_KEY: ConfigRecord({"masked": masked[:-4]})}), reply_to=msg
            )
        return reply

    strategy, result, grid = _run(7, mods=(garble,), privacy=2)
    assert set(strategy.dropped[1]) == {1002}
    assert "train:" in strategy.dropped[1][1002]
    nodes = [n for n in grid.get_node_ids() if n != 1002]
    _assert_close(result, _reference(grid, nodes))


def test_replies_carry_nothing_in_the_clear() -> None:
    seen: list[tuple[str | None, RecordDict]] = []

    def spy(msg: Message, context: Context, call_next):  # type: ignore[no-untyped-def]
        reply = call_next(msg, context)
        if reply.has_content():
            seen.append((_phase(msg), reply.content))
        return reply

    _run(6, mods=(spy,), privacy=2)
    assert {p for p, _ in seen} == {"advertise", "offline", "train", "decode"}
    for _, content in seen:
        assert list(content.keys()) == [SESA_KEY]
        assert not content.array_records and not content.metric_records
        record = content.config_records[SESA_KEY]
        assert len(record) == 1 and isinstance(next(iter(record.values())), bytes)


def test_two_rounds_each_with_its_own_round_state() -> None:
    strategy, result, grid = _run(6, rounds=2, privacy=2)
    assert strategy.failed_rounds == {}
    assert len(strategy.rounds) == 2 and result.train_metrics_clientapp[2]["sesa-clients"] == 6
    for node in grid.get_node_ids():
        slot = grid.context(node).state.config_records["fsl.sesa.client-state"]["bytes"]
        state = SesaNodeState.from_bytes(slot)  # type: ignore[arg-type]
        assert state.client.params.round_id == 2 and state.client.evaluated


def test_settings_and_model_structure_are_checked_before_round_1() -> None:
    with pytest.raises(ConfigurationError, match=r"frac_bits|max_clients"):
        SesaFedAvg(frac_bits=24, max_clients=1000)
    with pytest.raises(ConfigurationError, match="privacy"):
        SesaFedAvg(privacy=0)
    with pytest.raises(ConfigurationError, match="privacy"):
        SesaFedAvg(privacy=1.5)
    grid = InProcessGrid(_app(), 4)
    odd = {k: v for k, v in MODEL.items()}
    odd["fc1.weight"] = np.zeros((6, INPUTS), np.float32)
    odd["fc1.bias"] = np.zeros(6, np.float32)
    odd["fc2.weight"] = np.zeros((OUTPUTS, 6), np.float32)
    with pytest.raises(ConfigurationError, match="multiple of num_shards"):
        SesaFedAvg(num_shards=4).start(
            grid=grid, initial_arrays=ArrayRecord({k: Array(v) for k, v in odd.items()})
        )


def test_layout_groups_of_the_mlp_and_cnn_cover_every_coordinate_once() -> None:
    torch = pytest.importorskip("torch")
    from flwr_fsl.models.width import WidthCNN, WidthMLP

    del torch
    mlp = {k: v.detach().numpy() for k, v in WidthMLP().state_dict().items()}
    layout = SesaLayout.of(mlp, 4)
    assert layout.descriptors == ("node:blocks.0.layer", "common")
    assert [(g.shards, g.length) for g in layout.groups] == [(4, 50 * 784 + 50 + 10 * 50), (1, 10)]
    cnn = {k: v.detach().numpy() for k, v in WidthCNN().state_dict().items()}
    layout = SesaLayout.of(cnn, 4)
    assert [g.kind for g in layout.groups] == ["node", "node", "pair", "common"]
    for lay in (SesaLayout.of(mlp, 4), layout):
        coords = np.concatenate([g.coords.reshape(-1) for g in lay.groups])
        assert np.array_equal(np.sort(coords), np.arange(lay.flat.size))
    # A client's slots: node shards as chosen; pairs a*S + b.
    choice = {"blocks.0.layer": [1, 3], "blocks.1.layer": [0, 2]}
    assert layout.slots(choice) == ((1, 3), (0, 2), (1, 3, 9, 11), (0,))


def test_node_state_codec_round_trips_and_rejects_mutations() -> None:
    _, _, grid = _run(6, privacy=2)
    slot = grid.context(1000).state.config_records["fsl.sesa.client-state"]["bytes"]
    assert isinstance(slot, bytes)
    assert SesaNodeState.from_bytes(slot).to_bytes() == slot
    rng = np.random.default_rng(0)
    for _ in range(300):
        raw = bytearray(slot)
        if rng.random() < 0.5:
            raw[int(rng.integers(len(raw)))] ^= 1 << int(rng.integers(8))
        else:
            del raw[int(rng.integers(len(raw))) :]
        try:
            SesaNodeState.from_bytes(bytes(raw))
        except ClientInputError:
            pass


def test_a_sesa_message_without_round_state_is_refused() -> None:
    strategy, _, grid = _run(6, privacy=2)
    context = grid.context(1001)
    del context.state["fsl.sesa.client-state"]
    params = strategy.rounds[1].protocol
    msg = Message(
        RecordDict(
            {
                SESA_KEY: ConfigRecord(
                    {"phase": "offline", "params": params.to_bytes(), "roster": b""}
                )
            }
        ),
        dst_node_id=1001,
        message_type="train",
    )
    with pytest.raises(ClientInputError, match="no SESA state"):
        sesa_mod(msg, context, lambda m, c: m)
    msg.content.config_records[SESA_KEY]["phase"] = "unknown"
    with pytest.raises(ClientInputError, match="unknown SESA phase"):
        sesa_mod(msg, context, lambda m, c: m)


def _relay_mib_for(batch: int, n: int) -> float:
    """``relay_mib`` at which ``SesaFedAvg.relay_batch`` gives ``batch`` clients of ``n``."""
    words = sum(g.shards * (g.length + 1) for g in SesaLayout.of(MODEL, 4).sesa_groups())
    return batch * (8 * n * words + 4096) / (1 << 20)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "phase, lost, aggregated",
    [("offline", {1001}, False), ("train", {1002}, False), ("decode", {1003, 1004}, True)],
)
def test_relays_in_batches_give_the_same_round(
    batch: int, phase: str, lost: set[int], aggregated: bool
) -> None:
    # relay_mib small enough that the offline, train and decode phases go out `batch` clients
    # at a time: the same survivors, drops and plaintext average as one batch.
    def drop(node: int, msg: Message) -> bool:
        return node in lost and _phase(msg) == phase

    mib = _relay_mib_for(batch, 10)
    strategy, result, grid = _run(10, drop=drop, privacy=3, relay_mib=mib)
    state = strategy.round_state(1)
    assert strategy.relay_batch(state) == batch
    assert strategy.failed_rounds == {}
    assert set(strategy.dropped[1]) == lost
    nodes = [n for n in grid.get_node_ids() if aggregated or n not in lost]
    _assert_close(result, _reference(grid, nodes))
    assert result.train_metrics_clientapp[1]["sesa-clients"] == len(nodes)
    assert len(state.phase("decode").down_bytes) == 10 - (0 if aggregated else 1)


def test_relay_mib_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="relay_mib"):
        SesaFedAvg(relay_mib=0)
