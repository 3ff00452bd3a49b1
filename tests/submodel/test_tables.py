"""The shared table spec: row maps (CSR), table specs, a model's tables and a client's rows."""

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.submodel.tables import ModelTables, RowMap, TableSpec

GENRES = RowMap.from_lists([[0, 2], [1], [], [2, 0, 2]])  # 4 items -> 3 genres, many-to-many


def model() -> dict[str, np.ndarray]:
    return {
        "item": np.zeros((4, 3), np.float32),
        "genre": np.zeros((3, 3), np.float32),
        "mlp.w": np.zeros((6, 2), np.float32),
        "steps": np.zeros(1, np.int64),
        "mlp.b": np.zeros(2, np.float32),
    }


def tables() -> ModelTables:
    return ModelTables(
        (TableSpec("genre", 3, derived_from="item", row_map=GENRES), TableSpec("item", 2))
    )


def test_row_map_derive_is_sorted_unique() -> None:
    np.testing.assert_array_equal(GENRES.derive([3, 1]), [0, 1, 2])
    np.testing.assert_array_equal(GENRES.derive([2]), np.zeros(0, np.int64))
    np.testing.assert_array_equal(GENRES.derive([]), np.zeros(0, np.int64))
    assert GENRES.derive([0, 0]).dtype == np.int64
    assert GENRES.num_parents == 4 and GENRES.max_child == 2
    assert GENRES.bound(2) == 5 and GENRES.bound(0) == 0
    with pytest.raises(ValueError):
        GENRES.indices[0] = 5  # read-only


def test_row_map_counts_sum_parents_once_each() -> None:
    rows, counts = GENRES.derive_counts([0, 3, 1], [1.0, 2.0, 5.0])
    np.testing.assert_array_equal(rows, [0, 1, 2])
    # genre 0: items 0 (1) + 3 (2, listed once although 3 lists genre 2 twice) ...
    np.testing.assert_array_equal(counts, [3.0, 5.0, 3.0])


@pytest.mark.parametrize(
    ("indptr", "indices", "match"),
    [
        ([1, 2], [0, 1], "start with 0"),
        ([0, 2, 1], [0, 1], "non-decreasing"),
        ([0, 1], [0, 1], "ends at 1"),
        ([0, 1], [-1], "non-negative"),
        ([0.0, 1.0], [0], "integers"),
        ([], [], "start with 0"),
    ],
)
def test_row_map_refuses_malformed_csr(indptr: list, indices: list, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        RowMap(np.asarray(indptr), np.asarray(indices))


def test_row_map_refuses_parents_out_of_range() -> None:
    with pytest.raises(ConfigurationError, match=r"\[0, 4\)"):
        GENRES.derive([4])
    with pytest.raises(ConfigurationError, match="unique"):
        GENRES.derive_counts([1, 1], [1.0, 1.0])
    with pytest.raises(ConfigurationError, match="finite"):
        GENRES.derive_counts([1], [0.0])


def test_table_spec_validation_names_the_table() -> None:
    with pytest.raises(ConfigurationError, match="max_rows of table 'emb'"):
        TableSpec("emb", 0)
    with pytest.raises(ConfigurationError, match=r"'g'.*both or neither"):
        TableSpec("g", 1, derived_from="item")
    with pytest.raises(ConfigurationError, match="itself"):
        TableSpec("g", 1, derived_from="g", row_map=GENRES)
    with pytest.raises(ConfigurationError, match="name"):
        TableSpec("", 1)


def test_model_tables_order_names_and_dense() -> None:
    spec = tables()
    assert spec.names == ("item", "genre")  # parent first
    assert spec.primary == ("item",)
    assert spec["genre"].derived and not spec["item"].derived
    spec.check(model())
    assert spec.dense_names(model()) == ("mlp.w", "mlp.b")
    assert spec.worst_case_rows("genre") == 5 and spec.worst_case_rows("item") == 2
    # Capped by the tables' row counts, at every level: a client holds at most a table's rows.
    assert spec.worst_case_rows("genre", {"item": 4, "genre": 3}) == 3
    assert spec.worst_case_rows("genre", {"item": 1}) == GENRES.bound(1) == 3
    assert spec.worst_case_rows("item", {"item": 1, "genre": 3}) == 1
    assert ModelTables.single("item", 3).names == ("item",)
    with pytest.raises(ConfigurationError, match="'nope'"):
        spec["nope"]


def test_model_tables_refuses_bad_structure() -> None:
    with pytest.raises(ConfigurationError, match="at least one"):
        ModelTables(())
    with pytest.raises(ConfigurationError, match="'item' is named twice"):
        ModelTables((TableSpec("item", 1), TableSpec("item", 2)))
    with pytest.raises(ConfigurationError, match=r"'genre'.*not one of the tables"):
        ModelTables((TableSpec("genre", 1, derived_from="item", row_map=GENRES),))
    cyc = RowMap.from_lists([[0]])
    with pytest.raises(ConfigurationError, match="cycle"):
        ModelTables(
            (
                TableSpec("a", 1, derived_from="b", row_map=cyc),
                TableSpec("b", 1, derived_from="a", row_map=cyc),
            )
        )


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda m: m.pop("genre"), "'genre': the model has no such tensor"),
        (
            lambda m: m.__setitem__("item", np.zeros(4, np.float32)),
            "'item' must be a non-empty 2-D",
        ),
        (lambda m: m.__setitem__("item", np.zeros((5, 3), np.float32)), "covers 4 rows"),
        (lambda m: m.__setitem__("genre", np.zeros((2, 3), np.float32)), "'genre'.*row 2"),
        (lambda m: m.__setitem__("genre", np.zeros((3, 3), np.int64)), "'genre' must be floating"),
    ],
)
def test_check_refuses_a_model_that_does_not_fit(
    change: Callable[[dict], object], match: str
) -> None:
    arrays = model()
    change(arrays)
    with pytest.raises(ConfigurationError, match=match):
        tables().check(arrays)


