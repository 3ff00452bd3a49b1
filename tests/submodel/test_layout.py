"""Layouts and the one count-weighted apply, checked against hand-written per-coordinate loops.

Every expected value here is computed by an independent loop over coordinates (``np.ndindex``,
Python dictionaries), never by the functions under test.
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.families.ssa.protocol import SSAResult
from flwr_fsl.submodel import (
    ElementUpdate,
    Encoding,
    FlatLayout,
    Layout,
    RowLayout,
    SubmodelUpdate,
    TensorSlice,
    TensorUpdate,
    WidthLayout,
    accumulate,
    accumulate_elements,
    apply_count_weighted,
    count_weighted_average,
    count_weighted_mean,
)

# -- strategies -------------------------------------------------------------------------------

DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32]


@st.composite
def models(draw: st.DrawFn, min_tensors: int = 1) -> dict[str, np.ndarray]:
    n = draw(st.integers(min_tensors, 4))
    out: dict[str, np.ndarray] = {}
    for t in range(n):
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
        dtype = draw(st.sampled_from(DTYPES))
        seed = draw(st.integers(0, 2**32 - 1))
        values = np.random.default_rng(seed).uniform(-50, 50, size=shape)
        out[f"t{t}"] = np.asarray(values).astype(dtype)
    return out


@st.composite
def part_for(draw: st.DrawFn, shape: tuple[int, ...], dtype: np.dtype) -> TensorUpdate:
    encodings = [Encoding.DENSE, Encoding.COORDINATES] + ([Encoding.ROWS] if shape else [])
    encoding = draw(st.sampled_from(encodings))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if encoding is Encoding.DENSE:
        return TensorUpdate(encoding, rng.uniform(-5, 5, size=shape).astype(dtype))
    bound = math.prod(shape) if encoding is Encoding.COORDINATES else shape[0]
    k = draw(st.integers(0, bound))
    idx = rng.permutation(bound)[:k].astype(np.int64)  # unique, any order
    vshape = (k,) if encoding is Encoding.COORDINATES else (k, *shape[1:])
    values = rng.uniform(-5, 5, size=vshape).astype(dtype)
    counts = rng.uniform(0.5, 10, size=k) if draw(st.booleans()) else None
    return TensorUpdate(encoding, values, idx, counts)


@st.composite
def rounds(draw: st.DrawFn) -> tuple[dict[str, np.ndarray], list[SubmodelUpdate]]:
    model = draw(models())
    updates = []
    for _ in range(draw(st.integers(0, 5))):
        names = draw(st.lists(st.sampled_from(sorted(model)), unique=True))
        tensors = {n: draw(part_for(model[n].shape, model[n].dtype)) for n in names}
        updates.append(SubmodelUpdate(tensors, draw(st.floats(0.5, 100))))
    return model, updates


# -- independent oracles ----------------------------------------------------------------------


def coordinate_contributions(
    shape: tuple[int, ...], part: TensorUpdate, weight: float
) -> dict[tuple[int, ...], tuple[float, float]]:
    """Multi-index -> (value, weight) of one tensor part, by explicit loops."""
    out: dict[tuple[int, ...], tuple[float, float]] = {}
    if part.encoding is Encoding.DENSE:
        for pos in np.ndindex(*shape):
            out[pos] = (float(part.values[pos]), weight)
        return out
    assert part.indices is not None
    for i, j in enumerate(part.indices.tolist()):
        c = weight if part.counts is None else float(part.counts[i])
        if part.encoding is Encoding.COORDINATES:
            out[tuple(np.unravel_index(j, shape))] = (float(part.values[i]), c)
        else:
            for rest in np.ndindex(*shape[1:]):
                out[(j, *rest)] = (float(part.values[(i, *rest)]), c)
    return out


def naive_average(
    model: dict[str, np.ndarray], updates: list[SubmodelUpdate]
) -> dict[str, np.ndarray]:
    """Per coordinate: w + sum c*d / sum c over the clients holding it (float64 arithmetic)."""
    expected = {}
    for name, w in model.items():
        num: dict[tuple[int, ...], float] = {}
        den: dict[tuple[int, ...], float] = {}
        for u in updates:
            if name in u.tensors:
                for pos, (v, c) in coordinate_contributions(
                    w.shape, u.tensors[name], u.weight
                ).items():
                    num[pos] = num.get(pos, 0.0) + c * v
                    den[pos] = den.get(pos, 0.0) + c
        out = w.copy()
        for pos in np.ndindex(*w.shape):
            if den.get(pos, 0.0) > 0:
                new = float(w[pos]) + num[pos] / den[pos]
                out[pos] = np.rint(new) if np.issubdtype(w.dtype, np.integer) else new
        expected[name] = out
    return expected


# -- FlatLayout ---------------------------------------------------------------------------------


@given(models(), st.booleans())
def test_flat_flatten_unflatten_round_trip(model: dict[str, np.ndarray], ints: bool) -> None:
    layout = FlatLayout.of(model, include_integer=ints)
    kept = [
        n
        for n, a in model.items()
        if np.issubdtype(a.dtype, np.floating) or (ints and np.issubdtype(a.dtype, np.integer))
    ]
    assert list(layout.names) == kept
    assert layout.size == sum(model[n].size for n in kept) and layout.width == 1
    flat = layout.flatten(model)
    expected = [float(model[n][pos]) for n in kept for pos in np.ndindex(*model[n].shape)]
    np.testing.assert_array_equal(flat, np.asarray(expected))
    back = layout.unflatten(flat, model)
    for name, value in model.items():
        assert back[name].dtype == value.dtype and back[name] is not value
        np.testing.assert_array_equal(back[name], value)
    np.testing.assert_array_equal(layout.gather(model)[:, 0], flat)


@given(models(), st.integers(0, 2**32 - 1))
def test_flat_gather_and_write_at_indices(model: dict[str, np.ndarray], seed: int) -> None:
    layout = FlatLayout.of(model, include_integer=True)
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.permutation(layout.size)[: rng.integers(0, layout.size + 1)])
    got = layout.gather(model, idx)[:, 0]
    flat = np.concatenate([model[n].astype(np.float64).reshape(-1) for n in layout.names] or [[]])
    np.testing.assert_array_equal(got, flat[idx])
    values = rng.uniform(-9, 9, size=(idx.size, 1))
    new = layout.write(model, idx, values)
    # Independent: walk every tensor's coordinates, numbering them by hand.
    written = dict(zip(idx.tolist(), values[:, 0].tolist(), strict=True))
    j = 0
    for name in layout.names:
        for pos in np.ndindex(*model[name].shape):
            want = model[name][pos]
            if j in written:
                v = written[j]
                want = np.rint(v) if np.issubdtype(model[name].dtype, np.integer) else v
                want = np.asarray(want).astype(model[name].dtype)
            assert new[name][pos] == want
            j += 1
    for name in model:
        assert new[name] is not model[name] and new[name].dtype == model[name].dtype


@given(rounds())
def test_flat_elements_match_coordinate_loop(case: tuple) -> None:
    model, updates = case
    layout = FlatLayout.of(model, include_integer=True)
    offsets = dict(zip(layout.names, layout.offsets, strict=False))
    for u in updates:
        e = layout.elements(u)
        expected = {}
        for name, part in u.tensors.items():
            shape = model[name].shape
            for pos, vc in coordinate_contributions(shape, part, u.weight).items():
                flat = offsets[name] + (int(np.ravel_multi_index(pos, shape)) if shape else 0)
                expected[flat] = vc
        assert e.indices.tolist() == sorted(expected)
        np.testing.assert_array_equal(e.values[:, 0], [expected[j][0] for j in sorted(expected)])
        np.testing.assert_array_equal(e.counts, [expected[j][1] for j in sorted(expected)])


def test_flat_layout_skips_integer_buffers_and_flatten_update_keeps_its_contract() -> None:
    model = {"w": np.zeros((2, 3), np.float32), "n": np.array(4, np.int64)}
    layout = FlatLayout.of(model)
    assert layout.names == ("w",) and layout.size == 6
    up = SubmodelUpdate(
        {
            "w": TensorUpdate(
                Encoding.COORDINATES, np.array([1.0, 2.0], np.float32), np.array([5, 1])
            ),
            "n": TensorUpdate(Encoding.DENSE, np.array(1, np.int64)),
        }
    )
    idx, vals = layout.flatten_update(up)
    np.testing.assert_array_equal(idx, [1, 5])
    np.testing.assert_array_equal(vals, [2.0, 1.0])
    rows = SubmodelUpdate(
        {"w": TensorUpdate(Encoding.ROWS, np.ones((1, 3), np.float32), np.array([0]))}
    )
    with pytest.raises(ConfigurationError, match="row layout"):
        layout.flatten_update(rows)
    # The generic element map expands a row into its coordinates, each with the row's weight.
    e = layout.elements(rows)
    assert e.indices.tolist() == [0, 1, 2] and e.counts.tolist() == [1.0, 1.0, 1.0]
    foreign = SubmodelUpdate({"x": TensorUpdate(Encoding.DENSE, np.zeros(2, np.float32))})
    with pytest.raises(ConfigurationError, match="not a floating tensor"):
        layout.elements(foreign)
    assert layout.offset("w") == 0
    with pytest.raises(ConfigurationError, match="not a tensor"):
        layout.offset("n")


# -- error paths of the element map (client input) ----------------------------------------------

W = {"w": np.zeros((3, 2), np.float32), "s": np.array(0.0, np.float32)}


@pytest.mark.parametrize(
    ("part", "match"),
    [
        (TensorUpdate(Encoding.DENSE, np.zeros(6, np.float32)), "dense values have shape"),
        (
            TensorUpdate(Encoding.DENSE, np.zeros((3, 2), np.float32), np.arange(6)),
            "dense part carries",
        ),
        (TensorUpdate(Encoding.COORDINATES, np.zeros(2, np.float32)), "without indices"),
        (
            TensorUpdate(Encoding.COORDINATES, np.zeros(2, np.float32), np.array([[0, 1]])),
            "1-D integer",
        ),
        (
            TensorUpdate(Encoding.COORDINATES, np.zeros(2, np.float32), np.array([0.0, 1.0])),
            "1-D integer",
        ),
        (
            TensorUpdate(Encoding.COORDINATES, np.zeros(3, np.float32), np.array([0, 1])),
            "3 values for 2 indices",
        ),
        (
            TensorUpdate(Encoding.COORDINATES, np.zeros(2, np.float32), np.array([0, 6])),
            "out of range",
        ),
        (
            TensorUpdate(Encoding.COORDINATES, np.zeros(2, np.float32), np.array([-1, 0])),
            "out of range",
        ),
        (
            TensorUpdate(Encoding.COORDINATES, np.zeros(2, np.float32), np.array([2, 2])),
            "more than once",
        ),
        (
            TensorUpdate(
                Encoding.COORDINATES, np.zeros(2, np.float32), np.array([0, 1]), np.array([1.0])
            ),
            "1 counts for 2 indices",
        ),
        (
            TensorUpdate(
                Encoding.COORDINATES,
                np.zeros(2, np.float32),
                np.array([0, 1]),
                np.array([1.0, 0.0]),
            ),
            "finite and > 0",
        ),
        (
            TensorUpdate(
                Encoding.COORDINATES,
                np.zeros(2, np.float32),
                np.array([0, 1]),
                np.array([1.0, np.nan]),
            ),
            "finite and > 0",
        ),
        (TensorUpdate(Encoding.ROWS, np.zeros((1, 3), np.float32), np.array([0])), "rows values"),
        (TensorUpdate(Encoding.ROWS, np.zeros((1, 2), np.float32), np.array([3])), "out of range"),
    ],
)
def test_flat_elements_reject_malformed_parts(part: TensorUpdate, match: str) -> None:
    layout = FlatLayout.of(W)
    with pytest.raises(ClientInputError, match=match):
        layout.elements(SubmodelUpdate({"w": part}))


def test_rows_on_a_scalar_and_bad_weights_are_client_errors() -> None:
    layout = FlatLayout.of(W)
    scalar_rows = TensorUpdate(Encoding.ROWS, np.zeros((1,), np.float32), np.array([0]))
    with pytest.raises(ClientInputError, match="row axis"):
        layout.elements(SubmodelUpdate({"s": scalar_rows}))
    dense = TensorUpdate(Encoding.DENSE, np.zeros((3, 2), np.float32))
    for weight in (0.0, -1.0, float("nan"), float("inf"), True, "3"):
        with pytest.raises(ClientInputError, match="weight"):
            layout.elements(SubmodelUpdate({"w": dense}, weight))  # type: ignore[arg-type]
    # numpy scalars are fine
    assert layout.elements(SubmodelUpdate({"w": dense}, np.float32(2.0))).counts[0] == 2.0  # type: ignore[arg-type]


def test_element_update_guards_its_invariants() -> None:
    with pytest.raises(ConfigurationError, match="values must be"):
        ElementUpdate(np.zeros(1), np.ones(1), np.zeros(1, np.int64))
    with pytest.raises(ConfigurationError, match="counts must"):
        ElementUpdate(np.zeros((2, 1)), np.ones(3))
    with pytest.raises(ConfigurationError, match="indices must have shape"):
        ElementUpdate(np.zeros((1, 1)), np.ones(1), np.zeros(2, np.int64))
    with pytest.raises(ConfigurationError, match="indices must have shape"):
        ElementUpdate(np.zeros((1, 1)), np.ones(1), np.zeros((1, 1), np.int64))
    with pytest.raises(ConfigurationError, match="ascending"):
        ElementUpdate(np.zeros((2, 1)), np.ones(2), np.array([1, 0]))
    with pytest.raises(ConfigurationError, match="ascending"):
        ElementUpdate(np.zeros((2, 1)), np.ones(2), np.array([-1, 0]))
    with pytest.raises(ConfigurationError, match="cannot start"):
        ElementUpdate(np.zeros((2, 1)), np.ones(2), None, -1)
    listed = ElementUpdate(np.zeros((2, 4)), np.ones(2), np.array([0, 3]))
    assert listed.width == 4 and listed.last == 3 and listed.where is listed.index_array
    run = ElementUpdate(np.zeros((3, 1)), np.ones(3), None, 5)
    assert run.indices.tolist() == [5, 6, 7] and run.last == 7 and run.where == slice(5, 8)
    assert ElementUpdate(np.zeros((0, 1)), np.ones(0), None, 2).last == -1


def test_dense_parts_become_one_run_and_mixed_parts_an_index_array() -> None:
    model = {"a": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    layout = FlatLayout.of(model)
    dense = {n: TensorUpdate(Encoding.DENSE, np.ones_like(v)) for n, v in model.items()}
    e = layout.elements(SubmodelUpdate(dense, 2.0))
    assert e.index_array is None and e.start == 0 and e.indices.tolist() == list(range(7))
    only_b = layout.elements(SubmodelUpdate({"b": dense["b"]}, 2.0))
    assert only_b.index_array is None and only_b.start == 4
    coo = TensorUpdate(Encoding.COORDINATES, np.ones(1, np.float32), np.array([3]), np.array([5.0]))
    mixed = layout.elements(SubmodelUpdate({"a": coo, "b": dense["b"]}, 2.0))
    assert mixed.indices.tolist() == [3, 4, 5, 6] and mixed.counts.tolist() == [5, 2, 2, 2]
    # Whole tensors of a width slice are runs too; sliced ones are listed.
    width = WidthLayout.of(model, {"a": TensorSlice([1])})
    sub = width.extract(model)
    e = width.elements(
        SubmodelUpdate({n: TensorUpdate(Encoding.DENSE, np.ones_like(v)) for n, v in sub.items()})
    )
    assert e.indices.tolist() == [2, 3, 4, 5, 6]


def test_gather_and_write_reject_bad_element_indices() -> None:
    layout = FlatLayout.of(W)
    for bad in (
        np.array([1, 0]),
        np.array([0, 0]),
        np.array([7]),
        np.array([-1]),
        np.zeros((1, 1)),
    ):
        with pytest.raises(ConfigurationError, match="element indices"):
            layout.gather(W, bad)
        with pytest.raises(ConfigurationError, match="element indices"):
            layout.write(W, bad, np.zeros((bad.shape[0], 1)))
    with pytest.raises(ConfigurationError, match="values must have shape"):
        layout.write(W, np.array([0, 1]), np.zeros(2))


# -- RowLayout ----------------------------------------------------------------------------------


@given(
    st.integers(1, 12),
    st.integers(1, 5),
    st.integers(0, 2**32 - 1),
    st.sampled_from([np.float32, np.float64]),
)
def test_row_extract_scatter_round_trip(rows: int, width: int, seed: int, dtype: type) -> None:
    rng = np.random.default_rng(seed)
    model = {"emb": rng.normal(size=(rows, width)).astype(dtype), "b": np.ones(3, np.float32)}
    layout = RowLayout.of(model, "emb")
    assert (layout.size, layout.width) == (rows, width)
    chosen = rng.permutation(rows)[: rng.integers(1, rows + 1)]
    sub = layout.extract(model, chosen)
    for i, r in enumerate(chosen.tolist()):  # the client's rows, in the client's order
        np.testing.assert_array_equal(sub[i], model["emb"][r])
    idx, vals = layout.scatter(chosen, sub)
    assert idx.tolist() == sorted(chosen.tolist())
    np.testing.assert_array_equal(vals, model["emb"][np.sort(chosen)].astype(np.float64))
    blank = {"emb": np.zeros_like(model["emb"]), "b": model["b"]}
    back = layout.write(blank, idx, vals)
    for r in range(rows):
        want = model["emb"][r] if r in set(chosen.tolist()) else np.zeros(width, dtype)
        np.testing.assert_array_equal(back["emb"][r], want)
    np.testing.assert_array_equal(layout.gather(back, idx), vals)
    np.testing.assert_array_equal(layout.gather(model), model["emb"].astype(np.float64))


def test_row_elements_rows_dense_and_errors() -> None:
    model = {"emb": np.zeros((4, 2), np.float32), "fc": np.zeros(3, np.float32)}
    layout = RowLayout.of(model, "emb")
    up = SubmodelUpdate(
        {
            "emb": TensorUpdate(
                Encoding.ROWS,
                np.array([[1.0, 2.0], [3.0, 4.0]], np.float32),
                np.array([3, 1]),
                np.array([2.0, 5.0]),
            )
        },
        weight=7.0,
    )
    e = layout.elements(up)
    assert e.indices.tolist() == [1, 3] and e.counts.tolist() == [5.0, 2.0]
    np.testing.assert_array_equal(e.values, [[3.0, 4.0], [1.0, 2.0]])
    dense = layout.elements(
        SubmodelUpdate({"emb": TensorUpdate(Encoding.DENSE, np.ones((4, 2), np.float32))}, 3.0)
    )
    assert dense.indices.tolist() == [0, 1, 2, 3] and dense.counts.tolist() == [3.0] * 4
    assert layout.elements(SubmodelUpdate({})).indices.size == 0
    with pytest.raises(ConfigurationError, match="covers only"):
        layout.elements(
            SubmodelUpdate({"fc": TensorUpdate(Encoding.DENSE, np.zeros(3, np.float32))})
        )
    coo = TensorUpdate(Encoding.COORDINATES, np.zeros(1, np.float32), np.array([0]))
    with pytest.raises(ConfigurationError, match="flat layout"):
        layout.elements(SubmodelUpdate({"emb": coo}))
    dup = TensorUpdate(Encoding.ROWS, np.zeros((2, 2), np.float32), np.array([1, 1]))
    with pytest.raises(ClientInputError, match="more than once"):
        layout.elements(SubmodelUpdate({"emb": dup}))


def test_row_layout_errors() -> None:
    model = {"emb": np.zeros((4, 2), np.float32), "v": np.zeros(3, np.float32)}
    with pytest.raises(ConfigurationError, match="no tensor"):
        RowLayout.of(model, "nope")
    with pytest.raises(ConfigurationError, match="2-D table"):
        RowLayout.of(model, "v")
    with pytest.raises(ConfigurationError, match="2-D shape"):
        RowLayout("emb", (0, 2))
    layout = RowLayout.of(model, "emb")
    for rows, match in [
        ([1, 1], "duplicate"),
        ([4], "out of range"),
        ([-1], "out of range"),
        ([], "at least one"),
        ([0.5], "integer"),
        ([[0]], "integer"),
    ]:
        with pytest.raises(ClientInputError, match=match):
            layout.extract(model, rows)
        with pytest.raises(ClientInputError, match=match):
            layout.scatter(rows, np.zeros((1, 2)))
    with pytest.raises(ClientInputError, match="values have shape"):
        layout.scatter([0, 1], np.zeros((2, 3)))
    with pytest.raises(ClientInputError, match="NaN"):
        layout.scatter([0], np.array([[np.nan, 0.0]]))
    wrong = {"emb": np.zeros((5, 2), np.float32)}
    with pytest.raises(ConfigurationError, match="has shape"):
        layout.gather(wrong)
    with pytest.raises(ConfigurationError, match="has shape"):
        layout.write(wrong, np.array([0]), np.zeros((1, 2)))
    with pytest.raises(ConfigurationError, match="values must have shape"):
        layout.write(model, np.array([0]), np.zeros((1, 3)))


# -- WidthLayout --------------------------------------------------------------------------------


def width_model(seed: int) -> dict[str, np.ndarray]:
    """An MLP and a conv layer: in 5 -> 8 -> 8 -> 3 plus conv (8, 2, 3, 3), BN counter."""
    rng = np.random.default_rng(seed)
    return {
        "conv.weight": rng.normal(size=(8, 2, 3, 3)).astype(np.float32),
        "conv.bias": rng.normal(size=8).astype(np.float32),
        "bn.num_batches_tracked": np.array(7, np.int64),
        "fc1.weight": rng.normal(size=(8, 5)).astype(np.float32),
        "fc1.bias": rng.normal(size=8).astype(np.float32),
        "fc2.weight": rng.normal(size=(8, 8)).astype(np.float32),
        "fc2.bias": rng.normal(size=8).astype(np.float32),
        "out.weight": rng.normal(size=(3, 8)).astype(np.float32),
        "out.bias": rng.normal(size=3).astype(np.float32),
    }


def hidden_slices(
    h1: np.ndarray | None, h2: np.ndarray | None, conv: np.ndarray | None
) -> dict[str, TensorSlice]:
    """Input and output layers whole; hidden layers narrowed, inputs follow the previous layer."""
    return {
        "conv.weight": TensorSlice(out_idx=conv),
        "conv.bias": TensorSlice(out_idx=conv),
        "fc1.weight": TensorSlice(out_idx=h1),
        "fc1.bias": TensorSlice(out_idx=h1),
        "fc2.weight": TensorSlice(out_idx=h2, in_idx=h1),
        "fc2.bias": TensorSlice(out_idx=h2),
        "out.weight": TensorSlice(in_idx=h2),
    }


def rule_indices(
    rule: str, k_global: int, rate: float, rnd: int, rng: np.random.Generator
) -> np.ndarray:
    """HeteroFL static prefix, FedRolex rolling window (wraps), FedRolex random."""
    k = math.ceil(k_global * rate)
    if rule == "static":
        return np.arange(k)
    if rule == "rolling":
        return np.roll(np.arange(k_global), rnd % k_global)[:k]
    return rng.permutation(k_global)[:k]


def held_by(
    layout_slices: dict[str, TensorSlice], name: str, pos: tuple[int, ...]
) -> tuple[int, ...] | None:
    """Where global coordinate ``pos`` sits in a client's sub-tensor, or None if not held."""
    spec = layout_slices.get(name, TensorSlice())
    sub = list(pos)
    for axis, idx in ((0, spec.out_idx), (1, spec.in_idx)):
        if idx is None:
            continue
        where = np.flatnonzero(np.asarray(idx) == pos[axis])
        if where.size == 0:
            return None
        sub[axis] = int(where[0])
    return tuple(sub)


