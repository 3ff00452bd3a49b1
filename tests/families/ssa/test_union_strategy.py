"""``SecureRowFedSubAvg(union="psu")``: Cui's basic protocol through the Flower layer and S1.

PSU (``query.psu``, S1's ``PsuSum``) → PSR and SSA over the union's rows → one apply mapped
back. DP off on both ends so the result can equal the default round's exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.core.errors import ConfigurationError, RunFailedError
from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.index_mod import PrivateRows
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.families.ssa.union import NODE_ALLOW_UNION_KEY, PSU_UPLOAD_KEY
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.submodel.tables import ModelTables, TableSpec
from flwr_fsl.testing import InProcessGrid
from tests.families.ssa.test_index_strategy import (
    ROWS,
    TABLE,
    K,
    client_rows,
    expected_after,
    initial,
    row_delta,
)


def make_app(mods=()) -> ClientApp:  # type: ignore[no-untyped-def]
    def rows_fn(context: Context):  # type: ignore[no-untyped-def]
        pid = int(context.node_config["partition-id"])
        rnd = int(context.state.config_records["rnd"]["r"]) if "rnd" in context.state else 1
        return client_rows(pid, rnd, False)

    rows = PrivateRows("emb", rows=rows_fn)
    app = ClientApp(mods=[*mods, rows.mod])
    app.query("psr")(rows.query)
    app.query("psu")(rows.query_psu)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        table = msg.content["arrays"]["emb"].numpy()
        assert table.shape == (ROWS, TABLE.shape[1])  # the user's train sees the full table
        idx, _ = rows_fn(context)
        np.testing.assert_array_equal(table[idx], expected_rows(rnd)[idx])  # retrieved exactly
        table[idx] += row_delta(pid, rnd, idx).astype(np.float32)
        context.state["rnd"] = ConfigRecord({"r": rnd + 1})
        arrays = ArrayRecord({"emb": Array(table), "local": msg.content["arrays"]["local"]})
        return Message(
            RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 5})}),
            reply_to=msg,
        )

    return app


def expected_rows(rnd: int) -> np.ndarray:
    return TABLE if rnd == 1 else expected_after(rnd - 1, NODES, False).astype(np.float32)


NODES = 4
_LAST: list[SecureRowFedSubAvg] = []


def node_config(allow: bool = True):  # type: ignore[no-untyped-def]
    return lambda i: {
        "partition-id": i,
        "num-partitions": NODES,
        NODE_MIN_NOISE_KEY: 0.0,
        NODE_ALLOW_UNION_KEY: allow,
    }


@pytest.fixture(scope="module")
def key() -> SealingKeyPair:
    return SealingKeyPair.generate()


def _run(key, union="psu", rounds=2, mods=(), allow=True, helper=None):  # type: ignore[no-untyped-def]
    grid = InProcessGrid(
        make_app(mods),
        NODES,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=node_config(allow),
    )
    strategy = SecureRowFedSubAvg(
        helper or InProcessHelper(keypair=key),
        "emb",
        K,
        dp=None,
        frac_bits=32,
        max_abs=1e3,
        min_available_nodes=NODES,
        union=union,
    )
    _LAST[:] = [strategy]
    return strategy, strategy.start(grid=grid, initial_arrays=initial(), num_rounds=rounds)


def test_psu_rounds_equal_the_default_rounds(key: SealingKeyPair) -> None:
    strategy, result = _run(key, "psu")
    _, default = _run(key, "off")
    assert strategy.failed_rounds == {} and all(not d for d in strategy.dropped.values())
    np.testing.assert_allclose(
        result.arrays["emb"].numpy(), default.arrays["emb"].numpy(), atol=1e-6
    )
    np.testing.assert_allclose(
        result.arrays["emb"].numpy(), expected_after(2, NODES, False), atol=1e-6
    )
    np.testing.assert_array_equal(result.arrays["local"].numpy(), np.ones(2))


def test_psu_round_runs_psr_and_ssa_over_the_union_only(key: SealingKeyPair) -> None:
    helper = InProcessHelper(keypair=key)
    domains: list[int] = []
    set_model = helper.set_model

    def spy(round_id, table):  # type: ignore[no-untyped-def]
        domains.append(table.shape[0])  # S1 gets the union's rows only
        return set_model(round_id, table)

    helper.set_model = spy  # type: ignore[method-assign]
    _run(key, "psu", rounds=1, helper=helper)
    union = np.unique(np.concatenate([client_rows(p, 1, False)[0] for p in range(NODES)]))
    assert domains == [union.size] and union.size < ROWS


def test_malformed_psu_share_drops_that_client_others_exact(key: SealingKeyPair) -> None:
    def tamper(msg, context, call_next):  # type: ignore[no-untyped-def]
        reply = call_next(msg, context)
        if msg.metadata.message_type == "query.psu" and context.node_config["partition-id"] == 2:
            rec = reply.content[PSU_UPLOAD_KEY]
            rec["lead"] = rec["lead"][:-8]  # one word short
            return Message(reply.content, reply_to=msg)
        return reply

    strategy, result = _run(key, "psu", rounds=1, mods=(tamper,))
    (reason,) = strategy.dropped[1].values()
    assert "PSU share" in reason
    table = TABLE.astype(np.float64)
    num, den = np.zeros_like(table), np.zeros(ROWS)
    for pid in (0, 1, 3):
        idx, _ = client_rows(pid, 1, False)
        num[idx] += row_delta(pid, 1, idx).astype(np.float32)
        den[idx] += 1
    t = den > 0
    table[t] += num[t] / den[t, None]
    np.testing.assert_allclose(result.arrays["emb"].numpy(), table, atol=1e-6)


def test_tampered_sealed_seed_is_refused_by_s1_for_that_client(key: SealingKeyPair) -> None:
    def tamper(msg, context, call_next):  # type: ignore[no-untyped-def]
        reply = call_next(msg, context)
        if msg.metadata.message_type == "query.psu" and context.node_config["partition-id"] == 1:
            rec = reply.content[PSU_UPLOAD_KEY]
            sealed = bytearray(rec["sealed"])
            sealed[-1] ^= 1
            rec["sealed"] = bytes(sealed)
            return Message(reply.content, reply_to=msg)
        return reply

    strategy, _ = _run(key, "psu", rounds=1, mods=(tamper,))
    (reason,) = strategy.dropped[1].values()
    assert "S1 refused" in reason


def test_a_client_answers_psu_only_when_its_node_config_allows_it(key: SealingKeyPair) -> None:
    helper = InProcessHelper(keypair=key)
    with pytest.raises(RunFailedError):  # no client answers: no round produces a result
        _run(key, "psu", rounds=1, allow=False, helper=helper)
    strategy = _LAST[0]
    reasons = list(strategy.dropped[1].values())
    assert len(reasons) == NODES and all(NODE_ALLOW_UNION_KEY in r for r in reasons)


def test_union_option_is_validated() -> None:
    helper = InProcessHelper()
    with pytest.raises(ConfigurationError, match="union"):
        SecureRowFedSubAvg(helper, "emb", K, union="bloom")
    with pytest.raises(ConfigurationError, match="udpf"):
        SecureRowFedSubAvg(helper, "emb", K, union="psu", udpf=True)
    tables = ModelTables((TableSpec("a", 2), TableSpec("b", 2)))
    # Mixed rounds take union="psu" too (tests/families/ssa/test_mixed_union.py).
    assert SecureRowFedSubAvg(helper, tables, union="psu").union == "psu"
    assert SecureRowFedSubAvg(helper, "emb", K).union == "off"
