"""U-DPF per table in mixed index-mode rounds: hints per table, exact results, per-part drops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.families.ssa.mixed import DENSE_PART, clamp_rows, part_hash_key, part_key, read_held
from flwr_fsl.families.ssa.mixed_mod import PrivateTables
from flwr_fsl.families.ssa.records import SSA_UPLOAD_KEY
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.submodel.tables import ModelTables
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.helper_process import HelperProcess
from tests.families.ssa.test_mixed import ITEMS, WIDTH_G, WIDTH_I, deltas, initial, spec

NODES = 4


def rows_of(pid: int, rnd: int) -> np.ndarray:
    """Fixed rows per client, except client 3 changes its items in round 3."""
    seed = [pid, 3] if pid == 3 and rnd >= 3 else [pid]
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(ITEMS, 2 + pid % 3, replace=False)).astype(np.int64)


def make_app(tables: ModelTables, log: list[tuple[int, int, str, bool]], mods: tuple = ()) -> Any:
    """The mixed client; ``log`` gets (round, client, part, hinted) of every train upload."""

    def rows_fn(context: Context) -> np.ndarray:
        rnd = int(context.state.config_records["rnd"]["r"]) if "rnd" in context.state else 1
        return rows_of(int(context.node_config["partition-id"]), rnd)

    def spy(msg: Message, context: Context, call_next: Any) -> Message:
        reply = call_next(msg, context)
        if msg.metadata.message_type == "train" and not reply.has_error():
            rnd = int(next(iter(msg.content.config_records.values()))["server-round"])
            pid = int(context.node_config["partition-id"])
            for i, name in enumerate(["item", "genre", DENSE_PART]):
                record = reply.content.config_records.get(part_key(SSA_UPLOAD_KEY, i))
                if record is not None:
                    log.append((rnd, pid, name, "hint" in record))
        return reply

    private = PrivateTables(tables, rows=rows_fn)
    app = ClientApp(mods=[*mods, spy, private.mod])
    app.query("psr")(private.query)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        arrays = {k: v.numpy().copy() for k, v in msg.content["arrays"].items()}
        rows = tables.client_rows({"item": rows_of(pid, rnd)})
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


def expected(
    model: dict[str, np.ndarray],
    tables: ModelTables,
    rounds: int,
    left_out: dict[tuple[int, str], set[int]] | None = None,
) -> dict[str, np.ndarray]:
    """Plaintext count-weighted result per part; ``left_out[(round, part)]``: clients dropped."""
    left_out = left_out or {}
    model = {k: v.copy() for k, v in model.items()}
    for rnd in range(1, rounds + 1):
        new = {k: v.astype(np.float64) for k, v in model.items()}
        for name in ("item", "genre"):
            num, den = np.zeros_like(new[name]), np.zeros(new[name].shape[0])
            for pid in set(range(NODES)) - left_out.get((rnd, name), set()):
                rows = tables.client_rows({"item": rows_of(pid, rnd)})[name]
                rows = clamp_rows(rows, None, tables[name].max_rows)[0]
                num[rows] += deltas(pid, rnd, name, (rows.size, new[name].shape[1]))
                den[rows] += 1
            hit = den > 0
            new[name][hit] += num[hit] / den[hit, None]
        for name in ("mlp.w", "mlp.b"):
            new[name] += (
                sum(
                    deltas(p, rnd, name, model[name].shape).astype(np.float64) for p in range(NODES)
                )
                / NODES
            )
        model = {k: new[k].astype(model[k].dtype) for k in model}
    return model


def grid_of(app: Any, fingerprint: str) -> InProcessGrid:
    return InProcessGrid(
        app,
        NODES,
        {"ssa-helper-fingerprint": fingerprint},
        node_config_fn=lambda i: {
            "partition-id": i,
            "num-partitions": NODES,
            NODE_MIN_NOISE_KEY: 0.0,
        },
    )


def start(strategy: SecureRowFedSubAvg, grid: InProcessGrid, rounds: int) -> Any:
    arrays = ArrayRecord({k: Array(v) for k, v in initial().items()})
    return strategy.start(grid=grid, initial_arrays=arrays, num_rounds=rounds)


def secure(helper: Any, tables: ModelTables, **kw: Any) -> SecureRowFedSubAvg:
    return SecureRowFedSubAvg(
        helper, tables, dp=None, frac_bits=32, max_abs=1e3, min_available_nodes=NODES, **kw
    )


@pytest.fixture(scope="module")
def key() -> SealingKeyPair:
    return SealingKeyPair.generate()


def hinted(log: list[tuple[int, int, str, bool]], rnd: int, part: str) -> set[int]:
    return {pid for r, pid, name, hint in log if r == rnd and name == part and hint}


def test_hints_per_table_over_three_rounds_equal_plaintext(key: SealingKeyPair) -> None:
    tables, log = spec(), []
    strategy = secure(InProcessHelper(keypair=key), tables)
    assert strategy.udpf  # the default, as in single-table rounds
    result = start(strategy, grid_of(make_app(tables, log), key.fingerprint), 3)
    assert strategy.failed_rounds == {} and all(not d for d in strategy.dropped.values())
    assert hinted(log, 1, "item") == set() and hinted(log, 1, "genre") == set()
    assert hinted(log, 2, "item") == hinted(log, 2, "genre") == set(range(NODES))
    # Client 3 changed its items in round 3: fresh keys for both of its tables (its genres
    # follow its items), hints from the others; the dense part is always fresh.
    assert hinted(log, 3, "item") == {0, 1, 2}
    assert hinted(log, 3, "genre") <= {0, 1, 2, 3} and 3 not in hinted(log, 3, "item")
    assert not any(hint for _, _, name, hint in log if name == DENSE_PART)
    want = expected(initial(), tables, 3)
    for name in ("item", "genre", "mlp.w", "mlp.b"):
        np.testing.assert_allclose(result.arrays[name].numpy(), want[name], atol=1e-5, err_msg=name)


def test_udpf_off_sends_fresh_keys_and_is_exact(key: SealingKeyPair) -> None:
    tables, log = spec(), []
    strategy = secure(InProcessHelper(keypair=key), tables, udpf=False)
    result = start(strategy, grid_of(make_app(tables, log), key.fingerprint), 2)
    assert strategy.failed_rounds == {} and not any(hint for *_, hint in log)
    want = expected(initial(), tables, 2)
    np.testing.assert_allclose(result.arrays["item"].numpy(), want["item"], atol=1e-5)


@pytest.mark.parametrize("attack", ["forged", "stale"])
def test_bad_hint_for_one_table_drops_that_client_there_only(
    key: SealingKeyPair, attack: str
) -> None:
    tables, log = spec(), []
    saved: dict[str, ConfigRecord] = {}

    def tamper(msg: Message, context: Context, call_next: Any) -> Message:
        reply = call_next(msg, context)
        if int(context.node_config["partition-id"]) != 1 or msg.metadata.message_type != "train":
            return reply
        rnd = int(next(iter(msg.content.config_records.values()))["server-round"])
        key_ = part_key(SSA_UPLOAD_KEY, 1)  # the genre table's upload
        record = reply.content.config_records[key_]
        if rnd == 2 and attack == "forged":
            hint = bytearray(record["hint"])  # type: ignore[arg-type]
            hint[-1] ^= 1
            record["hint"] = bytes(hint)
        if rnd == 2 and attack == "stale":
            saved["r2"] = ConfigRecord(dict(record))
        if rnd == 3 and attack == "stale":  # replays round 2's hint in round 3
            reply.content.config_records[key_] = saved["r2"]
        return reply

    bad = 2 if attack == "forged" else 3
    strategy = secure(InProcessHelper(keypair=key), tables)
    grid = grid_of(make_app(tables, log, mods=(tamper,)), key.fingerprint)
    result = start(strategy, grid, 4)
    assert strategy.failed_rounds == {}
    (reason,) = strategy.dropped[bad].values()  # client 1, from the genre part only
    assert ("altered in transit" if attack == "forged" else "for epoch 2, expected 3") in reason
    # Next round S0 announces no genre keys for client 1: it sends fresh keys and is back in.
    assert 1 not in hinted(log, bad + 1, "genre") and 1 in hinted(log, bad + 1, "item")
    assert all(not d for r, d in strategy.dropped.items() if r != bad)
    want = expected(initial(), tables, 4, {(bad, "genre"): {1}})
    for name in ("item", "genre", "mlp.w", "mlp.b"):
        np.testing.assert_allclose(result.arrays[name].numpy(), want[name], atol=1e-5, err_msg=name)


def test_tables_of_one_shape_get_their_own_layouts() -> None:
    run = bytes(16)
    assert part_hash_key(run, "a") != part_hash_key(run, "b")
    assert len(part_hash_key(run, "a")) == 16
    assert part_hash_key(run, "a") == part_hash_key(run, "a")


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.none(),
        st.integers(),
        st.binary(max_size=40),
        st.lists(st.one_of(st.binary(max_size=40), st.integers(), st.text(max_size=3)), max_size=4),
    ),
    st.integers(1, 3),
)
def test_read_held_is_strict(value: object, tables: int) -> None:
    try:
        out = read_held(value, tables)
    except ClientInputError:
        assert value is not None
        return
    assert len(out) == tables
    assert all(h is None or len(h) == 32 for h in out)
    if value is not None:
        assert isinstance(value, list) and [h or b"" for h in out] == value


def test_through_a_real_helper_process_with_hints(tmp_path: Path) -> None:
    """S1 as a real ``flwr-fsl-helper`` process stores each table's keys apart: exact."""
    key_file = tmp_path / "s1.pem"
    SealingKeyPair.generate().save(key_file)
    tables, log = spec(), []
    with HelperProcess(key_file, tmp_path / "s1.log", state_dir=tmp_path / "state") as proc:
        strategy = secure(proc.client(timeout=60), tables, helper_fingerprint=proc.fingerprint)
        result = start(strategy, grid_of(make_app(tables, log), proc.fingerprint), 3)
    assert strategy.failed_rounds == {}
    assert hinted(log, 2, "item") == hinted(log, 2, "genre") == set(range(NODES))
    want = expected(initial(), tables, 3)
    for name in ("item", "genre", "mlp.w", "mlp.b"):
        np.testing.assert_allclose(result.arrays[name].numpy(), want[name], atol=1e-5, err_msg=name)
