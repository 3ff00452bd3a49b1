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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError

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

F64 = NDArray[np.float64]
Activation = Literal["relu", "sigmoid", "tanh"]
ACTIVATIONS: tuple[str, ...] = ("relu", "sigmoid", "tanh")
DEFAULT_MIN_BIAS = 1e-9
DEFAULT_RTOL = 1e-6


# ------------------------------------------------------------------------------ validation


def _floats(name: str, value: ArrayLike, ndim: int) -> F64:
    """``value`` as a finite float64 array of ``ndim`` dimensions (a copy, read-only)."""
    array = np.array(value, dtype=np.float64)
    if array.ndim != ndim:
        raise ConfigurationError(f"{name} must be {ndim}-D, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ConfigurationError(f"{name} must be finite")
    array.setflags(write=False)
    return array


def _nodes(name: str, value: ArrayLike, hidden: int | None = None) -> NDArray[np.int64]:
    """Strictly increasing non-negative node indices (below ``hidden`` if given)."""
    raw = np.asarray(value)
    if raw.ndim != 1 or (raw.size and not np.issubdtype(raw.dtype, np.integer)):
        raise ConfigurationError(f"{name} must be a 1-D integer array, got {raw.dtype} {raw.shape}")
    nodes = raw.astype(np.int64)
    if nodes.size and (nodes[0] < 0 or np.any(np.diff(nodes) <= 0)):
        raise ConfigurationError(f"{name} must be strictly increasing and >= 0")
    if hidden is not None and nodes.size and nodes[-1] >= hidden:
        raise ConfigurationError(f"{name} has node {int(nodes[-1])} >= hidden width {hidden}")
    nodes.setflags(write=False)
    return nodes


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise ConfigurationError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _tolerance(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
        raise ConfigurationError(f"{name} must be a number, got {value!r}")
    number = float(value)
    if not (np.isfinite(number) and number >= 0.0):
        raise ConfigurationError(f"{name} must be finite and >= 0, got {value!r}")
    return number


def activate(y: ArrayLike, activation: str) -> tuple[F64, F64]:
    """Return ``σ(y)`` and ``σ'(y)`` for ``activation`` (ReLU's derivative at 0 is 0, as torch).

    Parameters
    ----------
    y : array_like
        Pre-activations.
    activation : str
        One of :data:`ACTIVATIONS`.

    Returns
    -------
    tuple of numpy.ndarray
        ``(σ(y), σ'(y))``.

    Raises
    ------
    ConfigurationError
        If ``activation`` is unknown.
    """
    y = np.asarray(y, dtype=np.float64)
    if activation == "relu":
        return np.maximum(y, 0.0), (y > 0).astype(np.float64)
    if activation == "sigmoid":
        h = 1.0 / (1.0 + np.exp(-y))
        return h, h * (1.0 - h)
    if activation == "tanh":
        h = np.tanh(y)
        return h, 1.0 - h * h
    raise ConfigurationError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


# ------------------------------------------------------------------------------ inputs


@dataclass(frozen=True)
class ClientUpdate:
    """One client's update of its width-extracted submodel, in its own (narrow) coordinates.

    Parameters
    ----------
    nodes : array_like of int
        ``I_i``: the hidden nodes the client trained, strictly increasing.
    weight : array_like
        ``ΔW[I_i]``, shape ``(len(nodes), m)``.
    bias : array_like
        ``Δz[I_i]``, shape ``(len(nodes),)``.
    out_weight : array_like, optional
        ``ΔV[:, I_i]``, shape ``(C, len(nodes))`` (needed by :func:`attack_peel` only).
    out_bias : array_like, optional
        ``Δc``, shape ``(C,)``; given together with ``out_weight``.

    Raises
    ------
    ConfigurationError
        If a shape disagrees, a value is not finite, or only one output array is given.
    """

    nodes: NDArray[np.int64]
    weight: F64
    bias: F64
    out_weight: F64 | None = None
    out_bias: F64 | None = None

    def __post_init__(self) -> None:
        nodes = _nodes("nodes", self.nodes)
        weight = _floats("weight", self.weight, 2)
        bias = _floats("bias", self.bias, 1)
        if weight.shape[0] != nodes.size or bias.size != nodes.size:
            raise ConfigurationError(
                f"weight {weight.shape} and bias {bias.shape} must have one row per node "
                f"({nodes.size} nodes)"
            )
        if (self.out_weight is None) != (self.out_bias is None):
            raise ConfigurationError("out_weight and out_bias must be given together")
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "bias", bias)
        if self.out_weight is not None and self.out_bias is not None:
            out_weight = _floats("out_weight", self.out_weight, 2)
            out_bias = _floats("out_bias", self.out_bias, 1)
            if out_weight.shape != (out_bias.size, nodes.size):
                raise ConfigurationError(
                    f"out_weight must have shape (C, {nodes.size}) with C = {out_bias.size}, "
                    f"got {out_weight.shape}"
                )
            object.__setattr__(self, "out_weight", out_weight)
            object.__setattr__(self, "out_bias", out_bias)

    @property
    def input_dim(self) -> int:
        """``m``, the input dimension."""
        return int(self.weight.shape[1])

    @property
    def has_output_layer(self) -> bool:
        """Whether the second layer's update is included."""
        return self.out_weight is not None


@dataclass(frozen=True)
class GlobalMLP:
    """The global model the round started from (the server knows it).

    Parameters
    ----------
    weight : array_like
        ``W``, shape ``(H, m)``.
    bias : array_like
        ``z``, shape ``(H,)``.
    out_weight : array_like
        ``V``, shape ``(C, H)``.
    activation : str
        The hidden activation, one of :data:`ACTIVATIONS`.

    Raises
    ------
    ConfigurationError
        If a shape disagrees, a value is not finite or the activation is unknown.
    """

    weight: F64
    bias: F64
    out_weight: F64
    activation: str = "relu"

    def __post_init__(self) -> None:
        weight = _floats("weight", self.weight, 2)
        bias = _floats("bias", self.bias, 1)
        out_weight = _floats("out_weight", self.out_weight, 2)
        if bias.size != weight.shape[0] or out_weight.shape[1] != weight.shape[0]:
            raise ConfigurationError(
                f"weight {weight.shape}, bias {bias.shape} and out_weight {out_weight.shape} "
                "must agree on the hidden width H"
            )
        if self.activation not in ACTIVATIONS:
            raise ConfigurationError(
                f"activation must be one of {ACTIVATIONS}, got {self.activation!r}"
            )
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "bias", bias)
        object.__setattr__(self, "out_weight", out_weight)

    @property
    def hidden_width(self) -> int:
        """``H``."""
        return int(self.weight.shape[0])

    def hidden(self, x: ArrayLike) -> tuple[F64, F64]:
        """Return ``h = σ(W x + z)`` and ``σ'(W x + z)`` over all ``H`` nodes for one input."""
        y = self.weight @ np.asarray(x, dtype=np.float64) + self.bias
        return activate(y, self.activation)


