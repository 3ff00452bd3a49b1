"""Cui's basic protocol (Cui et al. §6): a private set union first, then SSA over the union.

The default SSA round runs over the whole element space ``[0, m)``: every server evaluates
every client's keys over all ``m`` elements and reveals no more than the aggregate. With
``union="psu"`` a round first computes the union ``U`` of the clients' element sets, opens it
to both servers and every client, and then runs SSA over ``[0, |U|)`` only — each client
re-indexes its elements to their positions in the sorted, public ``U`` — and maps the
aggregate back to ``[0, m)``. The servers' evaluation shrinks from ``m`` to ``|U|`` elements
per client and the keys get shorter (each bin's domain shrinks), which wins when the clients'
element sets overlap (rows of popular items); the PSU itself costs one more message round
and an upload of one vector per client.

**Which PSU, and why.** The two SSA servers run it themselves, on Niu's randomized Bloom
filter (:mod:`flwr_fsl.crypto.psu`, moved out of the SFSL family so SSA may use it; exact mode
— the indicator of the set, no false positive — by default): each client builds its vector
``v`` (a uniform nonzero word of ``Z_2^64`` at every position its set touches, 0 elsewhere)
and splits it additively: S1 gets a 16-byte seed (sealed to S1 in deployment, like SSA's
master seed) and S0 gets ``v - PRG(seed)``. Each server adds up its shares; the two sums are
exchanged and added, and only positions with a nonzero total are read. This needs no
SecAgg (no pairwise keys, no dropout recovery: a client that drops before SSA is simply
absent from the SSA phase) and adds no trust assumption beyond SSA's two non-colluding
servers. Because the words are uniform nonzero rather than 1s, the opened total does **not**
count the clients that set a position (the sum of ``c >= 1`` uniform nonzero words is
nonzero except with probability ``2^-64`` and otherwise close to uniform).

**Leakage (the option's, per round).** Each server sees one uniform-looking share per client
(nothing) and the opened total: the union ``U`` (up to Bloom false positives in Bloom mode),
not who holds which element nor how many. Every client learns ``U`` too. The aggregate then
reveals per element of ``U`` what the default round reveals. Without DP, the default already
reveals ``U`` as the support of the reconstructed counts; with DP (index mode's default) the
default reveals only noisy counts, while the PSU reveals the exact, noise-free support. Over
many rounds of changing participation, the differences of the unions reveal individual
clients' elements (``tests/attacks/test_ssa_psu_union_difference.py``): the option's leak,
which the default round does not have.

**Lying clients.** A client may claim elements in the PSU that it will not send (they enter
``U`` with a zero aggregate and count 0: the model keeps them; the cost grows, nothing else)
or send elements outside ``U`` — it cannot: its keys address positions of ``U`` only, so an
element that is not in ``U`` cannot be named (:meth:`UnionRound.local` drops it on an honest
client; a client can update any element of ``U`` it did not claim, as in the default round it
can update any element). A client claiming very many elements can inflate ``U`` up to ``m``
(the round then costs what the default round costs); a union larger than an honest one can
be (``clients * k`` in exact mode) makes the round fall back to the full domain
(:attr:`UnionRound.fallback`). A malformed share drops its client
(:class:`UnionInputError`). All harmless: the aggregate over ``U`` is exact for every client.
"""

from __future__ import annotations

import math
import os
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import register_magic
from flwr_fsl.crypto import channel
from flwr_fsl.crypto.channel import SealedBoxError, SealingKeyPair, client_party
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.crypto.psu import PSUParams, client_vector, reconstruct_union
from flwr_fsl.crypto.sealing import RoundBinding
from flwr_fsl.families.ssa.messages import SSAInputError
from flwr_fsl.families.ssa.protocol import (
    SSAParams,
    SSAResult,
    SSAServer,
    encode_update,
    reconstruct,
)
from flwr_fsl.families.ssa.verify import new_digest_key

__all__ = [
    "UNION_OPTIONS",
    "BasicRound",
    "ClientSet",
    "UnionInputError",
    "UnionParty",
    "UnionRound",
    "UnionShare",
    "check_union_option",
    "helper_vector",
    "lead_share_from_bytes",
    "open_psu_seed",
    "open_union",
    "psu_binding",
    "psu_params_from_bytes",
    "psu_params_to_bytes",
    "read_union",
    "run_basic_round",
    "seal_psu_seed",
    "share_set",
]

