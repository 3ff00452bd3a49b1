"""FedSubAvg bounds what one client's reply can do (issue 24 item 4).

Weights are bounded by ``max_weight`` (above it: dropped), each coordinate's change by
``clipping_range`` (the secure strategies' setting: a larger finite change is clipped), and a
non-finite value drops the client, never clipped.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, Context, Message, MetricRecord
from flwr.clientapp.typing import ClientAppCallable, Mod

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.mods import topk_mod
from flwr_fsl.strategies import FedSubAvg
from flwr_fsl.submodel import ARRAYS_KEY
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import MODEL, make_app, model_record

BAD = 2  # the faulty client's partition id


def _hostile(value: float | None, weight: float = 1e9) -> Mod:
    """Partition BAD sends every float tensor as ``value`` (None: the model + 8) at ``weight``."""

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        reply = call_next(msg, context)
        if msg.metadata.message_type != "train" or context.node_config["partition-id"] != BAD:
            return reply
        arrays = next(iter(reply.content.array_records.values()))
        for name in list(arrays.keys()):
            sent = msg.content["arrays"][name].numpy()
            if np.issubdtype(sent.dtype, np.floating):
                new = sent + np.float32(8) if value is None else np.full_like(sent, value)
                arrays[name] = Array(new)
        reply.content["metrics"] = MetricRecord({"num-examples": weight, "train-loss": 0.0})
        return reply

    return mod


def _run(value: float | None, rounds: int = 3, **kwargs: object) -> tuple[FedSubAvg, dict]:  # type: ignore[type-arg]
    grid = InProcessGrid(make_app([_hostile(value)]), 4)
    strategy = FedSubAvg(min_available_nodes=4, fraction_evaluate=0.0, **kwargs)  # type: ignore[arg-type]
    result = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=rounds)
    return strategy, {k: v.numpy() for k, v in result.arrays.items()}


def test_finite_huge_values_at_max_weight_are_clipped_to_the_range() -> None:
    strategy, model = _run(1e30)
    assert all(not d for d in strategy.dropped.values()) and not strategy.failed_rounds
    for name, value in MODEL.items():
        if np.issubdtype(value.dtype, np.floating):
            assert np.all(np.abs(model[name].astype(np.float64) - value) <= 3 * 8.0 + 1e-4)
    # What the same client sending the model + clipping_range gives (float32 rounding apart).
    _, reference = _run(None)
    for name in MODEL:
        np.testing.assert_allclose(model[name], reference[name], rtol=0, atol=1e-5)


def test_without_a_range_the_same_client_moves_the_model_arbitrarily_far() -> None:
    _, model = _run(1e30, clipping_range=None)
    assert np.max(np.abs(model["fc.bias"])) > 1e29  # what clipping_range bounds


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_a_non_finite_value_drops_the_client_never_clipped(value: float) -> None:
    strategy, _ = _run(value, rounds=1)
    assert len(strategy.dropped[1]) == 1
    assert "NaN or inf" in next(iter(strategy.dropped[1].values())) or "finite" in next(
        iter(strategy.dropped[1].values())
    )


def test_sparse_replies_are_clipped_too() -> None:
    def huge_sparse(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        reply = call_next(msg, context)
        if msg.metadata.message_type == "train" and context.node_config["partition-id"] == BAD:
            arrays = reply.content[ARRAYS_KEY]
            for name in list(arrays.keys()):
                if name.endswith("|values"):
                    arrays[name] = Array(np.full_like(arrays[name].numpy(), 1e30))
        return reply

    grid = InProcessGrid(make_app([huge_sparse, topk_mod]), 4, {"topk-ratio": 0.5})
    strategy = FedSubAvg(min_available_nodes=4, fraction_evaluate=0.0)
    result = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=2)
    assert not any(strategy.dropped.values())
    change = np.abs(result.arrays["fc.bias"].numpy().astype(np.float64) - MODEL["fc.bias"])
    assert np.all(change <= 2 * 8.0 + 1e-4)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "8", True])
def test_clipping_range_is_validated(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="clipping_range"):
        FedSubAvg(clipping_range=bad)  # type: ignore[arg-type]


def test_content_is_not_touched_within_the_range() -> None:
    # FedAvg's exact arithmetic on replies within the range (clipping changes nothing).
    grid = InProcessGrid(make_app(), 3)
    a = FedSubAvg(min_available_nodes=3, sampling_seed=1).start(
        grid=grid, initial_arrays=model_record()
    )
    b = FedSubAvg(min_available_nodes=3, sampling_seed=1, clipping_range=None).start(
        grid=grid, initial_arrays=model_record()
    )
    for name in MODEL:
        np.testing.assert_array_equal(a.arrays[name].numpy(), b.arrays[name].numpy())
