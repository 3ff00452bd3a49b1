"""Settings and session seeds of PrivHFL secure querying (see :mod:`.protocol`).

:class:`PrivHFLConfig` fixes the comparison (the leak-free DCF by default, or the paper's
DReLU, whose leak its docstring states), the fixed-point precision and the comparison bound;
:class:`SessionSeeds` holds the three pairwise PRG seeds of one (querier, answerer, server)
session. Both are re-exported by
:mod:`~flwr_fsl.families.privhfl.protocol`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.prg import SEED_BYTES

__all__ = ["COMPARISONS", "PrivHFLConfig", "SessionSeeds"]

COMPARISONS = ("dcf", "drelu")
"""The secure comparisons: ``"dcf"`` (the default; the querier learns nothing but its output)
and ``"drelu"`` (the paper's Π_DReLU; the querier learns ``z = r x`` of every comparison)."""


@dataclass(frozen=True)
class PrivHFLConfig:
    """Settings of secure querying.

    Parameters
    ----------
    comparison : {"dcf", "drelu"}
        The secure comparison behind every ReLU and max-pool step. ``"dcf"`` (default): one
        distributed comparison function per value; the querier's view is only the masked sum
        of the logits (``agg-S``), whatever the answerers' hidden values. ``"drelu"``: the
        paper's Π_DReLU, faster, and it **leaks to the querier** ``z = r x`` for every
        comparison input ``x`` (every hidden pre-activation and max-pool difference of every
        answerer's model on the querier's queries), with ``r`` uniform in ``[1, 2^(62 -
        bound_bits)]`` (``2^22`` by default) and ``z`` an exact integer product: the sign of
        ``x`` exactly, and ``|x|`` is a divisor of ``|z|`` of at least ``|z| / 2^22``. Factoring
        ``z`` leaves a short list of candidates; the smallest is ``|x|`` to the last fixed-point
        unit for about a quarter of the values, and a query sent three times (``r`` is fresh
        each time) pins ``|x|`` to within two units for about 90%
        (``tests/attacks/test_privhfl_drelu_factoring.py``). Both give the same outputs up to
        the fixed-point rounding (each comparison is exact).
    frac_bits : int
        Fixed-point fractional bits ``f`` (the paper: 20), in ``[1, 28]``.
    bound_bits : int
        ``l``: every comparison input satisfies ``|x| < 2^l`` in ring units, i.e. ``|x| <
        2^(l - f)`` in real units; in ``[f + 1, 60]``. The DCF domain has ``l`` bits; the paper's
        variant draws ``r <= 2^(62 - l)``. Default 40 (activations below ``2^20``).

    Raises
    ------
    ConfigurationError
        If a setting is out of range (named).
    """

    comparison: Literal["dcf", "drelu"] = "dcf"
    frac_bits: int = 20
    bound_bits: int = 40

    def __post_init__(self) -> None:
        if self.comparison not in COMPARISONS:
            raise ConfigurationError(
                f"comparison must be one of {COMPARISONS}, got {self.comparison!r}"
            )
        f = self.frac_bits
        if isinstance(f, bool) or not isinstance(f, int) or not 1 <= f <= 28:
            raise ConfigurationError(f"frac_bits must be an integer in [1, 28], got {f!r}")
        b = self.bound_bits
        if isinstance(b, bool) or not isinstance(b, int) or not f + 1 <= b <= 60:
            raise ConfigurationError(f"bound_bits must be an integer in [{f + 1}, 60], got {b!r}")

    @property
    def scale_bits(self) -> int:
        """Bits of the DReLU scale ``r`` (uniform in ``[1, 2^scale_bits]``): ``62 - l``."""
        return 62 - self.bound_bits

    @property
    def max_input(self) -> float:
        """Largest ``|query value|`` accepted: ``2^(l - f)``."""
        return float(2 ** (self.bound_bits - self.frac_bits))

    def codec(self) -> FixedPoint:
        """Return the fixed-point codec of queries, weights and outputs."""
        return FixedPoint(self.frac_bits, self.max_input, 1)


@dataclass(frozen=True)
class SessionSeeds:
    """The three pairwise PRG seeds of one (querier, answerer, server) session.

    Parameters
    ----------
    querier_answerer : bytes
        ``Sk_QA`` (16 bytes).
    server_answerer : bytes
        ``Sk_SA``.
    server_querier : bytes
        ``Sk_SQ``.

    Raises
    ------
    ConfigurationError
        If a seed is not 16 bytes or two coincide.
    """

    querier_answerer: bytes = field(repr=False)
    server_answerer: bytes = field(repr=False)
    server_querier: bytes = field(repr=False)

    def __post_init__(self) -> None:
        seeds = (self.querier_answerer, self.server_answerer, self.server_querier)
        if any(not isinstance(s, bytes) or len(s) != SEED_BYTES for s in seeds):
            raise ConfigurationError(f"every session seed must be {SEED_BYTES} bytes")
        if len(set(seeds)) != 3:
            raise ConfigurationError("the three session seeds must be distinct")

    @classmethod
    def fresh(cls) -> SessionSeeds:
        """Three fresh OS-random seeds."""
        return cls(os.urandom(16), os.urandom(16), os.urandom(16))
