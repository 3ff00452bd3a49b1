"""Private set union from Bloom filters and an additive sum (Niu et al., Alg. 3, Eq. 1).

A platform module: SFSL sums the vectors with Bonawitz SecAgg
(:mod:`flwr_fsl.families.sfsl`, which re-exports this module as ``flwr_fsl.families.sfsl.psu``),
Cui's basic protocol has the two SSA servers sum additive shares of them
(:mod:`flwr_fsl.families.ssa.union`). Only the sum is ever opened.

Each chosen client encodes its real index set ``S_i`` (indices in ``[0, m)``) as one vector
of ring words that secure aggregation (:mod:`flwr_fsl.families.secagg.protocol`) sums:

* a **Bloom filter** of ``beta`` positions and ``h`` keyed hash functions
  (``pos_k(j) = AES_key(j || k) mod beta``, the key public and fresh per round), where every
  position the set touches holds a *uniform nonzero* word of ``Z_2^64`` instead of a 1 —
  the sum of such words is nonzero (except with probability ``2^-64`` per position shared by
  two or more clients: a false negative) and, unlike a sum of 1s, does not count the clients
  that set it;
* a **partition indicator**: the domain is cut into ``P`` contiguous ranges and position ``p``
  holds a uniform nonzero word when ``S_i`` meets range ``p``.

The server opens only the sum, and reconstructs the union by testing the indices of the
non-empty partitions against the filter: ``j`` is in the union iff all ``h`` positions of
``j`` are nonzero. Candidates from empty partitions are never tested, which bounds the work by
the partitions the union touches and keeps their false positives out.

**Exact mode** (what the authors' code ran: ``beta = m``, ``h = 1``, the identity map, one
partition): no false positive at all, for small domains.

**Rates.** With ``phi`` the union's size, the filter's false-positive rate is
``(1 - (1 - 1/beta)^(h phi))^h`` (:meth:`PSUParams.false_positive_rate`); the design picks
``beta = -phi ln(FPR) / (ln 2)^2`` and ``h = log2(1/FPR)`` for a target FPR (Eq. 1,
:meth:`PSUParams.for_target`). After a round, :func:`union_report` gives the realized rate
``(set positions / beta)^h`` and the false-negative bound.

**Leakage.** Under secure aggregation the server learns the sum only: which filter positions
and partitions at least one client set (so the union, up to false positives, and the
partitions it meets), not which client set them nor how many. A client learns nothing but
the union (which Alg. 1 hands to everybody).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.prg import PRGStream, prf_blocks

__all__ = ["PSUParams", "UnionReport", "client_vector", "reconstruct_union", "union_report"]

_U64 = np.uint64
TAG_BLOOM = 0x6D6F6F6C622D7573  # b"su-bloom" little-endian
MAX_DOMAIN = 1 << 40
MAX_FILTER = 1 << 30


@dataclass(frozen=True)
class PSUParams:
    """One round's public PSU parameters.

    Parameters
    ----------
    domain_size : int
        ``m``: indices lie in ``[0, m)``.
    bloom_length : int
        ``beta``, the filter's positions.
    num_hashes : int
        ``h``; 0 selects exact mode (identity map, ``beta = m``).
    num_partitions : int
        ``P`` contiguous ranges of the domain.
    hash_key : bytes
        16-byte AES key of the hash functions (fresh per round).

    Raises
    ------
    ConfigurationError
        If a field is out of range (exact mode needs ``beta = m``).
    """

    domain_size: int
    bloom_length: int
    num_hashes: int
    num_partitions: int
    hash_key: bytes

    def __post_init__(self) -> None:
        for name, value, low, high in (
            ("domain_size", self.domain_size, 1, MAX_DOMAIN),
            ("bloom_length", self.bloom_length, 1, MAX_FILTER),
            ("num_hashes", self.num_hashes, 0, 64),
            ("num_partitions", self.num_partitions, 1, min(self.domain_size, MAX_FILTER)),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigurationError(f"PSU {name} must be an int in [{low}, {high}]")
        if self.num_hashes == 0 and self.bloom_length != self.domain_size:
            raise ConfigurationError("PSU exact mode (num_hashes = 0) needs bloom_length = m")
        if not isinstance(self.hash_key, bytes) or len(self.hash_key) != 16:
            raise ConfigurationError("PSU hash_key must be 16 bytes")

    @classmethod
    def exact(cls, domain_size: int) -> PSUParams:
        """Exact mode: the filter is the indicator of the set (FPR 0), one partition."""
        return cls(domain_size, domain_size, 0, 1, bytes(16))

    @classmethod
    def for_target(
        cls, domain_size: int, expected_union: int, target_fpr: float, num_partitions: int
    ) -> PSUParams:
        """Eq. (1): ``beta = -phi ln(FPR) / (ln 2)^2``, ``h = round(log2(1 / FPR))``.

        A fresh hash key is drawn. Raises :class:`ConfigurationError` on bad arguments.
        """
        if not 0.0 < target_fpr < 1.0:
            raise ConfigurationError("PSU target_fpr must be in (0, 1)")
        if isinstance(expected_union, bool) or not isinstance(expected_union, int):
            raise ConfigurationError("PSU expected_union must be an int")
        if expected_union < 1:
            raise ConfigurationError("PSU expected_union must be >= 1")
        beta = math.ceil(-expected_union * math.log(target_fpr) / math.log(2) ** 2)
        h = max(1, round(math.log2(1 / target_fpr)))
        return cls(domain_size, beta, h, num_partitions, os.urandom(16))

    @property
    def exact_mode(self) -> bool:
        """Whether the filter is the identity map."""
        return self.num_hashes == 0

    @property
    def vector_length(self) -> int:
        """Ring words one client contributes: ``beta + P``."""
        return self.bloom_length + self.num_partitions

    def false_positive_rate(self, union_size: int) -> float:
        """Return the filter's FPR for a union of ``union_size`` indices (0 in exact mode)."""
        if self.exact_mode:
            return 0.0
        fill = 1.0 - (1.0 - 1.0 / self.bloom_length) ** (self.num_hashes * union_size)
        return float(fill**self.num_hashes)

    def positions(self, indices: ArrayLike) -> NDArray[np.int64]:
        """Filter positions of each index: shape ``(len(indices), max(h, 1))``."""
        j = np.asarray(indices, dtype=np.int64)
        if self.exact_mode:
            return j.reshape(-1, 1)
        h = self.num_hashes
        grid = j.astype(_U64)[:, None] * _U64(h) + np.arange(h, dtype=_U64)[None, :]
        counters: NDArray[np.uint64] = np.ascontiguousarray(grid, dtype=_U64).reshape(-1)
        words = prf_blocks(self.hash_key, counters, TAG_BLOOM)[:, 0]
        return (words % _U64(self.bloom_length)).astype(np.int64).reshape(j.size, h)

    def partition_of(self, indices: ArrayLike) -> NDArray[np.int64]:
        """Return the partition of each index (contiguous ranges of ``ceil(m / P)``)."""
        width = -(-self.domain_size // self.num_partitions)
        return np.asarray(indices, dtype=np.int64) // width


def _check_set(params: PSUParams, indices: ArrayLike) -> NDArray[np.int64]:
    s = np.unique(np.asarray(indices, dtype=np.int64))
    if s.size and (s[0] < 0 or s[-1] >= params.domain_size):
        raise ConfigurationError(f"indices must lie in [0, {params.domain_size})")
    return s


def _nonzero_words(prg: PRGStream, count: int) -> NDArray[np.uint64]:
    words = prg.words(count)
    while np.any(words == 0):  # probability 2^-64 per word
        zero = words == 0
        words[zero] = prg.words(int(zero.sum()))
    return words


def client_vector(
    params: PSUParams, indices: ArrayLike, prg: PRGStream | None = None
) -> NDArray[np.uint64]:
    """Return a client's Alg. 3 vector: randomized Bloom filter, then partition indicator.

    Raises
    ------
    ConfigurationError
        If an index is outside ``[0, m)``.
    """
    s = _check_set(params, indices)
    prg = prg or PRGStream.fresh()
    vector = np.zeros(params.vector_length, dtype=_U64)
    bloom = np.unique(params.positions(s))
    vector[bloom] = _nonzero_words(prg, bloom.size)
    parts = np.unique(params.partition_of(s))
    vector[params.bloom_length + parts] = _nonzero_words(prg, parts.size)
    return vector


def reconstruct_union(params: PSUParams, total: NDArray[np.uint64]) -> NDArray[np.int64]:
    """Return the union from the aggregated vector (indices of non-empty partitions that pass).

    Raises
    ------
    ValueError
        If ``total`` does not have the round's length.
    """
    t = np.asarray(total)
    if t.dtype != _U64 or t.shape != (params.vector_length,):
        raise ValueError(f"the aggregate must be {params.vector_length} uint64 words")
    filled = t[: params.bloom_length] != 0
    parts = np.flatnonzero(t[params.bloom_length :] != 0)
    width = -(-params.domain_size // params.num_partitions)
    found = []
    for p in parts.tolist():  # candidates only from partitions some client touched
        candidates = np.arange(p * width, min((p + 1) * width, params.domain_size), dtype=np.int64)
        hit = filled[params.positions(candidates)].all(axis=1)
        found.append(candidates[hit])
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class UnionReport:
    """What a round's union reconstruction can be trusted to."""

    union_size: int
    set_positions: int
    false_positive_rate: float
    false_negative_bound: float
    candidates_tested: int


def union_report(
    params: PSUParams, total: NDArray[np.uint64], union: NDArray[np.int64], clients: int
) -> UnionReport:
    """Realized rates of a reconstruction.

    ``false_positive_rate`` is ``(set positions / beta)^h`` (a non-member of a non-empty
    partition passes with that probability; 0 in exact mode); ``false_negative_bound`` is
    ``positions * clients * 2^-64``, a union bound over the positions on the chance that the
    random words of two or more clients sum to zero.
    """
    set_positions = int(np.count_nonzero(total[: params.bloom_length]))
    fpr = 0.0 if params.exact_mode else (set_positions / params.bloom_length) ** params.num_hashes
    parts = int(np.count_nonzero(total[params.bloom_length :]))
    width = -(-params.domain_size // params.num_partitions)
    return UnionReport(
        union_size=int(union.size),
        set_positions=set_positions,
        false_positive_rate=float(fpr),
        false_negative_bound=float(params.vector_length * clients * 2.0**-64),
        candidates_tested=min(parts * width, params.domain_size),
    )
