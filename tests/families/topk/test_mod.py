"""topk_mod on a real ClientApp: configuration, pass-through, error feedback in Context.state."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from flwr_fsl.core.errors import ClientInputError, RunFailedError
from flwr_fsl.core.records import decode_update
from flwr_fsl.families.topk.mod import RESIDUAL, RESIDUAL_KEY, Residual
from flwr_fsl.mods import topk_mod
from flwr_fsl.strategies import FedSubAvg
from flwr_fsl.submodel import ARRAYS_KEY, HEADER_KEY, Encoding
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import MODEL, corrupt_mod, make_app, model_record, node_delta


def _train_once(grid: InProcessGrid, config: dict | None = None, rnd: int = 1) -> RecordDict:
    node = next(iter(grid.get_node_ids()))
    cfg = ConfigRecord({"server-round": rnd, **(config or {})})
    msg = Message(RecordDict({"arrays": model_record(), "config": cfg}), node, "train")
    (reply,) = grid.send_and_receive([msg])
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    return reply.content


def test_passes_dense_reply_through_without_settings_or_at_ratio_one() -> None:
    grid = InProcessGrid(make_app([topk_mod]), 1)
    assert HEADER_KEY not in _train_once(grid)
    grid = InProcessGrid(make_app([topk_mod]), 1, {"topk-ratio": 1.0})
    assert HEADER_KEY not in _train_once(grid)


def test_sparsifies_and_keeps_metrics() -> None:
    grid = InProcessGrid(make_app([topk_mod]), 1, {"topk-count": 5})
    content = _train_once(grid)
    update = decode_update(content, MODEL, 1.0)
    sent = sum(p.num_indices for n, p in update.tensors.items() if n != "bn.num_batches_tracked")
    assert sent == 5
    assert content["metrics"]["num-examples"] == 10


def test_server_config_overrides_run_config() -> None:
    grid = InProcessGrid(make_app([topk_mod]), 1, {"topk-count": 5})
    assert HEADER_KEY not in _train_once(grid, {"topk-ratio": 1.0})
    update = decode_update(_train_once(grid, {"topk-count": 9}), MODEL, 1.0)
    assert sum(p.num_indices for p in update.tensors.values()) == 9 + 1


def test_mega_elements_through_the_mod() -> None:
    grid = InProcessGrid(make_app([topk_mod]), 1, {"topk-ratio": 0.25, "topk-groups": "emb.weight"})
    part = decode_update(_train_once(grid), MODEL, 1.0).tensors["emb.weight"]
    assert part.encoding is Encoding.ROWS and part.indices.size == 3
    delta = node_delta(0, 1, "emb.weight", MODEL["emb.weight"].shape)
    np.testing.assert_allclose(part.values, delta[part.indices], rtol=1e-6)


def test_error_feedback_residual_lives_in_context_state() -> None:
    grid = InProcessGrid(make_app([topk_mod]), 1, {"topk-ratio": 0.1})
    node = next(iter(grid.get_node_ids()))
    sent = {k: np.zeros(v.shape) for k, v in MODEL.items() if v.dtype == np.float32}
    total = {k: np.zeros(v.shape) for k in sent for v in [MODEL[k]]}
    for rnd in (1, 2, 3):
        update = decode_update(_train_once(grid, rnd=rnd), MODEL, 1.0)
        for name in sent:
            total[name] += node_delta(0, rnd, name, MODEL[name].shape)
            part = update.tensors.get(name)
            if part is not None:
                sent[name].reshape(-1)[part.indices] += part.values
    stored = RESIDUAL.load(grid.context(node))
    assert stored is not None and RESIDUAL.name == RESIDUAL_KEY
    for name in sent:
        np.testing.assert_allclose(
            sent[name] + stored.arrays[name], total[name], rtol=1e-5, atol=1e-5
        )


def test_evaluate_messages_are_untouched() -> None:
    grid = InProcessGrid(make_app([topk_mod]), 1, {"topk-ratio": 0.1})
    node = next(iter(grid.get_node_ids()))
    msg = Message(RecordDict({"arrays": model_record()}), node, "evaluate")
    (reply,) = grid.send_and_receive([msg])
    assert set(reply.content.keys()) == {"metrics"}


@pytest.mark.parametrize(
    "run_config, reason",
    [
        ({"topk-ratio": 2.0}, "ratio"),
        ({"topk-scope": "layer", "topk-ratio": 0.5}, "scope"),
        ({"topk-ratio": 0.5, "topk-groups": "nope"}, "not a tensor"),
    ],
)
def test_bad_settings_fail_the_client_and_the_server_drops_it(
    run_config: dict, reason: str
) -> None:
    grid = InProcessGrid(make_app([topk_mod]), 2, run_config)
    strategy = FedSubAvg()
    with pytest.raises(RunFailedError) as failed:  # no round produced a result
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    result = failed.value.result
    assert len(strategy.dropped[1]) == 2
    assert all(reason in r for r in strategy.dropped[1].values())
    for name, value in MODEL.items():
        np.testing.assert_array_equal(result.arrays[name].numpy(), value)


def test_reply_that_changes_the_model_shape_is_an_error() -> None:
    def reshape(c: RecordDict) -> RecordDict:
        c["arrays"]["fc.bias"] = Array(np.ones(8, np.float32))
        return c

    # The corruption runs inside topk_mod (as if the user's train changed the model).
    grid = InProcessGrid(make_app([topk_mod, corrupt_mod(0, reshape)]), 1, {"topk-ratio": 0.5})
    node = next(iter(grid.get_node_ids()))
    cfg = ConfigRecord({"server-round": 1})
    msg = Message(RecordDict({"arrays": model_record(), "config": cfg}), node, "train")
    (reply,) = grid.send_and_receive([msg])
    assert reply.has_error() and "fc.bias" in reply.error.reason


def test_upload_is_a_fraction_of_dense() -> None:
    initial = ArrayRecord({"w": Array(np.zeros(50_000, np.float32))})
    sizes = {}
    for ratio in (1.0, 0.1, 0.01):
        grid = InProcessGrid(make_app([topk_mod]), 2, {"topk-ratio": ratio})
        strategy = FedSubAvg()
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=1)
        sizes[ratio] = strategy.traffic[0].mean_up_bytes
    # 8 bytes (float32 value + uint32 index) per kept coordinate vs 4 per dense one.
    assert sizes[0.1] < 0.22 * sizes[1.0] and sizes[0.01] < 0.03 * sizes[1.0]


def test_sparse_arrays_record_name() -> None:
    grid = InProcessGrid(make_app([topk_mod]), 1, {"topk-ratio": 0.1})
    content = _train_once(grid)
    assert set(content.keys()) == {HEADER_KEY, ARRAYS_KEY, "metrics"}
    assert isinstance(content["metrics"], MetricRecord)


def test_a_new_session_starts_without_a_residual() -> None:
    grid = InProcessGrid(make_app([topk_mod]), 1, {"topk-ratio": 0.1})
    node = next(iter(grid.get_node_ids()))
    _train_once(grid, {"topk-session": "a"})
    stored = RESIDUAL.load(grid.context(node))
    assert stored is not None and stored.session == "a"
    first = stored.arrays["fc.bias"]
    # Same session: the residual is carried; new session: it is not (as in round 1).
    carried = decode_update(_train_once(grid, {"topk-session": "a"}), MODEL, 1.0)
    fresh = decode_update(_train_once(grid, {"topk-session": "b"}), MODEL, 1.0)
    baseline = decode_update(
        _train_once(InProcessGrid(make_app([topk_mod]), 1, {"topk-ratio": 0.1})), MODEL, 1.0
    )
    assert np.any(first)
    for name in baseline.tensors:
        np.testing.assert_array_equal(fresh.tensors[name].values, baseline.tensors[name].values)
    assert any(
        not np.array_equal(carried.tensors.get(n, p).values, p.values)
        for n, p in baseline.tensors.items()
    )


def test_the_residual_round_trips_and_a_bad_slot_reads_as_empty() -> None:
    arrays = {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "h": np.array([1.5], np.float16),
        "s": np.float64(2.0).reshape(()),
    }
    data = Residual("sess", arrays).to_bytes()
    back = Residual.from_bytes(data)
    assert back.session == "sess" and list(back.arrays) == list(arrays)
    for name, value in arrays.items():
        assert back.arrays[name].dtype == value.dtype
        np.testing.assert_array_equal(back.arrays[name], value)
        assert back.arrays[name].flags.writeable
    for bad in (data[:-1], data + b"\x00", data[:4] + b"\x09" + data[5:], b""):
        with pytest.raises(ClientInputError):
            Residual.from_bytes(bad)
    context = Context(run_id=1, node_id=2, node_config={}, state=RecordDict(), run_config={})
    context.state[RESIDUAL_KEY] = ConfigRecord({"bytes": data[:-3]})
    assert RESIDUAL.load(context) is None  # corrupted: error feedback starts afresh
