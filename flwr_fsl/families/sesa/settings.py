"""SESA's Flower-free message formats: the one typed, versioned settings record.

How the clients of a SESA round choose their shards and build their shard vectors — the shard
count, the weighting, the clipping range, the fixed point, the train config's key and the
model's layer structure (hidden layers, their widths, the shard groups' descriptors) — travel
as one :class:`SesaSettings` record (``settings`` field of the SESA ConfigRecord of the
``advertise`` and ``train`` requests) instead of eleven loose fields each end re-validated:
the strategy builds and validates it once (:class:`~flwr_fsl.core.errors.ConfigurationError`),
the client decodes it strictly (:class:`~flwr_fsl.core.wireformat.WireFormatError`, a
:class:`~flwr_fsl.core.errors.ClientInputError`). Both ends derive the fixed point by the same
formula (:meth:`SesaSettings.codec`).

**Format** (little-endian, through :mod:`flwr_fsl.core.wireformat`): ``b"FSES"``, version
``u8`` (1), ``num_shards`` (``u32``), ``weighted`` (``u8``, 0 or 1), ``weight_key``,
``config_key`` (UTF-8 bytes), ``max_weight``, ``clip`` (each the IEEE-754 binary64 bits as
``u64``), ``frac_bits`` (``u8``), ``max_clients`` (``u32``), ``layers`` (count, then per layer
its UTF-8 name and its width as ``u32``), ``groups`` (count, then UTF-8 descriptors); nothing
after it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.ring import PrimeField
from flwr_fsl.families.width.settings import check_key, read_text

__all__ = ["MAX_LAYERS", "SETTINGS_MAGIC", "SETTINGS_VERSION", "SesaSettings"]

SETTINGS_MAGIC = register_magic(b"FSES", "SESA settings (flwr_fsl.families.sesa.settings)")
"""First bytes of an encoded :class:`SesaSettings`."""
SETTINGS_VERSION = 1
"""The settings format's version."""
MAX_LAYERS = 256
"""Most hidden layers (and shard groups) a round may have."""