# ------------------------------------------------------------------------------ views


@dataclass(frozen=True)
class NaiveView:
    """What the server learns from per-parameter secure aggregation with known index sets.

    Attributes
    ----------
    weight_sum : numpy.ndarray
        ``(H, m)``: row ``n`` is ``Σ_{i holds n} ΔW_i[n]``.
    bias_sum : numpy.ndarray
        ``(H,)``: ``Σ_{i holds n} Δz_i[n]``.
    holders : tuple of frozenset
        Per node, the clients that hold it (what the index sets reveal).
    clients : frozenset
        Every client of the round.
    out_weight_sum : numpy.ndarray or None
        ``(C, H)``: column ``n`` is ``Σ_{i holds n} ΔV_i[:, n]``.
    out_bias_sum : numpy.ndarray or None
        ``(C,)``: ``Σ_i Δc_i`` over every client.
    """

    weight_sum: F64
    bias_sum: F64
    holders: tuple[frozenset[int], ...]
    clients: frozenset[int]
    out_weight_sum: F64 | None = None
    out_bias_sum: F64 | None = None

    def __post_init__(self) -> None:
        weight = _floats("weight_sum", self.weight_sum, 2)
        bias = _floats("bias_sum", self.bias_sum, 1)
        if bias.size != weight.shape[0] or len(self.holders) != weight.shape[0]:
            raise ConfigurationError("weight_sum, bias_sum and holders must have H entries")
        holders = tuple(frozenset(int(c) for c in h) for h in self.holders)
        clients = frozenset(int(c) for c in self.clients)
        if not all(h <= clients for h in holders):
            raise ConfigurationError("a node's holders must be clients of the round")
        object.__setattr__(self, "weight_sum", weight)
        object.__setattr__(self, "bias_sum", bias)
        object.__setattr__(self, "holders", holders)
        object.__setattr__(self, "clients", clients)
        if (self.out_weight_sum is None) != (self.out_bias_sum is None):
            raise ConfigurationError("out_weight_sum and out_bias_sum must be given together")
        if self.out_weight_sum is not None and self.out_bias_sum is not None:
            out_weight = _floats("out_weight_sum", self.out_weight_sum, 2)
            out_bias = _floats("out_bias_sum", self.out_bias_sum, 1)
            if out_weight.shape != (out_bias.size, weight.shape[0]):
                raise ConfigurationError(f"out_weight_sum must be (C, H), got {out_weight.shape}")
            object.__setattr__(self, "out_weight_sum", out_weight)
            object.__setattr__(self, "out_bias_sum", out_bias)

    @property
    def hidden_width(self) -> int:
        """``H``."""
        return int(self.weight_sum.shape[0])

    def nodes_of(self, client: int) -> NDArray[np.int64]:
        """``I_client`` as the server knows it."""
        return np.array([n for n, h in enumerate(self.holders) if client in h], dtype=np.int64)