@pytest.mark.parametrize("rule", ["static", "rolling", "random"])
@pytest.mark.parametrize("rnd", [0, 3, 13])
def test_heterofl_fedrolex_average_over_holders(rule: str, rnd: int) -> None:
    """Rates 1, 1/2, 1/4: each coordinate is the mean of the weights of the clients holding it."""
    global_model = width_model(rnd)
    rng = np.random.default_rng(100 + rnd)
    rates = [1.0, 0.5, 0.5, 0.25, 0.25]
    clients = []
    for rate in rates:
        h1 = rule_indices(rule, 8, rate, rnd, rng)
        h2 = rule_indices(rule, 8, rate, rnd + 1, rng)
        conv = rule_indices(rule, 8, rate, rnd + 2, rng)
        slices = hidden_slices(h1, h2, conv)
        layout = WidthLayout.of(global_model, slices, include_integer=True)
        sub = layout.extract(global_model)
        # Training: every float coordinate moves; the counter counts a batch.
        trained = {
            n: (v + rng.normal(size=v.shape).astype(v.dtype)) if v.dtype != np.int64 else v + 1
            for n, v in sub.items()
        }
        clients.append((slices, layout, trained))
    if rule == "rolling" and rnd == 3:  # the window wraps: index sets are not sorted
        assert np.asarray(clients[1][0]["fc1.weight"].out_idx).tolist() == [5, 6, 7, 0]
        assert np.asarray(clients[3][0]["fc2.weight"].out_idx).tolist() == [4, 5]

    # The oracle: a loop over global coordinates, asking each client whether it holds it.
    expected = {}
    for name, w in global_model.items():
        out = w.copy()
        for pos in np.ndindex(*w.shape):
            held = [t[name][s] for sl, _, t in clients if (s := held_by(sl, name, pos)) is not None]
            if held:
                mean = np.mean(np.asarray(held, np.float64))
                out[pos] = np.rint(mean) if w.dtype == np.int64 else mean
        expected[name] = out

    # Path 1: weights -> deltas against the global -> count-weighted apply.
    base = clients[0][1]
    sums, counts = accumulate_elements(
        base.size, 1, (lay.elements(lay.delta(global_model, t, 1.0)) for _, lay, t in clients)
    )
    via_deltas = apply_count_weighted(global_model, base, sums, counts)
    # Path 2: scatter the weights themselves and take their mean over holders.
    wsum, wcount = np.zeros((base.size, 1)), np.zeros(base.size)
    for _, lay, t in clients:
        idx, vals = lay.scatter(t)
        wsum[idx, 0] += vals
        wcount[idx] += 1
    touched = wcount > 0
    direct = base.gather(global_model)
    direct[touched] = wsum[touched] / wcount[touched, None]
    via_weights = base.write(global_model, np.flatnonzero(touched), direct[touched])
    for name, want in expected.items():
        assert via_deltas[name].dtype == want.dtype
        np.testing.assert_allclose(via_deltas[name], want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(via_weights[name], want, rtol=1e-6, atol=1e-6)
    # Every client held the whole input and output layers: output bias is the 5-client mean.
    assert counts[base.base.offset("out.bias")] == len(rates)


@given(st.integers(0, 2**32 - 1))
def test_width_extract_scatter_round_trip(seed: int) -> None:
    rng = np.random.default_rng(seed)
    model = width_model(seed % 1000)
    pick = lambda k: rng.permutation(k)[: rng.integers(1, k + 1)]  # noqa: E731
    slices = hidden_slices(pick(8), pick(8), pick(8))
    layout = WidthLayout.of(model, slices)
    sub = layout.extract(model)
    # extract == hand loop over the sub-tensor's coordinates.
    for name, w in model.items():
        assert sub[name].shape == layout.sub_shape(name) and sub[name].dtype == w.dtype
        spec = slices.get(name, TensorSlice())
        for spos in np.ndindex(*sub[name].shape):
            gpos = list(spos)
            if spec.out_idx is not None:
                gpos[0] = int(np.asarray(spec.out_idx)[spos[0]])
            if spec.in_idx is not None:
                gpos[1] = int(np.asarray(spec.in_idx)[spos[1]])
            assert sub[name][spos] == w[tuple(gpos)]
    assert sub["bn.num_batches_tracked"] == model["bn.num_batches_tracked"]
    idx, vals = layout.scatter(sub)
    assert idx.size == layout.sub_size and np.all(np.diff(idx) > 0)
    np.testing.assert_array_equal(vals, layout.base.flatten(model)[idx])
    # Scatter onto a blank global, extract again: the same submodel; the rest stays blank.
    blank = {n: np.zeros_like(v) for n, v in model.items()}
    filled = layout.write(blank, idx, vals[:, None])
    again = layout.extract(filled)
    for name in layout.base.names:
        np.testing.assert_array_equal(again[name], sub[name])
    assert np.count_nonzero(layout.base.flatten(filled)) == np.count_nonzero(vals)
    # A dense sub-update maps to the same coordinates with the client's weight.
    up = SubmodelUpdate(
        {n: TensorUpdate(Encoding.DENSE, sub[n]) for n in layout.base.names}, weight=4.0
    )
    e = layout.elements(up)
    np.testing.assert_array_equal(e.indices, idx)
    np.testing.assert_array_equal(e.values[:, 0], vals)
    assert np.all(e.counts == 4.0)


@given(st.data())
def test_width_elements_match_hand_mapping(data: st.DataObject) -> None:
    """Random (dense / coordinate / row) updates in sub coordinates, sliced or whole tensors."""
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    model = width_model(seed % 1000)

    def pick(k: int) -> np.ndarray | None:
        return None if data.draw(st.booleans()) else rng.permutation(k)[: rng.integers(1, k + 1)]

    h1, h2, conv = pick(8), pick(8), pick(8)
    slices = hidden_slices(h1, h2, conv)  # None: that layer kept whole
    layout = WidthLayout.of(model, slices, include_integer=True)
    names = data.draw(st.lists(st.sampled_from(sorted(model)), unique=True))
    sub_shapes = layout.sub_shapes
    tensors = {n: data.draw(part_for(sub_shapes[n], model[n].dtype)) for n in names}
    update = SubmodelUpdate(tensors, data.draw(st.floats(0.5, 10)))
    e = layout.elements(update)
    offset, offsets = 0, {}
    for name, w in model.items():  # every tensor is in the space (integer buffers included)
        offsets[name] = offset
        offset += w.size
    expected = {}
    for name, part in tensors.items():
        spec = slices.get(name, TensorSlice())
        for spos, vc in coordinate_contributions(sub_shapes[name], part, update.weight).items():
            gpos = list(spos)
            if spec.out_idx is not None:
                gpos[0] = int(np.asarray(spec.out_idx)[spos[0]])
            if spec.in_idx is not None:
                gpos[1] = int(np.asarray(spec.in_idx)[spos[1]])
            shape = model[name].shape
            flat = int(np.ravel_multi_index(tuple(gpos), shape)) if shape else 0
            expected[offsets[name] + flat] = vc
    assert e.indices.tolist() == sorted(expected)
    np.testing.assert_array_equal(e.values[:, 0], [expected[j][0] for j in sorted(expected)])
    np.testing.assert_array_equal(e.counts, [expected[j][1] for j in sorted(expected)])


def test_width_coordinate_and_row_updates_land_on_global_coordinates() -> None:
    model = {"w": np.arange(20, dtype=np.float32).reshape(4, 5), "b": np.zeros(4, np.float32)}
    layout = WidthLayout.of(model, {"w": TensorSlice([3, 1], [4, 0, 2]), "b": TensorSlice([3, 1])})
    assert layout.sub_shapes == {"w": (2, 3), "b": (2,)}
    np.testing.assert_array_equal(layout.extract(model)["w"], [[19, 15, 17], [9, 5, 7]])
    np.testing.assert_array_equal(layout.positions("w"), [19, 15, 17, 9, 5, 7])
    # Sub coordinate 4 = sub (1, 1) = global (1, 0) = flat 5; rows: sub row 0 = global row 3.
    coo = TensorUpdate(
        Encoding.COORDINATES, np.array([2.0], np.float32), np.array([4]), np.array([3.0])
    )
    rows = TensorUpdate(Encoding.ROWS, np.array([7.0], np.float32), np.array([0]))
    e = layout.elements(SubmodelUpdate({"w": coo, "b": rows}, weight=2.0))
    assert e.indices.tolist() == [5, 20 + 3] and e.counts.tolist() == [3.0, 2.0]
    np.testing.assert_array_equal(e.values[:, 0], [2.0, 7.0])
    bad = TensorUpdate(Encoding.COORDINATES, np.zeros(1, np.float32), np.array([6]))
    with pytest.raises(ClientInputError, match="out of range"):
        layout.elements(SubmodelUpdate({"w": bad}))
    with pytest.raises(ConfigurationError, match="not a floating tensor"):
        layout.elements(SubmodelUpdate({"x": TensorUpdate(Encoding.DENSE, np.zeros(1))}))


def test_width_full_slices_equal_fedavg() -> None:
    """Every client at rate 1 sending weights with sample counts: exactly FedAvg."""
    model = width_model(5)
    rng = np.random.default_rng(5)
    layout = WidthLayout.of(model, {})
    trained = [
        {n: v + rng.normal(size=v.shape).astype(v.dtype) for n, v in model.items()}
        for _ in range(4)
    ]
    sizes = [10.0, 20.0, 30.0, 40.0]
    sums, counts = accumulate(
        layout, [layout.delta(model, t, n) for t, n in zip(trained, sizes, strict=True)]
    )
    new = apply_count_weighted(model, layout, sums, counts)
    for name in layout.base.names:
        fedavg = (
            sum(n * t[name].astype(np.float64) for t, n in zip(trained, sizes, strict=True)) / 100
        )
        np.testing.assert_allclose(new[name], fedavg, rtol=1e-6, atol=1e-6)
    assert new["bn.num_batches_tracked"] == model["bn.num_batches_tracked"]  # not in the space


@pytest.mark.parametrize("from_client", [False, True])
def test_width_layout_rejects_bad_index_sets(from_client: bool) -> None:
    model = {
        "w": np.zeros((4, 3), np.float32),
        "b": np.zeros(4, np.float32),
        "s": np.zeros((), np.float32),
    }
    kind = ClientInputError if from_client else ValueError
    cases = [
        ({"x": TensorSlice([0])}, "not a tensor"),
        ({"w": ([0], None)}, "TensorSlice"),
        ({"s": TensorSlice([0])}, "no output axis"),
        ({"b": TensorSlice(None, [0])}, "no input axis"),
        ({"w": TensorSlice([4])}, "out of range"),
        ({"w": TensorSlice([-1])}, "out of range"),
        ({"w": TensorSlice(None, [3])}, "out of range"),
        ({"w": TensorSlice([1, 1])}, "duplicate"),
        ({"w": TensorSlice([])}, "at least one"),
        ({"w": TensorSlice([0.0])}, "integer"),
        ({"w": TensorSlice([[0]])}, "integer"),
    ]
    for slices, match in cases:
        with pytest.raises(kind, match=match) as info:
            WidthLayout.of(model, slices, from_client=from_client)  # type: ignore[arg-type]
        assert isinstance(info.value, ClientInputError) == from_client


def test_width_scatter_and_delta_reject_bad_submodels() -> None:
    model = {"w": np.zeros((4, 3), np.float32), "n": np.array(0, np.int64)}
    layout = WidthLayout.of(model, {"w": TensorSlice([0, 2])})
    good = layout.extract(model)
    for sub, match in [
        ({"w": np.zeros((4, 3), np.float32)}, "submodel shape"),
        ({}, "lacks tensor"),
        ({**good, "zz": np.zeros(1)}, "unknown tensors"),
        ({"w": np.full((2, 3), np.inf, np.float32)}, "NaN or inf"),
    ]:
        with pytest.raises(ClientInputError, match=match):
            layout.scatter(sub)
        with pytest.raises(ClientInputError, match=match):
            layout.delta(model, sub)
    with pytest.raises(ConfigurationError, match="global model's shape"):
        layout.extract({"w": np.zeros((5, 3), np.float32), "n": model["n"]})
    # The integer buffer is outside a float-only space: ignored by scatter and delta.
    assert set(layout.delta(model, {"w": good["w"]}).tensors) == {"w"}


# -- the one count-weighted apply -----------------------------------------------------------------


@given(rounds())
def test_count_weighted_average_matches_naive_loop(case: tuple) -> None:
    model, updates = case
    new, stats = count_weighted_average(model, updates)
    expected = naive_average(model, updates)
    for name, want in expected.items():
        assert new[name].dtype == model[name].dtype and new[name] is not model[name]
        np.testing.assert_array_equal(new[name], want)
    assert stats.num_updates == len(updates)
    # Same through the two public halves.
    layout = FlatLayout.of(model, include_integer=True)
    sums, counts = accumulate(layout, updates)
    again = apply_count_weighted(model, layout, sums, counts)
    for name, want in expected.items():
        np.testing.assert_array_equal(again[name], want)


@given(st.integers(1, 10), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_apply_on_given_sums_and_counts_matches_loop(rows: int, width: int, seed: int) -> None:
    """Reconstructed sums/counts (as SSA hands them over): zero and negative counts untouched."""
    rng = np.random.default_rng(seed)
    model = {"emb": rng.normal(size=(rows, width)).astype(np.float32), "k": np.arange(3)}
    sums = rng.normal(size=(rows, width)) * 10
    counts = rng.choice([0.0, -1.0, 1.0, 2.5, 7.0], size=rows)
    new = apply_count_weighted(model, RowLayout.of(model, "emb"), sums, counts)
    for r in range(rows):
        for c in range(width):
            want = model["emb"][r, c]
            if counts[r] > 0:
                want = np.float32(float(want) + sums[r, c] / counts[r])
            assert new["emb"][r, c] == want
    np.testing.assert_array_equal(new["k"], model["k"])
    step = count_weighted_mean(sums, counts)
    for r in range(rows):
        np.testing.assert_array_equal(step[r], sums[r] / counts[r] if counts[r] > 0 else 0.0)


def test_write_and_gather_on_fortran_ordered_tensors() -> None:
    model = {"w": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))}
    layout = FlatLayout.of(model)
    np.testing.assert_array_equal(layout.gather(model, np.array([1, 3]))[:, 0], [1.0, 3.0])
    new = layout.write(model, np.array([1, 3]), np.array([[10.0], [30.0]]))
    np.testing.assert_array_equal(new["w"], [[0, 10, 2], [30, 4, 5]])


