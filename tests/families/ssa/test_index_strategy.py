"""Index mode: PSR retrieval + SSA of rows + U-DPF through the Flower layer (in-process S1).

Index mode adds DP noise by default; the tests here that compare with the plaintext average turn
it off on both ends (``dp=None`` on S0, node config ``fsl-min-noise-multiplier = 0`` on the
clients, :func:`no_floor`), as a user who accepts the documented leak would.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.core.errors import ConfigurationError, RunFailedError
from flwr_fsl.core.privacy import NODE_MIN_NOISE_KEY
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.index_mod import PrivateRows
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.families.ssa.records import PSR_UPLOAD_KEY
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.testing import InProcessGrid

ROWS, WIDTH, K = 40, 3, 6
TABLE = np.random.default_rng(0).normal(size=(ROWS, WIDTH)).astype(np.float32)


def client_rows(pid: int, server_round: int, fixed: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([pid] if fixed else [pid, server_round])
    n = 3 + pid % 3
    return rng.choice(ROWS, n, replace=False), rng.integers(1, 4, size=n).astype(np.float64)


def row_delta(pid: int, server_round: int, rows: np.ndarray) -> np.ndarray:
    return np.random.default_rng([pid, server_round, 7]).normal(size=(rows.size, WIDTH))


def make_index_app(fixed_rows: bool, seen: dict | None = None, mods=()) -> ClientApp:  # type: ignore[no-untyped-def]
    def rows_fn(context: Context):  # type: ignore[no-untyped-def]
        pid = int(context.node_config["partition-id"])
        rnd = int(context.state.config_records["rnd"]["r"]) if "rnd" in context.state else 1
        return client_rows(pid, rnd, fixed_rows)

    rows = PrivateRows("emb", rows=rows_fn)
    app = ClientApp(mods=[*mods, rows.mod])
    app.query("psr")(rows.query)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        table = msg.content["arrays"]["emb"].numpy()
        idx, _ = rows_fn(context)
        if seen is not None:
            seen[(pid, rnd)] = (idx, table.copy())
        table[idx] += row_delta(pid, rnd, idx).astype(np.float32)
        outside = np.setdiff1d((idx + 1) % ROWS, idx)
        table[outside] += 100.0  # changes outside the submodel are never uploaded
        from flwr.app import ConfigRecord

        context.state["rnd"] = ConfigRecord({"r": rnd + 1})
        arrays = ArrayRecord({"emb": Array(table), "local": msg.content["arrays"]["local"]})
        return Message(
            RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 5})}),
            reply_to=msg,
        )

    return app


def no_floor(nodes: int):  # type: ignore[no-untyped-def]
    """Node configs of clients that accept rounds without DP noise (floor 0)."""
    return lambda i: {"partition-id": i, "num-partitions": nodes, NODE_MIN_NOISE_KEY: 0.0}


def initial() -> ArrayRecord:
    return ArrayRecord({"emb": Array(TABLE.copy()), "local": Array(np.ones(2, np.float32))})


def expected_after(rounds: int, nodes: int, fixed: bool, weighted: bool = False) -> np.ndarray:
    """Plaintext count-weighted rows: per-row counts (weighted) or 1 per client (unit weights)."""
    table = TABLE.astype(np.float64)
    for rnd in range(1, rounds + 1):
        num, den = np.zeros_like(table), np.zeros(ROWS)
        for pid in range(nodes):
            idx, counts = client_rows(pid, rnd, fixed)
            if not weighted:
                counts = np.ones_like(counts)
            num[idx] += counts[:, None] * row_delta(pid, rnd, idx).astype(np.float32)
            den[idx] += counts
        touched = den > 0
        table[touched] += num[touched] / den[touched, None]
        table = table.astype(np.float32).astype(np.float64)
    return table


@pytest.fixture(scope="module")
def key() -> SealingKeyPair:
    return SealingKeyPair.generate()


def _run(key, fixed, rounds=3, nodes=4, udpf=True, mods=(), seen=None, helper=None, weighted=False):  # type: ignore[no-untyped-def]
    grid = InProcessGrid(
        make_index_app(fixed, seen, mods),
        nodes,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=no_floor(nodes),
    )
    strategy = SecureRowFedSubAvg(
        helper or InProcessHelper(keypair=key),
        "emb",
        K,
        dp=None,  # exact averages: DP off on both ends
        udpf=udpf,
        frac_bits=32,
        max_abs=1e3,
        min_available_nodes=nodes,
        weighted=weighted,
    )
    return strategy, strategy.start(grid=grid, initial_arrays=initial(), num_rounds=rounds)


@pytest.mark.parametrize("weighted", [False, True], ids=["unit-weights", "per-row-counts"])
@pytest.mark.parametrize("fixed", [False, True])
def test_rows_average_equals_plaintext_count_weighted(
    key: SealingKeyPair, fixed: bool, weighted: bool
) -> None:
    strategy, result = _run(key, fixed, weighted=weighted)
    assert strategy.failed_rounds == {} and all(not d for d in strategy.dropped.values())
    expected = expected_after(3, 4, fixed, weighted)
    np.testing.assert_allclose(result.arrays["emb"].numpy(), expected, atol=1e-6)
    np.testing.assert_array_equal(result.arrays["local"].numpy(), np.ones(2))
    udpf = [result.train_metrics_clientapp[r]["udpf-clients"] for r in (1, 2, 3)]
    assert udpf == ([0, 4, 4] if fixed else [0, 0, 0])


def test_udpf_rounds_equal_fresh_key_rounds(key: SealingKeyPair) -> None:
    _, with_hints = _run(key, fixed=True, udpf=True)
    _, fresh = _run(key, fixed=True, udpf=False)
    np.testing.assert_allclose(
        with_hints.arrays["emb"].numpy(), fresh.arrays["emb"].numpy(), atol=1e-6
    )


def test_client_retrieves_exactly_its_rows_and_nothing_else(key: SealingKeyPair) -> None:
    seen: dict = {}
    _run(key, fixed=False, rounds=1, seen=seen)
    for (_, _), (idx, table) in seen.items():
        np.testing.assert_array_equal(table[idx], TABLE[idx])
        others = np.setdiff1d(np.arange(ROWS), idx)
        assert not np.any(table[others])


def _tamper_query(c: RecordDict) -> RecordDict:
    rec = c[PSR_UPLOAD_KEY]
    sealed = bytearray(rec["sealed"])  # type: ignore[arg-type]
    sealed[10] ^= 1
    rec["sealed"] = bytes(sealed)
    return c


def test_tampered_query_drops_only_that_client(key: SealingKeyPair) -> None:
    def tamper(msg, context, call_next):  # type: ignore[no-untyped-def]
        reply = call_next(msg, context)
        if msg.metadata.message_type == "query.psr" and context.node_config["partition-id"] == 2:
            return Message(_tamper_query(reply.content), reply_to=msg)
        return reply

    strategy, result = _run(key, fixed=False, rounds=1, mods=(tamper,))
    assert len(strategy.dropped[1]) == 1
    assert "S1" in next(iter(strategy.dropped[1].values()))
    # The other three clients' rows are averaged exactly.
    table = TABLE.astype(np.float64)
    num, den = np.zeros_like(table), np.zeros(ROWS)
    for pid in (0, 1, 3):
        idx, counts = client_rows(pid, 1, False)
        num[idx] += counts[:, None] * row_delta(pid, 1, idx).astype(np.float32)
        den[idx] += counts
    t = den > 0
    table[t] += num[t] / den[t, None]
    np.testing.assert_allclose(result.arrays["emb"].numpy(), table, atol=1e-6)


def test_helper_failure_leaves_the_table_unchanged(key: SealingKeyPair) -> None:
    helper = InProcessHelper(keypair=key)
    helper.public_key()
    strategy = SecureRowFedSubAvg(helper, "emb", K, min_available_nodes=2, fraction_evaluate=0.0)
    strategy._helper_key = key.public_bytes
    helper.close()
    grid = InProcessGrid(make_index_app(False), 2, {"ssa-helper-fingerprint": key.fingerprint})
    with pytest.raises(RunFailedError) as failed:  # no round produced a result
        strategy.start(grid=grid, initial_arrays=initial(), num_rounds=1)
    result = failed.value.result
    assert "HelperUnavailableError" in strategy.failed_rounds[1]
    np.testing.assert_array_equal(result.arrays["emb"].numpy(), TABLE)


def test_too_many_rows_is_a_client_error(key: SealingKeyPair) -> None:
    grid = InProcessGrid(make_index_app(False), 2, {"ssa-helper-fingerprint": key.fingerprint})
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        "emb",
        max_rows=2,
        min_available_nodes=2,
        fraction_evaluate=0.0,
    )
    with pytest.raises(RunFailedError) as failed:  # no round produced a result
        strategy.start(grid=grid, initial_arrays=initial(), num_rounds=1)
    result = failed.value.result
    assert all("k=2" in r for r in strategy.dropped[1].values())
    # Issue 8 item 4: Flower forwards the client's exception text to S0; it names only the
    # public k, never the client's row indices or how many rows it has.
    for reason in strategy.dropped[1].values():
        assert set(re.findall(r"\d+", reason)) <= {"2"}, reason
    np.testing.assert_array_equal(result.arrays["emb"].numpy(), TABLE)


def test_constructor_validation(key: SealingKeyPair) -> None:
    with pytest.raises(ConfigurationError, match="max_rows"):
        SecureRowFedSubAvg(InProcessHelper(keypair=key), "emb", 0)


def test_index_clients_refuse_a_weight_key_their_node_config_does_not_allow(
    key: SealingKeyPair,
) -> None:
    seen: dict = {}
    grid = InProcessGrid(make_index_app(True, seen), 3, {"ssa-helper-fingerprint": key.fingerprint})
    strategy = SecureRowFedSubAvg(
        InProcessHelper(keypair=key),
        "emb",
        K,
        min_available_nodes=3,
        weighted=True,
        weighted_by_key="train_loss",
    )
    with pytest.raises(RunFailedError) as failed:  # no round produced a result
        strategy.start(grid=grid, initial_arrays=initial(), num_rounds=1)
    result = failed.value.result
    assert not seen  # refused before the user's train ran
    reasons = list(strategy.dropped[1].values())
    assert len(reasons) == 3 and all("weight key 'train_loss'" in r for r in reasons), reasons
    np.testing.assert_array_equal(result.arrays["emb"].numpy(), TABLE)
    with pytest.raises(ConfigurationError, match="plaintext_evaluation"):
        SecureRowFedSubAvg(InProcessHelper(keypair=key), "emb", K, fraction_evaluate=0.5)


def test_plaintext_train_messages_pass_through(key: SealingKeyPair) -> None:
    grid = InProcessGrid(make_index_app(False), 1, {"ssa-helper-fingerprint": key.fingerprint})
    node = next(iter(grid.get_node_ids()))
    from flwr.app import ConfigRecord

    msg = Message(
        RecordDict({"arrays": initial(), "config": ConfigRecord({"server-round": 1})}),
        node,
        "train",
    )
    (reply,) = grid.send_and_receive([msg])
    assert not reply.has_error() and "arrays" in reply.content


def _lost_reply(node_index: int, server_round: int):  # type: ignore[no-untyped-def]
    """A mod that loses one node's train reply in one round (as if it went offline)."""

    def mod(msg: Message, context: Context, call_next):  # type: ignore[no-untyped-def]
        reply = call_next(msg, context)
        lost = (
            msg.metadata.message_type == "train"
            and int(context.node_config["partition-id"]) == node_index
            and int(msg.content["config"]["server-round"]) == server_round
        )
        if lost:
            raise RuntimeError("connection lost")  # the reply never reaches S0 as an upload
        return reply

    return mod


