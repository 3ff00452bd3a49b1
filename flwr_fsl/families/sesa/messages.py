"""SESA's byte formats: round parameters, id sets, rosters, bundles, evaluations, client state.

Flower-free, the half of SESA that fixes what goes on the wire; the parties that produce and
consume these messages are in :mod:`flwr_fsl.families.sesa.protocol` (which re-exports the
names it always exported). :class:`ShardVector` is the fixed-point encoding of a shard update
(with its count word) into the field words those messages carry.

**Wire formats** (little-endian, :mod:`flwr_fsl.core.wireformat`, version 1, every length checked
before anything is allocated; field elements as ``u32`` words): parameters ``FSEP``, roster
``FSER``, id set ``FSEU``, offline bundle ``FSEB``, evaluation plaintext ``FSEI`` (sealed),
masked update ``FSEX`` (version 2: bound to the round's parameter digest, carrying the
client's complaint), evaluation request ``FSED``, evaluation ``FSEE``, client state ``FSEC``,
relayed mailbox ``FSEM`` (the sealed evaluations addressed to a client, sent with ``train``).
Every decoder raises :class:`SesaError` (a :class:`~flwr_fsl.core.errors.ClientInputError`:
drop that client).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.crypto.channel import KEY_BYTES, OVERHEAD, SESSION_BYTES
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.ring import SESA_PRIME, PrimeField
from flwr_fsl.crypto.sealing import RoundBinding

__all__ = [
    "MASKED_VERSION",
    "MAX_CLIENTS",
    "MAX_GROUPS",
    "MAX_LENGTH",
    "MAX_SHARDS",
    "VERSION",
    "SesaError",
    "SesaGroup",
    "SesaParams",
    "ShardVector",
    "bundle_bytes",
    "decode_ids",
    "encode_ids",
    "mailbox_from_bytes",
    "mailbox_to_bytes",
]

_U64 = np.uint64
VERSION = 1
MAX_CLIENTS = 10_000
"""Most clients one round may have (bounds every roster and list the decoders accept)."""
MAX_GROUPS = 64
"""Most groups (independent shard sets) in one round."""
MAX_SHARDS = 10_000
"""Most shards in one group, and the largest ``T``."""
MAX_LENGTH = 1 << 28
"""Most words in one shard vector."""
_SEED_BYTES = 16
_WORD = np.dtype("<u4")

_M_PARAMS = register_magic(b"FSEP", "SESA round parameters (flwr_fsl.families.sesa.messages)")
_M_ROSTER = register_magic(b"FSER", "SESA roster (flwr_fsl.families.sesa.messages)")
_M_IDS = register_magic(b"FSEU", "SESA client id set (flwr_fsl.families.sesa.messages)")
_M_BUNDLE = register_magic(b"FSEB", "SESA offline bundle (flwr_fsl.families.sesa.messages)")
_M_PIECE = register_magic(
    b"FSEI", "SESA sealed evaluations plaintext (flwr_fsl.families.sesa.messages)"
)
_M_MASKED = register_magic(b"FSEX", "SESA masked update (flwr_fsl.families.sesa.messages)")
_M_REQUEST = register_magic(b"FSED", "SESA evaluation request (flwr_fsl.families.sesa.messages)")
_M_EVAL = register_magic(b"FSEE", "SESA evaluation (flwr_fsl.families.sesa.messages)")
_M_STATE = register_magic(b"FSEC", "SESA client state (flwr_fsl.families.sesa.messages)")
_M_MAILBOX = register_magic(b"FSEM", "SESA relayed mailbox (flwr_fsl.families.sesa.messages)")
MASKED_VERSION = 2
"""Version of the ``FSEX`` masked update (2: bound to the round's parameters, with a complaint)."""


class SesaError(ClientInputError):
    """A SESA message from one party is malformed or inconsistent: drop that party."""


def _int(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigurationError(f"SESA {name} must be an int in [{low}, {high}], got {value!r}")
    if not low <= int(value) <= high:
        raise ConfigurationError(f"SESA {name} must be in [{low}, {high}], got {value}")
    return int(value)


# ---------------------------------------------------------------------------------- params


@dataclass(frozen=True)
class SesaGroup:
    """One set of ``shards`` shard vectors of ``length`` words, aggregated independently.

    Parameters
    ----------
    shards : int
        ``K``, the number of shards, in ``[1, MAX_SHARDS]``.
    length : int
        ``d``, the words per shard vector (with any count word), in ``[1, MAX_LENGTH]``.

    Raises
    ------
    ConfigurationError
        If a field is out of range.
    """

    shards: int
    length: int

    def __post_init__(self) -> None:
        _int(self.shards, "group shards", 1, MAX_SHARDS)
        _int(self.length, "group length", 1, MAX_LENGTH)


@dataclass(frozen=True)
class SesaParams:
    """Public parameters of one SESA round, as the server and every client see them.

    Parameters
    ----------
    round_id : int
        The server round (bound into every sealed evaluation).
    session : bytes
        16 random bytes the server drew for the run.
    privacy : int
        ``T >= 1``: colluding clients tolerated (with the server).
    groups : tuple of SesaGroup
        The independent shard sets (1 to :data:`MAX_GROUPS`).
    prime : int, optional
        The field modulus (default ``2^32 - 5``); any prime in ``[3, 2^32)``.

    Raises
    ------
    ConfigurationError
        If a field is out of range, the prime is not prime, or ``K_max + T`` does not leave
        room for a client's evaluation point below ``p``.
    """

    round_id: int
    session: bytes
    privacy: int
    groups: tuple[SesaGroup, ...]
    prime: int = SESA_PRIME

    def __post_init__(self) -> None:
        _int(self.round_id, "round_id", 0, (1 << 64) - 1)
        _int(self.privacy, "privacy T", 1, MAX_SHARDS)
        if not isinstance(self.session, bytes) or len(self.session) != SESSION_BYTES:
            raise ConfigurationError(f"SESA session must be {SESSION_BYTES} bytes")
        groups = tuple(self.groups) if isinstance(self.groups, list | tuple) else None
        if not groups or len(groups) > MAX_GROUPS:
            raise ConfigurationError(f"SESA needs 1 to {MAX_GROUPS} groups, got {self.groups!r}")
        if not all(isinstance(g, SesaGroup) for g in groups):
            raise ConfigurationError("SESA groups must be SesaGroup instances")
        object.__setattr__(self, "groups", groups)
        PrimeField(_int(self.prime, "prime", 3, (1 << 32) - 1))  # primality
        if self.alpha_base >= self.prime:
            raise ConfigurationError(
                f"SESA needs K_max + T + 1 = {self.alpha_base} < p = {self.prime} (distinct points)"
            )

    @property
    def field(self) -> PrimeField:
        """``F_p``."""
        return PrimeField(self.prime)

    @property
    def max_shards(self) -> int:
        """``K_max``, the most shards of any group."""
        return max(g.shards for g in self.groups)

    @property
    def threshold(self) -> int:
        """``K_max + T``: the fewest clients that must be left at every step."""
        return self.max_shards + self.privacy

    @property
    def alpha_base(self) -> int:
        """``α`` of the client at roster position 0 (``K_max + T + 1``)."""
        return self.threshold + 1

    @property
    def max_clients(self) -> int:
        """Most clients whose points ``α`` stay distinct and below ``p``."""
        return min(MAX_CLIENTS, self.prime - self.alpha_base)

    def betas(self, group: int) -> NDArray[np.uint64]:
        """``β_1..β_{K+T}`` of a group: ``1..K+T``."""
        g = self.groups[group]
        return np.arange(1, g.shards + self.privacy + 1, dtype=_U64)

    def alphas(self, positions: ArrayLike) -> NDArray[np.uint64]:
        """``α`` of the clients at these roster positions (0-based)."""
        pos = np.asarray(positions, dtype=np.int64)
        return (pos + self.alpha_base).astype(_U64)

    def to_bytes(self) -> bytes:
        """``FSEP`` v1: round u64, session 16, T u32, p u32, groups (count, K u32 + d u32)."""
        w = Writer()
        w.fixed(_M_PARAMS, 4)
        w.u8(VERSION)
        w.u64(self.round_id)
        w.fixed(self.session, SESSION_BYTES)
        w.u32(self.privacy)
        w.u32(self.prime)
        w.count(len(self.groups))
        for g in self.groups:
            w.u32(g.shards)
            w.u32(g.length)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: bytes) -> SesaParams:
        """Strict decoder of :meth:`to_bytes`.

        Raises
        ------
        SesaError
            If the bytes are not exactly one version-1 parameter record or a field is invalid.
        """
        try:
            r = Reader.versioned(data, _M_PARAMS, VERSION, "SESA parameters")
            round_id = r.u64("round")
            session = r.fixed(SESSION_BYTES, "session")
            privacy = r.u32("T")
            prime = r.u32("prime")
            n = r.count("groups", 8)
            if n > MAX_GROUPS:
                raise SesaError(f"SESA parameters list {n} groups, at most {MAX_GROUPS}")
            groups = tuple(SesaGroup(r.u32("shards"), r.u32("length")) for _ in range(n))
            r.done()
            return cls(round_id, session, privacy, groups, prime)
        except (WireFormatError, ConfigurationError) as err:
            raise SesaError(f"bad SESA parameters: {err}") from err

    @property
    def binding(self) -> RoundBinding:
        """Session, round and the SHA-256 of :meth:`to_bytes`, bound into every sealed piece."""
        return RoundBinding.of(self.session, self.round_id, self.to_bytes())

    @property
    def digest(self) -> bytes:
        """SHA-256 of :meth:`to_bytes`."""
        return hashlib.sha256(self.to_bytes()).digest()


# ---------------------------------------------------------------------------------- codecs


def _check_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise SesaError("a client id must be an int")
    if not 0 <= int(value) < 1 << 64:
        raise SesaError("a client id must be in [0, 2**64)")
    return int(value)


def _reader(data: object, magic: bytes, what: str, version: int = VERSION) -> Reader:
    try:
        return Reader.versioned(data, magic, version, what)
    except WireFormatError as err:
        raise SesaError(str(err)) from err


def _header(magic: bytes, error: type[ClientInputError] = WireFormatError) -> Writer:
    w = Writer(error)
    w.fixed(magic, 4)
    w.u8(VERSION)
    return w


def encode_ids(ids: Iterable[int]) -> bytes:
    """``FSEU`` v1: a set of client ids (count u32, sorted u64 ids)."""
    w = _header(_M_IDS, SesaError)
    w.ids([_check_id(i) for i in ids], canonical=True, limit=MAX_CLIENTS)
    return w.payload()


def decode_ids(data: bytes) -> tuple[int, ...]:
    """Strict decoder of :func:`encode_ids` (raises :class:`SesaError`)."""
    r = _reader(data, _M_IDS, "a SESA id set")
    try:
        ids = r.ids("client ids", increasing=True, limit=MAX_CLIENTS)
        r.done()
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    return ids


def _roster_to_bytes(roster: Mapping[int, bytes]) -> bytes:
    w = _header(_M_ROSTER)
    w.node_map(roster, KEY_BYTES)
    return w.payload()


def _roster_from_bytes(data: bytes) -> dict[int, bytes]:
    r = _reader(data, _M_ROSTER, "a SESA roster")
    try:
        roster = r.node_map("roster", KEY_BYTES, limit=MAX_CLIENTS)
        r.done()
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    if len(set(roster.values())) != len(roster):
        raise SesaError("the roster repeats a public key")
    return roster


def _words_to_bytes(w: Writer, words: NDArray[np.uint64]) -> None:
    w.parts.append(np.ascontiguousarray(words, dtype=_WORD).tobytes())


def _words(r: Reader, count: int, field_: PrimeField, what: str) -> NDArray[np.uint64]:
    """Read ``count`` u32 words that must be field elements (length checked first)."""
    try:
        raw = r.fixed(4 * count, what)
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    out = np.frombuffer(raw, dtype=_WORD).astype(_U64)
    if out.size and int(out.max()) >= field_.p:
        raise SesaError(f"{what} holds a value outside F_{field_.p}")
    return out


def _slot_counts(r: Reader, params: SesaParams, what: str) -> tuple[int, ...]:
    try:
        n = r.u32(f"{what} group count")
        if n != len(params.groups):
            raise SesaError(f"{what} has {n} groups, the round has {len(params.groups)}")
        counts = tuple(r.u32(f"{what} slots") for _ in range(n))
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    for c, g in zip(counts, params.groups, strict=True):
        if not 1 <= c <= g.shards:
            raise SesaError(f"{what} has {c} slots in a group of {g.shards} shards")
    return counts


def _piece_size(params: SesaParams, slots: Sequence[int]) -> int:
    """Plaintext bytes of one client's evaluations for another."""
    body = sum(4 + 4 * k * (1 + g.length) for k, g in zip(slots, params.groups, strict=True))
    return 4 + 1 + 16 + 4 + body


def _encode_piece(
    sender: int,
    recipient: int,
    selectors: Sequence[NDArray[np.uint64]],
    masks: Sequence[NDArray[np.uint64]],
) -> bytes:
    """``FSEI`` v1: sender, recipient u64, groups u32, then per group ``K_i``, ``ϕ``, ``φ``."""
    w = _header(_M_PIECE)
    w.u64(sender)
    w.u64(recipient)
    w.u32(len(selectors))
    for phi, mask in zip(selectors, masks, strict=True):
        w.u32(phi.size)
        _words_to_bytes(w, phi)
        _words_to_bytes(w, mask)
    return w.payload()


def _decode_piece(
    data: bytes, params: SesaParams, sender: int, recipient: int, slots: Sequence[int]
) -> list[tuple[NDArray[np.uint64], NDArray[np.uint64]]]:
    """Strict decoder of :func:`_encode_piece` for the slots the sender's ``x`` has."""
    r = _reader(data, _M_PIECE, "SESA evaluations")
    try:
        ids = (r.u64("sender"), r.u64("recipient"))
        if ids != (sender, recipient):
            raise SesaError("SESA evaluations name another sender or recipient")
        n = r.u32("groups")
        if n != len(params.groups):
            raise SesaError("SESA evaluations have the wrong number of groups")
        out = []
        for k, g in zip(slots, params.groups, strict=True):
            if r.u32("slots") != k:
                raise SesaError("SESA evaluations and masked update disagree on the slots")
            phi = _words(r, k, params.field, "selector evaluations")
            mask = _words(r, k * g.length, params.field, "mask evaluations")
            out.append((phi, mask.reshape(k, g.length)))
        r.done()
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    return out


def bundle_bytes(params: SesaParams, roster_size: int, slots: Sequence[int]) -> int:
    """Exact size of a client's offline upload (Theorem 1's ``O(N K_i d)``).

    ``FSEB`` header (5), group count and slot counts (``4 + 4 G``), recipient count (4), and
    for each of the ``N - 1`` others: id (8), length (4) and the sealed evaluations
    (plaintext :func:`_piece_size` + :data:`~flwr_fsl.crypto.channel.OVERHEAD`).
    """
    piece = _piece_size(params, slots) + OVERHEAD
    return 5 + 4 + 4 * len(params.groups) + 4 + (roster_size - 1) * (8 + 4 + piece)


def _masked_to_bytes(
    masked: Sequence[NDArray[np.uint64]], params: SesaParams, complaint: Iterable[int] = ()
) -> bytes:
    """``FSEX`` v2: the round's parameter digest, the complaint, ``K_i`` per group, the words.

    The digest binds the masked update to its round (a replay from another round or run is
    refused by the server, never decoded); the complaint is the sorted set of senders whose
    sealed evaluations did not open for this client (:mod:`flwr_fsl.families.sesa.attribution`).
    """
    w = Writer()
    w.fixed(_M_MASKED, 4)
    w.u8(MASKED_VERSION)
    w.fixed(params.digest, 32)
    w.ids([_check_id(i) for i in complaint], canonical=True, limit=MAX_CLIENTS)
    w.u32(len(masked))
    for x in masked:
        w.u32(x.shape[0])
    for x in masked:
        _words_to_bytes(w, x)
    return w.payload()


def _read_masked(
    data: bytes, params: SesaParams, slots: Sequence[int] | None = None
) -> tuple[list[NDArray[np.uint64]], tuple[int, ...]]:
    """Strict decoder of :func:`_masked_to_bytes`: the masked words and the complaint.

    Raises :class:`SesaError` if the bytes are malformed, bound to another round's parameters,
    or their slots differ from ``slots``.
    """
    r = _reader(data, _M_MASKED, "a SESA masked update", MASKED_VERSION)
    try:
        if r.fixed(32, "round digest") != params.digest:
            raise SesaError("the masked update is bound to another round (a replay)")
        complaint = r.ids("complaint", increasing=True, limit=MAX_CLIENTS)
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    counts = _slot_counts(r, params, "masked update")
    if slots is not None and tuple(counts) != tuple(slots):
        raise SesaError("the masked update's slots differ from the offline bundle's")
    out = [
        _words(r, k * g.length, params.field, "masked update").reshape(k, g.length)
        for k, g in zip(counts, params.groups, strict=True)
    ]
    try:
        r.done()
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    return out, complaint


def _masked_from_bytes(
    data: bytes, params: SesaParams, slots: Sequence[int] | None = None
) -> list[NDArray[np.uint64]]:
    """Return the masked words of :func:`_read_masked`."""
    return _read_masked(data, params, slots)[0]


def mailbox_to_bytes(entries: Mapping[int, tuple[Sequence[int], bytes | memoryview]]) -> bytes:
    """``FSEM`` v1: sender u64 -> (``K_i`` per group as u32, then its sealed evaluations)."""
    w = _header(_M_MAILBOX, SesaError)
    body = {
        _check_id(j): np.asarray(slots, dtype="<u4").tobytes() + blob
        for j, (slots, blob) in entries.items()
    }
    w.node_map(body, None, limit=MAX_CLIENTS)
    return w.payload()


def mailbox_from_bytes(data: bytes, params: SesaParams) -> dict[int, tuple[tuple[int, ...], bytes]]:
    """Strict decoder of :func:`mailbox_to_bytes` (raises :class:`SesaError`)."""
    r = _reader(data, _M_MAILBOX, "a SESA mailbox")
    head = 4 * len(params.groups)
    try:
        raw = r.node_map("mailbox", None, limit=MAX_CLIENTS)
        r.done()
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    out = {}
    for j, entry in raw.items():
        if len(entry) < head:
            raise SesaError("a SESA mailbox entry is truncated")
        slots = tuple(int(k) for k in np.frombuffer(entry[:head], dtype="<u4"))
        if not all(1 <= k <= g.shards for k, g in zip(slots, params.groups, strict=True)):
            raise SesaError("a SESA mailbox entry has slot counts out of range")
        out[j] = (slots, entry[head:])
    return out


def _evaluation_to_bytes(psi: Sequence[NDArray[np.uint64]]) -> bytes:
    w = _header(_M_EVAL)
    for y in psi:
        _words_to_bytes(w, y)
    return w.payload()


def _evaluation_from_bytes(data: bytes, params: SesaParams) -> list[NDArray[np.uint64]]:
    r = _reader(data, _M_EVAL, "a SESA evaluation")
    out = [_words(r, g.length, params.field, "evaluation") for g in params.groups]
    try:
        r.done()
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    return out


@dataclass(frozen=True)
class _Request:
    survivors: tuple[int, ...]
    masked: dict[int, bytes]
    pieces: dict[int, bytes]


def _request_to_bytes(req: _Request) -> bytes:
    w = _header(_M_REQUEST)
    w.ids(list(req.survivors))
    for j in req.survivors:
        w.raw(req.masked[j])
        w.raw(req.pieces.get(j, b""))
    return w.payload()


def _request_from_bytes(data: bytes, node: int) -> _Request:
    r = _reader(data, _M_REQUEST, "a SESA evaluation request")
    try:
        survivors = r.ids("U3", increasing=True, limit=MAX_CLIENTS)
        masked: dict[int, bytes] = {}
        pieces: dict[int, bytes] = {}
        for j in survivors:
            masked[j] = r.raw("masked update")
            blob = r.raw("sealed evaluations")
            if (j == node) != (not blob):
                raise SesaError("an evaluation request must hold one sealed piece per other client")
            if blob:
                pieces[j] = blob
        r.done()
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    return _Request(survivors, masked, pieces)


def _bundle_to_bytes(slots: Sequence[int], sealed: Sequence[tuple[int, bytes]]) -> bytes:
    """``FSEB`` v1: group count and ``K_i`` per group (u32), then recipient u64 -> sealed blob."""
    w = _header(_M_BUNDLE)
    w.u32(len(slots))
    for k in slots:
        w.u32(k)
    w.count(len(sealed))
    for peer, blob in sealed:
        w.u64(peer)
        w.raw(blob)
    return w.payload()


def _bundle_from_bytes(
    data: bytes, params: SesaParams
) -> tuple[tuple[int, ...], dict[int, memoryview]]:
    """Strict decoder of :func:`_bundle_to_bytes`: ``K_i`` per group and recipient -> blob.

    Every blob must have the sealed size of the announced slots, and no recipient may repeat.
    The blobs are read-only views into the bundle (no copy: a server's mailbox holds ``N²``
    of them, and the bundle's bytes are then kept once, by the views).
    """
    r = _reader(data, _M_BUNDLE, "a SESA offline bundle")
    view = memoryview(r.data)
    slots = _slot_counts(r, params, "bundle")
    size = _piece_size(params, slots) + OVERHEAD
    try:
        n = r.count("recipients", 12 + size)
        sealed = {}
        for _ in range(n):
            peer = r.u64("recipient")
            length = r.u32("sealed evaluations length")
            if length != size or peer in sealed:
                raise SesaError("a sealed evaluation has the wrong size or is repeated")
            r.fixed(length, "sealed evaluations")  # bounds-checked; the view is kept
            sealed[peer] = view[r.pos - length : r.pos]
        r.done()
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    return slots, sealed


@dataclass(frozen=True)
class _State:
    """What a :class:`~flwr_fsl.families.sesa.protocol.SesaClient` keeps between messages."""

    node: int
    private: bytes
    seed: bytes
    params: SesaParams
    shards: tuple[tuple[int, ...], ...]
    roster: dict[int, bytes]
    sharers: tuple[int, ...]
    evaluated: bool


def _state_to_bytes(state: _State) -> bytes:
    """``FSEC`` v1: node, private key, seed, parameters, shard choice, roster, ``U2``, flag."""
    w = _header(_M_STATE)
    w.u64(state.node)
    w.fixed(state.private, KEY_BYTES)
    w.fixed(state.seed, _SEED_BYTES)
    w.raw(state.params.to_bytes())
    for group in state.shards:
        w.ids(list(group))
    w.raw(_roster_to_bytes(state.roster) if state.roster else b"")
    w.ids(list(state.sharers))
    w.u8(int(state.evaluated))
    return w.payload()


def _state_from_bytes(data: bytes) -> _State:
    """Strict decoder of :func:`_state_to_bytes` (raises :class:`SesaError`)."""
    r = _reader(data, _M_STATE, "a SESA client state")
    try:
        node = r.u64("node")
        private = r.fixed(KEY_BYTES, "key")
        seed = r.fixed(_SEED_BYTES, "seed")
        params = SesaParams.from_bytes(r.raw("params"))
        shards = tuple(r.ids("shards") for _ in params.groups)
        roster_raw = r.raw("roster")
        sharers = r.ids("U2", increasing=True, limit=MAX_CLIENTS)
        evaluated = r.u8("evaluated")
        r.done()
    except WireFormatError as err:
        raise SesaError(str(err)) from err
    if evaluated > 1:
        raise SesaError("a SESA client state has a bad flag")
    roster = _roster_from_bytes(roster_raw) if roster_raw else {}
    return _State(node, private, seed, params, shards, roster, sharers, bool(evaluated))


# ---------------------------------------------------------------------------------- vectors


@dataclass(frozen=True)
class ShardVector:
    """Fixed-point shard vectors with a count word: ``(c·Δ, c)`` in ``F_p``.

    A client's update of one shard is ``length`` reals ``Δ`` and its averaging weight ``c``
    (its sample count, or 1 for an unweighted mean); it is encoded as ``length + 1`` field
    words. The decoded per-shard sums give ``Σ c·Δ / Σ c`` over the clients that chose the
    shard, and ``Σ c`` itself, which the server learns.

    Parameters
    ----------
    length : int
        Reals per shard (the group's ``d`` is ``length + 1``).
    codec : FixedPoint
        Fixed point in the round's field; ``max_abs`` must cover ``c · max |Δ|`` and the
        largest ``c``, ``max_summands`` the clients per round (its overflow bound is checked
        when it is built).

    Raises
    ------
    ConfigurationError
        If ``length`` is not positive or the codec is not over a prime field.
    """

    length: int
    codec: FixedPoint

    def __post_init__(self) -> None:
        _int(self.length, "shard length", 1, MAX_LENGTH - 1)
        if not isinstance(self.codec, FixedPoint) or not isinstance(self.codec.ring, PrimeField):
            raise ConfigurationError("ShardVector needs a FixedPoint over a PrimeField")

    @property
    def words(self) -> int:
        """``length + 1``: the group's ``d``."""
        return self.length + 1

    def group(self, shards: int) -> SesaGroup:
        """Return the :class:`SesaGroup` of ``shards`` such vectors."""
        return SesaGroup(shards, self.words)

    def encode(
        self,
        deltas: ArrayLike,
        weight: float,
        rng: np.random.Generator | None = None,
    ) -> NDArray[np.uint64]:
        """Encode ``(K_i, length)`` shard updates with weight ``c`` as ``(K_i, length + 1)``.

        Raises
        ------
        ClientInputError
            If the shape is wrong, a value is not finite, the weight is not positive, or a
            value exceeds the codec's ``max_abs`` after weighting.
        """
        d = np.asarray(deltas, dtype=np.float64)
        c = float(weight)
        if d.ndim != 2 or d.shape[1] != self.length:
            raise ClientInputError(f"shard updates must be (K_i, {self.length}), got {d.shape}")
        if not (math.isfinite(c) and c > 0):
            raise ClientInputError(f"a shard weight must be finite and > 0, got {weight}")
        if not np.all(np.isfinite(d)):
            raise ClientInputError("a shard update is not finite")
        block = np.empty((d.shape[0], self.words), dtype=np.float64)
        block[:, : self.length] = c * d
        block[:, self.length] = c
        try:
            return self.codec.encode(block, rng)
        except ConfigurationError as err:
            raise ClientInputError(f"a shard update does not fit the fixed point: {err}") from err

    def decode(self, total: NDArray[np.uint64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Per-shard means and weights from the ``(K, length + 1)`` decoded sums.

        Returns
        -------
        tuple
            ``means`` ``(K, length)`` (``Σ c·Δ / Σ c``; zeros where no client chose the
            shard) and ``weights`` ``(K,)`` (``Σ c``).
        """
        values = self.codec.decode(total)
        weights = values[:, self.length]
        means = np.zeros((values.shape[0], self.length), dtype=np.float64)
        touched = weights > 0.5 / self.codec.scale
        means[touched] = values[touched, : self.length] / weights[touched, None]
        return means, weights