UNION_OPTIONS = ("off", "psu")
"""Values of a two-server strategy's ``union`` option: ``off`` (default) or ``psu`` (Cui §6)."""

SEED_BYTES = 16
_TAG_UNION = 0x6E6F696E752D7573  # b"su-union" little-endian: the helper share's PRG stream
PSU_SEED = "psu-seed"
"""Purpose of a client's PSU seed sealed to S1 (:func:`seal_psu_seed`)."""
SEALED_SEED_BYTES = SEED_BYTES + channel.OVERHEAD
"""Length of a sealed PSU seed (a blob of any other length is refused before opening)."""
_PARAMS = struct.Struct("<4sBQQBQ16s")  # magic, version, m, beta, h, P, hash key
_PARAMS_MAGIC = register_magic(
    b"FSPU", "PSU parameters of a union round (flwr_fsl.families.ssa.union)"
)
_PARAMS_VERSION = 1

# Flower fields of a strategy round with ``union="psu"`` (index mode, one table).
PSU_QUERY_TYPE = "query.psu"
"""The PSU phase's message type (before ``query.psr``)."""
PSU_PARAMS_FIELD = "fsl.union.psu"
"""Config field: the round's PSU parameters (:func:`psu_params_to_bytes`)."""
UNION_FIELD = "fsl.union.rows"
"""Config field of the PSR and train messages: the opened union (sorted int64, little-endian)."""
PSU_UPLOAD_KEY = "fsl.union.share"
"""Reply record of ``query.psu``: ``lead`` (S0's share, uint64 LE) and ``sealed`` (S1's seed)."""
NODE_ALLOW_UNION_KEY = "fsl-allow-union"
"""Node config: a client answers ``query.psu`` only if this is true (default false)."""


class UnionInputError(ClientInputError):
    """A client's PSU share does not fit the round (wrong length or type, duplicate)."""


def check_union_option(value: object) -> str:
    """Return a valid ``union`` option.

    Raises
    ------
    ConfigurationError
        If ``value`` is not one of :data:`UNION_OPTIONS`.
    """
    if not isinstance(value, str) or value not in UNION_OPTIONS:
        raise ConfigurationError(f"union must be one of {UNION_OPTIONS}, got {value!r}")
    return value


def helper_vector(psu: PSUParams, seed: bytes) -> NDArray[np.uint64]:
    """Expand S1's share of a client's PSU vector from its 16-byte seed.

    Raises
    ------
    UnionInputError
        If ``seed`` is not 16 bytes.
    """
    if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
        raise UnionInputError(f"the helper's PSU share must be a {SEED_BYTES}-byte seed")
    return PRGStream.from_seed(seed, tag=_TAG_UNION).words(psu.vector_length)


def psu_params_to_bytes(psu: PSUParams) -> bytes:
    """Encode a round's PSU parameters (v1: magic, version, ``m``, ``beta``, ``h``, ``P``, key)."""
    return _PARAMS.pack(
        _PARAMS_MAGIC,
        _PARAMS_VERSION,
        psu.domain_size,
        psu.bloom_length,
        psu.num_hashes,
        psu.num_partitions,
        psu.hash_key,
    )


def psu_params_from_bytes(data: bytes) -> PSUParams:
    """Decode :func:`psu_params_to_bytes` strictly (exact length, magic, version, ranges).

    Raises
    ------
    UnionInputError
        If the bytes are not v1 PSU parameters or a field is out of range.
    """
    if not isinstance(data, bytes) or len(data) != _PARAMS.size:
        raise UnionInputError(f"PSU parameters must be {_PARAMS.size} bytes")
    magic, version, m, beta, h, parts, key = _PARAMS.unpack(data)
    if magic != _PARAMS_MAGIC or version != _PARAMS_VERSION:
        raise UnionInputError("not v1 PSU parameters (bad magic or version)")
    try:
        return PSUParams(m, beta, h, parts, key)
    except ConfigurationError as err:
        raise UnionInputError(str(err)) from None


def psu_binding(session: bytes, round_id: int, psu: PSUParams) -> RoundBinding:
    """Return what a round's sealed PSU seeds are bound to: session, round, the PSU parameters."""
    return RoundBinding.of(session, round_id, psu_params_to_bytes(psu))


