r"""The reconstruction attack of Sami & Güler §III, and exactly what is left of it under SESA.

**Setting.** A one-hidden-layer MLP ``o = V σ(W x + z) + c`` (``W``: ``H × m``, ``V``:
``C × H``) trained by heterogeneous clients on width-extracted submodels: client ``i`` trains
the hidden nodes ``I_i`` (rows ``W[I_i]``, ``z[I_i]``, columns ``V[:, I_i]``) and the full
output bias ``c``, for one local SGD step, and uploads the difference ``Δ = -η ∇`` in the
coordinates of the global model.

**Why an input leaks (Eq. 11–14).** For ``y_n = w_nᵀ x + z_n``,
``∂F/∂w_n = (∂F/∂y_n) xᵀ`` and ``∂F/∂z_n = ∂F/∂y_n``, so for one example
``x = Δw_n / Δz_n`` at every node with ``Δz_n ≠ 0`` (the step size cancels). For a batch of
``B`` examples, ``Δw_n / Δz_n = Σ_s a_{s,n} x_s / Σ_s a_{s,n}`` with ``a_{s,n} = ∂F_s/∂y_n``:
an affine mixture of the batch, except at a node where a single example has ``a_{s,n} ≠ 0``
(with ReLU: the only example whose unit is active) — there it is that example exactly. The
same holds when the sum runs over *clients* instead of examples.

**The naive pipeline** (:func:`naive_view`): per-parameter secure aggregation with the index
sets known to the server, which is what width extraction without SESA reveals (FedRolex,
HeteroFL and random extraction all tell the server ``I_i`` so it can average each coordinate
over its holders). The server learns, per coordinate, the sum over the clients holding it and
who they are. :func:`attack_exclusive` takes the nodes held by exactly one client, solves
``R ≈ b xᵀ`` by least squares over them (``x = Rᵀb / bᵀb``; exact for one example) and
attributes the result to that client. :func:`attack_peel` is Eq. 15–16: once a client's ``x``
is known, the server (which knows the global model) recomputes that client's contribution at
the nodes it shares — its output gradient ``d = Δc`` comes from a column ``ΔV[:, n] = d h_n``
at an exclusive node, ``h_n = σ(w_nᵀ x + z_n)`` — subtracts it, and recovers the next client
from the residual; with nested index sets (HeteroFL's prefix, FedRolex's common window: the
paper's Fig. 1, where client 1 holds no node alone) this recovers everybody. Where no client
holds a node alone, ReLU units active for one example only (point 2 below) give inputs that the
index sets attribute whenever a single client holds all the nodes isolating one, and peeling
resumes from there; clients with identical index sets (several full-width clients) stay
interchangeable: their inputs leak, unattributed.

**Under SESA** (:func:`sesa_view`, the ideal functionality of Eq. 28): the hidden nodes are
split into ``K`` equal shards, a client trains whole shards, and the server learns only the
per-shard sums over the surviving clients that chose each shard (and, if the implementation
averages per coordinate, their number), *not* who chose which shard. What
:func:`attack_shards` still gets, stated precisely (each point is a test in
``tests/research/test_sesa_attack.py``):

1. **A shard chosen by exactly one surviving client is that client's update in the clear**:
   its rows are rank one, the ratio gives that client's ``x`` exactly (up to float error),
   and the server can tell this happened even without counts (the least-squares residual is
   0). What SESA hides is *whose* ``x`` it is. So "the attack has nothing to work with under
   SESA" is true only when every shard has at least two contributors.
2. **With ReLU, two or more contributors per shard do not stop it either**: at a node where
   the unit is active for exactly one contributing example, the ratio is that example's
   ``x`` exactly; :func:`consensus_inputs` finds such nodes without any index set because
   two nodes isolating the same example give the *same* ratio, while mixture ratios differ
   from node to node. With ``k`` single-example contributors and units active about half the
   time, a node isolates one of them with probability about ``k 2^-k``: frequent for small
   ``k`` (and after colluding clients subtract their own updates, :func:`subtract_known`),
   rarer for more contributors or larger local batches, but not zero. Measured by
   ``python benchmarks/sesa_attack_demo.py`` (seed 0, 5 trials; MLP 784-200-10, one SGD step
   on one MNIST example per contributor, one 50-node shard): the fraction of contributors
   recovered exactly is 1.00 for k = 1, 2, 3, then 0.75 (4), 0.40 (5), 0.17-0.29 (6-8),
   0.10 (10), 0.02 (20), 0.01 (50) with ReLU, and 0 for every k >= 2 with sigmoid; for one
   client's batch of B examples on 200 nodes, 1.00 for B <= 4, 0.65 (8), 0.16 (16),
   0.02 (32), 0 (64).
3. **Otherwise the ratio is a mixture, not any single x**: with every contributing unit
   active (smooth activations, or ReLU nodes where two or more examples are active), each
   node's ratio is ``Σ_j a_{j,n} x_j / Σ_j a_{j,n}``; the shard's rows ``R = A X`` with
   ``b = A 1`` determine the inputs only up to ``X -> G X`` for any invertible ``G`` with
   ``G 1 = 1`` (every affine recombination of the true inputs explains the first-layer
   sums equally well), so no computation on these sums alone isolates one ``x``.
   :class:`ShardFinding` reports the least-squares mixture and its residual; its relative
   distance to the nearest contributor's ``x`` was 0.42-0.66 (median over 5 trials) for every
   k >= 2 in the measurement above, and the tests check it stays above 0.2.
   Optimization-based gradient inversion (DLG-style matching of the sums with a model of
   several examples) is *not* covered by this statement and not evaluated here.

T colluding clients learn no more from SESA than the per-shard sums (Eq. 10), but they know
their own updates and shards: subtracting them (:func:`subtract_known`) can leave a shard with
one honest contributor, which point 1 then exposes. SESA's guarantee (10) conditions on the
aggregates and so permits all of the above: it protects *which* shards and *whose* update,
not the content of an aggregate that happens to come from one example.

**Scope.** One SGD step (the update is a scaled gradient; Adam's per-coordinate scaling, or
several local steps, break the exact ratio), no batch norm in the first layer (a HeteroFL
scaler only rescales ``∂F/∂y_n`` and cancels in the ratio; :func:`attack_peel` assumes no
scaler). Flower-free and numpy-only: the server's views are built from the clients' float
updates (the ideal functionality of secure aggregation; a real per-parameter SecAgg round
gives the same sums up to fixed-point rounding, which the tests also run).

The attack's inputs and the server's views (:class:`ClientUpdate`, :class:`GlobalMLP`,
:func:`naive_view`, :func:`sesa_view`, ...) live in :mod:`flwr_fsl.research.sesa_views` and are
re-exported here; this module holds the estimators, the attacks and the metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.research.sesa_views import (
    ACTIVATIONS,
    F64,
    ClientUpdate,
    GlobalMLP,
    NaiveView,
    ShardView,
    _floats,
    _positive_int,
    _tolerance,
    activate,
    naive_view,
    nodes_of_shards,
    sesa_view,
    subtract_known,
)

__all__ = [
    "ACTIVATIONS",
    "ClientUpdate",
    "GlobalMLP",
    "NaiveView",
    "Recovery",
    "ShardFinding",
    "ShardView",
    "activate",
    "attack_exclusive",
    "attack_peel",
    "attack_shards",
    "consensus_inputs",
    "least_squares_input",
    "naive_view",
    "nearest_input",
    "nodes_of_shards",
    "relative_error",
    "sesa_view",
    "subtract_known",
]

DEFAULT_MIN_BIAS = 1e-9
DEFAULT_RTOL = 1e-6


# ------------------------------------------------------------------------------ estimators


@dataclass(frozen=True)
class Recovery:
    """An input the server reconstructed.

    Attributes
    ----------
    client : int or None
        The client it is attributed to (None under SESA: the server does not know whose).
    x : numpy.ndarray
        The recovered input, shape ``(m,)``.
    nodes : numpy.ndarray
        The hidden nodes whose rows it was solved from.
    residual : float
        ``||R - b xᵀ||_F / ||R||_F`` over those rows: ~0 when one input explains them all.
    method : str
        ``"exclusive"``, ``"peeled"`` (Eq. 15–16) or ``"consensus"``.
    """

    client: int | None
    x: F64
    nodes: NDArray[np.int64]
    residual: float
    method: str


def least_squares_input(weight_rows: ArrayLike, bias: ArrayLike) -> tuple[F64, float]:
    """Solve ``R ≈ b xᵀ`` for ``x`` by least squares: ``x = Rᵀ b / bᵀ b``.

    For rows that all come from one example (``R_n = a_n xᵀ``, ``b_n = a_n``) this is ``x``
    exactly, with every per-row ratio ``R_n / b_n`` weighted by ``b_n²`` (robust to rows with
    small ``b_n``).

    Parameters
    ----------
    weight_rows : array_like
        ``R``, shape ``(n, m)``.
    bias : array_like
        ``b``, shape ``(n,)``, not all zero.

    Returns
    -------
    tuple
        ``(x, relative residual ||R - b xᵀ||_F / ||R||_F)``.

    Raises
    ------
    ConfigurationError
        If the shapes disagree or ``b`` is zero.
    """
    rows = _floats("weight_rows", weight_rows, 2)
    b = _floats("bias", bias, 1)
    if rows.shape[0] != b.size:
        raise ConfigurationError(f"{rows.shape[0]} rows but {b.size} biases")
    norm = float(b @ b)
    if norm == 0.0:
        raise ConfigurationError("least_squares_input needs a nonzero bias gradient")
    x = rows.T @ b / norm
    scale = float(np.linalg.norm(rows))
    residual = float(np.linalg.norm(rows - np.outer(b, x))) / scale if scale > 0 else 0.0
    return x, residual


def _usable(bias: F64, min_bias: float, reference: float | None = None) -> NDArray[np.int64]:
    """Return indices with ``|b| > min_bias * max|b|`` (or ``* reference`` if given)."""
    top = float(np.max(np.abs(bias))) if reference is None and bias.size else (reference or 0.0)
    if top == 0.0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.abs(bias) > min_bias * top).astype(np.int64)


def consensus_inputs(  # noqa: C901
    weight_rows: ArrayLike,
    bias: ArrayLike,
    *,
    rtol: float = DEFAULT_RTOL,
    min_support: int = 2,
    min_bias: float = DEFAULT_MIN_BIAS,
) -> list[Recovery]:
    """Find inputs that several rows agree on, without knowing who contributed to which row.

    Each row with ``|b_n| > min_bias max|b|`` gives a candidate ``R_n / b_n``. Rows whose
    gradient comes from a single example give exactly that example, so two such rows agree;
    mixtures of several examples differ from row to row (their weights ``a_{j,n}`` do). Rows
    are grouped when their candidates lie within ``rtol`` (relative) of each other, and every
    group of at least ``min_support`` rows yields one recovered input (least squares over the
    group).

    Parameters
    ----------
    weight_rows : array_like
        ``R``, shape ``(n, m)``.
    bias : array_like
        ``b``, shape ``(n,)``.
    rtol : float
        Relative distance under which two candidates agree (1e-6 suits float64 updates;
        float32 uploads need about 1e-3).
    min_support : int
        Fewest agreeing rows for a recovery (1 accepts every single row's ratio).
    min_bias : float
        Rows with ``|b_n|`` at most this fraction of the largest are skipped.

    Returns
    -------
    list of Recovery
        One per group (``client`` None, ``nodes`` = row indices), largest support first.

    Raises
    ------
    ConfigurationError
        If the shapes disagree or a parameter is out of range.
    """
    rows = _floats("weight_rows", weight_rows, 2)
    b = _floats("bias", bias, 1)
    if rows.shape[0] != b.size:
        raise ConfigurationError(f"{rows.shape[0]} rows but {b.size} biases")
    rtol = _tolerance("rtol", rtol)
    min_bias = _tolerance("min_bias", min_bias)
    min_support = _positive_int("min_support", min_support)
    keep = _usable(b, min_bias)
    if keep.size < min_support:
        return []
    candidates = rows[keep] / b[keep, None]
    norms = np.linalg.norm(candidates, axis=1)
    parent = np.arange(keep.size)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = int(parent[i])
        return i

    for i in range(keep.size - 1):
        distance = np.linalg.norm(candidates[i + 1 :] - candidates[i], axis=1)
        close = distance <= rtol * np.maximum(norms[i + 1 :], norms[i])
        for j in np.flatnonzero(close) + i + 1:
            a, c = find(i), find(int(j))
            if a != c:
                parent[max(a, c)] = min(a, c)
    groups: dict[int, list[int]] = {}
    for i in range(keep.size):
        groups.setdefault(find(i), []).append(i)
    found = []
    for members in groups.values():
        if len(members) < min_support:
            continue
        idx = keep[np.array(members)]
        x, residual = least_squares_input(rows[idx], b[idx])
        found.append(Recovery(None, x, idx, residual, "consensus"))
    found.sort(key=lambda r: -r.nodes.size)
    return found


# ------------------------------------------------------------------------------ attacks


def attack_exclusive(view: NaiveView, *, min_bias: float = DEFAULT_MIN_BIAS) -> dict[int, Recovery]:
    """Eq. 11–14 on the naive pipeline: each client's ``x`` from the nodes only it holds.

    Parameters
    ----------
    view : NaiveView
        The server's view.
    min_bias : float
        Exclusive nodes with ``|Δz_n|`` at most this fraction of the client's largest are
        skipped (inactive units).

    Returns
    -------
    dict
        Client -> :class:`Recovery` (``method="exclusive"``), for every client with at least
        one exclusive node with a nonzero bias gradient.
    """
    min_bias = _tolerance("min_bias", min_bias)
    found: dict[int, Recovery] = {}
    for client in sorted(view.clients):
        nodes = np.array([n for n, h in enumerate(view.holders) if h == {client}], dtype=np.int64)
        if not nodes.size:
            continue
        use = nodes[_usable(view.bias_sum[nodes], min_bias)]
        if not use.size:
            continue
        x, residual = least_squares_input(view.weight_sum[use], view.bias_sum[use])
        found[client] = Recovery(client, x, use, residual, "exclusive")
    return found


def attack_peel(  # noqa: C901, PLR0915
    view: NaiveView,
    model: GlobalMLP,
    *,
    min_bias: float = DEFAULT_MIN_BIAS,
    isolate: bool = True,
    rtol: float = DEFAULT_RTOL,
    min_support: int = 2,
) -> dict[int, Recovery]:
    """Eq. 11–16 on the naive pipeline: exclusive nodes first, then peel shared nodes.

    A client is *solved* once its ``x`` and its output gradient ``d`` (``= Δc``) are known;
    its contribution at node ``n`` is then ``a_n xᵀ`` and ``a_n`` with
    ``a_n = σ'(w_nᵀ x + z_n) V[:, n]ᵀ d`` (and ``d h_n`` in the second layer). The attack
    repeats until nothing changes: a client's ``x`` comes from the nodes where every other
    holder is solved (least squares over the residual rows); its ``d`` from the residual
    second-layer columns there (``d = Σ h_n Q_n / Σ h_n²``) or, if every other client is
    solved, from the output bias sum.

    When that is stuck (e.g. every node has several holders, as with full-width clients) and
    ``isolate`` is set, the residual rows go through :func:`consensus_inputs`: an input that
    several nodes agree on is one example whose unit alone was active there (ReLU), and it is
    attributed when exactly one unsolved client holds all of those nodes. The other holders
    contribute nothing at those nodes (inactive units: ``h = 0``), so the same nodes also
    give that client's ``d``, and peeling resumes.

    Parameters
    ----------
    view : NaiveView
        The server's view; without the output layer only exclusive nodes can be used.
    model : GlobalMLP
        The global model of the round (the server's own).
    min_bias : float
        Rows whose residual ``|b_n|`` is at most this fraction of the view's largest
        ``|Δz_n|`` are skipped.
    isolate : bool
        Whether to use agreeing node ratios when peeling is stuck.
    rtol, min_support
        As in :func:`consensus_inputs`.

    Returns
    -------
    dict
        Client -> :class:`Recovery` (``method`` ``"exclusive"`` if only its exclusive nodes
        were used, ``"peeled"`` if shared nodes were, ``"isolated"`` if it came from agreeing
        node ratios).

    Raises
    ------
    ConfigurationError
        If the model does not match the view or a parameter is out of range.
    """
    min_bias = _tolerance("min_bias", min_bias)
    rtol = _tolerance("rtol", rtol)
    min_support = _positive_int("min_support", min_support)
    if model.weight.shape != view.weight_sum.shape:
        raise ConfigurationError(
            f"model weight {model.weight.shape} does not match the view {view.weight_sum.shape}"
        )
    out_w, out_b = view.out_weight_sum, view.out_bias_sum
    if out_w is not None and out_w.shape[0] != model.out_weight.shape[0]:
        raise ConfigurationError("model and view disagree on the number of classes")
    reference = float(np.max(np.abs(view.bias_sum))) if view.hidden_width else 0.0
    if reference == 0.0:
        return {}
    xs: dict[int, F64] = {}
    acts: dict[int, tuple[F64, F64]] = {}
    ds: dict[int, F64] = {}
    first: dict[int, F64] = {}  # solved client -> a (H,), its bias gradient at every node
    isolated: dict[int, NDArray[np.int64]] = {}  # client -> nodes where it alone was active
    found: dict[int, Recovery] = {}
    node_sets = {c: view.nodes_of(c) for c in view.clients}

    def ready(nodes: NDArray[np.int64], client: int) -> NDArray[np.int64]:
        """Return the nodes of ``client`` where every other holder is solved."""
        return np.array(
            [n for n in nodes if all(o in ds for o in view.holders[n] if o != client)],
            dtype=np.int64,
        )

    def residual_rows(nodes: NDArray[np.int64], client: int | None) -> tuple[F64, F64]:
        """Return the first-layer rows at ``nodes`` minus every solved holder's part."""
        rows = view.weight_sum[nodes].copy()
        b = view.bias_sum[nodes].copy()
        for j, n in enumerate(nodes):
            for other in view.holders[n] - {client}:
                if other in ds:
                    rows[j] -= first[other][n] * xs[other]
                    b[j] -= first[other][n]
        return rows, b

    def learn_x(client: int, x: F64, recovery: Recovery) -> None:
        xs[client] = x
        acts[client] = model.hidden(x)
        found[client] = recovery

    changed = True
    while changed:
        changed = False
        for client in sorted(view.clients - set(xs)):
            nodes = ready(node_sets[client], client)
            if not nodes.size:
                continue
            rows, b = residual_rows(nodes, client)
            use = _usable(b, min_bias, reference)
            if not use.size:
                continue
            x, residual = least_squares_input(rows[use], b[use])
            exclusive = all(view.holders[n] == {client} for n in nodes[use])
            method = "exclusive" if exclusive else "peeled"
            learn_x(client, x, Recovery(client, x, nodes[use], residual, method))
            changed = True
        if out_w is not None and out_b is not None:
            for client in sorted(set(xs) - set(ds)):
                h, slope = acts[client]
                d: F64 | None = None
                nodes = np.union1d(
                    ready(node_sets[client], client),
                    isolated.get(client, np.zeros(0, dtype=np.int64)),
                ).astype(np.int64)
                if nodes.size:
                    columns = out_w[:, nodes].copy()
                    for j, n in enumerate(nodes):
                        for other in view.holders[n] - {client}:
                            if other in ds:  # unsolved holders are inactive at these nodes
                                columns[:, j] -= ds[other] * acts[other][0][n]
                    hn = h[nodes]
                    if float(hn @ hn) > 0.0:
                        d = columns @ hn / float(hn @ hn)
                if d is None and all(o in ds for o in view.clients - {client}):
                    d = out_b - sum((ds[o] for o in view.clients - {client}), np.zeros_like(out_b))
                if d is not None:
                    ds[client] = d
                    first[client] = slope * (model.out_weight.T @ d)
                    changed = True
        if changed or not isolate:
            continue
        unsolved = view.clients - set(xs)
        pending = set(xs) - set(ds)  # x known, contribution unknown: their nodes are unusable
        candidates = np.array(
            [n for n, h in enumerate(view.holders) if h & unsolved and not h & pending],
            dtype=np.int64,
        )
        if not candidates.size:
            continue
        rows, b = residual_rows(candidates, None)
        for rec in consensus_inputs(rows, b, rtol=rtol, min_support=min_support, min_bias=min_bias):
            nodes = candidates[rec.nodes]
            common = frozenset.intersection(*(view.holders[n] for n in nodes)) & unsolved
            if len(common) != 1:
                continue  # not attributable (yet)
            (client,) = common
            if client in xs:
                continue
            isolated[client] = nodes
            learn_x(client, rec.x, Recovery(client, rec.x, nodes, rec.residual, "isolated"))
            changed = True
    return found


@dataclass(frozen=True)
class ShardFinding:
    """What :func:`attack_shards` gets out of one shard's sums.

    Attributes
    ----------
    shard : int
        The shard index.
    contributors : int or None
        How many clients chose it, if the view reveals counts.
    mixture : numpy.ndarray or None
        The least-squares ratio over the shard's active nodes (an affine mixture of the
        contributors' inputs; exactly the input if there is one contributing example);
        None if no node has a nonzero bias gradient.
    residual : float
        Its relative residual: ~0 iff a single input explains every active node.
    single_source : bool
        ``residual <= rtol`` over at least ``min_support`` active nodes: the server knows the
        shard's sum is one example's gradient, even without counts.
    recovered : tuple of Recovery
        Inputs several nodes agree on (:func:`consensus_inputs`; ``client`` None, ``nodes``
        global).
    """

    shard: int
    contributors: int | None
    mixture: F64 | None
    residual: float
    single_source: bool
    recovered: tuple[Recovery, ...]


def attack_shards(
    view: ShardView,
    *,
    rtol: float = DEFAULT_RTOL,
    min_support: int = 2,
    min_bias: float = DEFAULT_MIN_BIAS,
) -> tuple[ShardFinding, ...]:
    """Run the §III attack as far as SESA's per-shard sums allow (see the module docstring).

    Parameters
    ----------
    view : ShardView
        The per-shard sums.
    rtol, min_support, min_bias
        As in :func:`consensus_inputs`; ``rtol`` also bounds the residual of a single source.

    Returns
    -------
    tuple of ShardFinding
        One per shard.
    """
    rtol = _tolerance("rtol", rtol)
    min_support = _positive_int("min_support", min_support)
    min_bias = _tolerance("min_bias", min_bias)
    size = view.shard_size
    findings = []
    for k in range(view.num_shards):
        rows, b = view.weight_sums[k], view.bias_sums[k]
        use = _usable(b, min_bias)
        mixture: F64 | None = None
        residual = float("nan")
        if use.size:
            mixture, residual = least_squares_input(rows[use], b[use])
        single = use.size >= min_support and residual <= rtol
        recovered = tuple(
            Recovery(None, r.x, r.nodes + k * size, r.residual, r.method)
            for r in consensus_inputs(
                rows, b, rtol=rtol, min_support=min_support, min_bias=min_bias
            )
        )
        count = None if view.counts is None else int(view.counts[k])
        findings.append(ShardFinding(k, count, mixture, residual, single, recovered))
    return tuple(findings)


# ------------------------------------------------------------------------------ metrics


def relative_error(x_hat: ArrayLike, x: ArrayLike) -> float:
    """``||x̂ - x|| / ||x||`` (``||x̂ - x||`` if ``x`` is zero).

    Parameters
    ----------
    x_hat, x : array_like
        The recovered and the true input (same number of elements).

    Returns
    -------
    float
        The relative L2 error.
    """
    a = np.asarray(x_hat, dtype=np.float64).ravel()
    t = np.asarray(x, dtype=np.float64).ravel()
    if a.size != t.size:
        raise ConfigurationError(f"sizes differ: {a.size} vs {t.size}")
    scale = float(np.linalg.norm(t))
    error = float(np.linalg.norm(a - t))
    return error / scale if scale > 0 else error


def nearest_input(x_hat: ArrayLike, inputs: Mapping[Any, ArrayLike]) -> tuple[Any, float]:
    """Return the true input closest to ``x_hat`` and the relative error to it.

    Parameters
    ----------
    x_hat : array_like
        A recovered input.
    inputs : Mapping
        Label (client, or (client, example)) -> true input.

    Returns
    -------
    tuple
        ``(label, relative_error)`` of the nearest input.

    Raises
    ------
    ConfigurationError
        If ``inputs`` is empty.
    """
    if not inputs:
        raise ConfigurationError("nearest_input needs at least one true input")
    errors = {key: relative_error(x_hat, x) for key, x in inputs.items()}
    best = min(errors, key=lambda key: errors[key])
    return best, errors[best]
