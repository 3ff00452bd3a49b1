r"""SecAgg+'s sparse mask graph (Bell et al., CCS 2020): who masks with and shares to whom.

With ``neighbours = k`` (:class:`~flwr_fsl.families.secagg.messages.SecAggParams`), client
``u`` agrees pair masks with, and Shamir-shares its two secrets to, its ``k`` neighbours
``N(u)`` only, instead of every other client (Bonawitz et al.'s complete graph, which is what
``neighbours=None`` keeps). Flower's SecAgg+ calls ``k + 1`` its ``num_shares`` (the shares a
client deals, its own included); ``t`` (``reconstruction_threshold``) is then counted over the
neighbourhood: ``t <= k`` shares of a dropped client's key must come from its surviving
neighbours.

**The graph** is the Harary graph ``H(k, n)`` (the circulant graph on a ring of the ``n``
roster members, each joined to the ``k/2`` nearest on either side: ``k``-regular and
``k``-connected) over a pseudo-random ring order. The order sorts the clients by
``SHA-256(seed || id)`` where ``seed = SHA-256(domain || round parameters || roster)``, the
roster being every advertised id with both its public keys (:func:`graph_seed`). Every client
recomputes the graph from the roster it is sent; nobody sends it. Flower's SecAgg+ instead
has the server shuffle the ids with its own randomness, so a server that picks the graph can
give a victim only sybils (or clients it will report dropped) as neighbours and read the
victim's input from their pair masks and its self-mask seed.

**Threat model.** As :mod:`flwr_fsl.families.secagg.protocol` (honest-but-curious server,
colluding with fewer than ``t`` clients), plus a server that may insert sybil clients whose
keys it picks *after* seeing the honest advertisements. Because the seed hashes every key,
such a server can only *grind*: try rosters (sybil keys) until the hash isolates someone. One
try isolates a given honest victim with probability :func:`isolation_probability`
``= C(s, k) / C(n - 1, k)`` (``s`` adversarial clients, sybils and clients it drops alike,
among the victim's ``n - 1`` possible neighbours); ``G`` tries succeed with probability at
most ``G`` times that, times the number of honest victims (:func:`grinding_bound`). With a
third of 1,000 clients adversarial: at Bell et al.'s ``k = 2 ceil(log2 n) = 20`` one try
isolates a given victim with probability below ``10^-9``, but ``2^20`` tries isolate *some*
honest client with probability up to about 14%; ``k = 46`` keeps ``2^40`` tries below
``2^-20``; at ``k = 2`` one try succeeds with probability about ``1/9`` per victim and the
server then reads the victim's input exactly (``tests/attacks/test_secagg_isolation.py``).
So size ``k`` for the grinding a server could afford, or keep the default complete graph,
under which no sybil set short of all other clients isolates anyone. A commit-then-reveal
seed (clients commit to a nonce when advertising and reveal it after the roster is fixed)
would remove grinding and restore Bell et al.'s bound, at the cost of one more round trip; it
is not implemented. Beyond isolation, the
surviving honest clients' induced subgraph may split into components (then the server
learns each component's sum, not one client's): in ``H(k, n)`` that needs two runs of at
least ``k/2`` adversarial clients in ring order (:func:`split_bound`).
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from functools import lru_cache

from flwr_fsl.core.errors import ConfigurationError

__all__ = [
    "GRAPH_DOMAIN",
    "check_neighbours",
    "graph_seed",
    "grinding_bound",
    "harary",
    "isolation_probability",
    "neighbourhoods",
    "round_threshold",
    "split_bound",
    "suggested_neighbours",
]

GRAPH_DOMAIN = b"flwr_fsl/secagg/mask-graph/v1\x00"
"""Domain separation of :func:`graph_seed`."""


def check_neighbours(neighbours: object, threshold: int | None = None) -> int | None:
    """Validate a ``neighbours`` setting (``None``: the complete graph).

    Parameters
    ----------
    neighbours : object
        ``k``: an even int ``>= 2``, or ``None``.
    threshold : int, optional
        ``t`` as a count: it must not exceed ``k`` (a dropped client's key is rebuilt from
        its surviving neighbours' shares alone).

    Returns
    -------
    int or None
        ``k``.

    Raises
    ------
    ConfigurationError
        Naming ``neighbours`` (or ``reconstruction_threshold``) when invalid.
    """
    if neighbours is None:
        return None
    if isinstance(neighbours, bool) or not isinstance(neighbours, int) or neighbours < 2:
        raise ConfigurationError(f"neighbours must be an even int >= 2 or None, got {neighbours!r}")
    if neighbours % 2:
        raise ConfigurationError(
            f"neighbours must be even (Flower's num_shares = neighbours + 1 is odd), got "
            f"{neighbours}"
        )
    if threshold is not None and threshold > neighbours:
        raise ConfigurationError(
            f"reconstruction_threshold t = {threshold} exceeds neighbours = {neighbours}: a "
            "dropped client's key could never be rebuilt from its neighbours' shares"
        )
    return neighbours


def suggested_neighbours(n: int) -> int:
    """Return ``2 ceil(log2 n)`` (Bell et al.'s ``O(log n)``), even and below ``n``."""
    k = 2 * math.ceil(math.log2(max(n, 2)))
    return min(k, n - 1 if (n - 1) % 2 == 0 else n - 2) if n > 2 else 2


def graph_seed(params_bytes: bytes, roster_bytes: bytes) -> bytes:
    """``SHA-256(domain || params || roster)``: the public randomness that orders the ring."""
    return hashlib.sha256(GRAPH_DOMAIN + params_bytes + roster_bytes).digest()


def harary(ids: Sequence[int], k: int | None, seed: bytes) -> dict[int, frozenset[int]]:
    """Return ``id -> N(id)`` of ``H(k, n)`` over the ring order ``SHA-256(seed || id)``.

    ``k = None`` or ``k >= n - 1`` gives the complete graph.
    """
    members = sorted(set(ids))
    n = len(members)
    if k is None or k >= n - 1:
        everyone = frozenset(members)
        return {u: everyone - {u} for u in members}
    ring = sorted(members, key=lambda u: hashlib.sha256(seed + struct.pack("<Q", u)).digest())
    half = k // 2
    out: dict[int, frozenset[int]] = {}
    for pos, u in enumerate(ring):
        out[u] = frozenset(ring[(pos + d) % n] for d in range(-half, half + 1) if d)
    return out


@lru_cache(maxsize=8)
def _cached(
    params_bytes: bytes, roster_bytes: bytes, ids: tuple[int, ...], k: int | None
) -> Mapping[int, frozenset[int]]:
    return harary(ids, k, graph_seed(params_bytes, roster_bytes))


def neighbourhoods(
    params_bytes: bytes, roster_bytes: bytes, ids: Sequence[int], k: int | None
) -> Mapping[int, frozenset[int]]:
    """Return the round's graph from its parameters and roster bytes (cached)."""
    return _cached(params_bytes, roster_bytes, tuple(sorted(ids)), k)


def isolation_probability(n: int, k: int, adversarial: int) -> float:
    """Chance that all ``k`` neighbours of one honest client are among ``adversarial`` others.

    Exact for one random ring order: ``C(s, k) / C(n - 1, k)``.
    """
    if k >= n - 1:
        return 1.0 if adversarial >= n - 1 else 0.0
    return math.comb(adversarial, k) / math.comb(n - 1, k)


def grinding_bound(n: int, k: int, adversarial: int, tries: int) -> float:
    """Union bound on a grinding server isolating *some* honest client within ``tries`` rosters."""
    honest = n - adversarial
    return min(1.0, tries * honest * isolation_probability(n, k, adversarial))


def split_bound(n: int, k: int, fraction: float) -> float:
    """Union bound on the honest survivors' subgraph of ``H(k, n)`` splitting.

    Each client independently adversarial or dropped with probability ``fraction``; a split
    needs two disjoint runs of ``k/2`` such clients in ring order: at most
    ``(n fraction^(k/2))^2``.
    """
    return min(1.0, (n * fraction ** (k // 2)) ** 2)


def round_threshold(
    threshold: int | float, sampled: int, neighbours: int | None
) -> tuple[int, int | None]:
    """Return a round's ``t`` and the ``neighbours`` its parameters carry.

    ``neighbours`` applies only when the graph would be sparse (``k < sampled - 1``; else the
    round is the complete graph and its parameters stay version 1). A fractional ``t`` is a
    fraction of the shares each client deals: Flower's ``num_shares = k + 1`` when sparse (at
    most ``k``), else of the sampled clients; at least 2 either way.
    """
    sparse = neighbours is not None and neighbours < sampled - 1
    if not isinstance(threshold, float):
        return threshold, neighbours if sparse else None
    if neighbours is not None and sparse:
        return min(neighbours, max(2, math.ceil(threshold * (neighbours + 1)))), neighbours
    return max(2, math.ceil(threshold * sampled)), None