def seal_psu_seed(
    helper_public: bytes, *, binding: RoundBinding, client_id: int, seed: bytes
) -> bytes:
    """Client side: seal S1's 16-byte PSU seed to S1, bound to the round (:func:`psu_binding`).

    Raises
    ------
    SealedBoxError
        If an argument is malformed.
    """
    if not isinstance(seed, bytes) or len(seed) != SEED_BYTES:
        raise SealedBoxError(f"the PSU seed must be {SEED_BYTES} bytes")
    ad = channel.associated_data(
        purpose=PSU_SEED, sender=client_party(client_id), recipient="S1", **binding.fields()
    )
    return channel.seal(helper_public, seed, associated_data=ad)


def open_psu_seed(
    keypair: SealingKeyPair, sealed: bytes, *, binding: RoundBinding, client_id: int
) -> bytes:
    """S1 side: open a client's sealed PSU seed (length checked before opening).

    Raises
    ------
    SealedBoxError
        If the blob has the wrong length, does not open under this binding and client, or
        holds anything but 16 bytes.
    """
    if not isinstance(sealed, bytes) or len(sealed) != SEALED_SEED_BYTES:
        raise SealedBoxError(f"a sealed PSU seed is {SEALED_SEED_BYTES} bytes")
    ad = channel.associated_data(
        purpose=PSU_SEED, sender=client_party(client_id), recipient="S1", **binding.fields()
    )
    seed = channel.open_sealed(keypair, sealed, associated_data=ad)
    if len(seed) != SEED_BYTES:
        raise SealedBoxError(f"the PSU seed must be {SEED_BYTES} bytes")
    return seed


def lead_share_from_bytes(psu: PSUParams, data: object) -> NDArray[np.uint64]:
    """S0 side: a client's PSU share to S0 from its reply bytes (length checked first).

    Raises
    ------
    UnionInputError
        If ``data`` is not ``8 * psu.vector_length`` bytes.
    """
    if not isinstance(data, bytes) or len(data) != 8 * psu.vector_length:
        raise UnionInputError(f"S0's PSU share must be {psu.vector_length} uint64 words")
    return np.frombuffer(data, "<u8").astype(np.uint64)


def read_union(psu_bytes: object, union_bytes: object) -> UnionRound:
    """Client side: the round's union from its config fields, checked strictly.

    Raises
    ------
    UnionInputError
        If the parameters are malformed, or the union is not a non-empty, strictly ascending
        list of at most ``m`` int64 in ``[0, m)``.
    """
    if not isinstance(psu_bytes, bytes):
        raise UnionInputError(f"{PSU_PARAMS_FIELD!r} must be bytes")
    m = psu_params_from_bytes(psu_bytes).domain_size
    if (
        not isinstance(union_bytes, bytes)
        or not union_bytes
        or len(union_bytes) % 8
        or len(union_bytes) // 8 > m
    ):
        raise UnionInputError(f"{UNION_FIELD!r} must hold 1 to {m} int64 words")
    u = np.frombuffer(union_bytes, "<i8").astype(np.int64)
    if u[0] < 0 or u[-1] >= m or np.any(np.diff(u) <= 0):
        raise UnionInputError(f"the union must be strictly ascending in [0, {m})")
    return UnionRound(m, u)


@dataclass(frozen=True)
class UnionShare:
    """A client's PSU upload: S0's share in full, S1's as a seed.

    Attributes
    ----------
    lead_vector : numpy.ndarray
        ``v - PRG(seed)`` (uint64, ``psu.vector_length`` words), to S0.
    helper_seed : bytes
        16-byte seed of S1's share (sealed to S1 in deployment).
    """

    lead_vector: NDArray[np.uint64]
    helper_seed: bytes = field(repr=False)

    def upload_bytes(self) -> tuple[int, int]:
        """Bytes to S0 and to S1 (the seed sealed: ``16 + channel.OVERHEAD``)."""
        return 8 * int(self.lead_vector.size), SEED_BYTES + channel.OVERHEAD