def test_single_holder_and_untouched_integer_buffer() -> None:
    model = {"w": np.array([1.0, 2.0, 3.0], np.float32), "n": np.array([10, 20], np.int64)}
    up = SubmodelUpdate(
        {
            "w": TensorUpdate(Encoding.COORDINATES, np.array([0.5], np.float32), np.array([1])),
            "n": TensorUpdate(Encoding.COORDINATES, np.array([3], np.int64), np.array([0])),
        },
        weight=9.0,
    )
    new, stats = count_weighted_average(model, [up])
    np.testing.assert_array_equal(new["w"], [1.0, 2.5, 3.0])
    np.testing.assert_array_equal(new["n"], [13, 20])
    assert stats.touched == {"w": 1, "n": 1}
    with pytest.raises(KeyError):
        count_weighted_average(model, [SubmodelUpdate({"x": up.tensors["w"]})])


def test_ssa_result_average_and_the_strategies_apply() -> None:
    """The replacement for the strategies' ``flatten + average`` and ``table + average``."""
    rng = np.random.default_rng(3)
    model = {
        "a": rng.normal(size=(3, 2)).astype(np.float32),
        "n": np.array(2),
        "b": np.ones(4, np.float32),
    }
    flat = FlatLayout.of(model)
    sums = rng.normal(size=(flat.size, 1))
    counts = rng.choice([0.0, 1.0, 3.0], size=flat.size)
    result = SSAResult(sums, counts)
    np.testing.assert_array_equal(result.average(), count_weighted_mean(sums, counts))
    old = flat.unflatten(flat.flatten(model) + result.average()[:, 0], model)
    new = apply_count_weighted(model, flat, result.sums, result.counts)
    for name in model:
        np.testing.assert_array_equal(new[name], old[name])
    table = {"emb": rng.normal(size=(5, 3)).astype(np.float32), "fc": np.zeros(2, np.float32)}
    rows = RowLayout.of(table, "emb")
    result = SSAResult(rng.normal(size=(5, 3)), rng.choice([0.0, 2.0], size=5))
    old_table = (table["emb"].astype(np.float64) + result.average()).astype(np.float32)
    new_rows = apply_count_weighted(table, rows, result.sums, result.counts)
    np.testing.assert_array_equal(new_rows["emb"], old_table)
    np.testing.assert_array_equal(new_rows["fc"], table["fc"])
    with pytest.raises(ConfigurationError, match="count-weighted"):
        SSAResult(sums, None).average()