@pytest.mark.parametrize("lost_round", [1, 2])
def test_a_lost_reply_costs_one_round_of_fresh_keys_not_the_client(
    key: SealingKeyPair, lost_round: int
) -> None:
    # Issue 8 item 3: the client had already stored the keys of its lost upload. Before, it
    # then sent hints for keys the servers never got and was dropped for the rest of the run.
    # Now S0 announces what it holds, so the client sends fresh keys once and hints after.
    strategy, result = _run(key, fixed=True, rounds=4, mods=[_lost_reply(0, lost_round)])
    node0 = next(iter(InProcessGrid(make_index_app(True), 4).get_node_ids()))
    assert list(strategy.dropped[lost_round]) == [node0]
    later = [r for r in (1, 2, 3, 4) if r != lost_round]
    assert all(not strategy.dropped[r] for r in later) and strategy.failed_rounds == {}
    udpf = [result.train_metrics_clientapp[r]["udpf-clients"] for r in (1, 2, 3, 4)]
    # Round lost_round + 1: the three others hint, node 0 sends fresh keys; then all hint.
    expected = {1: [0, 3, 4, 4], 2: [0, 3, 3, 4]}[lost_round]
    assert udpf == expected


class _FailsFinishOnce:
    """S1 that fails round 1 at the very end (after every client uploaded its fresh keys)."""

    def __init__(self, inner: InProcessHelper) -> None:
        self.inner = inner

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)

    def finish_round(self, round_id: int):  # type: ignore[no-untyped-def]
        if round_id == 1:
            from flwr_fsl.helper import HelperUnavailableError

            raise HelperUnavailableError("S1 went away mid-round")
        return self.inner.finish_round(round_id)