def share_set(psu: PSUParams, indices: ArrayLike, seed: bytes | None = None) -> UnionShare:
    """Client side: the randomized filter of ``indices``, split into the two servers' shares.

    Parameters
    ----------
    psu : PSUParams
        The round's PSU parameters (public).
    indices : array_like
        The elements the client claims (in ``[0, m)``).
    seed : bytes, optional
        S1's 16-byte seed (tests); fresh OS randomness by default.

    Returns
    -------
    UnionShare
        What the client sends.

    Raises
    ------
    ConfigurationError
        If an index is outside ``[0, m)``.
    """
    seed = os.urandom(SEED_BYTES) if seed is None else seed
    vector = client_vector(psu, indices)
    return UnionShare(vector - helper_vector(psu, seed), seed)  # wraps mod 2^64


class UnionParty:
    """One server's side of the PSU: the sum of its shares of the clients' vectors.

    Parameters
    ----------
    psu : PSUParams
        The round's PSU parameters.
    party : int
        0 for S0 (full vectors), 1 for S1 (seeds).

    Raises
    ------
    ConfigurationError
        If ``party`` is not 0 or 1.
    """

    def __init__(self, psu: PSUParams, party: int) -> None:
        if party not in (0, 1):
            raise ConfigurationError(f"party must be 0 or 1, got {party!r}")
        self.psu, self.party = psu, party
        self.total = np.zeros(psu.vector_length, np.uint64)
        self.clients: list[int] = []

    def add(self, client_id: int, share: NDArray[np.uint64] | bytes) -> None:
        """Add a client's share (S0: its vector; S1: its seed).

        Raises
        ------
        UnionInputError
            If the client was added already or the share has the wrong type or length; the
            total is unchanged then.
        """
        if client_id in self.clients:
            raise UnionInputError(f"client {client_id} already sent its PSU share")
        if self.party == 1:
            if not isinstance(share, bytes):
                raise UnionInputError("S1's PSU share is a seed")
            words = helper_vector(self.psu, share)
        else:
            words = np.asarray(share)
            if words.dtype != np.uint64 or words.shape != (self.psu.vector_length,):
                raise UnionInputError(
                    f"S0's PSU share must be {self.psu.vector_length} uint64 words"
                )
        self.total += words
        self.clients.append(client_id)


def open_union(
    psu: PSUParams, total0: NDArray[np.uint64], total1: NDArray[np.uint64]
) -> NDArray[np.int64]:
    """Add the two servers' totals and read the union (sorted; the only thing opened)."""
    return reconstruct_union(psu, np.asarray(total0, np.uint64) + np.asarray(total1, np.uint64))


@dataclass(frozen=True)
class UnionRound:
    """A round's public union and the maps between ``[0, m)`` and ``[0, |U|)``.

    Attributes
    ----------
    domain_size : int
        ``m``.
    union : numpy.ndarray
        The sorted union (``arange(m)`` when :attr:`fallback`).
    fallback : bool
        The opened union was larger than honest clients can make it: the round runs over the
        full domain, as the default round does.
    """

    domain_size: int
    union: NDArray[np.int64]
    fallback: bool = False

    @classmethod
    def of(cls, domain_size: int, union: ArrayLike, limit: int) -> UnionRound:
        """Return the round's union, or the full domain when ``|U| > limit`` (a client lied).

        Raises
        ------
        ConfigurationError
            If ``union`` has an element outside ``[0, m)``.
        """
        u = np.unique(np.asarray(union, np.int64))
        if u.size and (u[0] < 0 or u[-1] >= domain_size):
            raise ConfigurationError(f"the union must lie in [0, {domain_size})")
        if u.size > limit:
            return cls(domain_size, np.arange(domain_size, dtype=np.int64), True)
        return cls(domain_size, u)

    @property
    def size(self) -> int:
        """``|U|``."""
        return int(self.union.size)

    def local(self, indices: ArrayLike) -> tuple[NDArray[np.int64], NDArray[np.bool_]]:
        """Client side: positions in ``U`` of ``indices``, and which of them are in ``U``.

        An element outside ``U`` (a Bloom false negative, probability ``2^-64``) cannot be
        sent; the mask says which elements are kept, in the order given.
        """
        idx = np.asarray(indices, np.int64).reshape(-1)
        pos = np.searchsorted(self.union, idx)
        inside = pos < self.size
        inside[inside] = self.union[pos[inside]] == idx[inside]
        return pos[inside], inside

    def params(self, base: SSAParams) -> SSAParams:
        """Return the SSA round over ``[0, |U|)`` (``num_items`` capped at ``|U|``).

        Raises
        ------
        ConfigurationError
            If the union is empty (there is nothing to aggregate).
        """
        if self.size == 0:
            raise ConfigurationError("the union is empty: no SSA round")
        return replace(base, domain_size=self.size, num_items=min(base.num_items, self.size))

    def expand(self, result: SSAResult) -> SSAResult:
        """Map an aggregate over ``[0, |U|)`` back to ``[0, m)`` (zeros off the union)."""
        sums = np.zeros((self.domain_size, result.sums.shape[1]), np.float64)
        sums[self.union] = result.sums
        counts = None
        if result.counts is not None:
            counts = np.zeros(self.domain_size, np.float64)
            counts[self.union] = result.counts
        return SSAResult(sums, counts)


