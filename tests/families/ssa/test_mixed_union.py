"""Mixed rounds with ``union="psu"``: one PSU per primary table, derived unions by the row map.

Two tables (``genre`` derived from ``item``) plus dense tensors; DP off on both ends so the
round can equal the default mixed round and the plaintext result exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.core.errors import ConfigurationError, RunFailedError
from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY, PrivacyAccount
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.dp import INDEX_MODE_DP
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.families.ssa.mixed import part_key
from flwr_fsl.families.ssa.mixed_mod import PrivateTables
from flwr_fsl.families.ssa.mixed_union import derive_unions, read_unions, union_fields
from flwr_fsl.families.ssa.union import (
    NODE_ALLOW_UNION_KEY,
    PSU_UPLOAD_KEY,
    UnionInputError,
    UnionRound,
)
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.submodel.tables import ModelTables
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.helper_process import HelperProcess
from tests.families.ssa.test_mixed import (
    GENRES,
    ITEMS,
    WIDTH_G,
    WIDTH_I,
    deltas,
    expected,
    expected_subset,
    initial,
    item_rows,
    spec,
)

NODES = 4
_LAST: list[SecureRowFedSubAvg] = []


def make_app(tables: ModelTables, mods: tuple[Any, ...] = (), weighted: bool = False) -> ClientApp:
    def rows_fn(context: Context) -> np.ndarray:
        pid = int(context.node_config["partition-id"])
        rnd = int(context.state.config_records["rnd"]["r"]) if "rnd" in context.state else 1
        return item_rows(pid, rnd, ITEMS, tables["item"].max_rows)

    def counted(context: Context) -> Any:
        rows = rows_fn(context)
        return rows, 1.0 + (rows % 3).astype(np.float64)  # per-row weights

    private = PrivateTables(tables, rows=counted if weighted else rows_fn)
    app = ClientApp(mods=[*mods, private.mod])
    app.query("psr")(private.query)
    app.query("psu")(private.query_psu)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        arrays = {k: v.numpy().copy() for k, v in msg.content["arrays"].items()}
        assert arrays["item"].shape == (ITEMS, WIDTH_I)  # full-shape tables
        assert arrays["genre"].shape == (GENRES, WIDTH_G)
        rows = tables.client_rows({"item": rows_fn(context)})
        genre = rows["genre"][: tables["genre"].max_rows]
        arrays["item"][rows["item"]] += deltas(pid, rnd, "item", (rows["item"].size, WIDTH_I))
        arrays["genre"][genre] += deltas(pid, rnd, "genre", (genre.size, WIDTH_G))
        for name in ("mlp.w", "mlp.b"):
            arrays[name] += deltas(pid, rnd, name, arrays[name].shape)
        context.state["rnd"] = ConfigRecord({"r": rnd + 1})
        reply = ArrayRecord({k: Array(v) for k, v in arrays.items()})
        return Message(
            RecordDict({"arrays": reply, "metrics": MetricRecord({"num-examples": 5})}),
            reply_to=msg,
        )

    return app


def run(
    key: SealingKeyPair,
    union: str = "psu",
    rounds: int = 2,
    mods: tuple[Any, ...] = (),
    allow: bool = True,
    helper: Any = None,
    **kw: Any,
) -> tuple[SecureRowFedSubAvg, Any]:
    tables, model = spec(), initial()
    grid = InProcessGrid(
        make_app(tables, mods, kw.get("weighted", False)),
        NODES,
        {"ssa-helper-fingerprint": kw.pop("fingerprint", key.fingerprint)},
        node_config_fn=lambda i: {
            "partition-id": i,
            "num-partitions": NODES,
            NODE_MIN_NOISE_KEY: 0.0,
            NODE_ALLOW_UNION_KEY: allow,
        },
    )
    settings: dict[str, Any] = {"dp": None, "frac_bits": 32, "max_abs": 1e3, **kw}
    strategy = SecureRowFedSubAvg(
        helper or InProcessHelper(keypair=key),
        tables,
        min_available_nodes=NODES,
        union=union,
        **settings,
    )
    _LAST[:] = [strategy]
    arrays = ArrayRecord({k: Array(v) for k, v in model.items()})
    return strategy, strategy.start(grid=grid, initial_arrays=arrays, num_rounds=rounds)


@pytest.fixture(scope="module")
def key() -> SealingKeyPair:
    return SealingKeyPair.generate()


def test_mixed_psu_equals_default_and_plaintext(key: SealingKeyPair) -> None:
    strategy, result = run(key, "psu")
    _, default = run(key, "off")
    assert strategy.failed_rounds == {} and all(not d for d in strategy.dropped.values())
    want = expected(initial(), spec(), 2, NODES)
    for name in ("item", "genre", "mlp.w", "mlp.b"):
        got = result.arrays[name].numpy()
        np.testing.assert_allclose(got, default.arrays[name].numpy(), atol=1e-6, err_msg=name)
        np.testing.assert_allclose(got, want[name], atol=1e-5, err_msg=name)
    np.testing.assert_array_equal(result.arrays["steps"].numpy(), [0])


def test_each_table_runs_over_its_union_derived_by_the_map(key: SealingKeyPair) -> None:
    helper = InProcessHelper(keypair=key)
    shapes: list[tuple[int, ...]] = []
    set_model = helper.set_model

    def spy(round_id, table):  # type: ignore[no-untyped-def]
        shapes.append(table.shape)  # S1 gets each table's union rows only
        return set_model(round_id, table)

    helper.set_model = spy  # type: ignore[method-assign]
    run(key, "psu", rounds=1, helper=helper)
    tables = spec()
    items = np.unique(np.concatenate([item_rows(p, 1) for p in range(NODES)]))
    genres = tables["genre"].row_map.derive(items)  # type: ignore[union-attr]
    assert shapes == [(items.size, WIDTH_I), (genres.size, WIDTH_G)]
    assert items.size < ITEMS


def test_weighted_rows_equal_the_default_round(key: SealingKeyPair) -> None:
    strategy, result = run(key, "psu", weighted=True)
    _, default = run(key, "off", weighted=True)
    assert strategy.failed_rounds == {} and all(not d for d in strategy.dropped.values())
    for name in ("item", "genre", "mlp.w", "mlp.b"):
        np.testing.assert_allclose(
            result.arrays[name].numpy(), default.arrays[name].numpy(), atol=1e-6, err_msg=name
        )


def test_through_a_real_helper_process_exact_and_with_dp(tmp_path: Path) -> None:
    """S1 as a real ``flwr-fsl-helper``: one ``PsuSum`` per primary table and round, exact
    without DP; with the default DP the run accounts as the default mixed round (3 parts)."""
    key_file = tmp_path / "s1.pem"
    keypair = SealingKeyPair.generate()
    keypair.save(key_file)
    with HelperProcess(key_file, tmp_path / "s1.log", state_dir=tmp_path / "state") as proc:
        pinned = {"fingerprint": proc.fingerprint, "helper_fingerprint": proc.fingerprint}
        strategy, result = run(keypair, "psu", helper=proc.client(timeout=60), **pinned)
        assert strategy.failed_rounds == {}
        want = expected(initial(), spec(), 2, NODES)
        for name in ("item", "genre", "mlp.w", "mlp.b"):
            np.testing.assert_allclose(result.arrays[name].numpy(), want[name], atol=1e-5)
        noisy, _ = run(
            keypair,
            "psu",
            helper=proc.client(timeout=60),
            dp=INDEX_MODE_DP,
            frac_bits=24,
            max_abs=1e4,
            **pinned,
        )
        assert noisy.failed_rounds == {} and sorted(noisy.rounds) == [1, 2]
        assert noisy.privacy_account.epsilon() == pytest.approx(
            PrivacyAccount(noise_multipliers=[1.0] * 6).epsilon(), rel=1e-6
        )


def test_malformed_psu_share_drops_that_client_only(key: SealingKeyPair) -> None:
    def tamper(msg: Message, context: Context, call_next: Any) -> Message:
        reply = call_next(msg, context)
        if msg.metadata.message_type == "query.psu" and context.node_config["partition-id"] == 2:
            record = reply.content[part_key(PSU_UPLOAD_KEY, 0)]
            record["lead"] = record["lead"][:-8]  # one word short
            return Message(reply.content, reply_to=msg)
        return reply

    strategy, result = run(key, "psu", rounds=1, mods=(tamper,))
    (reason,) = strategy.dropped[1].values()
    assert "PSU share" in reason
    want = expected_subset(initial(), spec(), [0, 1, 3])
    for name in ("item", "genre", "mlp.w", "mlp.b"):
        np.testing.assert_allclose(result.arrays[name].numpy(), want[name], atol=1e-5)


def test_client_refuses_without_opt_in(key: SealingKeyPair) -> None:
    with pytest.raises(RunFailedError):  # no client answers: no round produces a result
        run(key, "psu", rounds=1, allow=False)
    dropped = _LAST[0].dropped[1]
    assert len(dropped) == NODES
    assert all("fsl-allow-union" in r for r in dropped.values())


def test_constructor_accepts_mixed_psu_refuses_udpf(key: SealingKeyPair) -> None:
    helper = InProcessHelper(keypair=key)
    SecureRowFedSubAvg(helper, spec(), dp=None, union="psu")
    with pytest.raises(ConfigurationError, match="udpf"):
        SecureRowFedSubAvg(helper, spec(), dp=None, union="psu", udpf=True)


def test_derive_unions_and_fields_round_trip() -> None:
    tables = spec()
    items = UnionRound(ITEMS, np.array([1, 4, 9], np.int64))
    unions = derive_unions(tables, {"item": items}, {"item": ITEMS, "genre": GENRES})
    want = tables["genre"].row_map.derive([1, 4, 9])  # type: ignore[union-attr]
    np.testing.assert_array_equal(unions["genre"].union, want)
    back = read_unions(union_fields(unions), tables.names)
    assert back is not None
    for name in tables.names:
        np.testing.assert_array_equal(back[name].union, unions[name].union)
    empty = derive_unions(
        tables, {"item": UnionRound(ITEMS, np.zeros(0, np.int64))}, {"item": ITEMS, "genre": GENRES}
    )
    assert empty["item"].fallback and empty["item"].size == ITEMS
    assert read_unions({}, tables.names) is None
    bad = union_fields(unions)
    bad["fsl.mixed.unions"] = [bad["fsl.mixed.unions"][0], b"\x07" * 8]  # row 7 >= 7 genres
    with pytest.raises(UnionInputError):
        read_unions(bad, tables.names)
