"""What a width client is told each round: the ``FSLW`` :class:`WidthAssignment` format.

Flower-free. :class:`WidthAssignment` is what the server tells one client in one round (rate,
rule, kept channels per scaled layer); its strict versioned codec
(:meth:`WidthAssignment.from_bytes`) rejects malformed bytes with a
:class:`~flwr_fsl.core.wireformat.WireFormatError`. The rule names (:data:`EXTRACTIONS`) and the
rate check it relies on live here too; :mod:`flwr_fsl.families.width.rules` (which chooses the
channels, and re-exports these names) builds assignments with
:func:`~flwr_fsl.families.width.rules.assignment_of`.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic

__all__ = ["EXTRACTIONS", "Extraction", "WidthAssignment", "check_rate"]

Extraction = Literal["rolling", "static", "random", "shards"]
EXTRACTIONS: tuple[Extraction, ...] = ("rolling", "static", "random", "shards")
"""The extraction rules, in the order of their wire codes (1-based)."""


def check_rate(rate: object, name: str = "rate", upper: float = 1.0) -> float:
    """Return ``rate`` as a float after checking it is a real number in ``(0, upper]``.

    Parameters
    ----------
    rate : object
        The capacity.
    name : str
        What to call it in the error message.
    upper : float
        The largest allowed rate (the global model's rate).

    Returns
    -------
    float
        The rate.

    Raises
    ------
    ConfigurationError
        If ``rate`` is not a finite real number in ``(0, upper]``.
    """
    real = isinstance(rate, numbers.Real) and not isinstance(rate, bool | np.bool_)
    if not (real and math.isfinite(float(rate)) and 0.0 < float(rate) <= upper):  # type: ignore[arg-type]
        raise ConfigurationError(f"{name} must be a number in (0, {upper}], got {rate!r}")
    return float(rate)  # type: ignore[arg-type]


def _check_width(width: object, name: str = "width") -> int:
    if isinstance(width, bool) or not isinstance(width, int | np.integer) or width < 1:
        raise ConfigurationError(f"{name} must be an int >= 1, got {width!r}")
    return int(width)


def _frozen(values: NDArray[np.int64]) -> NDArray[np.int64]:
    out = np.ascontiguousarray(values, dtype=np.int64)
    out.flags.writeable = False
    return out


# -- what a client is told -------------------------------------------------------------------

_MAGIC = register_magic(b"FSLW", "width assignment (flwr_fsl.families.width.messages)")
_VERSION = 1
_MAX_NAME = 256


@dataclass(frozen=True, eq=False)
class WidthAssignment:
    """One client's width slice in one round: what the server tells it (versioned codec).

    Attributes
    ----------
    server_round : int
        The round (>= 1).
    rate : float
        The client's capacity this round (its model is built at this rate).
    extraction : str
        The rule that chose the channels (one of :data:`EXTRACTIONS`).
    indices : dict[str, numpy.ndarray]
        Scaled layer -> kept output channels (distinct non-negative int64).

    Raises
    ------
    ValueError
        If a field is out of range (the decoder raises
        :class:`~flwr_fsl.core.wireformat.WireFormatError` instead).
    """

    server_round: int
    rate: float
    extraction: str
    indices: dict[str, NDArray[np.int64]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.server_round, bool) or not isinstance(self.server_round, int):
            raise ConfigurationError(f"server_round must be an int, got {self.server_round!r}")
        if not 1 <= self.server_round < 2**32:
            raise ConfigurationError(f"server_round must be in [1, 2^32), got {self.server_round}")
        check_rate(self.rate)
        if self.extraction not in EXTRACTIONS:
            raise ConfigurationError(f"unknown extraction {self.extraction!r}")
        checked: dict[str, NDArray[np.int64]] = {}
        for name, idx in self.indices.items():
            if not isinstance(name, str) or not 0 < len(name.encode()) <= _MAX_NAME:
                raise ConfigurationError(f"layer names must be 1..{_MAX_NAME} bytes of text")
            a = np.asarray(idx)
            if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
                raise ConfigurationError(f"{name}: indices must be a non-empty 1-D integer array")
            if np.any(a < 0) or np.unique(a).size != a.size:
                raise ConfigurationError(f"{name}: indices must be distinct and non-negative")
            checked[name] = _frozen(a)
        object.__setattr__(self, "indices", checked)

    @property
    def widths(self) -> dict[str, int]:
        """Kept width per scaled layer."""
        return {name: int(idx.size) for name, idx in self.indices.items()}

    def to_bytes(self) -> bytes:
        """Encode: ``FSLW``, version, round u32, rate f64, rule u8, then (name, indices)s."""
        w = Writer()
        w.raw(_MAGIC)
        w.u8(_VERSION)
        w.u32(self.server_round)
        w.array(np.asarray(self.rate, dtype=np.float64))
        w.u8(EXTRACTIONS.index(self.extraction) + 1)
        w.count(len(self.indices))
        for name, idx in self.indices.items():
            w.raw(name.encode())
            w.array(idx)
        return w.payload()

    @classmethod
    def from_bytes(cls, data: object) -> WidthAssignment:
        """Decode strictly: every length, type and range checked; trailing bytes rejected.

        Raises
        ------
        WireFormatError
            If ``data`` is not a well-formed v1 width assignment.
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise WireFormatError("a width assignment must be bytes")
        reader = Reader(bytes(data), 0)
        if reader.raw("magic") != _MAGIC:
            raise WireFormatError("not a width assignment")
        version = reader.u8("version")
        if version != _VERSION:
            raise WireFormatError(f"unsupported width assignment version {version}")
        server_round = reader.u32("round")
        rate_arr = reader.array("rate")
        if rate_arr.shape != () or rate_arr.dtype != np.float64:
            raise WireFormatError("rate must be a float64 scalar")
        code = reader.u8("extraction")
        if not 1 <= code <= len(EXTRACTIONS):
            raise WireFormatError(f"unknown extraction code {code}")
        n = reader.count("layers", 4 + 2)
        indices: dict[str, NDArray[np.int64]] = {}
        for _ in range(n):
            raw = reader.raw("layer name")
            try:
                name = raw.decode()
            except UnicodeDecodeError:
                raise WireFormatError("a layer name is not UTF-8") from None
            if name in indices:
                raise WireFormatError(f"layer {name!r} appears twice")
            indices[name] = reader.vector(f"{name} indices", np.int64)
        reader.done()
        try:
            return cls(server_round, float(rate_arr), EXTRACTIONS[code - 1], indices)
        except ValueError as err:
            raise WireFormatError(f"invalid width assignment: {err}") from err

    @property
    def digest(self) -> bytes:
        """SHA-256 of :meth:`to_bytes` (a reply names the assignment it answers by it)."""
        return hashlib.sha256(self.to_bytes()).digest()

    def check_widths(self, widths: Mapping[str, int]) -> None:
        """Check the index sets against the global widths of the scaled layers.

        Raises
        ------
        ClientInputError
            If the layers differ from ``widths`` or an index is out of range.
        """
        if list(self.indices) != list(widths):
            raise ClientInputError(
                f"the assignment names layers {list(self.indices)}, the model {list(widths)}"
            )
        for name, idx in self.indices.items():
            if idx.size > widths[name] or int(idx.max()) >= widths[name]:
                raise ClientInputError(f"{name}: an index is out of range [0, {widths[name]})")
