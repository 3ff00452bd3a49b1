"""SecAgg+'s sparse mask graph (``neighbours``): graph, formats, correctness, bounds."""

from __future__ import annotations

import math
import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError, TooFewSurvivorsError
from flwr_fsl.families.secagg import graph as graph_module
from flwr_fsl.families.secagg.graph import (
    check_neighbours,
    grinding_bound,
    harary,
    isolation_probability,
    round_threshold,
    split_bound,
    suggested_neighbours,
)
from flwr_fsl.families.secagg.masks import pair_mask, self_mask
from flwr_fsl.families.secagg.protocol import (
    SecAggClient,
    SecAggError,
    SecAggParams,
    SecAggServer,
    run_round,
)
from flwr_fsl.families.secagg.rounds import RoundOutcome
from flwr_fsl.families.secagg.strategy import SecAggFedAvg

U64 = np.uint64


def _inputs(n: int, m: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {10 + 7 * i: rng.integers(0, 2**63, m, dtype=U64) for i in range(n)}


def _connected(nodes: set[int], graph: dict[int, frozenset[int]]) -> bool:
    if not nodes:
        return True
    start = next(iter(nodes))
    seen, todo = {start}, [start]
    while todo:
        for v in graph[todo.pop()] & nodes:
            if v not in seen:
                seen.add(v)
                todo.append(v)
    return seen == nodes


# ------------------------------------------------------------------------------- the graph


@pytest.mark.parametrize(("n", "k"), [(5, 2), (12, 4), (40, 10), (41, 12)])
def test_harary_graph_is_k_regular_symmetric_and_k_connected(n: int, k: int) -> None:
    ids = list(range(100, 100 + n))
    graph = harary(ids, k, os.urandom(32))
    assert all(len(graph[u]) == k and u not in graph[u] for u in ids)
    assert all(u in graph[v] for u in ids for v in graph[u])
    rng = random.Random(1)
    for _ in range(20):  # k-connected: removing any k - 1 clients leaves it connected
        gone = set(rng.sample(ids, k - 1))
        assert _connected(set(ids) - gone, graph)


def test_graph_is_complete_without_neighbours_or_with_k_at_least_n_minus_1() -> None:
    ids = [3, 5, 9, 11]
    for k in (None, 4, 6):
        graph = harary(ids, k, b"s" * 32)
        assert all(graph[u] == frozenset(ids) - {u} for u in ids)


def test_graph_follows_the_roster_hash_and_every_party_agrees() -> None:
    params = SecAggParams(1, os.urandom(16), 2, 4, neighbours=2)
    clients = {u: SecAggClient(u, params) for u in range(1, 9)}
    server = SecAggServer(params)
    for u, c in clients.items():
        server.add_advertisement(u, c.advertise())
    roster = server.roster()
    for c in clients.values():
        c.share_keys(roster)
        assert c.neighbours() == server.graph[c.node]
    # Another roster (fresh keys: a grinding server's only lever) gives another ring order.
    orders = set()
    for _ in range(6):
        other = SecAggServer(params)
        for u in range(1, 9):
            other.add_advertisement(u, SecAggClient(u, params).advertise())
        other.roster()
        orders.add(tuple(sorted((u, tuple(sorted(n))) for u, n in other.graph.items())))
    assert len(orders) > 1


# ------------------------------------------------------------------------------- settings


def test_params_without_neighbours_keep_version_1_bytes_and_v2_round_trips() -> None:
    session = bytes(range(16))
    v1 = SecAggParams(2, session, 3, 10)
    assert v1.to_bytes()[4] == 1 and len(v1.to_bytes()) == 41
    v2 = SecAggParams(2, session, 3, 10, neighbours=4)
    raw = v2.to_bytes()
    assert raw[4] == 2 and raw[:4] == v1.to_bytes()[:4] and len(raw) == 45
    assert SecAggParams.from_bytes(raw) == v2
    assert v1.digest != v2.digest  # the graph setting is bound into every mask and share
    with pytest.raises(SecAggError):
        SecAggParams.from_bytes(raw[:4] + b"\x01" + raw[5:])  # v1 header, v2 length
    with pytest.raises(SecAggError):
        SecAggParams.from_bytes(raw[:-4] + (3).to_bytes(4, "little"))  # odd neighbours


def test_client_state_round_trips_with_neighbours() -> None:
    params = SecAggParams(1, os.urandom(16), 2, 4, neighbours=2)
    outcome = run_round(_inputs(6, 4), params, persist=True)
    assert outcome.total is not None
    c = next(iter(outcome.clients.values()))
    assert SecAggClient.from_bytes(c.to_bytes()).params == params


@pytest.mark.parametrize(
    ("k", "t", "match"),
    [(3, None, "even"), (0, None, "neighbours"), (True, None, "neighbours"),
     ("4", None, "neighbours"), (4, 5, "reconstruction_threshold")],
)  # fmt: skip
def test_neighbours_are_validated_naming_the_key(k: object, t: int | None, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        check_neighbours(k, t)
    kwargs = {} if t is None else {"reconstruction_threshold": t}
    with pytest.raises(ConfigurationError, match=match):
        SecAggFedAvg(neighbours=k, **kwargs)  # type: ignore[arg-type]


def test_round_threshold_counts_over_the_neighbourhood() -> None:
    assert round_threshold(0.6, 1000, 20) == (13, 20)  # Flower: 0.6 * num_shares (21)
    assert round_threshold(0.6, 10, 20) == (6, None)  # complete graph: v1 parameters
    assert round_threshold(1.0, 1000, 4) == (4, 4)  # never above k
    assert round_threshold(3, 1000, 4) == (3, 4)
    assert suggested_neighbours(1000) == 20 and suggested_neighbours(3) == 2


# ------------------------------------------------------------------------------- correctness


def _expect_ok(
    n_ids: list[int], graph: dict[int, frozenset[int]], t: int, drops: dict[str, set[int]]
) -> bool:
    everyone = set(n_ids)
    u2 = everyone - drops["share"]
    u3 = u2 - drops["mask"]
    u4 = u3 - drops["unmask"]
    if len(u2) < t or len(u3) < t:
        return False
    hood = {u: graph[u] | {u} for u in n_ids}
    if any(len(hood[u] & u2) < t for u in u3):
        return False  # a client refuses to mask with too few neighbours in U2
    if any(len(hood[u] & u3) < t for u in u4):
        return False  # ... or to unmask with too few in U3
    return all(len(hood[v] & u4) >= t for v in u2)


def _round(
    n: int, k: int, t: int, seed: int, drops: dict[str, set[int]]
) -> tuple[dict[int, np.ndarray], dict[int, frozenset[int]], object]:
    """Run one round whose ring order is fixed by ``seed`` (so a failure can be predicted)."""
    inputs = _inputs(n, 6, seed)
    graph = harary(list(inputs), k, seed.to_bytes(32, "little"))
    params = SecAggParams(1, os.urandom(16), t, 6, neighbours=k)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(graph_module, "graph_seed", lambda *_: seed.to_bytes(32, "little"))
        try:
            return inputs, graph, run_round(inputs, params, dropouts=drops)
        except (SecAggError, TooFewSurvivorsError) as err:
            return inputs, graph, err


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(4, 14),
    half=st.integers(1, 3),
    t_frac=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
    rates=st.tuples(*(st.floats(0.0, 0.3) for _ in range(3))),
)
def test_reconstruction_equals_the_plaintext_sum_over_survivors_or_fails_as_predicted(
    n: int, half: int, t_frac: float, seed: int, rates: tuple[float, float, float]
) -> None:
    k = 2 * half
    t = 2 + round(t_frac * (k - 2))
    rng = random.Random(seed)
    ids = [10 + 7 * i for i in range(n)]
    phases = ("share", "mask", "unmask")
    drops = {p: {u for u in ids if rng.random() < r} for p, r in zip(phases, rates, strict=True)}
    inputs, graph, outcome = _round(n, k, t, seed, drops)
    ok = _expect_ok(ids, graph, t, drops)
    assert ok == isinstance(outcome, RoundOutcome), (ok, outcome)
    if isinstance(outcome, RoundOutcome):
        assert dict(outcome.server.graph) == graph
        expected = sum((inputs[u] for u in outcome.survivors), np.zeros(6, U64))
        assert set(outcome.survivors) == set(ids) - drops["share"] - drops["mask"]
        np.testing.assert_array_equal(outcome.total, expected)


def test_a_dropped_client_is_recovered_from_its_neighbours_and_nobody_else() -> None:
    n, k, t = 16, 4, 3
    params = SecAggParams(1, os.urandom(16), t, 8, neighbours=k)
    inputs = _inputs(n, 8)
    first = run_round(inputs, params)  # learn nothing: another round draws other keys
    assert first.total is not None
    victim = next(iter(inputs))
    outcome = run_round(inputs, params, dropouts={"mask": {victim}})
    expected = sum((inputs[u] for u in outcome.survivors), np.zeros(8, U64))
    np.testing.assert_array_equal(outcome.total, expected)
    shares_of_victim = set(outcome.server._shares[victim])
    assert shares_of_victim <= outcome.server.graph[victim]
    assert len(shares_of_victim) >= t


def test_masks_exist_only_between_neighbours() -> None:
    params = SecAggParams(1, os.urandom(16), 2, 8, neighbours=2)
    inputs = _inputs(9, 8)
    outcome = run_round(inputs, params)
    graph = outcome.server.graph
    for u, client in outcome.clients.items():
        residue = outcome.masked[u] - inputs[u] - self_mask(params, client.seed)
        for v in graph[u]:
            mask = pair_mask(
                params, client.s_key.private_key, outcome.clients[v].s_key.public_bytes,
                min(u, v), max(u, v),
            )  # fmt: skip
            residue = residue - mask if u < v else residue + mask
        assert not residue.any()


def test_a_client_whose_neighbours_all_dropped_refuses_to_unmask() -> None:
    # Its b_u would otherwise unmask x_u: y_u = x_u + PRG(b_u) + removable masks only.
    params = SecAggParams(1, os.urandom(16), 2, 4, neighbours=2)
    clients = {u: SecAggClient(u, params) for u in range(1, 8)}
    server = SecAggServer(params)
    for u, c in clients.items():
        server.add_advertisement(u, c.advertise())
    roster = server.roster()
    for u, c in clients.items():
        server.add_shares(u, c.share_keys(roster))
    u2 = server.sharers()
    victim = 1
    gone = server.graph[victim]
    for u, c in clients.items():
        if u not in gone:
            server.add_masked_input(u, c.masked_input(u2, np.ones(4, U64)))
    with pytest.raises(SecAggError, match="neighbourhood"):
        clients[victim].unmask(server.unmask_request(victim))


def test_subset_rounds_refuse_a_sparse_graph() -> None:
    params = SecAggParams(1, os.urandom(16), 2, 8, neighbours=2)
    rows = {u: np.arange(4, dtype=np.int64) for u in _inputs(6, 1)}
    with pytest.raises(SecAggError, match="complete mask graph"):
        run_round({u: np.ones(4, U64) for u in rows}, params, rows=rows)


# ------------------------------------------------------------------------------- bounds


def test_isolation_probability_matches_random_ring_orders() -> None:
    n, k, bad = 12, 2, 4
    ids = list(range(n))
    adversarial = set(range(1, 1 + bad))  # victim 0
    # Fixed, distinct seeds (SHA-256 inside harary makes the ring orders independent): the
    # 4-sigma check would fail about 1 run in 16,000 on os.urandom seeds (z = +0.54 here).
    hits = sum(harary(ids, k, i.to_bytes(32, "big"))[0] <= adversarial for i in range(4000))
    exact = isolation_probability(n, k, bad)
    assert exact == pytest.approx(math.comb(4, 2) / math.comb(11, 2))
    assert abs(hits / 4000 - exact) < 4 * math.sqrt(exact * (1 - exact) / 4000)


def test_the_bounds_at_the_target_scale() -> None:
    k = suggested_neighbours(1000)
    assert isolation_probability(1000, k, 333) < 1e-9
    # A server that inserts a third of sybils and grinds their keys: at Bell et al.'s k = 20 a
    # million rosters give it about a 14% chance to isolate some honest client; k = 46 (about
    # 4.6 log2 n) pushes 2^40 tries below 2^-20.
    assert 0.1 < grinding_bound(1000, k, 333, tries=2**20) < 0.2
    assert grinding_bound(1000, 46, 333, tries=2**40) < 2**-20
    assert isolation_probability(1000, 2, 333) == pytest.approx(1 / 9, rel=0.01)
    assert split_bound(1000, k, 0.1) < 1e-13