def test_apply_finite_checks_the_updated_elements() -> None:
    # finite=True fails on a non-finite model element or a float64 overflow it touches; an
    # untouched non-finite element, or finite=False (the default), leaves it to the caller.
    model = {"w": np.array([np.nan, 1.0, 1e308]), "n": np.array([2, 3], np.int64)}
    layout = FlatLayout.of(model, include_integer=True)
    sums, counts = np.array([[1.0], [1.0], [0.0], [1.5], [0.0]]), np.array([1.0, 1, 0, 1, 0])
    new = apply_count_weighted(model, layout, sums, counts)
    assert np.isnan(new["w"][0]) and new["w"][1] == 2.0
    with pytest.raises(RoundFailedError, match="updated element"):
        apply_count_weighted(model, layout, sums, counts, finite=True)
    counts[0] = 0
    new = apply_count_weighted(model, layout, sums, counts, finite=True)
    assert np.isnan(new["w"][0]) and new["n"].tolist() == [4, 3]  # rint(3.5) = 4
    huge = np.array([[0.0], [0.0], [1e308], [0.0], [0.0]])  # 1e308 + 1e308 overflows
    with np.errstate(over="ignore"), pytest.raises(RoundFailedError, match="updated element"):
        apply_count_weighted(model, layout, huge, np.array([0.0, 0, 1, 0, 0]), finite=True)