def _check_updates(updates: Iterable[ClientUpdate], hidden: int) -> list[ClientUpdate]:
    """Check that the updates agree on ``m`` and the output layer's presence and shape."""
    items = list(updates)
    for u in items:
        if not isinstance(u, ClientUpdate):
            raise ConfigurationError(f"updates must be ClientUpdate, got {type(u).__name__}")
        if u.nodes.size and int(u.nodes[-1]) >= hidden:
            raise ConfigurationError(f"a client's node {int(u.nodes[-1])} >= hidden width {hidden}")
    if len({u.input_dim for u in items}) > 1:
        raise ConfigurationError("clients' updates disagree on the input dimension")
    if len({u.has_output_layer for u in items}) > 1:
        raise ConfigurationError("either every update carries the output layer or none does")
    if len({u.out_bias.size for u in items if u.out_bias is not None}) > 1:
        raise ConfigurationError("clients' updates disagree on the number of classes")
    return items


def naive_view(updates: Mapping[int, ClientUpdate], hidden: int) -> NaiveView:
    """Aggregate like per-parameter secure aggregation over known index sets (the naive pipeline).

    Parameters
    ----------
    updates : Mapping[int, ClientUpdate]
        Client id -> its update (at least one).
    hidden : int
        ``H``, the global hidden width.

    Returns
    -------
    NaiveView
        Per-coordinate sums over each coordinate's holders, and the holders.

    Raises
    ------
    ConfigurationError
        If there is no update or the updates disagree on shapes.
    """
    hidden = _positive_int("hidden", hidden)
    items = _check_updates(updates.values(), hidden)
    if not items:
        raise ConfigurationError("naive_view needs at least one client update")
    m = items[0].input_dim
    weight = np.zeros((hidden, m))
    bias = np.zeros(hidden)
    holders: list[set[int]] = [set() for _ in range(hidden)]
    with_out = items[0].has_output_layer
    num_classes = items[0].out_bias.size if items[0].out_bias is not None else 0
    out_weight = np.zeros((num_classes, hidden)) if with_out else None
    out_bias = np.zeros(num_classes) if with_out else None
    for client, u in updates.items():
        weight[u.nodes] += u.weight
        bias[u.nodes] += u.bias
        for n in u.nodes:
            holders[int(n)].add(int(client))
        if out_weight is not None and out_bias is not None:
            assert u.out_weight is not None and u.out_bias is not None
            out_weight[:, u.nodes] += u.out_weight
            out_bias += u.out_bias
    return NaiveView(
        weight,
        bias,
        tuple(frozenset(h) for h in holders),
        frozenset(int(c) for c in updates),
        out_weight,
        out_bias,
    )


