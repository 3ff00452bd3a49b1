"""Mixed index-mode rounds: two tables (one derived many-to-many) plus two dense tensors.

Each part goes through PSR (tables) and SSA with the in-process S1; the result must equal the
plaintext count-weighted average per part, rows nobody touched unchanged. DP is off on both
ends here (exact comparison), as in ``test_index_strategy.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError, RunFailedError
from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY, PrivacyAccount
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.families.ssa.mixed import DENSE_PART, DenseChunks, clamp_rows, part_key
from flwr_fsl.families.ssa.mixed_mod import PrivateTables
from flwr_fsl.families.ssa.records import SSA_UPLOAD_KEY
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.helper.accounts import ACCOUNTS_DIR
from flwr_fsl.submodel.aggregate import apply_count_weighted_parts
from flwr_fsl.submodel.tables import ModelTables, RowMap, TableSpec
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.helper_process import HelperProcess

ITEMS, GENRES, WIDTH_I, WIDTH_G = 30, 7, 3, 2
RNG = np.random.default_rng(0)
GENRE_MAP = RowMap.from_lists(
    [RNG.choice(GENRES, 1 + i % 3, replace=False).tolist() for i in range(ITEMS)]
)


def spec(k_item: int = 5, k_genre: int = 7) -> ModelTables:
    return ModelTables(
        (
            TableSpec("item", k_item),
            TableSpec("genre", k_genre, derived_from="item", row_map=GENRE_MAP),
        )
    )


def initial(seed: int = 1, items: int = ITEMS, genres: int = GENRES) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "item": rng.normal(size=(items, WIDTH_I)).astype(np.float32),
        "genre": rng.normal(size=(genres, WIDTH_G)).astype(np.float32),
        "mlp.w": rng.normal(size=(4, 3)).astype(np.float32),
        "steps": np.zeros(1, np.int64),
        "mlp.b": rng.normal(size=5).astype(np.float32),
    }


def item_rows(pid: int, rnd: int, items: int = ITEMS, k: int = 5) -> np.ndarray:
    rng = np.random.default_rng([pid, rnd])
    return np.sort(rng.choice(items, min(k, 2 + pid % 3), replace=False)).astype(np.int64)


def deltas(pid: int, rnd: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    key = {"item": 1, "genre": 2, "mlp.w": 3, "mlp.b": 4}[name]
    return np.random.default_rng([pid, rnd, key]).normal(size=shape).astype(np.float32) * 0.1


def make_app(tables: ModelTables, items: int = ITEMS, mods: tuple[Any, ...] = ()) -> ClientApp:
    def rows_fn(context: Context) -> np.ndarray:
        pid = int(context.node_config["partition-id"])
        rnd = int(context.state.config_records["rnd"]["r"]) if "rnd" in context.state else 1
        return item_rows(pid, rnd, items, tables["item"].max_rows)

    private = PrivateTables(tables, rows=rows_fn)
    app = ClientApp(mods=[*mods, private.mod])
    app.query("psr")(private.query)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        arrays = {k: v.numpy().copy() for k, v in msg.content["arrays"].items()}
        rows = tables.client_rows({"item": rows_fn(context)})
        genre = rows["genre"][: tables["genre"].max_rows]
        arrays["item"][rows["item"]] += deltas(pid, rnd, "item", (rows["item"].size, WIDTH_I))
        arrays["genre"][genre] += deltas(pid, rnd, "genre", (genre.size, WIDTH_G))
        for name in ("mlp.w", "mlp.b"):
            arrays[name] += deltas(pid, rnd, name, arrays[name].shape)
        arrays["steps"] += 1  # integer buffers are not federated
        context.state["rnd"] = ConfigRecord({"r": rnd + 1})
        reply = ArrayRecord({k: Array(v) for k, v in arrays.items()})
        return Message(
            RecordDict({"arrays": reply, "metrics": MetricRecord({"num-examples": 5})}),
            reply_to=msg,
        )

    return app


def expected(
    model: dict[str, np.ndarray], tables: ModelTables, rounds: int, nodes: int
) -> dict[str, np.ndarray]:
    """Plaintext count-weighted result per part (unit weights: every client counts 1)."""
    model = {k: v.copy() for k, v in model.items()}
    items = model["item"].shape[0]
    for rnd in range(1, rounds + 1):
        new = {k: v.astype(np.float64) for k, v in model.items()}
        for name in ("item", "genre"):
            num = np.zeros_like(new[name])
            den = np.zeros(new[name].shape[0])
            for pid in range(nodes):
                rows = tables.client_rows({"item": item_rows(pid, rnd, items, 5)})[name]
                rows = clamp_rows(rows, None, tables[name].max_rows)[0]
                num[rows] += deltas(pid, rnd, name, (rows.size, new[name].shape[1]))
                den[rows] += 1
            hit = den > 0
            new[name][hit] += num[hit] / den[hit, None]
        for name in ("mlp.w", "mlp.b"):
            total = sum(
                deltas(pid, rnd, name, model[name].shape).astype(np.float64) for pid in range(nodes)
            )
            new[name] += total / nodes
        model = {k: new[k].astype(model[k].dtype) for k in model}
    return model


def run(
    key: SealingKeyPair,
    tables: ModelTables,
    model: dict[str, np.ndarray],
    rounds: int = 2,
    nodes: int = 4,
    **kw: Any,
) -> tuple[SecureRowFedSubAvg, Any]:
    grid = InProcessGrid(
        make_app(tables, model["item"].shape[0]),
        nodes,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=lambda i: {
            "partition-id": i,
            "num-partitions": nodes,
            NODE_MIN_NOISE_KEY: 0.0,
        },
    )
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        tables,
        dp=None,
        frac_bits=32,
        max_abs=1e3,
        min_available_nodes=nodes,
        **kw,
    )
    initial_arrays = ArrayRecord({k: Array(v) for k, v in model.items()})
    return strategy, strategy.start(grid=grid, initial_arrays=initial_arrays, num_rounds=rounds)


@pytest.fixture(scope="module")
def key() -> SealingKeyPair:
    return SealingKeyPair.generate()


def test_mixed_model_equals_plaintext_per_part(key: SealingKeyPair) -> None:
    model, tables = initial(), spec()
    strategy, result = run(key, tables, model)
    assert strategy.failed_rounds == {} and all(not d for d in strategy.dropped.values())
    want = expected(model, tables, 2, 4)
    for name in ("item", "genre", "mlp.w", "mlp.b"):
        np.testing.assert_allclose(result.arrays[name].numpy(), want[name], atol=1e-5, err_msg=name)
    np.testing.assert_array_equal(result.arrays["steps"].numpy(), [0])
    touched = np.zeros(ITEMS, bool)
    for pid in range(4):
        for rnd in (1, 2):
            touched[item_rows(pid, rnd)] = True
    untouched = ~touched
    assert untouched.any()
    np.testing.assert_array_equal(
        result.arrays["item"].numpy()[untouched], model["item"][untouched]
    )


def test_derived_rows_over_max_rows_keep_the_heaviest(key: SealingKeyPair) -> None:
    model, tables = initial(), spec(k_genre=2)  # a client's genres can exceed 2: clamped
    strategy, result = run(key, tables, model)
    assert strategy.failed_rounds == {}
    want = expected(model, tables, 2, 4)
    np.testing.assert_allclose(result.arrays["genre"].numpy(), want["genre"], atol=1e-5)


def test_clamp_rows_keeps_heaviest_then_lowest() -> None:
    rows = np.array([1, 4, 6, 9])
    assert clamp_rows(rows, None, 2)[0].tolist() == [1, 4]
    kept, counts = clamp_rows(rows, np.array([1.0, 3.0, 2.0, 3.0]), 2)
    assert kept.tolist() == [4, 9] and counts is not None and counts.tolist() == [3.0, 3.0]


def test_malformed_part_drops_only_that_client(key: SealingKeyPair) -> None:
    model, tables = initial(), spec()

    def corrupt(msg: Message, context: Context, call_next: Any) -> Message:
        reply = call_next(msg, context)
        if int(context.node_config["partition-id"]) == 1 and msg.metadata.message_type == "train":
            record = reply.content.config_records[part_key(SSA_UPLOAD_KEY, 1)]
            record["public"] = record["public"][:-3]  # the genre part only
        return reply

    nodes = 4
    app = make_app(tables, mods=(corrupt,))  # outermost: alters the encoded reply
    grid = InProcessGrid(
        app,
        nodes,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=lambda i: {
            "partition-id": i,
            "num-partitions": nodes,
            NODE_MIN_NOISE_KEY: 0.0,
        },
    )
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        tables,
        dp=None,
        frac_bits=32,
        max_abs=1e3,
        min_available_nodes=nodes,
    )
    initial_arrays = ArrayRecord({k: Array(v) for k, v in model.items()})
    result = strategy.start(grid=grid, initial_arrays=initial_arrays, num_rounds=1)
    dropped = strategy.dropped[1]
    assert len(dropped) == 1 and "'genre'" in next(iter(dropped.values()))
    # The other three clients' average, exactly.
    want = expected_subset(model, tables, [0, 2, 3])
    for name in ("item", "genre", "mlp.w", "mlp.b"):
        np.testing.assert_allclose(result.arrays[name].numpy(), want[name], atol=1e-5)


def expected_subset(
    model: dict[str, np.ndarray], tables: ModelTables, pids: list[int]
) -> dict[str, np.ndarray]:
    new = {k: v.astype(np.float64) for k, v in model.items()}
    for name in ("item", "genre"):
        num, den = np.zeros_like(new[name]), np.zeros(new[name].shape[0])
        for pid in pids:
            rows = tables.client_rows({"item": item_rows(pid, 1)})[name]
            num[rows] += deltas(pid, 1, name, (rows.size, new[name].shape[1]))
            den[rows] += 1
        hit = den > 0
        new[name][hit] += num[hit] / den[hit, None]
    for name in ("mlp.w", "mlp.b"):
        new[name] += sum(
            deltas(p, 1, name, model[name].shape).astype(np.float64) for p in pids
        ) / len(pids)
    return {k: new[k].astype(model[k].dtype) for k in model}


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    items=st.integers(6, 20),
    genres=st.integers(2, 6),
    k_item=st.integers(2, 5),
    k_genre=st.integers(1, 6),
    dense_width=st.sampled_from([None, 1, 4]),
)
def test_hypothesis_sizes(
    key: SealingKeyPair, items: int, genres: int, k_item: int, k_genre: int, dense_width: int | None
) -> None:
    rng = np.random.default_rng(items * 100 + genres)
    row_map = RowMap.from_lists(
        [rng.choice(genres, 1 + i % 2, replace=False).tolist() for i in range(items)]
    )
    tables = ModelTables(
        (
            TableSpec("item", k_item),
            TableSpec("genre", k_genre, derived_from="item", row_map=row_map),
        )
    )
    model = initial(items=items, genres=genres)
    strategy, result = run(key, tables, model, rounds=1, nodes=3, dense_width=dense_width)
    assert strategy.failed_rounds == {}
    want = expected_general(model, tables, 3, k_item)
    for name in ("item", "genre", "mlp.w", "mlp.b"):
        np.testing.assert_allclose(result.arrays[name].numpy(), want[name], atol=1e-5, err_msg=name)


def expected_general(
    model: dict[str, np.ndarray], tables: ModelTables, nodes: int, k_item: int
) -> dict[str, np.ndarray]:
    items = model["item"].shape[0]
    new = {k: v.astype(np.float64) for k, v in model.items()}
    for name in ("item", "genre"):
        num, den = np.zeros_like(new[name]), np.zeros(new[name].shape[0])
        for pid in range(nodes):
            rows = tables.client_rows({"item": item_rows(pid, 1, items, k_item)})[name]
            rows = clamp_rows(rows, None, tables[name].max_rows)[0]
            num[rows] += deltas(pid, 1, name, (rows.size, new[name].shape[1]))
            den[rows] += 1
        hit = den > 0
        new[name][hit] += num[hit] / den[hit, None]
    for name in ("mlp.w", "mlp.b"):
        new[name] += (
            sum(deltas(p, 1, name, model[name].shape).astype(np.float64) for p in range(nodes))
            / nodes
        )
    return {k: new[k].astype(model[k].dtype) for k in model}


def test_constructor_settings(key: SealingKeyPair) -> None:
    helper = InProcessHelper(keypair=key)
    single = SecureRowFedSubAvg(helper, "emb", 4)
    assert single.mixed is None and single.udpf
    mixed = SecureRowFedSubAvg(helper, spec())
    assert mixed.mixed is not None and mixed.mixed.num_parts == 3 and mixed.udpf
    assert mixed.round_noise_multiplier() == pytest.approx(1 / np.sqrt(3))
    assert "noise multiplier 1 on each of 3 parts (one round at 0.577)" in mixed.describe_privacy()
    assert "parts" not in single.describe_privacy()
    dense_off = SecureRowFedSubAvg(helper, spec(), dense=False)
    assert dense_off.mixed is not None and dense_off.mixed.num_parts == 2
    one_plus_dense = SecureRowFedSubAvg(helper, "emb", 4, dense=True)
    assert one_plus_dense.mixed is not None and one_plus_dense.mixed.num_parts == 2
    with pytest.raises(ConfigurationError, match="max_rows"):
        SecureRowFedSubAvg(helper, spec(), 4)
    with pytest.raises(ConfigurationError, match="max_rows"):
        SecureRowFedSubAvg(helper, "emb")
    assert not SecureRowFedSubAvg(helper, spec(), udpf=False).udpf
    with pytest.raises(ConfigurationError, match="dense_width"):
        SecureRowFedSubAvg(helper, spec(), dense_width=0)
    assert DENSE_PART not in spec().names


def test_through_a_real_helper_process_exact_and_dp_accounts(tmp_path: Path) -> None:
    """S1 as a real ``flwr-fsl-helper`` process: the round shape needs no helper change.

    Without DP the result is the plaintext one; with the default DP (z = 1 per part) S1 keeps
    one ledger entry per part (3 per round) and S0's account, which spends ``z / sqrt(3)`` per
    round, gives the same epsilon.
    """
    key_file = tmp_path / "s1.pem"
    SealingKeyPair.generate().save(key_file)
    state = tmp_path / "state"
    model, tables = initial(), spec()
    with HelperProcess(key_file, tmp_path / "s1.log", state_dir=state) as proc:
        grid = InProcessGrid(
            make_app(tables),
            4,
            {"ssa-helper-fingerprint": proc.fingerprint},
            node_config_fn=lambda i: {
                "partition-id": i,
                "num-partitions": 4,
                NODE_MIN_NOISE_KEY: 0.0,
            },
        )
        exact = SecureRowFedSubAvg(
            proc.client(timeout=60),
            tables,
            helper_fingerprint=proc.fingerprint,
            dp=None,
            frac_bits=32,
            max_abs=1e3,
            min_available_nodes=4,
        )
        result = exact.start(
            grid=grid,
            initial_arrays=ArrayRecord({k: Array(v) for k, v in model.items()}),
            num_rounds=2,
        )
        assert exact.failed_rounds == {}
        want = expected(model, tables, 2, 4)
        for name in ("item", "genre", "mlp.w", "mlp.b"):
            np.testing.assert_allclose(result.arrays[name].numpy(), want[name], atol=1e-5)
        noisy = SecureRowFedSubAvg(
            proc.client(timeout=60),
            tables,
            helper_fingerprint=proc.fingerprint,
            min_available_nodes=4,
        )
        dp_grid = InProcessGrid(make_app(tables), 4, {"ssa-helper-fingerprint": proc.fingerprint})
        noisy.start(
            grid=dp_grid,
            initial_arrays=ArrayRecord({k: Array(v) for k, v in model.items()}),
            num_rounds=2,
        )
        assert noisy.failed_rounds == {} and sorted(noisy.rounds) == [1, 2]
    files = list((state / ACCOUNTS_DIR).iterdir())
    assert len(files) == 1
    ledger = PrivacyAccount.decode(files[0].read_bytes())
    assert ledger == [1.0] * 6  # S1: one round at z = 1 per part
    s1 = PrivacyAccount(noise_multipliers=ledger)
    assert noisy.privacy_account.epsilon() == pytest.approx(s1.epsilon(), rel=1e-6)


@st.composite
def mixed_models(draw: st.DrawFn) -> tuple[ModelTables, dict[str, np.ndarray]]:
    """1-3 tables, each primary or derived from an earlier one, random sizes and bounds."""
    count = draw(st.integers(1, 3))
    specs: list[TableSpec] = []
    arrays: dict[str, np.ndarray] = {}
    for j in range(count):
        rows = draw(st.integers(3, 12))
        width = draw(st.integers(1, 3))
        bound = draw(st.integers(1, rows))
        name = f"t{j}"
        parent = draw(st.sampled_from([None, *[s.name for s in specs]])) if j else None
        if parent is None:
            specs.append(TableSpec(name, bound))
        else:
            parents = arrays[parent].shape[0]
            lists = [
                draw(st.lists(st.integers(0, rows - 1), max_size=3, unique=True))
                for _ in range(parents)
            ]
            specs.append(TableSpec(name, bound, parent, RowMap.from_lists(lists)))
        arrays[name] = np.random.default_rng(j).normal(size=(rows, width)).astype(np.float32)
    arrays["dense"] = np.random.default_rng(9).normal(size=(2, 3)).astype(np.float32)
    return ModelTables(tuple(specs)), arrays


def generic_rows(tables: ModelTables, arrays: dict[str, np.ndarray], pid: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in tables.primary:
        rng = np.random.default_rng([pid, int(name[1:])])
        n = min(tables[name].max_rows, arrays[name].shape[0], 1 + pid % 3)
        idx = np.sort(rng.choice(arrays[name].shape[0], n, replace=False)).astype(np.int64)
        out[name] = (idx, (1.0 + (idx % 3)).astype(np.float64))
    return out


def generic_app(tables: ModelTables, arrays: dict[str, np.ndarray]) -> ClientApp:
    def rows_fn(context: Context) -> dict[str, Any]:
        return generic_rows(tables, arrays, int(context.node_config["partition-id"]))

    private = PrivateTables(tables, rows=rows_fn)
    app = ClientApp(mods=[private.mod])
    app.query("psr")(private.query)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        got = {k: v.numpy().copy() for k, v in msg.content["arrays"].items()}
        for name, (rows, _) in generic_counts(tables, arrays, pid).items():
            got[name][rows] += deltas(pid, 1, "item", (rows.size, got[name].shape[1]))
        got["dense"] += deltas(pid, 1, "mlp.w", got["dense"].shape)
        return Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v) for k, v in got.items()}),
                    "metrics": MetricRecord({"num-examples": 2 + pid}),
                }
            ),
            reply_to=msg,
        )

    return app


def generic_counts(
    tables: ModelTables, arrays: dict[str, np.ndarray], pid: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    primary = generic_rows(tables, arrays, pid)
    both = tables.client_counts(
        {k: v[0] for k, v in primary.items()}, {k: v[1] for k, v in primary.items()}
    )
    out = {}
    for name, (rows, counts) in both.items():
        if tables[name].derived:
            kept, kept_counts = clamp_rows(rows, counts, tables[name].max_rows)
            assert kept_counts is not None
            rows, counts = kept, kept_counts
        out[name] = (rows, counts)
    return out


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(drawn=mixed_models(), weighted=st.booleans())
def test_hypothesis_table_counts_sizes_and_bounds(
    key: SealingKeyPair, drawn: tuple[ModelTables, dict[str, np.ndarray]], weighted: bool
) -> None:
    tables, arrays = drawn
    nodes = 3
    grid = InProcessGrid(
        generic_app(tables, arrays),
        nodes,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=lambda i: {
            "partition-id": i,
            "num-partitions": nodes,
            NODE_MIN_NOISE_KEY: 0.0,
        },
    )
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        tables,
        dp=None,
        frac_bits=32,
        max_abs=1e3,
        min_available_nodes=nodes,
        weighted=weighted,
    )
    initial_arrays = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    result = strategy.start(grid=grid, initial_arrays=initial_arrays, num_rounds=1)
    assert strategy.failed_rounds == {} and not strategy.dropped.get(1)
    for name in tables.names:
        num = np.zeros(arrays[name].shape)
        den = np.zeros(arrays[name].shape[0])
        for pid in range(nodes):
            rows, counts = generic_counts(tables, arrays, pid)[name]
            c = counts if weighted else np.ones(rows.size)
            num[rows] += c[:, None] * deltas(pid, 1, "item", (rows.size, arrays[name].shape[1]))
            den[rows] += c
        want = arrays[name].astype(np.float64)
        hit = den > 0
        want[hit] += num[hit] / den[hit, None]
        got = result.arrays[name].numpy()
        np.testing.assert_allclose(got, want.astype(np.float32), atol=1e-5, err_msg=name)
        np.testing.assert_array_equal(got[~hit], arrays[name][~hit])  # untouched rows
    weights = [float(2 + p) if weighted else 1.0 for p in range(nodes)]
    dense = sum(w * deltas(p, 1, "mlp.w", (2, 3)).astype(np.float64) for p, w in enumerate(weights))
    np.testing.assert_allclose(
        result.arrays["dense"].numpy(), arrays["dense"] + dense / sum(weights), atol=1e-5
    )


def test_dense_chunks_round_trip_and_parts_apply() -> None:
    model = initial()
    names = ModelTables.single("item", 2).dense_names(model)
    assert names == ("genre", "mlp.w", "mlp.b")
    chunks = DenseChunks.of(model, ("mlp.w", "mlp.b"), 4)
    assert (chunks.size, chunks.width) == (5, 4)  # 17 coordinates, the last chunk padded
    vec = chunks.gather(model)
    np.testing.assert_array_equal(vec.reshape(-1)[:12], model["mlp.w"].reshape(-1))
    written = chunks.write(model, np.array([0, 4]), np.ones((2, 4)))
    assert written["mlp.w"].reshape(-1)[:4].tolist() == [1.0] * 4
    assert written["mlp.b"][-1] == 1.0 and written["mlp.b"][0] == model["mlp.b"][0]
    sums, counts = np.ones((5, 4)), np.array([2.0, 0, 0, 0, 1.0])
    out = apply_count_weighted_parts(model, [(chunks, sums, counts)])
    np.testing.assert_allclose(out["mlp.w"].reshape(-1)[:4], model["mlp.w"].reshape(-1)[:4] + 0.5)
    np.testing.assert_array_equal(out["item"], model["item"])
    with pytest.raises(ConfigurationError, match="no dense"):
        DenseChunks.of(model, (), 4)


def test_more_parts_than_s1_open_rounds_fails_the_round_loudly(key: SealingKeyPair) -> None:
    """Five parts (four tables + dense) against S1's default of 4 open rounds per session."""
    specs = tuple(TableSpec(f"t{j}", 2) for j in range(4))
    model = {f"t{j}": np.ones((4, 2), np.float32) for j in range(4)}
    model["dense"] = np.ones(3, np.float32)
    tables = ModelTables(specs)
    private = PrivateTables(tables, rows=lambda ctx: {"t0": np.array([0])})
    app = ClientApp(mods=[private.mod])
    app.query("psr")(private.query)
    grid = InProcessGrid(
        app,
        2,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=lambda i: {"partition-id": i, "num-partitions": 2, NODE_MIN_NOISE_KEY: 0.0},
    )
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key), tables, dp=None, min_available_nodes=2
    )
    initial_arrays = ArrayRecord({k: Array(v) for k, v in model.items()})
    with pytest.raises(RunFailedError):
        strategy.start(grid=grid, initial_arrays=initial_arrays, num_rounds=2)
    assert set(strategy.failed_rounds) == {1, 2}
    # Round 2's parts are S1 rounds 6-10: the fifth cannot open; round 1's four were released.
    assert "rounds are open (limit 4)" in strategy.failed_rounds[2]
    assert "[6, 7, 8, 9]" in strategy.failed_rounds[2]


