"""SecAgg's Flower-free message formats: the one typed, versioned settings record.

The masked-input (``train``) request tells the client how to build its vector
(:class:`~flwr_fsl.families.secagg.vector.WeightedVector`): the model's array names in vector
order, the metric names averaged inside the vector, the weight's metric key and the fixed
point's bounds. They travel as one :class:`SecAggSettings` record (``settings`` field of the
SecAgg ConfigRecord) instead of eight loose fields each end re-validated: the strategy builds
and validates it once (:class:`~flwr_fsl.core.errors.ConfigurationError`), the client decodes
it strictly (:class:`~flwr_fsl.core.wireformat.WireFormatError`, a
:class:`~flwr_fsl.core.errors.ClientInputError`).

**Format** (little-endian, through :mod:`flwr_fsl.core.wireformat`): ``b"FSAS"``, version
``u8`` (1), ``names`` (list of UTF-8 byte strings), ``metrics`` (same), ``weight_key`` (UTF-8
bytes), ``clip``, ``max_weight``, ``max_metric`` (each the IEEE-754 binary64 bits as ``u64``),
``frac_bits`` (``u8``), ``max_clients`` (``u32``); nothing after it.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.families.secagg.vector import WeightedVector

__all__ = ["SETTINGS_MAGIC", "SETTINGS_VERSION", "SecAggSettings"]

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