def test_apply_and_accumulate_error_paths() -> None:
    model = {"w": np.zeros(3, np.float32)}
    layout = FlatLayout.of(model)
    with pytest.raises(ConfigurationError, match="layout's space"):
        apply_count_weighted(model, layout, np.zeros((4, 1)), np.zeros(4))
    with pytest.raises(ConfigurationError, match="sums must be"):
        apply_count_weighted(model, layout, np.zeros(3), np.zeros(3))
    with pytest.raises(ConfigurationError, match="sums must be"):
        apply_count_weighted(model, layout, np.zeros((3, 1)), np.zeros(2))
    with pytest.raises(RoundFailedError, match="not finite"):
        apply_count_weighted(model, layout, np.array([[np.inf], [0], [0]]), np.ones(3))
    with pytest.raises(RoundFailedError, match="not finite"):
        count_weighted_mean(np.zeros((3, 1)), np.array([1.0, np.nan, 1.0]))
    with pytest.raises(ConfigurationError, match="size >= 0"):
        accumulate_elements(-1, 1, [])
    with pytest.raises(ConfigurationError, match="width >= 1"):
        accumulate_elements(3, 0, [])
    with pytest.raises(ConfigurationError, match="width 2"):
        accumulate_elements(3, 1, [ElementUpdate(np.zeros((1, 2)), np.ones(1), np.array([0]))])
    with pytest.raises(ConfigurationError, match="outside"):
        accumulate_elements(3, 1, [ElementUpdate(np.zeros((1, 1)), np.ones(1), np.array([3]))])
    with pytest.raises(ConfigurationError, match="outside"):
        accumulate_elements(3, 1, [ElementUpdate(np.zeros((2, 1)), np.ones(2), None, 2)])
    # Overflow of a client-chosen huge value is a failed round, not a crash or an inf model.
    huge = SubmodelUpdate({"w": TensorUpdate(Encoding.DENSE, np.full(3, 3e38, np.float32))}, 1e300)
    with pytest.raises(RoundFailedError):
        count_weighted_average(model, [huge])


def test_every_layout_satisfies_the_protocol() -> None:
    model = {"w": np.zeros((2, 2), np.float32)}
    for layout in (FlatLayout.of(model), RowLayout.of(model, "w"), WidthLayout.of(model, {})):
        assert isinstance(layout, Layout)


def test_submodel_package_loads_without_flower() -> None:
    code = (
        "import sys, flwr_fsl.submodel, flwr_fsl.families.ssa.protocol\n"
        "assert 'flwr' not in sys.modules, 'flwr imported'\n"
        "from flwr_fsl.submodel import decode_parts\n"
        "assert 'flwr' not in sys.modules and callable(decode_parts)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
