"""Count-weighted averaging: hand-built exact cases and a brute-force property test."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.submodel import Encoding, SubmodelUpdate, TensorUpdate, count_weighted_average


def coo(idx: list[int], vals: list[float], counts: list[float] | None = None) -> TensorUpdate:
    return TensorUpdate(
        Encoding.COORDINATES,
        np.asarray(vals, np.float32),
        np.asarray(idx, np.int64),
        None if counts is None else np.asarray(counts, np.float64),
    )


def test_hand_built_coordinates_one_many_and_none() -> None:
    w = {"w": np.array([10.0, 20.0, 30.0, 40.0], np.float32)}
    a = SubmodelUpdate({"w": coo([0, 1], [1.0, 2.0])}, weight=1.0)
    b = SubmodelUpdate({"w": coo([1, 2], [5.0, 6.0])}, weight=3.0)
    new, stats = count_weighted_average(w, [a, b])
    # idx0: only a -> +1; idx1: (1*2 + 3*5)/4 = 4.25; idx2: only b -> +6; idx3: none -> kept.
    np.testing.assert_array_equal(new["w"], np.array([11.0, 24.25, 36.0, 40.0], np.float32))
    assert stats.touched == {"w": 3} and stats.num_updates == 2


def test_hand_built_rows_with_counts_and_dense() -> None:
    w = {
        "emb": np.zeros((3, 2), np.float32),
        "fc": np.array([1.0, 1.0], np.float32),
    }
    a = SubmodelUpdate(
        {
            "emb": TensorUpdate(
                Encoding.ROWS, np.array([[1.0, 2.0]], np.float32), np.array([2]), np.array([1.0])
            ),
            "fc": TensorUpdate(Encoding.DENSE, np.array([2.0, 0.0], np.float32)),
        },
        weight=10.0,
    )
    b = SubmodelUpdate(
        {
            "emb": TensorUpdate(
                Encoding.ROWS,
                np.array([[3.0, 4.0], [5.0, 5.0]], np.float32),
                np.array([2, 0]),
                np.array([3.0, 2.0]),
            ),
        },
        weight=1.0,
    )
    new, _ = count_weighted_average(w, [a, b])
    # Row 2: counts 1 and 3 -> (1*[1,2] + 3*[3,4]) / 4 = [2.5, 3.5]; row 0: only b; row 1: none.
    np.testing.assert_array_equal(new["emb"], [[5.0, 5.0], [0.0, 0.0], [2.5, 3.5]])
    # fc: only a (dense, weight 10) -> +[2, 0].
    np.testing.assert_array_equal(new["fc"], [3.0, 1.0])


def test_no_updates_keeps_model_and_inputs_untouched() -> None:
    w = {"w": np.arange(4, dtype=np.float32)}
    new, stats = count_weighted_average(w, [])
    np.testing.assert_array_equal(new["w"], w["w"])
    assert new["w"] is not w["w"] and stats.touched == {"w": 0}


def test_integer_tensor_rounds_and_keeps_dtype() -> None:
    w = {"n": np.array(5, np.int64)}
    ups = [
        SubmodelUpdate({"n": TensorUpdate(Encoding.DENSE, np.array(2, np.int64))}, 1.0),
        SubmodelUpdate({"n": TensorUpdate(Encoding.DENSE, np.array(3, np.int64))}, 1.0),
    ]
    new, _ = count_weighted_average(w, ups)
    assert new["n"].dtype == np.int64 and int(new["n"]) == 8  # 5 + rint(2.5) (banker's: 2)


@st.composite
def client_updates(draw: st.DrawFn) -> tuple[int, list[SubmodelUpdate]]:
    size = draw(st.integers(1, 40))
    n = draw(st.integers(0, 6))
    ups = []
    for _ in range(n):
        idx = draw(st.lists(st.integers(0, size - 1), unique=True, max_size=size))
        vals = draw(st.lists(st.floats(-100, 100), min_size=len(idx), max_size=len(idx)))
        use_counts = draw(st.booleans())
        counts = (
            draw(st.lists(st.floats(0.5, 10), min_size=len(idx), max_size=len(idx)))
            if use_counts
            else None
        )
        weight = draw(st.floats(0.5, 100))
        ups.append(SubmodelUpdate({"w": coo(idx, vals, counts)}, weight))
    return size, ups


@given(client_updates())
def test_matches_per_coordinate_definition(case: tuple[int, list[SubmodelUpdate]]) -> None:
    size, ups = case
    w = np.linspace(-1, 1, size).astype(np.float32)
    new, _ = count_weighted_average({"w": w}, ups)
    expected = w.astype(np.float64).copy()
    for j in range(size):
        num = den = 0.0
        for u in ups:
            part = u.tensors["w"]
            hits = np.flatnonzero(part.indices == j)
            if hits.size:
                c = u.weight if part.counts is None else float(part.counts[hits[0]])
                num += c * float(part.values[hits[0]])
                den += c
        if den > 0:
            expected[j] += num / den
    np.testing.assert_allclose(new["w"], expected.astype(np.float32), rtol=1e-6, atol=1e-5)


def test_check_contribution_shares_float64s_range_among_the_round_s_clients() -> None:
    from flwr_fsl.core.errors import ClientInputError
    from flwr_fsl.submodel.aggregate import check_contribution

    def update(value: float, weight: float, counts: float | None = None) -> SubmodelUpdate:
        part = TensorUpdate(
            Encoding.COORDINATES,
            np.array([value]),
            np.array([0]),
            None if counts is None else np.array([counts]),
        )
        return SubmodelUpdate({"w": part}, weight)

    check_contribution(update(1e300, 1.0), 1e9, num_clients=10)  # 1e300 < 1e307 / 10
    with pytest.raises(ClientInputError, match="too large"):
        check_contribution(update(1e300, 1.0), 1e9, num_clients=10**8)
    with pytest.raises(ClientInputError, match="too large"):
        check_contribution(update(1e299, 1e9), 1e9, num_clients=2)
    with pytest.raises(ClientInputError, match="exceeds max_weight"):
        check_contribution(update(0.1, 1.0, counts=2e9), 1e9, num_clients=2)