@dataclass(frozen=True)
class ClientSet:
    """One simulated client's round: the elements it sends and, optionally, what it claims.

    Attributes
    ----------
    indices : numpy.ndarray
        Elements of its update (at most ``k``).
    values : numpy.ndarray
        ``(len(indices), value_width)`` deltas.
    claims : numpy.ndarray or None
        Elements it puts in the PSU (None: ``indices``, an honest client).
    """

    indices: NDArray[np.int64]
    values: NDArray[np.float64]
    claims: NDArray[np.int64] | None = None


@dataclass
class BasicRound:
    """Outcome and costs of one simulated round (:func:`run_basic_round`).

    Attributes
    ----------
    result : SSAResult
        The aggregate over ``[0, m)``.
    union : UnionRound or None
        The opened union (None with ``union="off"``).
    up_lead, up_helper : dict[int, int]
        Bytes each client sent to S0 and to S1 (PSU and SSA phases together).
    down_union : int
        Bytes of the union sent to every client (8 per element; 0 with ``union="off"``).
    server_seconds : dict[str, float]
        Each server's time (PSU adds and opening, SSA evaluation) and ``reconstruct``.
    dropped : dict[int, str]
        Clients dropped with the reason.
    ssa_params : SSAParams or None
        The SSA round that ran (over ``[0, |U|)`` with the PSU; None if the union was empty).
    """

    result: SSAResult
    union: UnionRound | None
    up_lead: dict[int, int] = field(default_factory=dict)
    up_helper: dict[int, int] = field(default_factory=dict)
    down_union: int = 0
    server_seconds: dict[str, float] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    ssa_params: SSAParams | None = None


def _psu_phase(
    psu: PSUParams, clients: Mapping[int, ClientSet], out: BasicRound, bad: Iterable[int]
) -> NDArray[np.int64]:
    parties = (UnionParty(psu, 0), UnionParty(psu, 1))
    spent = [0.0, 0.0]
    bad = set(bad)
    for cid, client in clients.items():
        claims = client.indices if client.claims is None else client.claims
        share = share_set(psu, claims)
        lead: NDArray[np.uint64] = share.lead_vector[:-1] if cid in bad else share.lead_vector
        up0, up1 = share.upload_bytes()
        out.up_lead[cid] = out.up_lead.get(cid, 0) + up0
        out.up_helper[cid] = out.up_helper.get(cid, 0) + up1
        try:
            for party, payload in ((0, lead), (1, share.helper_seed)):
                start = time.perf_counter()
                parties[party].add(cid, payload)
                spent[party] += time.perf_counter() - start
        except UnionInputError as err:
            out.dropped[cid] = f"PSU: {err}"
            if cid in parties[0].clients:  # S1 refused after S0 added: S0 takes it back
                parties[0].total -= lead
                parties[0].clients.remove(cid)
    start = time.perf_counter()
    union = open_union(psu, parties[0].total, parties[1].total)
    opened = time.perf_counter() - start
    out.server_seconds["S0"] = spent[0] + opened
    out.server_seconds["S1"] = spent[1] + opened
    return union