def test_a_failed_first_round_does_not_exclude_anyone(key: SealingKeyPair) -> None:
    helper = _FailsFinishOnce(InProcessHelper(keypair=key))
    strategy, result = _run(key, fixed=True, rounds=3, helper=helper)
    assert list(strategy.failed_rounds) == [1]
    assert all(not strategy.dropped[r] for r in (2, 3))
    udpf = [result.train_metrics_clientapp[r]["udpf-clients"] for r in (2, 3)]
    assert udpf == [0, 4]  # round 2: everyone sends fresh keys again; round 3: hints


def test_two_strategies_share_one_helper_connection(key: SealingKeyPair) -> None:
    # Two arms of one experiment on one connection to S1 (as examples/recsys-movielens runs
    # them): each start() opens its own S1 session, so the second arm's round 1 is not refused
    # as "already opened", and each arm's result is exact. The first arm runs in the session
    # the connection had; S1 then holds one session (the connection closed the first arm's
    # when the second opened its own).
    helper = InProcessHelper(keypair=key)
    helper.open_session()  # as connect_helper does: the first start() runs in this session
    sessions = [helper.session_id]
    for _ in range(2):
        strategy, result = _run(key, fixed=True, helper=helper)
        sessions.append(helper.session_id)
        assert strategy.failed_rounds == {} and all(not d for d in strategy.dropped.values())
        np.testing.assert_allclose(
            result.arrays["emb"].numpy(), expected_after(3, 4, True), atol=1e-6
        )
        udpf = [result.train_metrics_clientapp[r]["udpf-clients"] for r in (1, 2, 3)]
        assert udpf == [0, 4, 4]
    assert sessions[0] == sessions[1] != sessions[2]
    assert helper.service.session_count() == 1


def test_a_strategy_started_twice_sends_fresh_keys_in_a_new_session(key: SealingKeyPair) -> None:
    # The second start() numbers its rounds from 1 again in a new S1 session: S0 forgot its
    # stored U-DPF keys with the old session, so the clients (which still hold theirs) are
    # told to send fresh keys in round 1 and hints again from round 2.
    nodes = 4
    grid = InProcessGrid(
        make_index_app(True),
        nodes,
        {"ssa-helper-fingerprint": key.fingerprint},
        node_config_fn=no_floor(nodes),
    )
    helper = InProcessHelper(keypair=key)
    strategy = SecureRowFedSubAvg(
        helper, "emb", K, dp=None, frac_bits=32, max_abs=1e3, min_available_nodes=nodes
    )
    for _ in range(2):
        result = strategy.start(grid=grid, initial_arrays=initial(), num_rounds=2)
        assert strategy.failed_rounds == {}
        udpf = [result.train_metrics_clientapp[r]["udpf-clients"] for r in (1, 2)]
        assert udpf == [0, 4]
    assert helper.service.session_count() == 1