def test_client_rows_adds_derived_tables() -> None:
    rows = tables().client_rows({"item": np.array([3, 1])})
    assert list(rows) == ["item", "genre"]
    np.testing.assert_array_equal(rows["item"], [3, 1])
    np.testing.assert_array_equal(rows["genre"], [0, 1, 2])
    empty = tables().client_rows({})
    assert empty["item"].size == 0 and empty["genre"].size == 0
    weighted = tables().client_counts({"item": [0, 1]}, {"item": [2.0, 1.0]})
    np.testing.assert_array_equal(weighted["genre"][0], [0, 1, 2])
    np.testing.assert_array_equal(weighted["genre"][1], [2.0, 1.0, 2.0])


def test_client_rows_errors_name_the_table() -> None:
    with pytest.raises(ConfigurationError, match="'genre' is not a primary table"):
        tables().client_rows({"genre": [0]})
    with pytest.raises(ConfigurationError, match="'item' must be unique"):
        tables().client_rows({"item": [1, 1]})
    with pytest.raises(ConfigurationError, match="'item' must be non-negative"):
        tables().client_rows({"item": [-1]})
    with pytest.raises(ConfigurationError, match=r"table 'genre'.*\[0, 4\)"):
        tables().client_rows({"item": [7]})
    with pytest.raises(ConfigurationError, match="'item': one count per row"):
        tables().client_counts({"item": [0, 1]}, {"item": [1.0]})


@st.composite
def csr_maps(draw: st.DrawFn) -> tuple[list[list[int]], int]:
    children = draw(st.integers(1, 12))
    lists = draw(
        st.lists(st.lists(st.integers(0, children - 1), max_size=6), min_size=1, max_size=15)
    )
    return lists, children


@settings(max_examples=200, deadline=None)
@given(csr_maps(), st.data())
def test_derive_matches_brute_force(
    drawn: tuple[list[list[int]], int], data: st.DataObject
) -> None:
    lists, _ = drawn
    row_map = RowMap.from_lists(lists)
    parents = data.draw(st.lists(st.integers(0, len(lists) - 1), max_size=10))
    expected = sorted({c for p in parents for c in lists[p]})
    got = row_map.derive(np.asarray(parents, np.int64))
    assert got.tolist() == expected and got.dtype == np.int64
    unique = sorted(set(parents))
    weights = [float(1 + p) for p in unique]
    rows, counts = row_map.derive_counts(unique, weights)
    brute = {
        c: sum(w for p, w in zip(unique, weights, strict=True) if c in lists[p]) for c in expected
    }
    assert rows.tolist() == expected
    assert counts.tolist() == [brute[c] for c in expected]
    assert len(expected) <= row_map.bound(len(unique))


@settings(max_examples=100, deadline=None)
@given(csr_maps(), st.data())
def test_model_tables_check_accepts_exactly_fitting_maps(
    drawn: tuple[list[list[int]], int], data: st.DataObject
) -> None:
    lists, _ = drawn
    spec = ModelTables(
        (
            TableSpec("child", 2, derived_from="parent", row_map=RowMap.from_lists(lists)),
            TableSpec("parent", 3),
        )
    )
    max_child = max((c for cs in lists for c in cs), default=-1)
    rows = data.draw(st.integers(1, 14))
    arrays = {
        "parent": np.zeros((len(lists), 2), np.float32),
        "child": np.zeros((rows, 2), np.float32),
    }
    if rows > max_child:
        spec.check(arrays)
    else:
        with pytest.raises(ConfigurationError, match="'child'"):
            spec.check(arrays)