def run_basic_round(
    params: SSAParams,
    clients: Mapping[int, ClientSet],
    union: str = "off",
    psu: PSUParams | None = None,
    *,
    malformed_psu: Iterable[int] = (),
    rng: np.random.Generator | None = None,
) -> BasicRound:
    """Run one round of SSA (``union="off"``) or Cui's basic protocol (``"psu"``) in one process.

    Flower-free and in-process (both servers here, S1's material not sealed; bytes are
    counted as sent); for tests and benchmarks of the phase logic a strategy runs.

    Parameters
    ----------
    params : SSAParams
        The round over ``[0, m)`` (count-weighted, one-shot keys).
    clients : Mapping[int, ClientSet]
        Client id -> its update (and its PSU claims).
    union : str
        ``"off"`` or ``"psu"`` (:data:`UNION_OPTIONS`).
    psu : PSUParams, optional
        The PSU's parameters (default exact mode over ``[0, m)``).
    malformed_psu : iterable of int
        Clients whose PSU share to S0 is malformed (tests of a dropped client).
    rng : numpy.random.Generator, optional
        Stochastic rounding and cuckoo randomness.

    Returns
    -------
    BasicRound
        The aggregate over ``[0, m)`` and the costs.

    Raises
    ------
    ConfigurationError
        If ``union`` is not an option or ``psu`` does not cover ``[0, m)``.
    """
    check_union_option(union)
    m = params.domain_size
    out = BasicRound(SSAResult(np.zeros((m, params.tau - 1)), np.zeros(m)), None)
    out.server_seconds = {"S0": 0.0, "S1": 0.0, "reconstruct": 0.0}
    round_params = params
    if union == "psu":
        psu = PSUParams.exact(m) if psu is None else psu
        if psu.domain_size != m:
            raise ConfigurationError(f"psu.domain_size must be the round's m = {m}")
        opened = _psu_phase(psu, clients, out, malformed_psu)
        honest = len(clients) * params.num_items
        slack = 0 if psu.exact_mode else math.ceil(2 * psu.false_positive_rate(honest) * m) + 8
        out.union = UnionRound.of(m, opened, honest + slack)
        out.down_union = 8 * out.union.size
        if out.union.size == 0:
            return out
        round_params = out.union.params(params)
    out.ssa_params = round_params
    servers = _ssa_phase(round_params, clients, out, rng)
    start = time.perf_counter()
    result = reconstruct(round_params, servers[0].share(), servers[1].share())
    out.server_seconds["reconstruct"] = time.perf_counter() - start
    out.result = result if out.union is None else out.union.expand(result)
    return out


def _ssa_phase(
    params: SSAParams,
    clients: Mapping[int, ClientSet],
    out: BasicRound,
    rng: np.random.Generator | None,
) -> tuple[SSAServer, SSAServer]:
    """Encode every client left and add it to both servers, as the real pair does.

    As :class:`~flwr_fsl.families.ssa.two_server.LeadServer` and S1 do, a checked round
    (``params.verify``) draws a fresh secret digest key (digest version 3,
    :func:`~flwr_fsl.families.ssa.verify.new_digest_key`) known to both servers only; S1 checks
    each client against S0's digest, and a client that fails is dropped from both shares
    (``out.dropped``).
    """
    key = new_digest_key() if params.verify else None
    servers = tuple(SSAServer(params, party, threads=1, digest_key=key) for party in (0, 1))
    for cid, client in clients.items():
        if cid in out.dropped:
            continue
        indices, values = client.indices, np.asarray(client.values, np.float64)
        if out.union is not None:
            indices, kept = out.union.local(indices)
            values = values[kept]
        upload, _ = encode_update(params, indices, values, 1.0, rng=rng)
        out.up_lead[cid] = out.up_lead.get(cid, 0) + len(upload.public_part) + SEED_BYTES
        out.up_helper[cid] = out.up_helper.get(cid, 0) + SEED_BYTES + channel.OVERHEAD
        digest: bytes | None = None
        for party in (0, 1):
            start = time.perf_counter()
            try:
                digest = servers[party].add_client(
                    cid, upload.public_part, upload.master_seeds[party], digest
                )
            except SSAInputError as err:
                out.dropped[cid] = f"SSA: {err}"
                if party == 1:  # S0 added it before S1's check: S0 takes it back
                    servers[0].discard(cid)
                break
            finally:
                out.server_seconds[f"S{party}"] += time.perf_counter() - start
        servers[0].forget_recent()
    return servers[0], servers[1]