@dataclass(frozen=True)
class ShardView:
    """What the server learns under SESA (Eq. 28): per-shard sums, no index sets.

    Attributes
    ----------
    weight_sums : numpy.ndarray
        ``(K, s, m)``: shard ``k``'s first-layer rows summed over the clients that chose it.
    bias_sums : numpy.ndarray
        ``(K, s)``.
    counts : numpy.ndarray or None
        ``(K,)`` contributors per shard, if the aggregation reveals them (a per-coordinate
        average needs them); None if only the sums are opened.
    out_weight_sums : numpy.ndarray or None
        ``(K, C, s)``: the shard's second-layer columns summed likewise.
    out_bias_sum : numpy.ndarray or None
        ``(C,)``: the output bias summed over every client.
    """

    weight_sums: F64
    bias_sums: F64
    counts: NDArray[np.int64] | None = None
    out_weight_sums: F64 | None = None
    out_bias_sum: F64 | None = None

    def __post_init__(self) -> None:
        weight = _floats("weight_sums", self.weight_sums, 3)
        bias = _floats("bias_sums", self.bias_sums, 2)
        if bias.shape != weight.shape[:2]:
            raise ConfigurationError(f"bias_sums must be (K, s) = {weight.shape[:2]}")
        object.__setattr__(self, "weight_sums", weight)
        object.__setattr__(self, "bias_sums", bias)
        if self.counts is not None:
            counts = np.asarray(self.counts)
            if counts.shape != (weight.shape[0],) or not np.issubdtype(counts.dtype, np.integer):
                raise ConfigurationError(f"counts must be {weight.shape[0]} integers")
            if np.any(counts < 0):
                raise ConfigurationError("counts must be >= 0")
            counts = counts.astype(np.int64)
            counts.setflags(write=False)
            object.__setattr__(self, "counts", counts)
        if (self.out_weight_sums is None) != (self.out_bias_sum is None):
            raise ConfigurationError("out_weight_sums and out_bias_sum must be given together")
        if self.out_weight_sums is not None and self.out_bias_sum is not None:
            out_weight = _floats("out_weight_sums", self.out_weight_sums, 3)
            out_bias = _floats("out_bias_sum", self.out_bias_sum, 1)
            k, s = weight.shape[:2]
            if out_weight.shape != (k, out_bias.size, s):
                raise ConfigurationError(
                    f"out_weight_sums must be (K, C, s), got {out_weight.shape}"
                )
            object.__setattr__(self, "out_weight_sums", out_weight)
            object.__setattr__(self, "out_bias_sum", out_bias)

    @property
    def num_shards(self) -> int:
        """``K``."""
        return int(self.weight_sums.shape[0])

    @property
    def shard_size(self) -> int:
        """``s = H / K`` nodes per shard."""
        return int(self.weight_sums.shape[1])


def nodes_of_shards(shards: ArrayLike, hidden: int, num_shards: int) -> NDArray[np.int64]:
    """Hidden nodes of the given shards (contiguous blocks of ``H / K`` nodes), increasing.

    Parameters
    ----------
    shards : array_like of int
        Distinct shard indices in ``[0, num_shards)``.
    hidden : int
        ``H``, a multiple of ``num_shards``.
    num_shards : int
        ``K``.

    Returns
    -------
    numpy.ndarray
        The nodes, strictly increasing.

    Raises
    ------
    ConfigurationError
        If ``H`` is not a multiple of ``K`` or a shard index is invalid or repeated.
    """
    size = _shard_size(hidden, num_shards)
    chosen = np.sort(np.asarray(shards, dtype=np.int64).ravel())
    if chosen.size and (chosen[0] < 0 or chosen[-1] >= num_shards or np.any(np.diff(chosen) == 0)):
        raise ConfigurationError(f"shards must be distinct indices in [0, {num_shards})")
    if not chosen.size:
        return np.zeros(0, dtype=np.int64)
    return (chosen[:, None] * size + np.arange(size)[None, :]).ravel()


