"""SecAgg's Flower-free message formats: round parameters, id sets, rosters, shares, rows, state.

The parties that produce and consume them are in :mod:`flwr_fsl.families.secagg.protocol`
(which re-exports the names it always exported). Every decoder checks each length first and
raises :class:`SecAggError` (a :class:`~flwr_fsl.core.errors.ClientInputError`), except
:class:`SecAggSettings`', which raises :class:`~flwr_fsl.core.wireformat.WireFormatError`.

**Round formats** (all little-endian, version 1, read and written through
:mod:`flwr_fsl.core.wireformat` with :class:`SecAggError` as the error): :class:`SecAggParams`
(``FSAG``), client id sets (:func:`encode_ids`, a canonical ``ids`` field), the roster, the
share bundle and unmask reply (``node_map`` fields of fixed-size entries),
:class:`UnmaskRequest`, row sets (:func:`encode_rows`) and the client state (``FSAC``) — see
each ``*_to_bytes`` function.

**Settings.** The masked-input (``train``) request tells the client how to build its vector
(:class:`~flwr_fsl.families.secagg.vector.WeightedVector`): the model's array names in vector
order, the metric names averaged inside the vector, the weight's metric key and the fixed
point's bounds. They travel as one :class:`SecAggSettings` record (``settings`` field of the
SecAgg ConfigRecord) instead of eight loose fields each end re-validated: the strategy builds
and validates it once (:class:`~flwr_fsl.core.errors.ConfigurationError`), the client decodes
it strictly (:class:`~flwr_fsl.core.wireformat.WireFormatError`, a
:class:`~flwr_fsl.core.errors.ClientInputError`).

**Settings format** (little-endian, through :mod:`flwr_fsl.core.wireformat`): ``b"FSAS"``, version
``u8`` (1 or 2), ``names`` (list of UTF-8 byte strings), ``metrics`` (same), ``weight_key`` (UTF-8
bytes), ``clip``, ``max_weight``, ``max_metric`` (each the IEEE-754 binary64 bits as ``u64``),
``frac_bits`` (``u8``), ``max_clients`` (``u32``); version 2 then has ``weighted`` (``u8``, 0 or
1) and ``dp`` (``u8`` 0, or 1 followed by ``noise_multiplier`` and ``clip_norm`` as binary64);
nothing after it. Version 1 (written before unit weights and DP existed) is sample-weighted
without DP, and is still what :meth:`SecAggSettings.to_bytes` writes for exactly those settings
(``weighted=True``, no ``dp``), byte for byte as before; every other setting is version 2.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol, runtime_checkable

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.crypto.channel import KEY_BYTES, OVERHEAD, SESSION_BYTES
from flwr_fsl.crypto.ring import PrimeField
from flwr_fsl.crypto.sealing import RoundBinding
from flwr_fsl.families.secagg.dp import (
    SecAggDP,
    check_headroom,
    client_sigma,
    effective_noise_multiplier,
    sensitivity,
)
from flwr_fsl.families.secagg.graph import check_neighbours, neighbourhoods
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
    "MaskedWords",
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
_PARAMS_BYTES = 4 + 1 + 8 + SESSION_BYTES + 4 + 8  # FSAG record: magic .. vector length
_SPARSE_SUBSET = "a subset round needs the complete mask graph (a lone holder is unmasked)"
_PARAMS_V2 = 2  # FSAG with neighbours
_PARAMS_V2_BYTES = _PARAMS_BYTES + 4
_STATE_V2 = 2  # FSAC whose parameters are version 2
_PARAMS_MAGIC = register_magic(
    b"FSAG", "SecAgg round parameters (flwr_fsl.families.secagg.messages)"
)
_STATE_MAGIC = register_magic(b"FSAC", "SecAgg client state (flwr_fsl.families.secagg.messages)")


class SecAggError(ClientInputError):
    """A SecAgg message from one party is malformed or inconsistent: drop that party."""


SETTINGS_MAGIC = register_magic(b"FSAS", "SecAgg settings (flwr_fsl.families.secagg.messages)")
"""First bytes of an encoded :class:`SecAggSettings`."""
SETTINGS_VERSION = 2
"""The settings format's newest version (1 is still read, and written for weighted, no dp)."""
_SETTINGS_V1 = 1
_NUM_EXAMPLES = "num-examples"
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
    weighted : bool
        Weight each client by ``weight_key`` (bounded by ``max_weight``); ``False`` (the
        default): every client counts 1.
    dp : SecAggDP, optional
        Distributed DP inside the vector (:mod:`flwr_fsl.families.secagg.dp`).

    Raises
    ------
    ConfigurationError
        If a setting is invalid, a train metric is ``num-examples``, or the sum of
        ``max_clients`` vectors (with their noise, for the longest vector) could overflow
        (naming the setting).
    """

    metrics: tuple[str, ...] = ("train_loss",)
    weight_key: str = "num-examples"
    clip: float = 8.0
    max_weight: float = 1e5
    max_metric: float = 1e3
    frac_bits: int = 24
    max_clients: int = 1000
    names: tuple[str, ...] = ()
    weighted: bool = False
    dp: SecAggDP | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.weight_key, str) or not self.weight_key:
            raise ConfigurationError("weighted_by_key must be a non-empty metric name")
        try:
            metrics = _names(self.metrics, "train_metrics")
        except ConfigurationError as err:
            raise ConfigurationError(
                "train_metrics must be metric names other than the weight"
            ) from err
        if self.weight_key in metrics or _NUM_EXAMPLES in metrics:
            # num-examples is what the weight hides: a client never averages it as a metric
            # (the mean over changing survivors gives each client's by least squares).
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
            self._check_headroom(self.layout({"w": (1,)}, ("w",)))
        except ConfigurationError as err:
            raise ConfigurationError(
                f"SecAgg settings (clipping_range / max_weight / max_metric / frac_bits / "
                f"max_clients / dp): {err}"
            ) from err

    def _check_headroom(self, probe: WeightedVector) -> None:
        """Check the noise of the longest vector at the smallest ``t`` (2) fits (with dp).

        ``probe`` (the layout of the largest round) already checked the fixed point; ``weighted``
        and ``dp`` were type-checked by it too.
        """
        if self.dp is None:
            return
        codec = probe.codec
        longest = sensitivity(
            self.dp, probe.weight_bound, len(self.metrics), self.max_metric, self.frac_bits,
            MAX_VECTOR_LENGTH,
        )  # fmt: skip
        check_headroom(
            math.ceil(codec.max_abs * codec.scale),
            client_sigma(self.dp, longest, 2),
            self.max_clients,
        )

    @property
    def noise_multiplier(self) -> float:
        """The effective noise multiplier a round under these settings promises (0: no dp).

        :func:`~flwr_fsl.families.secagg.dp.effective_noise_multiplier` for the worst round
        the settings allow; the strategy accounts it and a client checks it against its floor.
        """
        if self.dp is None:
            return 0.0
        base = sensitivity(
            self.dp, 1.0 if not self.weighted else self.max_weight, len(self.metrics),
            self.max_metric, self.frac_bits, 0,
        )  # fmt: skip
        return effective_noise_multiplier(self.dp, base, self.max_clients, MAX_VECTOR_LENGTH)

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
            self.max_weight, self.max_metric, self.frac_bits, self.max_clients, self.weighted,
            self.dp,
        )  # fmt: skip

    @property
    def version(self) -> int:
        """The format version :meth:`to_bytes` writes: 1 for weighted without dp, else 2."""
        return _SETTINGS_V1 if (self.weighted and self.dp is None) else SETTINGS_VERSION

    def to_bytes(self) -> bytes:
        """Return the versioned record (module docstring)."""
        w = Writer()
        w.fixed(SETTINGS_MAGIC, len(SETTINGS_MAGIC))
        w.u8(self.version)
        for names in (self.names, self.metrics):
            w.count(len(names))
            for name in names:
                w.raw(name.encode())
        w.raw(self.weight_key.encode())
        for value in (self.clip, self.max_weight, self.max_metric):
            w.f64(value)
        w.u8(self.frac_bits)
        w.u32(self.max_clients)
        if self.version >= 2:
            w.u8(int(self.weighted))
            w.u8(int(self.dp is not None))
            if self.dp is not None:
                w.f64(self.dp.noise_multiplier)
                w.f64(self.dp.clip_norm)
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
        r = _settings_reader(data)
        version = r.u8("version")
        if version not in (_SETTINGS_V1, SETTINGS_VERSION):
            raise WireFormatError(f"unsupported SecAgg settings version {version}")
        lists = []
        for what in ("names", "metrics"):
            lists.append(tuple(_text(r, what) for _ in range(r.count(what, 4))))
        weight_key = _text(r, "weight key")
        clip, max_weight, max_metric = (r.f64(w) for w in ("clip", "max weight", "max metric"))
        frac_bits = r.u8("frac bits")
        max_clients = r.u32("max clients")
        weighted, dp = True, None
        try:
            if version >= 2:
                weighted, has_dp = _flag(r, "weighted"), _flag(r, "dp")
                if has_dp:
                    dp = SecAggDP(r.f64("noise multiplier"), r.f64("clip norm"))
            r.done()
            settings = cls(
                lists[1], weight_key, clip, max_weight, max_metric, frac_bits, max_clients,
                lists[0], weighted, dp,
            )  # fmt: skip
        except ConfigurationError as err:
            raise WireFormatError(f"invalid SecAgg settings: {err}") from err
        if settings.version != version:  # one encoding per setting: v2 never carries v1's
            raise WireFormatError("SecAgg settings: version 2 carries weighted settings with dp")
        return settings


def _settings_reader(data: object) -> Reader:
    """Return a reader after the settings' magic (the caller reads the version: 1 or 2)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireFormatError("SecAgg settings must be bytes")
    raw = bytes(data)
    if raw[: len(SETTINGS_MAGIC)] != SETTINGS_MAGIC:
        raise WireFormatError("not SecAgg settings")
    return Reader(raw, len(SETTINGS_MAGIC))


