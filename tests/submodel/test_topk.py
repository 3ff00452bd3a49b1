"""Top-k selection, error feedback and mega-element grouping (Flower-free)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.submodel import Encoding, TopKConfig, sparsify


def test_global_topk_picks_largest_magnitudes_across_tensors() -> None:
    deltas = {
        "a": np.array([0.1, -5.0, 0.2], np.float32),
        "b": np.array([[3.0, -0.05], [0.0, 4.0]], np.float32),
    }
    update, _ = sparsify(deltas, TopKConfig(count=3, error_feedback=False))
    assert update.tensors["a"].indices.tolist() == [1]
    assert update.tensors["b"].indices.tolist() == [0, 3]
    np.testing.assert_array_equal(update.tensors["b"].values, [3.0, 4.0])
    assert update.tensors["b"].encoding is Encoding.COORDINATES


def test_per_tensor_scope_keeps_budget_in_each_tensor() -> None:
    deltas = {"a": np.array([1.0, 2.0, 3.0, 4.0]), "b": np.array([0.1, 0.2, 0.3, 0.4])}
    update, _ = sparsify(deltas, TopKConfig(ratio=0.5, scope="per-tensor", error_feedback=False))
    assert update.tensors["a"].indices.tolist() == [2, 3]
    assert update.tensors["b"].indices.tolist() == [2, 3]
    update, _ = sparsify(deltas, TopKConfig(ratio=0.5, error_feedback=False))
    assert update.tensors["a"].indices.tolist() == [0, 1, 2, 3] and "b" not in update.tensors


def test_mega_elements_send_whole_rows_ranked_by_l1() -> None:
    emb = np.zeros((5, 3), np.float32)
    emb[1] = [1.0, 1.0, 1.0]  # L1 3
    emb[3] = [-4.0, 0.0, 0.0]  # L1 4, but its max |x| is what element top-k would see
    emb[4] = [0.0, 0.0, 2.9]  # L1 2.9
    update, residuals = sparsify({"emb": emb}, TopKConfig(ratio=0.4, groups=("emb",)))
    part = update.tensors["emb"]
    assert part.encoding is Encoding.ROWS
    assert part.indices.tolist() == [1, 3]
    np.testing.assert_array_equal(part.values, emb[[1, 3]])
    np.testing.assert_array_equal(residuals["emb"][[1, 3]], 0.0)
    np.testing.assert_array_equal(residuals["emb"][4], emb[4])


def test_integer_tensors_are_sent_dense_without_residual() -> None:
    update, residuals = sparsify(
        {"n": np.array(3, np.int64), "w": np.ones(10, np.float32)}, TopKConfig(ratio=0.1)
    )
    assert update.tensors["n"].encoding is Encoding.DENSE and "n" not in residuals


@given(
    rounds=st.integers(1, 6),
    size=st.integers(1, 50),
    ratio=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**16),
)
def test_error_feedback_preserves_the_sum_of_updates(
    rounds: int, size: int, ratio: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    config = TopKConfig(ratio=ratio)
    residuals: dict[str, np.ndarray] | None = None
    sent_total = np.zeros(size)
    delta_total = np.zeros(size)
    for _ in range(rounds):
        delta = rng.normal(size=size)
        delta_total += delta
        update, residuals = sparsify({"w": delta}, config, residuals)
        part = update.tensors.get("w")
        if part is not None:
            sent_total[part.indices] += part.values
            assert part.indices.size == min(size, int(np.ceil(ratio * size)))
    assert residuals is not None
    np.testing.assert_allclose(sent_total + residuals["w"], delta_total, atol=1e-9)


def test_without_error_feedback_nothing_is_carried() -> None:
    _, residuals = sparsify({"w": np.arange(5.0)}, TopKConfig(ratio=0.2, error_feedback=False))
    assert residuals == {}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "exactly one"),
        ({"ratio": 0.1, "count": 3}, "exactly one"),
        ({"ratio": 0.0}, "ratio"),
        ({"ratio": 1.5}, "ratio"),
        ({"count": 0}, "count"),
        ({"count": True}, "count"),
        ({"ratio": 0.1, "scope": "layer"}, "scope"),
    ],
)
def test_config_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        TopKConfig(**kwargs)


def test_bad_group_and_residual_shapes_raise() -> None:
    with pytest.raises(ConfigurationError, match="not a tensor"):
        sparsify({"w": np.ones(3)}, TopKConfig(ratio=0.5, groups=("emb",)))
    with pytest.raises(ConfigurationError, match="row axis"):
        sparsify({"w": np.ones(())}, TopKConfig(ratio=0.5, groups=("w",)))
    with pytest.raises(ConfigurationError, match="residual"):
        sparsify({"w": np.ones(3)}, TopKConfig(ratio=0.5), {"w": np.ones(4)})