def _shard_size(hidden: int, num_shards: int) -> int:
    hidden = _positive_int("hidden", hidden)
    num_shards = _positive_int("num_shards", num_shards)
    if hidden % num_shards:
        raise ConfigurationError(f"hidden width {hidden} is not a multiple of {num_shards} shards")
    return hidden // num_shards


def _shards_of(update: ClientUpdate, size: int, num_shards: int) -> NDArray[np.int64]:
    """Return the shards ``update`` trained (its nodes must be whole shards)."""
    shards = np.unique(update.nodes // size)
    if not np.array_equal(nodes_of_shards(shards, size * num_shards, num_shards), update.nodes):
        raise ConfigurationError("under SESA a client's nodes must be whole shards")
    return shards


def sesa_view(
    updates: Iterable[ClientUpdate], hidden: int, num_shards: int, *, reveal_counts: bool = True
) -> ShardView:
    """Aggregate like SESA (Eq. 28): per-shard sums over the clients that chose each shard.

    Parameters
    ----------
    updates : Iterable[ClientUpdate]
        The surviving clients' updates (no ids: the view has none). Each trains whole shards.
    hidden : int
        ``H``.
    num_shards : int
        ``K = 1 / B_min``; ``H`` must be a multiple.
    reveal_counts : bool
        Whether the view includes the number of contributors per shard.

    Returns
    -------
    ShardView
        The per-shard sums.

    Raises
    ------
    ConfigurationError
        If a client's nodes are not whole shards or the updates disagree on shapes.
    """
    size = _shard_size(hidden, num_shards)
    items = _check_updates(updates, hidden)
    if not items:
        raise ConfigurationError("sesa_view needs at least one client update")
    m = items[0].input_dim
    weight = np.zeros((num_shards, size, m))
    bias = np.zeros((num_shards, size))
    counts = np.zeros(num_shards, dtype=np.int64)
    num_classes = items[0].out_bias.size if items[0].out_bias is not None else 0
    with_out = items[0].has_output_layer
    out_weight = np.zeros((num_shards, num_classes, size)) if with_out else None
    out_bias = np.zeros(num_classes) if with_out else None
    for u in items:
        for j, k in enumerate(_shards_of(u, size, num_shards)):
            rows = slice(j * size, (j + 1) * size)
            weight[k] += u.weight[rows]
            bias[k] += u.bias[rows]
            counts[k] += 1
            if out_weight is not None and u.out_weight is not None:
                out_weight[k] += u.out_weight[:, rows]
        if out_bias is not None and u.out_bias is not None:
            out_bias += u.out_bias
    return ShardView(weight, bias, counts if reveal_counts else None, out_weight, out_bias)


def subtract_known(view: ShardView, known: Iterable[ClientUpdate]) -> ShardView:
    """Remove updates the server knows (colluding clients') from a SESA view.

    Parameters
    ----------
    view : ShardView
        The per-shard sums.
    known : Iterable[ClientUpdate]
        Updates of clients colluding with the server (each knows its shards and values).

    Returns
    -------
    ShardView
        The sums over the remaining (honest) contributors; counts decremented if present.

    Raises
    ------
    ConfigurationError
        If a known update does not fit the view, or would make a count negative.
    """
    items = list(known)
    if not items:
        return view
    hidden = view.num_shards * view.shard_size
    partial = sesa_view(items, hidden, view.num_shards)
    if partial.weight_sums.shape != view.weight_sums.shape:
        raise ConfigurationError("known updates do not have the view's input dimension")
    counts = None
    if view.counts is not None:
        assert partial.counts is not None
        counts = view.counts - partial.counts
        if np.any(counts < 0):
            raise ConfigurationError("more known contributors than the view's counts")
    out_weight = out_bias = None
    if view.out_weight_sums is not None and partial.out_weight_sums is not None:
        out_weight = view.out_weight_sums - partial.out_weight_sums
        assert view.out_bias_sum is not None and partial.out_bias_sum is not None
        out_bias = view.out_bias_sum - partial.out_bias_sum
    return ShardView(
        view.weight_sums - partial.weight_sums,
        view.bias_sums - partial.bias_sums,
        counts,
        out_weight,
        out_bias,
    )


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


def consensus_inputs(
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


def attack_peel(
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
