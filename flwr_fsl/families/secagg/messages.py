"""SecAgg's Flower-free message formats: round parameters, id sets, rosters, shares, rows, state.

The parties that produce and consume them are in :mod:`flwr_fsl.families.secagg.protocol`
(which re-exports the names it always exported). Every decoder checks each length first and
raises :class:`SecAggError` (a :class:`~flwr_fsl.core.errors.ClientInputError`), except
:class:`SecAggSettings`', which raises :class:`~flwr_fsl.core.wireformat.WireFormatError`.

**Round formats** (all little-endian, version 1): :class:`SecAggParams` (``FSAG``), client id
sets (:func:`encode_ids`), the roster, the share bundle and unmask reply (id -> fixed-size
entry lists), :class:`UnmaskRequest`, row sets (:func:`encode_rows`) and the client state
(``FSAC``) — see each ``*_to_bytes`` function.

**Settings.** The masked-input (``train``) request tells the client how to build its vector
(:class:`~flwr_fsl.families.secagg.vector.WeightedVector`): the model's array names in vector
order, the metric names averaged inside the vector, the weight's metric key and the fixed
point's bounds. They travel as one :class:`SecAggSettings` record (``settings`` field of the
SecAgg ConfigRecord) instead of eight loose fields each end re-validated: the strategy builds
and validates it once (:class:`~flwr_fsl.core.errors.ConfigurationError`), the client decodes
it strictly (:class:`~flwr_fsl.core.wireformat.WireFormatError`, a
:class:`~flwr_fsl.core.errors.ClientInputError`).

**Settings format** (little-endian, through :mod:`flwr_fsl.core.wireformat`): ``b"FSAS"``, version
``u8`` (1), ``names`` (list of UTF-8 byte strings), ``metrics`` (same), ``weight_key`` (UTF-8
bytes), ``clip``, ``max_weight``, ``max_metric`` (each the IEEE-754 binary64 bits as ``u64``),
``frac_bits`` (``u8``), ``max_clients`` (``u32``); nothing after it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.crypto.channel import KEY_BYTES, OVERHEAD, SESSION_BYTES
from flwr_fsl.crypto.ring import PrimeField
from flwr_fsl.crypto.sealing import RoundBinding
from flwr_fsl.families.secagg.vector import WeightedVector

__all__ = [
    "FIELD",
    "MAX_CLIENTS",
    "MAX_VECTOR_LENGTH",
    "SEALED_SHARE_BYTES",
    "SETTINGS_MAGIC",
    "SETTINGS_VERSION",
    "SHARE_PLAINTEXT_BYTES",
    "VERSION",
    "SecAggError",
    "SecAggParams",
    "SecAggSettings",
    "UnmaskRequest",
    "decode_ids",
    "decode_rows",
    "encode_ids",
    "encode_rows",
]

_U64 = np.uint64
VERSION = 1
MAX_CLIENTS = 10_000
"""Most clients one round may have (bounds every roster and bundle the decoders accept)."""
MAX_VECTOR_LENGTH = 1 << 30
"""Most ring words one client's vector may have."""
FIELD = PrimeField()
"""Shamir's field, ``p = 2^32 - 5``."""
_LIMB = 3  # bytes of a secret per field element (2^24 < p)
_SK_LIMBS = -(-KEY_BYTES // _LIMB)  # 11
_SEED_BYTES = 16
_SEED_LIMBS = -(-_SEED_BYTES // _LIMB)  # 6
_LIMBS = _SK_LIMBS + _SEED_LIMBS
SHARE_PLAINTEXT_BYTES = 16 + 4 * _LIMBS
"""Sealed share plaintext: sender and recipient ids (u64 each), then the field elements."""
SEALED_SHARE_BYTES = SHARE_PLAINTEXT_BYTES + OVERHEAD
_KIND_SEED, _KIND_KEY = 0, 1
_PARAMS_MAGIC = register_magic(
    b"FSAG", "SecAgg round parameters (flwr_fsl.families.secagg.messages)"
)
_STATE_MAGIC = register_magic(b"FSAC", "SecAgg client state (flwr_fsl.families.secagg.messages)")


class SecAggError(ClientInputError):
    """A SecAgg message from one party is malformed or inconsistent: drop that party."""


SETTINGS_MAGIC = register_magic(b"FSAS", "SecAgg settings (flwr_fsl.families.secagg.messages)")
"""First bytes of an encoded :class:`SecAggSettings`."""
SETTINGS_VERSION = 1
"""The settings format's version."""
_MAX_NAME_BYTES = 1024  # an array or metric name; Flower's keys are far shorter


def _names(value: object, what: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigurationError(f"{what} must be a sequence of names")
    names = tuple(value)
    for name in names:
        if not isinstance(name, str) or not name or len(name.encode()) > _MAX_NAME_BYTES:
            raise ConfigurationError(f"{what} must be non-empty strings")
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{what} repeat a name")
    return names


@dataclass(frozen=True)
class SecAggSettings:
    """How one SecAgg round's clients build their vectors (module docstring).

    Parameters
    ----------
    metrics : tuple of str
        Train metrics averaged inside the vector (weighted by the client's weight).
    weight_key : str
        The train reply's metric that is the client's weight (``weighted_by_key``).
    clip : float
        Largest ``|w_i - w|`` per coordinate (``clipping_range``).
    max_weight : float
        Largest client weight.
    max_metric : float
        Largest ``|metric|``.
    frac_bits : int
        Fixed-point fractional bits.
    max_clients : int
        Most clients summed (sizes the overflow bound).
    names : tuple of str
        The model's arrays in vector order (empty until a round knows its model).

    Raises
    ------
    ConfigurationError
        If a setting is invalid or the sum of ``max_clients`` vectors could overflow (naming
        the setting).
    """

    metrics: tuple[str, ...] = ("train_loss",)
    weight_key: str = "num-examples"
    clip: float = 8.0
    max_weight: float = 1e5
    max_metric: float = 1e3
    frac_bits: int = 24
    max_clients: int = 1000
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.weight_key, str) or not self.weight_key:
            raise ConfigurationError("weighted_by_key must be a non-empty metric name")
        try:
            metrics = _names(self.metrics, "train_metrics")
        except ConfigurationError as err:
            raise ConfigurationError(
                "train_metrics must be metric names other than the weight"
            ) from err
        if self.weight_key in metrics:
            raise ConfigurationError("train_metrics must be metric names other than the weight")
        object.__setattr__(self, "metrics", metrics)
        object.__setattr__(self, "names", _names(self.names, "names"))
        mc = self.max_clients
        if isinstance(mc, bool) or not isinstance(mc, int) or not 2 <= mc <= 0xFFFFFFFF:
            raise ConfigurationError(f"max_clients must be an int >= 2, got {mc!r}")
        fb = self.frac_bits
        if isinstance(fb, bool) or not isinstance(fb, int) or not 0 <= fb <= 0xFF:
            raise ConfigurationError(f"frac_bits must be an int, got {fb!r}")
        for name in ("clip", "max_weight", "max_metric"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"{name} must be a number, got {value!r}")
            object.__setattr__(self, name, float(value))
        try:
            self.layout({"w": (1,)}, ("w",))  # the fixed point of the largest round
        except ConfigurationError as err:
            raise ConfigurationError(
                f"SecAgg settings (clipping_range / max_weight / max_metric / frac_bits / "
                f"max_clients): {err}"
            ) from err

    def layout(
        self, shapes: Mapping[str, tuple[int, ...]], names: Sequence[str] | None = None
    ) -> WeightedVector:
        """Return the round's vector layout over the arrays ``names`` (default :attr:`names`).

        Raises
        ------
        ConfigurationError
            If a name has no shape in ``shapes`` or the layout is invalid.
        """
        order = tuple(self.names if names is None else names)
        if any(n not in shapes for n in order):
            raise ConfigurationError("the SecAgg layout names an array the model does not have")
        return WeightedVector(
            order, tuple(tuple(shapes[n]) for n in order), self.metrics, self.clip,
            self.max_weight, self.max_metric, self.frac_bits, self.max_clients,
        )  # fmt: skip

    def to_bytes(self) -> bytes:
        """Return the versioned record (module docstring)."""
        w = Writer()
        w.fixed(SETTINGS_MAGIC, len(SETTINGS_MAGIC))
        w.u8(SETTINGS_VERSION)
        for names in (self.names, self.metrics):
            w.count(len(names))
            for name in names:
                w.raw(name.encode())
        w.raw(self.weight_key.encode())
        for value in (self.clip, self.max_weight, self.max_metric):
            w.u64(struct.unpack("<Q", struct.pack("<d", value))[0])
        w.u8(self.frac_bits)
        w.u32(self.max_clients)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: bytes) -> SecAggSettings:
        """Strict decoder of :meth:`to_bytes`.

        Raises
        ------
        WireFormatError
            If the bytes are truncated, have trailing bytes, another magic or version, a name
            that is not UTF-8, or settings that do not validate.
        """
        r = Reader.versioned(data, SETTINGS_MAGIC, SETTINGS_VERSION, "SecAgg settings")
        lists = []
        for what in ("names", "metrics"):
            lists.append(tuple(_text(r, what) for _ in range(r.count(what, 4))))
        weight_key = _text(r, "weight key")
        clip, max_weight, max_metric = (
            struct.unpack("<d", struct.pack("<Q", r.u64(what)))[0]
            for what in ("clip", "max weight", "max metric")
        )
        frac_bits = r.u8("frac bits")
        max_clients = r.u32("max clients")
        r.done()
        try:
            return cls(
                lists[1], weight_key, clip, max_weight, max_metric, frac_bits, max_clients,
                lists[0],
            )  # fmt: skip
        except ConfigurationError as err:
            raise WireFormatError(f"invalid SecAgg settings: {err}") from err


def _text(reader: Reader, what: str) -> str:
    raw = reader.raw(what)
    if len(raw) > _MAX_NAME_BYTES:
        raise WireFormatError(f"SecAgg settings: {what} is too long")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise WireFormatError(f"SecAgg settings: {what} is not UTF-8") from err


# ---------------------------------------------------------------------------------- params


@dataclass(frozen=True)
class SecAggParams:
    """Public parameters of one SecAgg round, as both sides see them.

    Parameters
    ----------
    round_id : int
        The server round (bound into every sealed share and pair mask).
    session : bytes
        16 random bytes the server drew for the run (rounds of other runs never mix).
    threshold : int
        ``t``: shares needed to reconstruct a secret, and the fewest clients that may be left
        at every step; ``t >= 2``.
    vector_length : int
        Ring words in each client's vector, ``1..MAX_VECTOR_LENGTH``.

    Raises
    ------
    ConfigurationError
        If a field is out of range.
    """

    round_id: int
    session: bytes
    threshold: int
    vector_length: int

    def __post_init__(self) -> None:
        for name, value, low, high in (
            ("round_id", self.round_id, 0, (1 << 64) - 1),
            ("threshold", self.threshold, 2, MAX_CLIENTS),
            ("vector_length", self.vector_length, 1, MAX_VECTOR_LENGTH),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigurationError(f"SecAgg {name} must be an int in [{low}, {high}]")
        if not isinstance(self.session, bytes) or len(self.session) != SESSION_BYTES:
            raise ConfigurationError(f"SecAgg session must be {SESSION_BYTES} bytes")

    _FORMAT = struct.Struct("<4sBQ16sIQ")

    def to_bytes(self) -> bytes:
        """``b"FSAG"``, version, round (u64), session (16), threshold (u32), length (u64)."""
        return self._FORMAT.pack(
            _PARAMS_MAGIC, VERSION, self.round_id, self.session, self.threshold, self.vector_length
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> SecAggParams:
        """Strict decoder of :meth:`to_bytes`.

        Raises
        ------
        SecAggError
            If the bytes are not exactly one version-1 parameter record or a field is invalid.
        """
        if not isinstance(data, bytes) or len(data) != cls._FORMAT.size:
            raise SecAggError(f"SecAgg parameters must be {cls._FORMAT.size} bytes")
        magic, version, round_id, session, threshold, length = cls._FORMAT.unpack(data)
        if magic != _PARAMS_MAGIC or version != VERSION:
            raise SecAggError("not SecAgg parameters of version 1")
        try:
            return cls(round_id, session, threshold, length)
        except ConfigurationError as err:
            raise SecAggError(str(err)) from err

    @property
    def digest(self) -> bytes:
        """SHA-256 of :meth:`to_bytes` (bound into sealed shares and pair masks)."""
        return hashlib.sha256(self.to_bytes()).digest()

    @property
    def binding(self) -> RoundBinding:
        """Session, round and :attr:`digest`: what every sealed share is bound to."""
        return RoundBinding.of(self.session, self.round_id, self.to_bytes())


# ---------------------------------------------------------------------------------- codecs


def _check_id(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise SecAggError("a client id must be an int")
    if not 0 <= int(value) < 1 << 64:
        raise SecAggError("a client id must be in [0, 2**64)")
    return int(value)


def encode_ids(ids: Iterable[int]) -> bytes:
    """Encode a set of client ids: count (u32), then the sorted ids (u64 each)."""
    values = sorted({_check_id(i) for i in ids})
    return struct.pack("<I", len(values)) + np.asarray(values, dtype="<u8").tobytes()


def _read_count(data: bytes, offset: int, entry: int, what: str) -> tuple[int, int]:
    if len(data) < offset + 4:
        raise SecAggError(f"{what} truncated")
    (count,) = struct.unpack_from("<I", data, offset)
    if count > MAX_CLIENTS:
        raise SecAggError(f"{what} lists {count} entries, more than {MAX_CLIENTS}")
    if len(data) < offset + 4 + count * entry:
        raise SecAggError(f"{what} truncated")
    return count, offset + 4


def decode_ids(data: bytes, offset: int = 0, *, exact: bool = True) -> tuple[list[int], int]:
    """Strict decoder of :func:`encode_ids`; returns the ids and the offset after them.

    Raises
    ------
    SecAggError
        If the bytes are truncated, too long (``exact``), list too many ids, or the ids are not
        strictly increasing.
    """
    if not isinstance(data, bytes):
        raise SecAggError("client ids must be bytes")
    count, offset = _read_count(data, offset, 8, "client id list")
    ids = np.frombuffer(data, dtype="<u8", count=count, offset=offset).astype(_U64)
    end = offset + 8 * count
    if exact and end != len(data):
        raise SecAggError("client id list has trailing bytes")
    if count > 1 and not np.all(ids[1:] > ids[:-1]):
        raise SecAggError("client ids must be strictly increasing")
    return [int(i) for i in ids], end


def _roster_to_bytes(roster: Mapping[int, tuple[bytes, bytes]]) -> bytes:
    parts = [struct.pack("<I", len(roster))]
    for node in sorted(roster):
        c_pk, s_pk = roster[node]
        parts.append(struct.pack("<Q", node) + c_pk + s_pk)
    return b"".join(parts)


def _roster_from_bytes(data: bytes) -> dict[int, tuple[bytes, bytes]]:
    if not isinstance(data, bytes):
        raise SecAggError("the roster must be bytes")
    entry = 8 + 2 * KEY_BYTES
    count, offset = _read_count(data, 0, entry, "roster")
    if offset + count * entry != len(data):
        raise SecAggError("roster has trailing bytes")
    roster: dict[int, tuple[bytes, bytes]] = {}
    previous = -1
    for k in range(count):
        at = offset + k * entry
        (node,) = struct.unpack_from("<Q", data, at)
        if node <= previous:
            raise SecAggError("roster ids must be strictly increasing")
        previous = node
        roster[node] = (
            data[at + 8 : at + 8 + KEY_BYTES],
            data[at + 8 + KEY_BYTES : at + entry],
        )
    return roster


def _entries_to_bytes(entries: Mapping[int, bytes], size: int) -> bytes:
    parts = [struct.pack("<I", len(entries))]
    for node in sorted(entries):
        if len(entries[node]) != size:
            raise SecAggError(f"an entry must be {size} bytes")
        parts.append(struct.pack("<Q", node) + entries[node])
    return b"".join(parts)


def _entries_from_bytes(data: bytes, size: int, what: str) -> dict[int, bytes]:
    if not isinstance(data, bytes):
        raise SecAggError(f"{what} must be bytes")
    count, offset = _read_count(data, 0, 8 + size, what)
    if offset + count * (8 + size) != len(data):
        raise SecAggError(f"{what} has trailing bytes")
    out: dict[int, bytes] = {}
    previous = -1
    for k in range(count):
        at = offset + k * (8 + size)
        (node,) = struct.unpack_from("<Q", data, at)
        if node <= previous:
            raise SecAggError(f"{what} ids must be strictly increasing")
        previous = node
        out[node] = data[at + 8 : at + 8 + size]
    return out


@dataclass(frozen=True)
class UnmaskRequest:
    """What the server sends a survivor in the Unmask round.

    Parameters
    ----------
    survivors : tuple of int
        ``U3``, the clients whose masked input the server holds.
    sealed_shares : dict[int, bytes]
        Sender ``v in U2`` -> the sealed share ``v`` addressed to this client.
    """

    survivors: tuple[int, ...]
    sealed_shares: dict[int, bytes] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        """``U3`` (:func:`encode_ids`), then the shares (count, then sender u64 + blob each)."""
        return encode_ids(self.survivors) + _entries_to_bytes(
            self.sealed_shares, SEALED_SHARE_BYTES
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> UnmaskRequest:
        """Strict decoder of :meth:`to_bytes` (raises :class:`SecAggError`)."""
        survivors, offset = decode_ids(data, exact=False)
        shares = _entries_from_bytes(data[offset:], SEALED_SHARE_BYTES, "sealed shares")
        return cls(tuple(survivors), shares)


def _check_rows(rows: object, length: int, what: str) -> NDArray[np.int64]:
    arr = np.asarray(rows)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise SecAggError(f"{what} must be a 1-D integer array")
    out = arr.astype(np.int64)
    if out.size and (out[0] < 0 or out[-1] >= length or np.any(out[1:] <= out[:-1])):
        raise SecAggError(f"{what} must be strictly increasing positions in [0, {length})")
    return out


def encode_rows(rows: Mapping[int, NDArray[np.int64]]) -> bytes:
    """Encode client -> positions.

    Format: count (u32), then per client its id (u64), length (u64) and sorted positions
    (u64 each).
    """
    parts = [struct.pack("<I", len(rows))]
    for node in sorted(rows):
        r = np.asarray(rows[node], dtype="<u8")
        parts.append(struct.pack("<QQ", _check_id(node), r.size) + r.tobytes())
    return b"".join(parts)


def decode_rows(data: bytes, length: int) -> dict[int, NDArray[np.int64]]:
    """Strict decoder of :func:`encode_rows` for a round of ``length`` positions.

    Raises
    ------
    SecAggError
        If the bytes are truncated or too long, a count is larger than the round or the
        remaining bytes, ids are not increasing, or positions are not increasing in range.
    """
    if not isinstance(data, bytes):
        raise SecAggError("row sets must be bytes")
    count, at = _read_count(data, 0, 16, "row sets")
    out: dict[int, NDArray[np.int64]] = {}
    previous = -1
    for _ in range(count):
        if len(data) < at + 16:
            raise SecAggError("row sets truncated")
        node, size = struct.unpack_from("<QQ", data, at)
        at += 16
        if node <= previous or size > length or len(data) < at + 8 * size:
            raise SecAggError("row sets are malformed")
        previous = node
        rows = np.frombuffer(data, dtype="<u8", count=size, offset=at)
        if size and int(rows[-1]) >= length:
            raise SecAggError("a row position is out of range")
        out[node] = _check_rows(rows.astype(np.int64), length, "row positions")
        at += 8 * size
    if at != len(data):
        raise SecAggError("row sets have trailing bytes")
    return out


_UNMASK_ENTRY = 1 + 4 * max(_SK_LIMBS, _SEED_LIMBS)


def _unmask_reply_to_bytes(entries: Mapping[int, bytes]) -> bytes:
    return _entries_to_bytes(
        {v: e + bytes(_UNMASK_ENTRY - len(e)) for v, e in entries.items()}, _UNMASK_ENTRY
    )


def _unmask_reply_from_bytes(data: bytes) -> dict[int, tuple[int, NDArray[np.uint64]]]:
    out: dict[int, tuple[int, NDArray[np.uint64]]] = {}
    for v, entry in _entries_from_bytes(data, _UNMASK_ENTRY, "unmask reply").items():
        kind = entry[0]
        limbs = {_KIND_SEED: _SEED_LIMBS, _KIND_KEY: _SK_LIMBS}.get(kind)
        if limbs is None:
            raise SecAggError("unmask reply has an unknown share kind")
        if any(entry[1 + 4 * limbs :]):
            raise SecAggError("unmask reply has non-zero padding")
        share = np.frombuffer(entry, dtype="<u4", count=limbs, offset=1).astype(_U64)
        if np.any(share >= FIELD.p):
            raise SecAggError("unmask reply holds a value outside the field")
        out[v] = (kind, share)
    return out


@dataclass(frozen=True)
class _State:
    """What a :class:`~flwr_fsl.families.secagg.protocol.SecAggClient` keeps between messages."""

    node: int
    c_private: bytes
    s_private: bytes
    seed: bytes
    params: SecAggParams
    roster: dict[int, tuple[bytes, bytes]]
    sharers: tuple[int, ...]
    own_share: NDArray[np.uint64] | None
    unmasked: bool


_STATE_FORMAT = struct.Struct("<4sBQ32s32s16sB")


def _state_to_bytes(state: _State) -> bytes:
    """``b"FSAC"``, version, node, both private keys, seed, flag, params, own share, roster, U2."""
    params = state.params.to_bytes()
    own = b"" if state.own_share is None else state.own_share.astype("<u4").tobytes()
    return b"".join(
        [
            _STATE_FORMAT.pack(
                _STATE_MAGIC,
                VERSION,
                state.node,
                state.c_private,
                state.s_private,
                state.seed,
                int(state.unmasked),
            ),
            params,
            struct.pack("<I", len(own)) + own,
            struct.pack("<I", len(_roster_to_bytes(state.roster))),
            _roster_to_bytes(state.roster),
            encode_ids(state.sharers),
        ]
    )


def _state_from_bytes(data: bytes) -> _State:
    """Strict decoder of :func:`_state_to_bytes` (raises :class:`SecAggError`)."""
    if not isinstance(data, bytes) or len(data) < _STATE_FORMAT.size:
        raise SecAggError("SecAgg client state truncated")
    magic, version, node, c_sk, s_sk, seed, unmasked = _STATE_FORMAT.unpack_from(data)
    if magic != _STATE_MAGIC or version != VERSION or unmasked > 1:
        raise SecAggError("not a SecAgg client state of version 1")
    at = _STATE_FORMAT.size
    size = SecAggParams._FORMAT.size
    params = SecAggParams.from_bytes(data[at : at + size])
    at += size
    if len(data) < at + 4:
        raise SecAggError("SecAgg client state truncated")
    (own_len,) = struct.unpack_from("<I", data, at)
    if own_len not in (0, 4 * _LIMBS) or len(data) < at + 4 + own_len + 4:
        raise SecAggError("SecAgg client state has a bad own share")
    own = np.frombuffer(data, dtype="<u4", count=own_len // 4, offset=at + 4).astype(_U64)
    at += 4 + own_len
    (roster_len,) = struct.unpack_from("<I", data, at)
    at += 4
    if len(data) < at + roster_len:
        raise SecAggError("SecAgg client state truncated")
    roster = _roster_from_bytes(data[at : at + roster_len]) if roster_len else {}
    sharers, _ = decode_ids(data, at + roster_len)
    return _State(
        node, c_sk, s_sk, seed, params, roster, tuple(sharers), own if own_len else None,
        bool(unmasked),
    )  # fmt: skip