def test_derived_table_warning_is_capped_at_the_tables_rows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A client with 5 items can reach 15 genres by the map's fan-outs, but there are only 7:
    # max_rows 7 holds every client's genres (no warning); max_rows 4 does not, and the
    # warning names the reachable 7, not 15.
    import logging

    from flwr_fsl.families.ssa.mixed_strategy import MixedRounds

    assert spec(5, 7).worst_case_rows("genre") == 15
    model = initial()
    with caplog.at_level(logging.WARNING):
        MixedRounds(spec(5, 7), True, None).layouts(model)
    assert "derived rows can reach" not in caplog.text
    with caplog.at_level(logging.WARNING):
        MixedRounds(spec(5, 4), True, None).layouts(model)
    assert "table 'genre': a client's derived rows can reach 7 > max_rows 4" in caplog.text


@pytest.mark.parametrize(
    ("counts", "message"),
    [([1.0], "one count per row"), ([1.0, 0.0], r"counts must be finite, > 0")],
)
def test_private_rows_and_tables_check_rows_counts_alike(counts: list[float], message: str) -> None:
    # One check (flwr_fsl.submodel.tables.row_counts) of what rows() returns, one message.
    from flwr_fsl.families.ssa.index_mod import PrivateRows

    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    rows = PrivateRows("item", rows=lambda _c: (np.array([1, 2]), counts))
    tables = PrivateTables(spec(), rows=lambda _c: (np.array([1, 2]), counts))
    for call in (lambda: rows._rows(context), lambda: tables._client_rows(context)):
        with pytest.raises(ConfigurationError, match=f"table 'item': {message}"):
            call()
