"""Settings and session seeds of PrivHFL secure querying (see :mod:`.protocol`).

:class:`PrivHFLConfig` fixes the comparison (the paper's DReLU or the leak-free DCF), the
fixed-point precision and the comparison bound; :class:`SessionSeeds` holds the three pairwise
PRG seeds of one (querier, answerer, server) session. Both are re-exported by
:mod:`~flwr_fsl.families.privhfl.protocol`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.prg import SEED_BYTES

__all__ = ["PrivHFLConfig", "SessionSeeds"]


@dataclass(frozen=True)
class PrivHFLConfig:
    """Settings of secure querying.

    Parameters
    ----------
    relu : {"drelu", "dcf"}
        Comparison: the paper's DReLU (the querier learns ``r x``; see the module docstring)
        or the leak-free DCF comparison.
    frac_bits : int
        Fixed-point fractional bits ``f`` (the paper: 20), in ``[1, 28]``.
    bound_bits : int
        ``l``: every comparison input satisfies ``|x| < 2^l`` in ring units, i.e. ``|x| <
        2^(l - f)`` in real units; in ``[f + 1, 60]``. The DCF domain has ``l`` bits; the paper's
        variant draws ``r <= 2^(62 - l)``. Default 40 (activations below ``2^20``).
    """

    relu: Literal["drelu", "dcf"] = "drelu"
    frac_bits: int = 20
    bound_bits: int = 40

    def __post_init__(self) -> None:
        if self.relu not in ("drelu", "dcf"):
            raise ConfigurationError(f"relu must be 'drelu' or 'dcf', got {self.relu!r}")
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