def _int(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(f"{what} must be an int in [{low}, {high}], got {value!r}")
    return value


def _keys(value: Sequence[object], what: str) -> tuple[str, ...]:
    if isinstance(value, str) or len(value) > MAX_LAYERS:
        raise ConfigurationError(f"{what} must be at most {MAX_LAYERS} names")
    names = tuple(check_key(v, what) for v in value)
    return names


@dataclass(frozen=True)
class SesaSettings:
    """How one SESA round's clients choose shards and build their vectors (module docstring).

    Parameters
    ----------
    num_shards : int
        ``S``: shards per hidden layer.
    weighted : bool
        Weight each client by ``weight_key`` over ``max_weight`` (default False: every client
        counts 1; a weighted count word leaks, see :class:`~flwr_fsl.families.sesa.strategy.
        SesaFedAvg`).
    weight_key : str
        The train reply's metric that is the client's weight (``weighted_by_key``).
    max_weight : float
        Largest client weight.
    clip : float
        Largest ``|Δ|`` per coordinate (``clipping_range``).
    frac_bits : int
        Fixed-point fractional bits.
    max_clients : int
        Most clients per round (sizes the overflow bound).
    config_key : str
        The message's train ConfigRecord (``configrecord_key``), where the mod sets
        ``width-rate``.
    layers : tuple of str
        The model's hidden layers (empty until a round knows its model).
    widths : tuple of int
        Each hidden layer's width.
    groups : tuple of str
        The shard groups' descriptors (``SesaLayout.descriptors``).

    Raises
    ------
    ConfigurationError
        If a setting is invalid or the sum of ``max_clients`` shard vectors could overflow
        ``F_p`` (naming the setting).
    """

    num_shards: int = 4
    weighted: bool = False
    weight_key: str = "num-examples"
    max_weight: float = 1000.0
    clip: float = 8.0
    frac_bits: int = 16
    max_clients: int = 1000
    config_key: str = "config"
    layers: tuple[str, ...] = ()
    widths: tuple[int, ...] = ()
    groups: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _int(self.num_shards, "num_shards", 1, 0xFFFFFFFF)
        if not isinstance(self.weighted, bool):
            raise ConfigurationError("weighted must be a bool")
        check_key(self.weight_key, "weighted_by_key")
        check_key(self.config_key, "configrecord_key")
        for name in ("max_weight", "clip"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"{name} must be a number, got {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise ConfigurationError(f"{name} must be finite and > 0, got {value}")
            object.__setattr__(self, name, float(value))
        _int(self.frac_bits, "frac_bits", 0, 0xFF)
        _int(self.max_clients, "max_clients", 2, 0xFFFFFFFF)
        layers = _keys(self.layers, "layers")
        if len(set(layers)) != len(layers):
            raise ConfigurationError("layers repeat a name")
        widths = tuple(_int(w, "a layer width", 1, 0xFFFFFFFF) for w in self.widths)
        if len(widths) != len(layers):
            raise ConfigurationError("layers and widths do not match")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(self, "widths", widths)
        object.__setattr__(self, "groups", _keys(self.groups, "groups"))
        self.codec()

    def codec(self, field: PrimeField | None = None) -> FixedPoint:
        """Return the round's fixed point in ``field`` (default ``F_p``, ``p = 2^32 - 5``).

        Raises
        ------
        ConfigurationError
            If the sum of ``max_clients`` values could overflow the field.
        """
        try:
            return FixedPoint(
                self.frac_bits, max(self.clip, 1.0), self.max_clients,
                PrimeField() if field is None else field,
            )  # fmt: skip
        except ConfigurationError as err:
            raise ConfigurationError(
                f"SesaFedAvg (clipping_range / frac_bits / max_clients): {err}"
            ) from err

    def to_bytes(self) -> bytes:
        """Return the versioned record (module docstring)."""
        w = Writer()
        w.fixed(SETTINGS_MAGIC, len(SETTINGS_MAGIC))
        w.u8(SETTINGS_VERSION)
        w.u32(self.num_shards)
        w.u8(int(self.weighted))
        w.raw(self.weight_key.encode())
        w.raw(self.config_key.encode())
        w.f64(self.max_weight)
        w.f64(self.clip)
        w.u8(self.frac_bits)
        w.u32(self.max_clients)
        w.count(len(self.layers))
        for name, width in zip(self.layers, self.widths, strict=True):
            w.raw(name.encode())
            w.u32(width)
        w.count(len(self.groups))
        for group in self.groups:
            w.raw(group.encode())
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> SesaSettings:
        """Strict decoder of :meth:`to_bytes`.

        Raises
        ------
        WireFormatError
            If the bytes are truncated, have trailing bytes, another magic or version, a name
            that is not UTF-8, or settings that do not validate.
        """
        r = Reader.versioned(data, SETTINGS_MAGIC, SETTINGS_VERSION, "SESA settings")
        num_shards = r.u32("num shards")
        weighted = r.u8("weighted")
        if weighted > 1:
            raise WireFormatError("SESA settings: weighted must be 0 or 1")
        weight_key = read_text(r, "weight key", "SESA")
        config_key = read_text(r, "config key", "SESA")
        max_weight = r.f64("max weight")
        clip = r.f64("clip")
        frac_bits = r.u8("frac bits")
        max_clients = r.u32("max clients")
        n = r.count("layers", 4 + 4)
        if n > MAX_LAYERS:
            raise WireFormatError("SESA settings: too many layers")
        layers, widths = [], []
        for _ in range(n):
            layers.append(read_text(r, "layer", "SESA"))
            widths.append(r.u32("width"))
        m = r.count("groups", 4)
        if m > MAX_LAYERS:
            raise WireFormatError("SESA settings: too many groups")
        groups = tuple(read_text(r, "group", "SESA") for _ in range(m))
        r.done()
        try:
            return cls(
                num_shards, bool(weighted), weight_key, max_weight, clip, frac_bits, max_clients,
                config_key, tuple(layers), tuple(widths), groups,
            )  # fmt: skip
        except ConfigurationError as err:
            raise WireFormatError(f"invalid SESA settings: {err}") from err
