"""SFSL's Flower-free messages: the one typed, versioned settings record and the round's asks.

**Settings.** How the clients of one SFSL round build their vectors — the row table's name,
the weight's metric key, the clip, the largest count, the fixed point, the quantizer and the
round's PSU parameters — travel as one :class:`SFSLSettings` record (``settings`` field of the
SecAgg ConfigRecord of the ``union`` and ``rows`` train messages) instead of twelve loose
fields each end re-validated: the strategy builds and validates it once
(:class:`~flwr_fsl.core.errors.ConfigurationError`), the client decodes it strictly
(:class:`~flwr_fsl.core.wireformat.WireFormatError`, a
:class:`~flwr_fsl.core.errors.ClientInputError`). Both ends derive the fixed point
(:meth:`SFSLSettings.codec`) and the quantizer from it by the same formula.

**Format** (little-endian, through :mod:`flwr_fsl.core.wireformat`): ``b"FSFL"``, version
``u8`` (1 or 2), ``table``, ``weight_key`` (UTF-8 bytes), ``clip``, ``max_count`` (each the
IEEE-754 binary64 bits as ``u64``), ``frac_bits`` (``u8``), ``max_clients`` (``u32``),
``levels`` (``u32``, 0: no quantization), ``has_psu`` (``u8``, 0 or 1) and, when 1, the PSU
parameters: ``domain_size``, ``bloom_length`` (``u64``), ``num_hashes``,
``num_partitions`` (``u32``), ``hash_key`` (16 bytes). Version 1 ends there (Niu's protocol
as the paper specifies it: count-weighted, no noise). Version 2 (issue 20) goes on with
``weighted`` (``u8``, 0 or 1) and ``has_dp`` (``u8``, 0 or 1) and, when 1, the
:class:`~flwr_fsl.families.sfsl.dp.SFSLDP` settings: ``noise_multiplier``, ``clip_norm``,
``count_clip`` (``f64``), ``max_rows`` (``u32``); nothing after it. A record whose settings
are version 1's (``weighted`` and no DP) is written as version 1, so those bytes are unchanged
and a version-1 client still reads them; any other is version 2, which a version-1 client
refuses rather than misreads.

**Asks.** One round of :class:`~flwr_fsl.families.sfsl.server.SFSLServer` is a sequence of
exchanges with the clients; the request of each is one of the frozen classes below
(:class:`ControlAsk` for SecAgg's control phases of the ``union`` and ``rows`` instances,
:class:`UnionAsk`, :class:`PerturbAsk`, :class:`RowsAsk`). The Flower layer carries them as
the typed phases of :mod:`flwr_fsl.families.sfsl.records`; the in-process driver hands them
to the clients directly.

**Sparse download.** The rows ask carries the table's rows of ``S''`` only, in the order of
``rows`` (:func:`submodel_download`), not the whole table with zeros elsewhere: Niu et al.'s
download saving (§VI, Fig. 5a). The server already knows ``S''`` (the client answered it), so
the smaller message tells it nothing new. The client puts the rows back into a table of the
full shape, zeros elsewhere (:func:`expand_download`), which is what its train function sees.
Beside it, the subset SecAgg round tells the client, per peer ``v``, the positions it shares
with ``v`` (``R_u ∩ R_v``); a row is ``width + 1`` consecutive positions and the union's rows
are consecutive too, so these sets are a few runs: :func:`encode_shared_runs` writes each as
``(start, length)`` runs instead of one 8-byte word per position (at 100 users under CPP5,
~3 kB instead of 13.7 MB per client).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.families.secagg.messages import MAX_CLIENTS, SecAggParams
from flwr_fsl.families.sfsl.dp import SFSLDP
from flwr_fsl.families.sfsl.protocol import GammaQuantizer, RowVector
from flwr_fsl.families.sfsl.psu import PSUParams

__all__ = [
    "ROWS_INSTANCE",
    "SETTINGS_MAGIC",
    "SETTINGS_VERSION",
    "SFSL_INSTANCES",
    "UNION_INSTANCE",
    "ControlAsk",
    "PerturbAsk",
    "RowsAsk",
    "SFSLSettings",
    "UnionAsk",
    "decode_shared_runs",
    "encode_shared_runs",
    "expand_download",
    "submodel_download",
]

UNION_INSTANCE = "union"
"""The SecAgg instance of the private set union (SFSL step 1)."""
ROWS_INSTANCE = "rows"
"""The SecAgg instance of the perturb phase and the count-weighted rows round (steps 2, 3)."""
SFSL_INSTANCES = (UNION_INSTANCE, ROWS_INSTANCE)

SETTINGS_MAGIC = register_magic(b"FSFL", "SFSL settings (flwr_fsl.families.sfsl.messages)")
"""First bytes of an encoded :class:`SFSLSettings`."""
SETTINGS_VERSION = 2
"""The settings format's newest version (1 is still written and read, module docstring)."""
_MAX_NAME_BYTES = 1024


