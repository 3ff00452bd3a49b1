"""SFSL with several tables (one derived) plus dense tensors (issue 22 item 4).

Reconstruction: two tables — items (primary) and genres (derived from the items by a public
many-to-many map, narrower than the items) — plus dense tensors through one SFSL round equal
the plaintext count-weighted result over each part: a row moves by ``Σ v Δ / Σ v`` over the
clients that really hold it and whose ``S''`` holds it (a genre's count is the sum of its
items' counts), the dense tensors by the weighted mean; rows nobody touched are unchanged.
In process (``run_round``, hypothesis over maps and sizes) and on the in-process Flower grid.

Derived sets (Niu §VI): a client answers its perturbed *items* only; the server derives the
genres, so ``S''_genres`` is a function of ``S''_items`` and the public map — two clients
with the same perturbed items and different true genres get identical genre requests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.families.secagg.records import SECAGG_KEY
from flwr_fsl.families.sfsl.messages import SFSLSettings
from flwr_fsl.families.sfsl.perturb import RRParams
from flwr_fsl.families.sfsl.server import SFSLParty, run_round
from flwr_fsl.families.sfsl.tables import TablePacking
from flwr_fsl.mods import PerturbedRows
from flwr_fsl.strategies import SFSLFedSubAvg
from flwr_fsl.submodel.tables import ModelTables, RowMap, TableSpec
from flwr_fsl.testing import InProcessGrid

ITEMS, GENRES, D, DG = 30, 6, 4, 3


def genre_map(items: int, genres: int, seed: int = 0) -> RowMap:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, min(genres, 2) + 1, size=items)
    lists = [rng.choice(genres, size=int(k), replace=False) for k in sizes]
    return RowMap.from_lists(lists)


def spec(
    items: int = ITEMS, genres: int = GENRES, max_rows: int = 12, seed: int = 0
) -> ModelTables:
    return ModelTables(
        (
            TableSpec("item", max_rows),
            TableSpec("genre", genres, "item", genre_map(items, genres, seed)),
        )
    )


def model(items: int = ITEMS, genres: int = GENRES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "item": rng.normal(size=(items, D)),
        "fc.w": rng.normal(size=(D + DG, 2)),
        "genre": rng.normal(size=(genres, DG)),
        "fc.b": rng.normal(size=2),
    }


def client_rows(pid: int, items: int = ITEMS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + pid)
    rows = np.sort(rng.choice(items, size=min(items, 3 + pid), replace=False))
    return rows, 1.0 + np.arange(rows.size) + pid


def delta(pid: int, table: str, row: int, width: int) -> np.ndarray:
    return np.random.default_rng([pid, len(table), row]).normal(size=width) * 0.1


def trained(pid: int, tables: ModelTables, m: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    rows, _counts = client_rows(pid, m["item"].shape[0])
    real = tables.client_rows({"item": rows})
    out = {k: np.array(v, dtype=np.float64) for k, v in m.items()}
    for name in ("item", "genre"):
        for r in real[name]:
            out[name][r] += delta(pid, name, int(r), out[name].shape[1])
    out["fc.w"] += 0.01 * pid
    out["fc.b"] -= 0.02 * pid
    return out


def reference(
    tables: ModelTables,
    m: dict[str, np.ndarray],
    pids: list[int],
    perturbed: dict[int, dict[str, np.ndarray]],
    weights: dict[int, float],
) -> dict[str, np.ndarray]:
    """The plaintext count-weighted result over each part."""
    out = {k: np.array(v, dtype=np.float64) for k, v in m.items()}
    for name in ("item", "genre"):
        num = np.zeros(m[name].shape)
        den = np.zeros(m[name].shape[0])
        for pid in pids:
            rows, counts = client_rows(pid, m["item"].shape[0])
            every = tables.client_counts({"item": rows}, {"item": counts})
            for r, v in zip(*every[name], strict=True):
                if r in perturbed[pid][name]:
                    num[r] += v * delta(pid, name, int(r), m[name].shape[1])
                    den[r] += v
        moved = den > 0
        out[name][moved] += num[moved] / den[moved, None]
    w = np.array([weights[p] for p in pids])
    out["fc.w"] += 0.01 * float((w * np.array(pids)).sum() / w.sum())
    out["fc.b"] -= 0.02 * float((w * np.array(pids)).sum() / w.sum())
    return out


def run_in_process(tables: ModelTables, m: dict[str, np.ndarray], n: int, rr: RRParams) -> Any:
    packing = TablePacking.of(tables, m)
    parties = {}
    for pid in range(1, n + 1):
        rows, counts = client_rows(pid, m["item"].shape[0])

        def train(received: dict[str, np.ndarray], pid: int = pid) -> Any:
            assert received["genre"].shape == m["genre"].shape  # unpacked, own widths
            return trained(pid, tables, received), float(10 * pid)

        parties[pid] = SFSLParty(
            pid, packing.to_virtual({"item": rows}), counts, rr, train, packing=packing
        )
    result = run_round(m, parties, SFSLSettings("x", max_count=1e3), packing=packing)
    perturbed = {p: packing.split(s) for p, s in result.perturbed.items()}
    return result, perturbed, packing


@pytest.mark.parametrize(
    "rr",
    [RRParams.symmetric(1, 0), RRParams.symmetric(15 / 16, 1 / 16), RRParams.symmetric(1, 1)],
    ids=["CPP1", "CPP2", "CPP5"],
)
def test_two_tables_and_dense_equal_the_plaintext_count_weighted_result(rr: RRParams) -> None:
    tables, m = spec(), model()
    result, perturbed, _ = run_in_process(tables, m, 5, rr)
    expected = reference(
        tables, m, list(range(1, 6)), perturbed, {p: 10.0 * p for p in range(1, 6)}
    )
    assert list(result.model) == list(m)  # the model's order and shapes come back
    for name in m:
        np.testing.assert_allclose(result.model[name], expected[name], atol=1e-5, err_msg=name)
    # rows nobody touched are unchanged, bit for bit
    for name in ("item", "genre"):
        touched = np.zeros(m[name].shape[0], bool)
        for pid in range(1, 6):
            rows, _ = client_rows(pid)
            touched[tables.client_rows({"item": rows})[name]] = True
        np.testing.assert_array_equal(result.model[name][~touched], m[name][~touched])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.integers(4, 25),
    genres=st.integers(1, 7),
    seed=st.integers(0, 10_000),
    n=st.integers(2, 4),
    max_rows=st.integers(1, 8),
)
def test_reconstruction_over_maps_and_sizes(
    items: int, genres: int, seed: int, n: int, max_rows: int
) -> None:
    tables, m = spec(items, genres, max_rows, seed), model(items, genres)
    # the client keeps its max_rows rows of largest count: the reference uses the same cut
    packing = TablePacking.of(tables, m)
    rr = RRParams.symmetric(15 / 16, 1 / 16)
    parties = {}
    kept: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for pid in range(1, n + 1):
        rows, counts = client_rows(pid, items)
        kept[pid] = packing.primary_rows({"item": (rows, counts)})["item"]

        def train(received: dict[str, np.ndarray], pid: int = pid) -> Any:
            out = {k: np.array(v, dtype=np.float64) for k, v in received.items()}
            real = tables.client_rows({"item": kept[pid][0]})
            for name in ("item", "genre"):
                for r in real[name]:
                    out[name][r] += delta(pid, name, int(r), out[name].shape[1])
            out["fc.b"] += 0.1
            return out, 1.0

        parties[pid] = SFSLParty(
            pid, packing.to_virtual({"item": kept[pid][0]}), kept[pid][1], rr, train,
            packing=packing,
        )  # fmt: skip
    result = run_round(m, parties, SFSLSettings("x", max_count=1e3), packing=packing)
    for name in ("item", "genre"):
        num = np.zeros(m[name].shape)
        den = np.zeros(m[name].shape[0])
        for pid in result.clients:
            s = packing.split(result.perturbed[pid])[name]
            every = tables.client_counts({"item": kept[pid][0]}, {"item": kept[pid][1]})
            for r, v in zip(*every[name], strict=True):
                if r in s:
                    num[r] += v * delta(pid, name, int(r), m[name].shape[1])
                    den[r] += v
        want = m[name].copy()
        want[den > 0] += num[den > 0] / den[den > 0, None]
        np.testing.assert_allclose(result.model[name], want, atol=1e-5)
        np.testing.assert_array_equal(result.model[name][den == 0], m[name][den == 0])
    np.testing.assert_allclose(result.model["fc.b"], m["fc.b"] + 0.1, atol=1e-5)
    np.testing.assert_array_equal(result.model["fc.w"], m["fc.w"])


def test_the_derived_set_is_a_function_of_the_perturbed_set_only() -> None:
    """Same perturbed items, different true genres: identical genre requests."""
    items = 8
    tables = ModelTables(
        (
            TableSpec("item", 8),
            TableSpec("genre", 4, "item", RowMap.from_lists([[i % 4] for i in range(items)])),
        )
    )
    m = model(items, 4)
    packing = TablePacking.of(tables, m)
    # true genres {0, 1}, {0, 2}, {2, 3}: clients 1 and 2 differ
    real = {1: np.array([0, 1]), 2: np.array([0, 6]), 3: np.array([2, 3])}
    answers: dict[int, np.ndarray] = {}

    def tamper(label: str, node: int, reply: Any) -> Any:
        if label == "perturb":
            answers[node] = np.asarray(reply)
        return reply

    parties = {
        p: SFSLParty(
            p,
            packing.to_virtual({"item": r}),
            np.ones(r.size),
            RRParams.symmetric(1, 1),
            lambda x: (x, 1.0),
            packing=packing,
        )
        for p, r in real.items()
    }
    result = run_round(m, parties, SFSLSettings("x"), packing=packing, tamper=tamper)
    # the perturb replies hold primary (item) rows only: no client sends a genre request
    for reply in answers.values():
        assert packing.primary_mask(reply).all()
    # CPP5: all three answered every union item, so their S'' are identical, genres included
    assert np.array_equal(answers[1], answers[2])
    assert np.array_equal(result.perturbed[1], result.perturbed[2])
    genres = {p: tables.client_rows({"item": r})["genre"] for p, r in real.items()}
    assert not np.array_equal(genres[1], genres[2])
    # and the genre part is the map of the perturbed items, nothing else
    split = packing.split(result.perturbed[1])
    np.testing.assert_array_equal(split["genre"], tables["genre"].row_map.derive(split["item"]))


def test_extend_ignores_the_derived_rows_it_is_given() -> None:
    tables, m = spec(), model()
    packing = TablePacking.of(tables, m)
    items = packing.to_virtual({"item": np.array([1, 5, 7])})
    noise = packing.to_virtual({"genre": np.arange(GENRES)})
    assert np.array_equal(packing.extend(items), packing.extend(np.union1d(items, noise)))


def test_a_client_refuses_derived_rows_that_do_not_follow() -> None:
    tables, m = spec(), model()
    packing = TablePacking.of(tables, m)
    good = packing.extend(packing.to_virtual({"item": np.array([0, 1, 2])}))
    packing.check_extended(good)
    extra = np.union1d(good, packing.to_virtual({"genre": np.arange(GENRES)}))
    if extra.size != good.size:
        with pytest.raises(ClientInputError):
            packing.check_extended(extra)


def test_packing_round_trip_and_name_check() -> None:
    tables, m = spec(), model()
    packing = TablePacking.of(tables, m)
    packed = packing.pack(m)
    assert packed[packing.name].shape == (ITEMS + GENRES, D)
    back = packing.unpack(packed, tuple(m))
    for k in m:
        np.testing.assert_array_equal(back[k], m[k])
    assert TablePacking.from_name(packing.name, tables) == packing
    with pytest.raises(ClientInputError):
        TablePacking.from_name(packing.name, spec(seed=1))  # another map
    with pytest.raises(ClientInputError):
        TablePacking.from_name("item", tables)
    with pytest.raises(ConfigurationError):
        TablePacking.of(tables, {**m, "genre": m["genre"].astype(np.float32)})


# -- the Flower strategy and mod --------------------------------------------------------------
PAPER_NODE = {"fsl-min-noise-multiplier": 0.0}
FLOWER_MODEL = {k: v.astype(np.float32) for k, v in model().items()}


def make_app(tables: ModelTables, rr: RRParams, seen: dict[int, np.ndarray]) -> ClientApp:
    def rows(context: Context) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return {"item": client_rows(int(context.node_config["partition-id"]) + 1)}

    mod = PerturbedRows(tables, rows=rows, rr=rr, persist_memo=False)

    def spy(msg, context, call_next):  # type: ignore[no-untyped-def]
        reply = call_next(msg, context)
        record = reply.content.config_records.get(SECAGG_KEY) if reply.has_content() else None
        if record is not None and "perturbed" in record:
            seen[int(context.node_config["partition-id"]) + 1] = np.frombuffer(
                record["perturbed"], "<i8"
            )
        return reply

    app = ClientApp(mods=[spy, mod.mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"]) + 1
        got = {k: a.numpy() for k, a in msg.content["arrays"].items()}
        assert got["genre"].shape == (GENRES, DG)
        new = trained(pid, tables, got)
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v.astype(np.float32)) for k, v in new.items()}),
                    "metrics": MetricRecord({"num-examples": 10 * pid}),
                }
            ),
            reply_to=msg,
        )

    return app


@pytest.mark.parametrize("rr", [RRParams.symmetric(15 / 16, 1 / 16)], ids=["CPP2"])
def test_strategy_and_mod_with_several_tables(rr: RRParams) -> None:
    n, tables = 4, spec()
    seen: dict[int, np.ndarray] = {}

    def node(i: int) -> dict[str, Any]:
        return {"partition-id": i, "num-partitions": n, **PAPER_NODE}

    grid = InProcessGrid(make_app(tables, rr, seen), n, node_config_fn=node)
    strategy = SFSLFedSubAvg(tables, min_available_nodes=n, max_count=100.0, dp=None, weighted=True)
    initial = ArrayRecord({k: Array(v.copy()) for k, v in FLOWER_MODEL.items()})
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=1)
    assert strategy.failed_rounds == {} and strategy.dropped == {1: {}}
    packing = TablePacking.of(tables, FLOWER_MODEL)
    perturbed = {p: packing.split(packing.extend(s)) for p, s in seen.items()}
    assert all(packing.primary_mask(s).all() for s in seen.values())
    m64 = {k: v.astype(np.float64) for k, v in FLOWER_MODEL.items()}
    expected = reference(
        tables, m64, list(range(1, n + 1)), perturbed, {p: 10.0 * p for p in range(1, n + 1)}
    )
    got = {k: a.numpy() for k, a in result.arrays.items()}
    assert list(got) == list(FLOWER_MODEL)
    for name in FLOWER_MODEL:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-4, err_msg=name)


def test_strategy_with_several_tables_at_the_dp_defaults_runs() -> None:
    n, tables = 5, spec()
    seen: dict[int, np.ndarray] = {}
    grid = InProcessGrid(
        make_app(tables, RRParams.symmetric(15 / 16, 1 / 16), seen), n,
        node_config_fn=lambda i: {"partition-id": i, "num-partitions": n},
    )  # fmt: skip
    strategy = SFSLFedSubAvg(tables, min_available_nodes=n)
    initial = ArrayRecord({k: Array(v.copy()) for k, v in FLOWER_MODEL.items()})
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=1)
    assert strategy.dropped == {1: {}}
    got = {k: a.numpy() for k, a in result.arrays.items()}
    assert all(
        got[k].shape == v.shape and np.all(np.isfinite(got[k])) for k, v in FLOWER_MODEL.items()
    )


def test_settings_with_tables_are_checked() -> None:
    with pytest.raises(ConfigurationError):
        SFSLFedSubAvg(3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        PerturbedRows(3, rows=lambda c: None, rr=RRParams.symmetric(1, 0))  # type: ignore[arg-type]
