"""The §III reconstruction attack (Sami & Güler, Eq. 11–16) on real one-step MNIST training.

Naive pipeline (per-parameter secure aggregation, index sets known): the attack recovers every
client's input exactly and attributes it, also through a real SecAgg subset round. Under SESA
(per-shard sums, no index sets): with two or more contributors on every shard the shard ratio
is a mixture, not any client's x; a shard with one contributor, and with ReLU a unit active for
only one contributor, still give that (unattributed) contributor's x — the known leaks.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.families.secagg.protocol import SecAggClient, SecAggParams, SecAggServer
from flwr_fsl.research.sesa_attack import (
    ClientUpdate,
    GlobalMLP,
    NaiveView,
    ShardView,
    activate,
    attack_exclusive,
    attack_peel,
    attack_shards,
    consensus_inputs,
    least_squares_input,
    naive_view,
    nearest_input,
    nodes_of_shards,
    relative_error,
    sesa_view,
    subtract_known,
)
from tests.prepared_data import require_prepared

M, C = 784, 10
EXACT = 1e-9  # float64 training: the attack is exact up to rounding

# ---------------------------------------------------------------- real one-step training


ACT = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh}


class SubMLP(nn.Module):
    """The width-extracted submodel a client trains: hidden nodes ``nodes`` of 784-H-10."""

    def __init__(self, glob: GlobalMLP, out_bias: np.ndarray, nodes: np.ndarray) -> None:
        super().__init__()
        self.fc1 = nn.Linear(M, len(nodes)).double()
        self.fc2 = nn.Linear(len(nodes), C).double()
        self.act = ACT[glob.activation]
        with torch.no_grad():
            self.fc1.weight.copy_(torch.from_numpy(glob.weight[nodes]))
            self.fc1.bias.copy_(torch.from_numpy(glob.bias[nodes]))
            self.fc2.weight.copy_(torch.from_numpy(glob.out_weight[:, nodes]))
            self.fc2.bias.copy_(torch.from_numpy(out_bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def global_model(hidden: int, activation: str, seed: int = 0) -> tuple[GlobalMLP, np.ndarray]:
    """A freshly initialized 784-hidden-10 MLP (torch's default init), float64."""
    torch.manual_seed(seed)
    fc1, fc2 = nn.Linear(M, hidden).double(), nn.Linear(hidden, C).double()
    glob = GlobalMLP(
        fc1.weight.detach().numpy(),
        fc1.bias.detach().numpy(),
        fc2.weight.detach().numpy(),
        activation,
    )
    return glob, fc2.bias.detach().numpy().copy()


def local_step(
    glob: GlobalMLP,
    out_bias: np.ndarray,
    nodes: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    lr: float = 0.1,
) -> ClientUpdate:
    """One SGD step on the submodel (mean cross-entropy of the batch); the upload after - before."""
    net = SubMLP(glob, out_bias, np.asarray(nodes))
    before = [p.detach().clone() for p in net.parameters()]
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    xb = torch.from_numpy(np.asarray(x, dtype=np.float64).reshape(-1, M))
    loss = F.cross_entropy(net(xb), torch.from_numpy(np.asarray(y, dtype=np.int64).reshape(-1)))
    loss.backward()
    opt.step()
    w1, b1, w2, b2 = (
        (p.detach() - b).numpy() for p, b in zip(net.parameters(), before, strict=True)
    )
    return ClientUpdate(np.asarray(nodes), w1, b1, w2, b2)


@pytest.fixture(scope="module")
def mnist() -> tuple[np.ndarray, np.ndarray]:
    """Real MNIST training images (flattened, float64) and labels."""
    require_prepared("mnist")
    from flwr_fsl.data import load_mnist

    x_train, y_train, _, _ = load_mnist()
    return x_train.reshape(-1, M).astype(np.float64), y_train


def samples(mnist: tuple[np.ndarray, np.ndarray], n: int, seed: int) -> tuple[np.ndarray, ...]:
    idx = np.random.default_rng(seed).choice(len(mnist[1]), n, replace=False)
    return mnist[0][idx], mnist[1][idx]


# ---------------------------------------------------------------- the naive pipeline


def test_paper_example_fig1_recovers_both_clients(mnist) -> None:  # type: ignore[no-untyped-def]
    # Fig. 1: N = 2, B = (1/4, 1/2), a layer of 4 nodes; user 1 trains n1, user 2 n1 and n2.
    glob, c = global_model(4, "sigmoid")
    x, y = samples(mnist, 2, seed=1)
    updates = {
        1: local_step(glob, c, np.array([0]), x[0], y[0]),
        2: local_step(glob, c, np.array([0, 1]), x[1], y[1]),
    }
    view = naive_view(updates, hidden=4)
    assert view.holders[:2] == (frozenset({1, 2}), frozenset({2}))

    # Eq. 14 at n2, held by user 2 alone; user 1 has no node of its own.
    exclusive = attack_exclusive(view)
    assert set(exclusive) == {2}
    assert relative_error(exclusive[2].x, x[1]) < EXACT
    assert exclusive[2].nodes.tolist() == [1]

    # Eq. 15-16: subtract user 2's (recomputed) gradient at n1 and recover user 1.
    peeled = attack_peel(view, glob)
    assert peeled[2].method == "exclusive" and peeled[1].method == "peeled"
    assert peeled[1].nodes.tolist() == [0]
    for client, true_x in ((1, x[0]), (2, x[1])):
        assert relative_error(peeled[client].x, true_x) < EXACT
        assert nearest_input(peeled[client].x, {1: x[0], 2: x[1]})[0] == client  # attributed


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh"])
def test_nested_width_extraction_leaks_every_client(mnist, activation: str) -> None:  # type: ignore[no-untyped-def]
    # The paper's capacities at MLP 784-200-10 with HeteroFL's prefix (= FedRolex's common
    # window): index sets nested, so only the widest client has nodes of its own.
    glob, c = global_model(200, activation, seed=2)
    x, y = samples(mnist, 3, seed=3)
    widths = {1: 50, 2: 100, 3: 200}
    updates = {u: local_step(glob, c, np.arange(w), x[u - 1], y[u - 1]) for u, w in widths.items()}
    view = naive_view(updates, hidden=200)
    assert set(attack_exclusive(view)) == {3}
    found = attack_peel(view, glob)
    assert set(found) == {1, 2, 3}
    for u in widths:
        assert found[u].client == u
        assert relative_error(found[u].x, x[u - 1]) < 1e-8
        assert found[u].residual < 1e-8


def test_random_extraction_exclusive_nodes_attribute_each_input(mnist) -> None:  # type: ignore[no-untyped-def]
    glob, c = global_model(200, "relu", seed=4)
    rng = np.random.default_rng(5)
    x, y = samples(mnist, 6, seed=6)
    widths = [50, 50, 100, 100, 200, 50]
    updates = {
        u: local_step(glob, c, np.sort(rng.choice(200, w, replace=False)), x[u], y[u])
        for u, w in enumerate(widths)
    }
    view = naive_view(updates, hidden=200)
    truth = {u: x[u] for u in updates}
    found = attack_peel(view, glob)
    assert found  # with six clients some hold nodes alone
    for u, rec in found.items():
        assert rec.client == u and nearest_input(rec.x, truth) == (u, pytest.approx(0, abs=1e-8))
    exclusive = attack_exclusive(view)
    for u, rec in exclusive.items():
        assert all(view.holders[n] == {u} for n in rec.nodes)
        assert relative_error(rec.x, x[u]) < 1e-8


# Three clients, no node held by one client alone: {A, C}, {A, B}, {B, C} share the blocks.
OVERLAPPING = {
    1: np.arange(0, 100),
    2: np.arange(50, 150),
    3: np.concatenate([np.arange(0, 50), np.arange(100, 150)]),
}


def test_without_exclusive_nodes_relu_isolation_attributes_and_peels(mnist) -> None:  # type: ignore[no-untyped-def]
    glob, c = global_model(200, "relu", seed=12)
    x, y = samples(mnist, 3, seed=13)
    updates = {u: local_step(glob, c, n, x[u - 1], y[u - 1]) for u, n in OVERLAPPING.items()}
    view = naive_view(updates, hidden=200)
    assert attack_exclusive(view) == {}
    assert attack_peel(view, glob, isolate=False) == {}  # Eq. 14-16 alone have no start
    found = attack_peel(view, glob)
    assert set(found) == {1, 2, 3}
    assert "isolated" in {r.method for r in found.values()}
    for u, rec in found.items():
        assert relative_error(rec.x, x[u - 1]) < 1e-8


def test_without_exclusive_nodes_smooth_activation_leaves_nothing(mnist) -> None:  # type: ignore[no-untyped-def]
    # Every unit active for every example: no node isolates anybody, and nobody holds a node
    # alone, so the closed-form attacks have no start (the honest limit of Eq. 11-16).
    glob, c = global_model(200, "sigmoid", seed=12)
    x, y = samples(mnist, 3, seed=13)
    updates = {u: local_step(glob, c, n, x[u - 1], y[u - 1]) for u, n in OVERLAPPING.items()}
    view = naive_view(updates, hidden=200)
    assert attack_peel(view, glob) == {}
    assert consensus_inputs(view.weight_sum, view.bias_sum) == []


def test_identical_index_sets_leak_inputs_but_not_whose(mnist) -> None:  # type: ignore[no-untyped-def]
    # Two full-width clients: every node has both as holders.
    glob, c = global_model(200, "relu", seed=14)
    x, y = samples(mnist, 2, seed=15)
    updates = {u: local_step(glob, c, np.arange(200), x[u], y[u]) for u in (0, 1)}
    view = naive_view(updates, hidden=200)
    assert attack_peel(view, glob) == {}  # never attributed
    found = consensus_inputs(view.weight_sum, view.bias_sum)
    assert {nearest_input(r.x, {0: x[0], 1: x[1]})[0] for r in found} == {0, 1}
    assert all(nearest_input(r.x, {0: x[0], 1: x[1]})[1] < 1e-8 for r in found)


def _secagg_subset_sum(
    rows: dict[int, np.ndarray], vectors: dict[int, np.ndarray], length: int
) -> tuple[np.ndarray, SecAggServer]:
    """One Bonawitz subset round (each position summed over its holders), no dropouts."""
    params = SecAggParams(1, os.urandom(16), 2, length)
    clients = {u: SecAggClient(u, params) for u in rows}
    server = SecAggServer(params)
    for u, cl in clients.items():
        server.add_advertisement(u, cl.advertise())
    roster = server.roster()
    for u, cl in clients.items():
        server.add_shares(u, cl.share_keys(roster))
    u2 = server.sharers()
    shared = server.assign_rows({u: rows[u] for u in u2})
    for u in u2:
        masked = clients[u].masked_input(u2, vectors[u], rows=rows[u], shared_rows=shared[u])
        server.add_masked_input(u, masked)
    for u in server.survivors:
        server.add_unmask(u, clients[u].unmask(server.unmask_request(u)))
    return server.result(), server


def test_real_secagg_subset_round_gives_the_server_the_same_leak(mnist) -> None:  # type: ignore[no-untyped-def]
    # Per-parameter SecAgg (the project's Bonawitz subset rounds, Niu's count-weighted
    # aggregation): each parameter summed over the clients that hold it. Layout: node n's
    # block is [W row (784), z_n, V[:, n] (10)], then the output bias c held by everybody.
    hidden, block = 200, M + 1 + C
    glob, c = global_model(hidden, "relu", seed=7)
    x, y = samples(mnist, 2, seed=8)
    updates = {
        11: local_step(glob, c, np.arange(50), x[0], y[0]),
        12: local_step(glob, c, np.arange(100), x[1], y[1]),
    }
    length = hidden * block + C
    fp = FixedPoint(frac_bits=40, max_abs=1.0, max_summands=2)
    rng = np.random.default_rng(9)
    rows, vectors = {}, {}
    for u, up in updates.items():
        assert up.out_weight is not None and up.out_bias is not None
        blocks = np.concatenate([up.weight, up.bias[:, None], up.out_weight.T], axis=1)
        rows[u] = np.concatenate(
            [(up.nodes[:, None] * block + np.arange(block)).ravel(), hidden * block + np.arange(C)]
        )
        vectors[u] = fp.encode(np.concatenate([blocks.ravel(), up.out_bias]), rng)
    total, server = _secagg_subset_sum(rows, vectors, length)
    sums = fp.decode(total)
    dense = sums[: hidden * block].reshape(hidden, block)
    # The server knows who holds which position (it assigned the rows).
    holders = tuple(
        frozenset(u for u in rows if server.rows_of(u) is not None and n * block in rows[u])
        for n in range(hidden)
    )
    view = NaiveView(
        dense[:, :M], dense[:, M], holders, frozenset(rows), dense[:, M + 1 :].T, sums[-C:]
    )
    plain = naive_view(updates, hidden)
    assert np.max(np.abs(view.weight_sum - plain.weight_sum)) < 2**-38  # fixed-point rounding
    found = attack_peel(view, glob)
    assert set(found) == {11, 12}
    assert relative_error(found[12].x, x[1]) < 1e-6  # exclusive nodes
    assert relative_error(found[11].x, x[0]) < 1e-4  # peeled through the recomputed gradient


# ---------------------------------------------------------------- batches


def test_batch_ratio_is_the_gradient_weighted_mean(mnist) -> None:  # type: ignore[no-untyped-def]
    glob, c = global_model(200, "relu", seed=10)
    xb, yb = samples(mnist, 8, seed=11)
    nodes = np.arange(200)
    batch = local_step(glob, c, nodes, xb, yb, lr=0.1)
    # Per-example gradients at the same model: the batch's update is their mean.
    single = [local_step(glob, c, nodes, xb[s], yb[s], lr=0.1) for s in range(8)]
    a = np.stack([u.bias for u in single])  # (B, H): a_{s,n} up to -lr
    np.testing.assert_allclose(batch.bias, a.mean(axis=0), rtol=1e-10, atol=1e-15)
    active = np.flatnonzero(np.abs(batch.bias) > 1e-9 * np.abs(batch.bias).max())
    ratio = batch.weight[active] / batch.bias[active, None]
    expected = (a[:, active].T @ xb) / a[:, active].sum(axis=0)[:, None]
    np.testing.assert_allclose(ratio, expected, rtol=1e-6, atol=1e-9)

    # The least-squares ratio over all nodes is a mixture: far from every example.
    mixture, residual = least_squares_input(batch.weight[active], batch.bias[active])
    assert residual > 0.1
    assert min(relative_error(mixture, xb[s]) for s in range(8)) > 0.2
    # ReLU: where one example alone is active, the ratio is that example exactly.
    isolated = (a != 0).sum(axis=0) == 1
    for n in np.flatnonzero(isolated):
        s = int(np.flatnonzero(a[:, n])[0])
        assert relative_error(batch.weight[n] / batch.bias[n], xb[s]) < 1e-8
    found = consensus_inputs(batch.weight, batch.bias)
    truth = {s: xb[s] for s in range(8)}
    assert found, "with 8 examples and 200 ReLU units some example is isolated twice"
    for rec in found:  # no false positive: every agreed input is an example of the batch
        assert nearest_input(rec.x, truth)[1] < 1e-8


# ---------------------------------------------------------------- under SESA


def _sesa_round(mnist, activation: str, shards: dict[int, list[int]], seed: int):  # type: ignore[no-untyped-def]
    hidden, k = 200, 4
    glob, c = global_model(hidden, activation, seed=seed)
    x, y = samples(mnist, len(shards), seed=seed + 1)
    updates = {
        u: local_step(glob, c, nodes_of_shards(s, hidden, k), x[i], y[i])
        for i, (u, s) in enumerate(shards.items())
    }
    truth = {u: x[i] for i, u in enumerate(shards)}
    return updates, truth


# Every shard chosen by exactly two of four clients (B = 1/2 each, K = 4).
TWO_PER_SHARD = {1: [0, 1], 2: [1, 2], 3: [2, 3], 4: [3, 0]}


@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu"])
def test_sesa_two_contributors_per_shard_ratio_is_a_mixture(mnist, activation: str) -> None:  # type: ignore[no-untyped-def]
    updates, truth = _sesa_round(mnist, activation, TWO_PER_SHARD, seed=20)
    view = sesa_view(updates.values(), 200, 4)
    assert view.counts is not None and view.counts.tolist() == [2, 2, 2, 2]
    for finding in attack_shards(view):
        assert finding.mixture is not None and not finding.single_source
        assert finding.residual > 0.05
        # The paper's ratio on a shard sum is far from every client's input.
        assert nearest_input(finding.mixture, truth)[1] > 0.2
        if activation != "relu":  # every unit active for both: no node isolates anybody
            assert finding.recovered == ()


def test_sesa_relu_unit_active_for_one_contributor_still_leaks(mnist) -> None:  # type: ignore[no-untyped-def]
    # Known leak: with ReLU, a node where only one contributor's unit is active gives that
    # contributor's x exactly, and two such nodes agree — no index set needed.
    updates, truth = _sesa_round(mnist, "relu", TWO_PER_SHARD, seed=20)
    findings = attack_shards(sesa_view(updates.values(), 200, 4, reveal_counts=False))
    recovered = [r for f in findings for r in f.recovered]
    assert recovered
    hits = set()
    for rec in recovered:
        assert rec.client is None  # SESA hides whose input it is
        who, error = nearest_input(rec.x, truth)
        assert error < 1e-8  # no false positive: an exact input or nothing
        hits.add(who)
    assert len(hits) >= 2


def test_sesa_single_contributor_shard_is_a_known_leak(mnist) -> None:  # type: ignore[no-untyped-def]
    # Shard 3 is chosen by client 3 alone; the others have two contributors.
    shards = {1: [0, 1], 2: [0, 1, 2], 3: [2, 3]}
    updates, truth = _sesa_round(mnist, "sigmoid", shards, seed=30)
    for counts in (True, False):
        findings = attack_shards(sesa_view(updates.values(), 200, 4, reveal_counts=counts))
        alone = findings[3]
        assert alone.contributors == (1 if counts else None)
        assert alone.single_source  # detectable without counts: the rows are rank one
        assert alone.mixture is not None
        assert nearest_input(alone.mixture, truth) == (3, pytest.approx(0, abs=EXACT))
        assert len(alone.recovered) == 1 and alone.recovered[0].nodes.size == 50
        for other in findings[:3]:
            assert not other.single_source and other.recovered == ()
            assert other.mixture is not None and nearest_input(other.mixture, truth)[1] > 0.2


def test_sesa_colluders_subtract_their_updates_and_expose_an_honest_client(mnist) -> None:  # type: ignore[no-untyped-def]
    updates, truth = _sesa_round(mnist, "sigmoid", TWO_PER_SHARD, seed=40)
    view = sesa_view(updates.values(), 200, 4)
    assert not any(f.single_source for f in attack_shards(view))
    reduced = subtract_known(view, [updates[2]])  # client 2 (shards 1, 2) colludes
    assert reduced.counts is not None and reduced.counts.tolist() == [2, 1, 1, 2]
    findings = attack_shards(reduced)
    assert findings[1].single_source and findings[2].single_source
    assert findings[1].mixture is not None and findings[2].mixture is not None
    assert nearest_input(findings[1].mixture, truth) == (1, pytest.approx(0, abs=1e-8))
    assert nearest_input(findings[2].mixture, truth) == (3, pytest.approx(0, abs=1e-8))


# ---------------------------------------------------------------- properties (synthetic)


def _reference_update(
    glob: GlobalMLP, c: np.ndarray, nodes: np.ndarray, x: np.ndarray, label: int, lr: float
) -> ClientUpdate:
    """Independent numpy backprop of one example through the submodel (softmax + CE)."""
    y = glob.weight[nodes] @ x + glob.bias[nodes]
    h, slope = activate(y, glob.activation)
    o = glob.out_weight[:, nodes] @ h + c
    p = np.exp(o - o.max())
    p /= p.sum()
    delta = p - np.eye(C)[label]
    g_y = slope * (glob.out_weight[:, nodes].T @ delta)
    return ClientUpdate(
        nodes, -lr * np.outer(g_y, x), -lr * g_y, -lr * np.outer(delta, h), -lr * delta
    )


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    clients=st.integers(2, 5),
    activation=st.sampled_from(["sigmoid", "tanh"]),
)
def test_peel_recovers_every_client_of_nested_index_sets(
    seed: int, clients: int, activation: str
) -> None:
    rng = np.random.default_rng(seed)
    hidden, m = 40, 12
    glob = GlobalMLP(
        rng.normal(0, 0.5, (hidden, m)),
        rng.normal(0, 0.5, hidden),
        rng.normal(0, 0.5, (C, hidden)),
        activation,
    )
    c = rng.normal(0, 0.1, C)
    order = rng.permutation(hidden)
    widths = np.sort(rng.choice(np.arange(4, hidden + 1), clients, replace=False))
    xs = rng.random((clients, m))
    updates = {
        u: _reference_update(glob, c, np.sort(order[: widths[u]]), xs[u], int(rng.integers(C)), 0.1)
        for u in range(clients)
    }
    found = attack_peel(naive_view(updates, hidden), glob)
    assert set(found) == set(range(clients))
    for u in range(clients):
        assert relative_error(found[u].x, xs[u]) < 1e-6


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), clients=st.integers(2, 6))
def test_every_attribution_of_the_peel_is_right(seed: int, clients: int) -> None:
    # ReLU, random index sets: whatever attack_peel returns (exclusive, peeled or isolated)
    # is the input of the client it names.
    rng = np.random.default_rng(seed)
    hidden, m = 48, 16
    glob = GlobalMLP(
        rng.normal(0, 0.5, (hidden, m)),
        rng.normal(0, 0.5, hidden),
        rng.normal(0, 0.5, (C, hidden)),
        "relu",
    )
    c = rng.normal(0, 0.1, C)
    xs = rng.random((clients, m))
    updates = {}
    for u in range(clients):
        nodes = np.sort(rng.choice(hidden, int(rng.integers(4, hidden + 1)), replace=False))
        updates[u] = _reference_update(glob, c, nodes, xs[u], int(rng.integers(C)), 0.1)
    for u, rec in attack_peel(naive_view(updates, hidden), glob).items():
        assert rec.client == u
        assert relative_error(rec.x, xs[u]) < 1e-6


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sources=st.integers(2, 4), rows=st.integers(3, 30))
def test_generic_mixtures_never_pass_for_an_input(seed: int, sources: int, rows: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.random((sources, 20))
    a = rng.normal(size=(rows, sources))  # every source active at every row
    weight, bias = a @ x, a.sum(axis=1)
    assert consensus_inputs(weight, bias) == []
    _, residual = least_squares_input(weight, bias)
    assert residual > 1e-6


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 30))
def test_single_source_rows_give_the_input_exactly(seed: int, rows: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.random(20)
    a = rng.normal(size=rows)
    x_hat, residual = least_squares_input(np.outer(a, x), a)
    assert relative_error(x_hat, x) < 1e-12 and residual < 1e-12
    found = consensus_inputs(np.outer(a, x), a, min_support=1)
    assert len(found) == 1 and relative_error(found[0].x, x) < 1e-12


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), clients=st.integers(1, 5))
def test_views_equal_dense_sums(seed: int, clients: int) -> None:
    rng = np.random.default_rng(seed)
    hidden, k, m = 12, 4, 5
    dense_w, dense_b = np.zeros((hidden, m)), np.zeros(hidden)
    updates = {}
    for u in range(clients):
        shards = np.sort(rng.choice(k, int(rng.integers(1, k + 1)), replace=False))
        nodes = nodes_of_shards(shards, hidden, k)
        w, b = rng.normal(size=(nodes.size, m)), rng.normal(size=nodes.size)
        updates[u] = ClientUpdate(nodes, w, b)
        dense_w[nodes] += w
        dense_b[nodes] += b
    naive = naive_view(updates, hidden)
    np.testing.assert_allclose(naive.weight_sum, dense_w)
    np.testing.assert_allclose(naive.bias_sum, dense_b)
    shard = sesa_view(updates.values(), hidden, k)
    np.testing.assert_allclose(shard.weight_sums.reshape(hidden, m), dense_w)
    np.testing.assert_allclose(shard.bias_sums.ravel(), dense_b)
    for n in range(hidden):
        holders = {u for u, up in updates.items() if n in up.nodes}
        assert naive.holders[n] == holders
        assert shard.counts is not None and shard.counts[n // 3] == len(holders)


# ---------------------------------------------------------------- argument validation


def test_invalid_arguments_are_refused_with_clear_messages() -> None:
    w, b = np.zeros((2, 3)), np.zeros(2)
    with pytest.raises(ConfigurationError, match="one row per node"):
        ClientUpdate(np.array([0, 1, 2]), w, b)
    with pytest.raises(ConfigurationError, match="strictly increasing"):
        ClientUpdate(np.array([1, 0]), w, b)
    with pytest.raises(ConfigurationError, match="finite"):
        ClientUpdate(np.array([0, 1]), np.full((2, 3), np.nan), b)
    with pytest.raises(ConfigurationError, match="together"):
        ClientUpdate(np.array([0, 1]), w, b, out_weight=np.zeros((C, 2)))
    with pytest.raises(ConfigurationError, match=r"\(C, 2\)"):
        ClientUpdate(np.array([0, 1]), w, b, np.zeros((C, 3)), np.zeros(C))
    with pytest.raises(ConfigurationError, match="activation"):
        GlobalMLP(np.zeros((2, 3)), np.zeros(2), np.zeros((C, 2)), "gelu")
    with pytest.raises(ConfigurationError, match="hidden width"):
        GlobalMLP(np.zeros((2, 3)), np.zeros(3), np.zeros((C, 2)))
    with pytest.raises(ConfigurationError, match=">= hidden width"):
        naive_view({1: ClientUpdate(np.array([0, 5]), w, b)}, hidden=4)
    with pytest.raises(ConfigurationError, match="input dimension"):
        naive_view(
            {1: ClientUpdate(np.array([0, 1]), w, b), 2: ClientUpdate([0], np.zeros((1, 4)), [0])},
            hidden=4,
        )
    with pytest.raises(ConfigurationError, match="multiple"):
        nodes_of_shards([0], hidden=10, num_shards=4)
    with pytest.raises(ConfigurationError, match="distinct"):
        nodes_of_shards([1, 1], hidden=8, num_shards=4)
    with pytest.raises(ConfigurationError, match="whole shards"):
        sesa_view([ClientUpdate(np.array([0, 1]), w, b)], hidden=8, num_shards=2)
    view = sesa_view([ClientUpdate(np.array([0, 1]), w, b)], hidden=4, num_shards=2)
    with pytest.raises(ConfigurationError, match="more known"):
        subtract_known(view, [ClientUpdate(np.array([2, 3]), w, b)])
    with pytest.raises(ConfigurationError, match="rtol"):
        attack_shards(view, rtol=-1.0)
    with pytest.raises(ConfigurationError, match="min_support"):
        consensus_inputs(w, b, min_support=0)
    with pytest.raises(ConfigurationError, match="nonzero"):
        least_squares_input(w, b)
    with pytest.raises(ConfigurationError, match="does not match"):
        attack_peel(
            naive_view({1: ClientUpdate(np.array([0, 1]), w, b)}, hidden=2),
            GlobalMLP(np.zeros((4, 3)), np.zeros(4), np.zeros((C, 4))),
        )
    with pytest.raises(ConfigurationError, match="counts"):
        ShardView(np.zeros((2, 2, 3)), np.zeros((2, 2)), counts=np.array([1, -1]))


def test_a_view_without_any_gradient_yields_nothing() -> None:
    zero = ClientUpdate(np.array([0, 1]), np.zeros((2, 3)), np.zeros(2))
    view = naive_view({1: zero}, hidden=2)
    assert attack_exclusive(view) == {}
    assert attack_peel(view, GlobalMLP(np.zeros((2, 3)), np.zeros(2), np.zeros((C, 2)))) == {}
    (finding,) = attack_shards(sesa_view([zero], hidden=2, num_shards=1))
    assert finding.mixture is None and not finding.single_source and finding.recovered == ()