@dataclass(frozen=True)
class SFSLSettings:
    """How one SFSL round's clients build their vectors (module docstring).

    Parameters
    ----------
    table : str
        The row table's name in the model.
    weight_key : str
        The train reply's metric that weights the dense tensors (``weighted_by_key``).
    clip : float
        Largest ``|Δ|`` per coordinate.
    max_count : float
        Largest per-row count and client weight.
    frac_bits : int
        Fixed-point fractional bits.
    max_clients : int
        Most clients per round (sizes the overflow bound).
    levels : int
        γ of the App. B quantizer over ``[-clip, clip]``; 0 (default) sends fixed point.
    psu : PSUParams, optional
        The round's PSU parameters (None until a round knows its table and hash key).
    weighted : bool
        True (the paper, and version 1): per-row counts from the client's data and the dense
        weight from ``weight_key``; False: every contributing client counts 1.
    dp : SFSLDP, optional
        Distributed DP of the round (:mod:`flwr_fsl.families.sfsl.dp`); None: the paper's
        noiseless protocol (whose counts leak, ``tests/attacks/``).

    Raises
    ------
    ConfigurationError
        If a setting is invalid or the round's fixed point could overflow (naming the setting).
    """

    table: str
    weight_key: str = "num-examples"
    clip: float = 8.0
    max_count: float = 1e4
    frac_bits: int = 24
    max_clients: int = 1000
    levels: int = 0
    psu: PSUParams | None = None
    weighted: bool = True
    dp: SFSLDP | None = None

    def __post_init__(self) -> None:
        for name in ("table", "weight_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or len(value.encode()) > _MAX_NAME_BYTES:
                what = "table must name the model's row table" if name == "table" else (
                    "weighted_by_key must be a non-empty metric name"
                )  # fmt: skip
                raise ConfigurationError(what)
        for name in ("clip", "max_count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"{name} must be a number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not (np.isfinite(self.clip) and self.clip > 0):
            raise ConfigurationError("clip must be finite and > 0")
        for name, high in (("frac_bits", 0xFF), ("max_clients", 0xFFFFFFFF), ("levels", 2**31)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
                raise ConfigurationError(f"{name} must be an int in [0, {high}], got {value!r}")
        if self.psu is not None and not isinstance(self.psu, PSUParams):
            raise ConfigurationError("psu must be PSUParams or None")
        self._check_codec()

    def _check_codec(self) -> None:
        if not isinstance(self.weighted, bool):
            raise ConfigurationError("weighted must be a bool")
        try:
            self.quantizer()
            codec = self.codec()
        except ConfigurationError as err:
            raise ConfigurationError(
                f"clip / max_count / frac_bits / max_clients / quantization_levels: {err}"
            ) from err
        if self.dp is not None:
            self._check_dp(self.dp, codec)

    def _check_dp(self, dp: SFSLDP, codec: FixedPoint) -> None:
        if not isinstance(dp, SFSLDP):
            raise ConfigurationError("dp must be SFSLDP or None")
        if self.levels:
            raise ConfigurationError(
                "quantization_levels needs dp=None (quantized levels are not clipped the way "
                "the noise needs)"
            )
        if self.psu is not None and not self.psu.exact_mode:
            raise ConfigurationError(
                "bloom_fpr needs dp=None: with DP the union is a noisy count per table row "
                "(exact mode)"
            )
        if dp.count_clip > self.max_count:
            raise ConfigurationError("dp count_clip must be at most max_count")
        if dp.count_clip * max(dp.clip_norm, 1.0) > codec.max_abs:
            raise ConfigurationError("dp count_clip * clip_norm exceeds the fixed point's range")
        dp.check_headroom(codec.max_abs, self.frac_bits, self.max_clients)

    @property
    def noise_multiplier(self) -> float:
        """``z`` the round promises (0: no noise)."""
        return 0.0 if self.dp is None else self.dp.noise_multiplier

    def union_length(self) -> int:
        """Words of the union round's vector: Alg. 3's filter, or one count per row with DP.

        Raises
        ------
        ConfigurationError
            If the settings carry no PSU parameters yet.
        """
        if self.psu is None:
            raise ConfigurationError("the settings carry no PSU parameters")
        return self.psu.vector_length if self.dp is None else self.psu.domain_size

    def quantizer(self) -> GammaQuantizer | None:
        """Return the App. B quantizer of the row updates (None: fixed point)."""
        return None if self.levels == 0 else GammaQuantizer(self.levels, -self.clip, self.clip)

    def codec(self) -> FixedPoint:
        """Return the fixed point of every word: ``max_abs = max_count · max(clip, 1, γ - 1)``."""
        top = 0 if self.levels == 0 else self.levels - 1
        return FixedPoint(
            self.frac_bits, self.max_count * max(self.clip, 1.0, top), self.max_clients
        )

    def layout(
        self, union: NDArray[np.int64], width: int, dense_size: int
    ) -> tuple[RowVector, int]:
        """Return the rows round's layout: union rows and counts, then the dense part and weight.

        Returns
        -------
        tuple[RowVector, int]
            The rows' part and the whole vector's length.
        """
        rows = RowVector(union, width, self.codec(), self.quantizer())
        return rows, rows.length + dense_size + 1

    def to_bytes(self) -> bytes:
        """Return the versioned record (module docstring): version 1 when it says all."""
        legacy = self.weighted and self.dp is None
        w = Writer()
        w.fixed(SETTINGS_MAGIC, len(SETTINGS_MAGIC))
        w.u8(1 if legacy else SETTINGS_VERSION)
        w.raw(self.table.encode())
        w.raw(self.weight_key.encode())
        w.f64(self.clip)
        w.f64(self.max_count)
        w.u8(self.frac_bits)
        w.u32(self.max_clients)
        w.u32(self.levels)
        w.u8(0 if self.psu is None else 1)
        if self.psu is not None:
            w.u64(self.psu.domain_size)
            w.u64(self.psu.bloom_length)
            w.u32(self.psu.num_hashes)
            w.u32(self.psu.num_partitions)
            w.fixed(self.psu.hash_key, 16)
        if not legacy:
            w.u8(int(self.weighted))
            w.u8(0 if self.dp is None else 1)
            if self.dp is not None:
                w.f64(self.dp.noise_multiplier)
                w.f64(self.dp.clip_norm)
                w.f64(self.dp.count_clip)
                w.u32(self.dp.max_rows)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: bytes) -> SFSLSettings:
        """Strict decoder of :meth:`to_bytes`.

        Raises
        ------
        WireFormatError
            If the bytes are truncated, have trailing bytes, another magic or version, a name
            that is not UTF-8, or settings (PSU parameters included) that do not validate.
        """
        version = _version(data)
        r = Reader.versioned(data, SETTINGS_MAGIC, version, "SFSL settings")
        table = _text(r, "table")
        weight_key = _text(r, "weight key")
        clip = r.f64("clip")
        max_count = r.f64("max count")
        frac_bits = r.u8("frac bits")
        max_clients = r.u32("max clients")
        levels = r.u32("levels")
        has_psu = r.u8("psu flag")
        if has_psu not in (0, 1):
            raise WireFormatError("SFSL settings: the PSU flag must be 0 or 1")
        try:
            psu = None
            if has_psu:
                domain, length = r.u64("psu domain"), r.u64("psu length")
                hashes, partitions = r.u32("psu hashes"), r.u32("psu partitions")
                psu = PSUParams(domain, length, hashes, partitions, r.fixed(16, "psu key"))
            weighted, dp = (True, None) if version == 1 else _privacy(r)
            r.done()
            return cls(
                table, weight_key, clip, max_count, frac_bits, max_clients, levels, psu,
                weighted, dp,
            )  # fmt: skip
        except ConfigurationError as err:
            raise WireFormatError(f"invalid SFSL settings: {err}") from err


def _version(data: object) -> int:
    """Return the record's version (1 or 2) from its header; the reader checks the rest."""
    if isinstance(data, bytes | bytearray | memoryview):
        head = bytes(data[: len(SETTINGS_MAGIC) + 1])
        if len(head) == len(SETTINGS_MAGIC) + 1 and head[-1] in (1, SETTINGS_VERSION):
            return head[-1]
    return SETTINGS_VERSION


def _privacy(r: Reader) -> tuple[bool, SFSLDP | None]:
    """Version 2's tail: ``weighted`` and the DP settings."""
    weighted, has_dp = r.u8("weighted"), r.u8("dp flag")
    if weighted not in (0, 1) or has_dp not in (0, 1):
        raise WireFormatError("SFSL settings: the weighted and dp flags must be 0 or 1")
    if not has_dp:
        return bool(weighted), None
    z, clip_norm, count_clip = r.f64("dp noise"), r.f64("dp clip norm"), r.f64("dp count clip")
    return bool(weighted), SFSLDP(z, clip_norm, count_clip, r.u32("dp max rows"))


def _text(reader: Reader, what: str) -> str:
    raw = reader.raw(what)
    if len(raw) > _MAX_NAME_BYTES:
        raise WireFormatError(f"SFSL settings: {what} is too long")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise WireFormatError(f"SFSL settings: {what} is not UTF-8") from err


@dataclass(frozen=True)
class ControlAsk:
    """A SecAgg control phase (advertise, share, unmask) of the ``union`` or ``rows`` instance.

    ``body`` is the roster (share), this client's unmask request (unmask) or empty
    (advertise); the reply is the SecAgg client's bytes.
    """

    instance: str
    params: SecAggParams
    body: bytes = b""


@dataclass(frozen=True)
class UnionAsk:
    """The PSU's masked input: ``U2`` and the round's settings (with its PSU parameters).

    The reply is the masked Bloom filter (uint64 words).
    """

    params: SecAggParams
    sharers: tuple[int, ...]
    settings: SFSLSettings


@dataclass(frozen=True)
class PerturbAsk:
    """Alg. 2: the union ``U`` (the rows round's parameters name the round).

    The reply is ``S''``, strictly increasing rows of ``U``.
    """

    params: SecAggParams
    union: NDArray[np.int64]


@dataclass(frozen=True)
class RowsAsk:
    """The rows round's masked input: the client's submodel and its subset SecAgg round.

    ``model`` holds the table's rows of ``rows`` (``S''``) only, in that order
    (:func:`submodel_download`), and the dense tensors. The reply is the masked vector at the
    client's positions.
    """

    params: SecAggParams
    sharers: tuple[int, ...]
    rows: NDArray[np.int64]
    shared: Mapping[int, NDArray[np.int64]]
    union: NDArray[np.int64]
    settings: SFSLSettings
    model: Mapping[str, NDArray[np.generic]] = field(default_factory=dict, compare=False)


MAX_TABLE_BYTES = 1 << 31
"""The largest table a client rebuilds from a sparse download (its rows x width x item size)."""


def submodel_download(
    model: Mapping[str, NDArray[np.generic]], table: str, rows: NDArray[np.int64]
) -> dict[str, NDArray[np.generic]]:
    """Return what a client of ``S'' = rows`` downloads: those table rows and the dense tensors.

    Parameters
    ----------
    model : Mapping[str, numpy.ndarray]
        The global model, with the 2-D row table ``table``.
    table : str
        The row table's name.
    rows : numpy.ndarray
        The client's perturbed set ``S''`` (distinct table rows).

    Returns
    -------
    dict[str, numpy.ndarray]
        The model with ``table`` replaced by ``model[table][rows]`` (``len(rows)`` rows).
    """
    return {k: np.asarray(v)[rows] if k == table else np.asarray(v) for k, v in model.items()}


def expand_download(
    download: Mapping[str, NDArray[np.generic]],
    table: str,
    rows: NDArray[np.int64],
    table_rows: int,
) -> dict[str, NDArray[np.generic]]:
    """Return the model a client trains on: its downloaded rows in a full-shape table.

    Parameters
    ----------
    download : Mapping[str, numpy.ndarray]
        What the client received (:func:`submodel_download`).
    table : str
        The row table's name.
    rows : numpy.ndarray
        The client's ``S''``, in the order of the downloaded rows.
    table_rows : int
        The table's number of rows (the round's PSU domain).

    Returns
    -------
    dict[str, numpy.ndarray]
        The model, the table of ``table_rows`` rows holding the downloaded ones at ``rows``
        and zeros elsewhere.

    Raises
    ------
    ClientInputError
        If the download's table is not ``len(rows)`` rows of a 2-D table, a row lies outside
        the table, or the table would exceed :data:`MAX_TABLE_BYTES`.
    """
    part = download.get(table)
    if part is None or part.ndim != 2 or part.shape[0] != rows.size:
        raise ClientInputError(
            f"the download's {table!r} must be the {rows.size} rows of S'' (got "
            f"{None if part is None else part.shape})"
        )
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= table_rows):
        raise ClientInputError(f"a row of S'' lies outside the table's {table_rows} rows")
    if table_rows * part.shape[1] * part.itemsize > MAX_TABLE_BYTES:
        raise ClientInputError(
            f"a table of {table_rows} rows x {part.shape[1]} is over {MAX_TABLE_BYTES} bytes"
        )
    full = np.zeros((table_rows, part.shape[1]), dtype=part.dtype)
    full[rows] = part
    return {k: full if k == table else v for k, v in download.items()}


def encode_shared_runs(shared: Mapping[int, NDArray[np.int64]]) -> bytes:
    """Encode peer -> the sorted, distinct positions a client shares with it, as runs.

    Format (little-endian, :mod:`flwr_fsl.core.wireformat`): the number of peers (``u32``),
    then per peer in increasing id order its id (``u64``), its number of runs (``u32``) and
    each run's ``start`` and ``length`` (``u64`` each): runs increasing, each at least one
    position long, none touching the next (so every set has one encoding).
    """
    w = Writer()
    w.count(len(shared), limit=MAX_CLIENTS)
    for peer in sorted(shared):
        positions = np.asarray(shared[peer], dtype=np.int64)
        if positions.ndim != 1 or np.any(np.diff(positions) < 1) or np.any(positions < 0):
            raise ConfigurationError("shared positions must be sorted, distinct and >= 0")
        w.u64(int(peer))
        if positions.size == 0:
            w.count(0, limit=None)
            continue
        breaks = np.flatnonzero(np.diff(positions) != 1) + 1
        starts = positions[np.concatenate(([0], breaks))]
        ends = positions[np.concatenate((breaks - 1, [positions.size - 1]))] + 1
        w.count(int(starts.size), limit=None)
        runs = np.empty(2 * starts.size, dtype="<u8")
        runs[0::2], runs[1::2] = starts, ends - starts
        w.words(runs, "<u8")
    return w.payload()


def decode_shared_runs(
    data: bytes, length: int, max_peers: int = MAX_CLIENTS
) -> dict[int, NDArray[np.int64]]:
    """Strict decoder of :func:`encode_shared_runs` for a vector of ``length`` positions.

    Every run is checked before anything is allocated: at most ``max_peers`` peers (the
    round's other sharers), each with at most ``length`` positions, so a few bytes cannot make
    the client allocate more than the largest honest list.

    Raises
    ------
    WireFormatError
        If the bytes are truncated or too long, peer ids are not increasing, or a run is
        empty, out of range, not increasing or touches the previous one.
    """
    if not isinstance(data, bytes):
        raise WireFormatError("the shared runs must be bytes")
    r = Reader(data)
    out: dict[int, NDArray[np.int64]] = {}
    previous = -1
    for _ in range(r.count("peers", 12, max_peers)):
        peer = r.u64("peer id")
        if peer <= previous:
            raise WireFormatError("the shared runs' peer ids must be strictly increasing")
        previous = peer
        raw = r.words(2 * r.count("runs", 16, length), "<u8", "runs")
        if np.any(raw > length):  # before any signed arithmetic on the words
            raise WireFormatError("a shared run lies outside the vector")
        runs = raw.astype(np.int64)
        starts, sizes = runs[0::2], runs[1::2]
        ends = starts + sizes
        if runs.size and (
            np.any(sizes < 1) or int(ends[-1]) > length or np.any(starts[1:] <= ends[:-1])
        ):
            raise WireFormatError("the shared runs are empty, out of range or not increasing")
        total = int(sizes.sum()) if runs.size else 0
        if total > length:
            raise WireFormatError("the shared runs cover more positions than the vector has")
        offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(sizes)[:-1])), sizes)
        out[peer] = np.arange(total, dtype=np.int64) + offsets
    r.done()
    return out
