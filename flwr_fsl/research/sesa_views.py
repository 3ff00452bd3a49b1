r"""What the server sees in the SESA attack: client updates, the global MLP, and its two views.

Split out of :mod:`flwr_fsl.research.sesa_attack` (which re-exports every public name here and
holds the estimators and the attacks themselves): the inputs of the attack —
:class:`ClientUpdate` (one client's hidden nodes and its one-SGD-step difference) and
:class:`GlobalMLP` — and the two things a server can be given, the plain per-client view
(:func:`naive_view`, FedAvg / HeteroFL without secure aggregation) and SESA's per-shard sums
(:func:`sesa_view`, :func:`subtract_known` for colluding clients). Flower-free and numpy-only,
with the input checks the attacks share.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError

__all__ = [
    "ACTIVATIONS",
    "ClientUpdate",
    "GlobalMLP",
    "NaiveView",
    "ShardView",
    "activate",
    "naive_view",
    "nodes_of_shards",
    "sesa_view",
    "subtract_known",
]

F64 = NDArray[np.float64]
Activation = Literal["relu", "sigmoid", "tanh"]
ACTIVATIONS: tuple[str, ...] = ("relu", "sigmoid", "tanh")


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