def _flag(reader: Reader, what: str) -> bool:
    value = reader.u8(what)
    if value > 1:
        raise WireFormatError(f"SecAgg settings: {what} must be 0 or 1")
    return bool(value)


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
    neighbours : int, optional
        ``k`` of SecAgg+'s mask graph (:mod:`flwr_fsl.families.secagg.graph`): each client
        masks with and shares to ``k`` neighbours; ``None`` (default): the complete graph.
        Written as format version 2 (a ``u32`` after the length); ``None`` writes version 1,
        byte for byte as before.

    Raises
    ------
    ConfigurationError
        If a field is out of range.
    """

    round_id: int
    session: bytes
    threshold: int
    vector_length: int
    neighbours: int | None = None

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
        check_neighbours(self.neighbours, self.threshold)
        if self.neighbours is not None and self.neighbours > MAX_CLIENTS:
            raise ConfigurationError(f"SecAgg neighbours must be at most {MAX_CLIENTS}")

    def to_bytes(self) -> bytes:
        """Return :attr:`encoded` (computed once: a round uses it for every mask and share)."""
        return self.encoded

    @cached_property
    def encoded(self) -> bytes:
        """``b"FSAG"``, version, round (u64), session (16), threshold (u32), length (u64).

        Version 2 (only with ``neighbours``) then has ``neighbours`` (u32).
        """
        w = Writer(SecAggError)
        w.fixed(_PARAMS_MAGIC, 4)
        w.u8(VERSION if self.neighbours is None else _PARAMS_V2)
        w.u64(self.round_id)
        w.fixed(self.session, SESSION_BYTES)
        w.u32(self.threshold)
        w.u64(self.vector_length)
        if self.neighbours is not None:
            w.u32(self.neighbours)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: bytes) -> SecAggParams:
        """Strict decoder of :meth:`to_bytes`.

        Raises
        ------
        SecAggError
            If the bytes are not exactly one version-1 parameter record or a field is invalid.
        """
        if not isinstance(data, bytes) or len(data) not in (_PARAMS_BYTES, _PARAMS_V2_BYTES):
            raise SecAggError(f"SecAgg parameters must be {_PARAMS_BYTES} bytes (or 4 more)")
        v2 = len(data) == _PARAMS_V2_BYTES
        what = "SecAgg parameters"
        r = Reader.versioned(data, _PARAMS_MAGIC, _PARAMS_V2 if v2 else VERSION, what, SecAggError)
        round_id, session = r.u64("round"), r.fixed(SESSION_BYTES, "session")
        threshold, length = r.u32("threshold"), r.u64("vector length")
        neighbours = r.u32("neighbours") if v2 else None
        r.done()
        try:
            return cls(round_id, session, threshold, length, neighbours)
        except ConfigurationError as err:
            raise SecAggError(str(err)) from err

    @cached_property
    def digest(self) -> bytes:
        """SHA-256 of :meth:`to_bytes` (bound into sealed shares and pair masks)."""
        return hashlib.sha256(self.to_bytes()).digest()

    @cached_property
    def binding(self) -> RoundBinding:
        """Session, round and :attr:`digest`: what every sealed share is bound to."""
        return RoundBinding.of(self.session, self.round_id, self.to_bytes())


# ---------------------------------------------------------------------------------- codecs


def _check_id(value: int) -> int:
    if type(value) is int and 0 <= value < 1 << 64:  # the common case, first
        return value
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise SecAggError("a client id must be an int")
    if not 0 <= int(value) < 1 << 64:
        raise SecAggError("a client id must be in [0, 2**64)")
    return int(value)


def _header(magic: bytes) -> Writer:
    w = Writer(SecAggError)
    w.fixed(magic, 4)
    w.u8(VERSION)
    return w


def _reader(data: bytes, magic: bytes, what: str) -> Reader:
    return Reader.versioned(data, magic, VERSION, what, SecAggError)


def _write_ids(w: Writer, ids: Iterable[int]) -> None:
    # No count limit on the writer's side, as before: every decoder bounds it (MAX_CLIENTS).
    # Writer.ids(canonical=True)'s bytes (count, sorted distinct u64 ids) in one numpy write.
    values = sorted({_check_id(i) for i in ids})
    w.count(len(values), None)
    w.words(values, "<u8")


def encode_ids(ids: Iterable[int]) -> bytes:
    """Encode a set of client ids: count (u32), then the sorted ids (u64 each)."""
    w = Writer(SecAggError)
    _write_ids(w, ids)
    return w.payload()


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
    r = Reader(data, offset, SecAggError)
    ids = r.ids("client id list", increasing=True, limit=MAX_CLIENTS)
    if exact:
        r.done()
    return list(ids), r.pos


def _roster_to_bytes(roster: Mapping[int, tuple[bytes, bytes]]) -> bytes:
    w = Writer(SecAggError)
    w.node_map({n: c_pk + s_pk for n, (c_pk, s_pk) in roster.items()}, 2 * KEY_BYTES, limit=None)
    return w.payload()


def _roster_index(data: bytes) -> tuple[list[int], dict[int, int], NDArray[np.uint8]]:
    """Parse a roster without a bytes object per key: ids, id -> row, ``(n, 64)`` key bytes.

    Checks what :func:`_roster_from_bytes` checks (count, length, increasing ids).
    """
    if not isinstance(data, bytes) or len(data) < 4:
        raise SecAggError("roster must be bytes with a count")
    n = int.from_bytes(data[:4], "little")
    step = 8 + 2 * KEY_BYTES
    if n > MAX_CLIENTS or len(data) != 4 + n * step:
        raise SecAggError(f"roster: bad count {n} or length {len(data)}")
    rows = np.frombuffer(data, dtype=np.uint8, offset=4).reshape(n, step)
    ids = rows[:, :8].copy().view("<u8").reshape(n)
    if n > 1 and not np.all(ids[1:] > ids[:-1]):
        raise SecAggError("roster ids must be strictly increasing")
    order = ids.tolist()
    return order, {u: i for i, u in enumerate(order)}, rows[:, 8:]


def _repeats(keys: NDArray[np.uint8]) -> bool:
    """Whether any two of the ``2n`` 32-byte public keys in ``(n, 64)`` rows are equal."""
    flat = np.ascontiguousarray(keys).reshape(-1, KEY_BYTES).view("<u8")  # (2n, 4) words
    ranked = flat[np.lexsort(flat.T[::-1])]
    return bool(np.any(np.all(ranked[1:] == ranked[:-1], axis=1)))


def _roster_from_bytes(data: bytes) -> dict[int, tuple[bytes, bytes]]:
    keys = _entries_from_bytes(data, 2 * KEY_BYTES, "roster")
    return {node: (both[:KEY_BYTES], both[KEY_BYTES:]) for node, both in keys.items()}


def _entries_to_bytes(entries: Mapping[int, bytes], size: int) -> bytes:
    """Write the ``node_map`` field of fixed-size entries (``u32`` count, ``u64`` id, entry).

    Byte for byte :meth:`~flwr_fsl.core.wireformat.Writer.node_map`, built in one join (the
    roster of 1,000 clients is written and read once per client, issue 26).
    """
    nodes = sorted(_check_id(n) for n in entries)
    if any(not isinstance(entries[n], bytes) or len(entries[n]) != size for n in nodes):
        raise SecAggError(f"expected exactly {size} bytes")
    pack = struct.Struct("<Q").pack
    return struct.pack("<I", len(nodes)) + b"".join(pack(n) + entries[n] for n in nodes)


def _entries_from_bytes(data: bytes, size: int, what: str) -> dict[int, bytes]:
    """Strict decoder of :func:`_entries_to_bytes` (ids strictly increasing, exact length)."""
    if not isinstance(data, bytes) or len(data) < 4:
        raise SecAggError(f"{what} must be bytes with a count")
    n = int.from_bytes(data[:4], "little")
    if n > MAX_CLIENTS:
        raise SecAggError(f"{what}: {n} items exceed the limit of {MAX_CLIENTS}")
    step = 8 + size
    if len(data) != 4 + n * step:
        raise SecAggError(f"truncated message or trailing bytes: {n} {what} entries declared")
    ids = np.frombuffer(data, dtype="<u8", count=n * step // 8, offset=4) if size % 8 == 0 else None
    nodes = (
        ids[:: step // 8].tolist()
        if ids is not None
        else [int.from_bytes(data[4 + k * step : 12 + k * step], "little") for k in range(n)]
    )
    if any(b <= a for a, b in itertools.pairwise(nodes)):
        raise SecAggError(f"{what} ids must be strictly increasing")
    return {node: data[12 + k * step : 4 + (k + 1) * step] for k, node in enumerate(nodes)}


@runtime_checkable
class MaskedWords(Protocol):
    """A masked input still in its message: it is parsed only at the size the server expects."""

    def words(self, size: int) -> NDArray[np.uint64]:
        """Return exactly ``size`` uint64 words (raise a ClientInputError subclass otherwise)."""


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
        w = Writer(SecAggError)
        _write_ids(w, self.survivors)
        return w.payload() + _entries_to_bytes(self.sealed_shares, SEALED_SHARE_BYTES)

    @classmethod
    def from_bytes(cls, data: bytes) -> UnmaskRequest:
        """Strict decoder of :meth:`to_bytes` (raises :class:`SecAggError`)."""
        if not isinstance(data, bytes):
            raise SecAggError("an unmask request must be bytes")
        r = Reader(data, 0, SecAggError)
        survivors = r.ids("client id list", increasing=True, limit=MAX_CLIENTS)
        shares = r.node_map("sealed shares", SEALED_SHARE_BYTES, limit=MAX_CLIENTS)
        r.done()
        return cls(survivors, shares)


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
    w = Writer(SecAggError)
    w.count(len(rows), limit=None)
    for node in sorted(rows):
        r = np.asarray(rows[node], dtype="<u8")
        w.u64(_check_id(node))
        w.u64(r.size)
        w.words(r, "<u8")
    return w.payload()


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
    r = Reader(data, 0, SecAggError)
    out: dict[int, NDArray[np.int64]] = {}
    previous = -1
    for _ in range(r.count("row sets", 16, MAX_CLIENTS)):
        node, size = r.u64("row set id"), r.u64("row set length")
        if node <= previous or size > length:
            raise SecAggError("row sets are malformed")
        previous = node
        rows = r.words(size, "<u8", "row positions")
        if size and int(rows[-1]) >= length:
            raise SecAggError("a row position is out of range")
        out[node] = _check_rows(rows.astype(np.int64), length, "row positions")
    r.done()
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


def _graph(
    params: SecAggParams,
    roster: Mapping[int, tuple[bytes, bytes]] | Sequence[int],
    raw: bytes | None = None,
) -> Mapping[int, frozenset[int]]:
    """Return the round's mask graph (``graph``): every roster member's neighbours.

    ``raw`` is the roster's bytes when at hand (then ``roster`` may be its ids only).
    """
    if raw is None:
        assert isinstance(roster, Mapping)
        raw = _roster_to_bytes(roster)
    return neighbourhoods(params.to_bytes(), raw, tuple(roster), params.neighbours)


def _public(raw: bytes) -> X25519PublicKey:
    try:
        return X25519PublicKey.from_public_bytes(raw)
    except ValueError as err:
        raise SecAggError("not an X25519 public key") from err


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


def _state_to_bytes(state: _State) -> bytes:
    """``b"FSAC"``, version, node, both private keys, seed, flag, params, own share, roster, U2."""
    v2 = state.params.neighbours is not None
    w = Writer(SecAggError)
    w.fixed(_STATE_MAGIC, 4)
    w.u8(_STATE_V2 if v2 else VERSION)
    w.u64(state.node)
    w.fixed(state.c_private, KEY_BYTES)
    w.fixed(state.s_private, KEY_BYTES)
    w.fixed(state.seed, _SEED_BYTES)
    w.u8(int(state.unmasked))
    if v2:  # version 2: the parameters' own version 2, length-prefixed
        w.raw(state.params.to_bytes())
    else:
        w.fixed(state.params.to_bytes(), _PARAMS_BYTES)
    w.raw(b"" if state.own_share is None else state.own_share.astype("<u4").tobytes())
    w.raw(_roster_to_bytes(state.roster))
    _write_ids(w, state.sharers)
    return w.payload()


def _state_from_bytes(data: bytes) -> _State:
    """Strict decoder of :func:`_state_to_bytes` (raises :class:`SecAggError`)."""
    if not isinstance(data, bytes):
        raise SecAggError("a SecAgg client state must be bytes")
    v2 = data[4:5] == bytes([_STATE_V2])
    what = "a SecAgg client state"
    r = Reader.versioned(data, _STATE_MAGIC, _STATE_V2 if v2 else VERSION, what, SecAggError)
    node = r.u64("node")
    c_sk, s_sk = r.fixed(KEY_BYTES, "c key"), r.fixed(KEY_BYTES, "s key")
    seed = r.fixed(_SEED_BYTES, "seed")
    unmasked = r.u8("unmasked flag")
    if unmasked > 1:
        raise SecAggError("a SecAgg client state has a bad flag")
    params = SecAggParams.from_bytes(r.raw("params") if v2 else r.fixed(_PARAMS_BYTES, "params"))
    if v2 and params.neighbours is None:
        raise SecAggError("a version-2 SecAgg client state must hold version-2 parameters")
    own = r.raw("own share")
    if len(own) not in (0, 4 * _LIMBS):
        raise SecAggError("SecAgg client state has a bad own share")
    roster_raw = r.raw("roster")
    roster = _roster_from_bytes(roster_raw) if roster_raw else {}
    sharers = r.ids("U2", increasing=True, limit=MAX_CLIENTS)
    r.done()
    own_share = np.frombuffer(own, dtype="<u4").astype(_U64) if own else None
    return _State(node, c_sk, s_sk, seed, params, roster, sharers, own_share, bool(unmasked))
