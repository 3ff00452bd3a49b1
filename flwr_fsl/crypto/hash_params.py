"""Public hashing parameters of a round: the hash key, the scale factor and :class:`HashParams`.

Split out of :mod:`flwr_fsl.crypto.hashing` (which re-exports every public name here): the
hashing module builds and uses the cuckoo and simple tables, this one decides their size.
:func:`choose_scale_factor` picks ``scale_factor`` (so ``B = ceil(scale_factor * k)`` bins) for
a target cuckoo failure probability from Cui et al. 2023, Table 3, and an empirical fit of
cryptoTools beyond it; :class:`HashParams` bundles the domain size, bin count, key, number of
hash functions and stash size that clients and both servers must agree on. Nothing here
hashes an index.
"""

from __future__ import annotations

import itertools
import math
import operator
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flwr_fsl.core.errors import ConfigurationError

__all__ = [
    "DEFAULT_NUM_HASHES",
    "DEFAULT_STAT_SECURITY",
    "HASH_KEY_BYTES",
    "HashParams",
    "choose_scale_factor",
    "generate_hash_key",
    "num_bins_for",
]

HASH_KEY_BYTES = 16
"""Size of the public per-round hash key (an AES-128 key)."""

DEFAULT_NUM_HASHES = 3
"""``η``: three hash functions, as in Cui et al. §7.1."""

DEFAULT_STAT_SECURITY = 40
"""Target cuckoo failure probability ``2**-40`` (Cui et al. §7)."""

_MAX_NUM_HASHES = 8
_MAX_NUM_BINS = 2**32 - 1
_MAX_DOMAIN_SIZE = 2**62
_MAX_SCALE_ITEMS = 2**32

# Cui et al. 2023, Table 3 (η = 3, stash-less, failure probability <= 2**-40):
# (log2 of the number of inserted items, scale factor).
_CUI_TABLE_3: tuple[tuple[float, float], ...] = (
    (10.0, 1.25),
    (15.0, 1.25),
    (20.0, 1.27),
    (25.0, 1.28),
)

# Empirical stash-less η = 3 fit of cryptoTools (Rindal, github.com/ladnir/cryptoTools,
# CuckooIndex::selectParams; also used by Ant Group's SPU): for n >= 2**9,
# stat_security = 240 * ε - log2(n) - 256; for smaller n, stat_security = slope * ε + intercept
# per floor(log2 n). Used below 2**10, where Table 3 has no entry, for the slope in
# stat_security, and for the growth beyond 2**25.
_FIT_LARGE_SLOPE = 240.0
_FIT_LARGE_INTERCEPT = -256.0
_FIT_SMALL_LINES: tuple[tuple[float, float], ...] = (
    (5.5, 6.35),  # floor(log2 n) = 0
    (5.5, 6.35),  # 1
    (5.5, 6.35),  # 2
    (8.5, -0.07),  # 3
    (13.4, -6.74),  # 4
    (21.9, -16.1),  # 5
    (57.8, -62.6),  # 6
    (100.0, -113.0),  # 7
    (142.0, -158.0),  # 8
)
# Below 1/0.918 three-way cuckoo hashing fails with high probability for large n.
_MIN_SCALE_FACTOR = 1.1


def _check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """Return ``value`` as an ``int`` in ``[low, high]`` or raise ``ValueError``."""
    if isinstance(value, bool | np.bool_):
        raise ConfigurationError(f"{name} must be an integer, got a bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise ConfigurationError(f"{name} must be an integer, got {value!r}") from None
    if number < low or (high is not None and number > high):
        bound = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigurationError(f"{name} must be in {bound}, got {number}")
    return number


def _check_key(key: Any) -> bytes:
    """Return the hash key as ``bytes`` or raise ``ValueError``."""
    if not isinstance(key, bytes | bytearray) or len(key) != HASH_KEY_BYTES:
        length = len(key) if isinstance(key, bytes | bytearray) else type(key).__name__
        raise ConfigurationError(f"hash key must be {HASH_KEY_BYTES} bytes, got {length}")
    return bytes(key)


def generate_hash_key() -> bytes:
    """Return a fresh random 16-byte hash key (the servers publish one per round).

    Returns
    -------
    bytes
        16 bytes from the operating system's CSPRNG.
    """
    return secrets.token_bytes(HASH_KEY_BYTES)


def _log2_items(num_items: int) -> float:
    return math.log2(num_items)


def _fit_line(num_items: int) -> tuple[float, float]:
    """Return ``(slope, intercept)`` of the cryptoTools fit ``λ = slope * ε + intercept``."""
    floor_log2 = num_items.bit_length() - 1
    if floor_log2 < len(_FIT_SMALL_LINES):
        return _FIT_SMALL_LINES[floor_log2]
    return _FIT_LARGE_SLOPE, _FIT_LARGE_INTERCEPT - _log2_items(num_items)


def _scale_factor_at_40(num_items: int) -> float:
    """Scale factor for failure probability ``2**-40``: Cui Table 3, else the cryptoTools fit."""
    log_n = _log2_items(num_items)
    first_log, (last_log, last_eps) = _CUI_TABLE_3[0][0], _CUI_TABLE_3[-1]
    if log_n < first_log:
        slope, intercept = _fit_line(num_items)
        return (DEFAULT_STAT_SECURITY - intercept) / slope
    if log_n >= last_log:
        return last_eps + (log_n - last_log) / _FIT_LARGE_SLOPE
    for (log_a, eps_a), (log_b, eps_b) in itertools.pairwise(_CUI_TABLE_3):
        if log_a <= log_n <= log_b:
            return eps_a + (eps_b - eps_a) * (log_n - log_a) / (log_b - log_a)
    raise AssertionError("unreachable: Table 3 covers [2**10, 2**25]")  # pragma: no cover


def choose_scale_factor(
    num_items: int,
    *,
    stat_security: float = DEFAULT_STAT_SECURITY,
    num_hashes: int = DEFAULT_NUM_HASHES,
    stash_size: int = 0,
) -> float:
    """Choose the cuckoo scale factor ``ε`` (bins per item) for a target failure probability.

    For ``stat_security = 40`` and ``2**10 <= num_items <= 2**25`` this interpolates Cui et
    al. 2023, Table 3 linearly in ``log2 num_items`` (1.25, 1.25, 1.27, 1.28 at ``2**10``,
    ``2**15``, ``2**20``, ``2**25``). Outside that range, and for the dependence on
    ``stat_security``, it uses the empirical stash-less three-way fit of cryptoTools
    (``λ = 240 ε - log2 n - 256`` for ``n >= 2**9``, per-``floor(log2 n)`` lines below; it asks
    for more bins than Table 3, e.g. 1.317 instead of 1.27 at ``2**20``): small sets need far
    more bins (6.1 for fewer than 8 items), and above ``2**25`` ε grows by ``1/240`` per
    doubling. Other ``stat_security`` values shift ε by ``(λ - 40) / slope`` of that fit.
    A stash only lowers the failure probability, so for ``stash_size > 0`` the stash-less
    value is returned (conservative).

    Parameters
    ----------
    num_items : int
        ``k``, the number of indices each client cuckoo-hashes (``1 <= k <= 2**32``).
    stat_security : float, optional
        ``λ``: target failure probability ``2**-λ`` (``1 <= λ <= 128``), default 40.
    num_hashes : int, optional
        ``η``; only 3 has a fitted table.
    stash_size : int, optional
        ``σ >= 0``.

    Returns
    -------
    float
        The scale factor ``ε`` (at least 1.1).

    Raises
    ------
    ConfigurationError
        If an argument is out of range, or ``num_hashes != 3``.
    """
    num_items = _check_int("num_items", num_items, 1, _MAX_SCALE_ITEMS)
    _check_int("stash_size", stash_size, 0)
    _check_int("num_hashes", num_hashes, 1, _MAX_NUM_HASHES)
    if num_hashes != DEFAULT_NUM_HASHES:
        raise ConfigurationError(
            f"scale factors are only fitted for num_hashes = 3, got {num_hashes}; "
            "pass scale_factor explicitly"
        )
    if isinstance(stat_security, bool) or not isinstance(stat_security, int | float):
        raise ConfigurationError(f"stat_security must be a number, got {stat_security!r}")
    if not 1 <= stat_security <= 128:
        raise ConfigurationError(f"stat_security must be in [1, 128], got {stat_security}")
    slope, _ = _fit_line(num_items)
    epsilon = _scale_factor_at_40(num_items) + (stat_security - DEFAULT_STAT_SECURITY) / slope
    return max(_MIN_SCALE_FACTOR, epsilon)


def num_bins_for(num_items: int, scale_factor: float) -> int:
    """Return ``B = ceil(scale_factor * num_items)``, and at least 1.

    Parameters
    ----------
    num_items : int
        ``k >= 0``.
    scale_factor : float
        ``ε >= 1``.

    Returns
    -------
    int
        The number of bins; the product is rounded to 9 decimals first so that, e.g.,
        ``1.27 * 100`` gives 127 bins, not 128.

    Raises
    ------
    ConfigurationError
        If ``num_items < 0``, ``scale_factor`` is not a finite number ``>= 1``, or the result
        is ``2**32`` or more.
    """
    num_items = _check_int("num_items", num_items, 0)
    if isinstance(scale_factor, bool) or not isinstance(scale_factor, int | float):
        raise ConfigurationError(f"scale_factor must be a number, got {scale_factor!r}")
    if not (math.isfinite(scale_factor) and scale_factor >= 1.0):
        raise ConfigurationError(f"scale_factor must be a finite number >= 1, got {scale_factor}")
    num_bins = max(1, math.ceil(round(scale_factor * num_items, 9)))
    if num_bins > _MAX_NUM_BINS:
        raise ConfigurationError(f"{num_bins} bins is too many (at most {_MAX_NUM_BINS})")
    return num_bins


@dataclass(frozen=True)
class HashParams:
    """The public hashing parameters of one round, shared by clients and both servers.

    Parameters
    ----------
    domain_size : int
        ``m``: indices are in ``[0, m)`` (``1 <= m <= 2**62``).
    num_bins : int
        ``B``: bins of both the cuckoo and the simple table (``1 <= B < 2**32``).
    key : bytes
        The 16-byte public hash key of the round.
    num_hashes : int, optional
        ``η`` in ``[1, 8]``, default 3.
    stash_size : int, optional
        ``σ >= 0``, default 0 (stash-less).

    Raises
    ------
    ValueError
        If a field is out of range or the key is not 16 bytes.
    """

    domain_size: int
    num_bins: int
    key: bytes = field(repr=False)
    num_hashes: int = DEFAULT_NUM_HASHES
    stash_size: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "domain_size", _check_int("domain_size", self.domain_size, 1, _MAX_DOMAIN_SIZE)
        )
        object.__setattr__(
            self, "num_bins", _check_int("num_bins", self.num_bins, 1, _MAX_NUM_BINS)
        )
        object.__setattr__(self, "key", _check_key(self.key))
        object.__setattr__(
            self, "num_hashes", _check_int("num_hashes", self.num_hashes, 1, _MAX_NUM_HASHES)
        )
        object.__setattr__(self, "stash_size", _check_int("stash_size", self.stash_size, 0))

    @classmethod
    def for_items(
        cls,
        domain_size: int,
        num_items: int,
        key: bytes,
        *,
        num_hashes: int = DEFAULT_NUM_HASHES,
        stash_size: int = 0,
        scale_factor: float | None = None,
        stat_security: float = DEFAULT_STAT_SECURITY,
    ) -> HashParams:
        """Size the tables for clients that each cuckoo-hash ``num_items`` indices.

        Parameters
        ----------
        domain_size : int
            ``m``.
        num_items : int
            ``k``, the (public) number of indices per client, ``0 <= k <= m``.
        key : bytes
            The 16-byte public hash key of the round.
        num_hashes : int, optional
            ``η``, default 3.
        stash_size : int, optional
            ``σ``, default 0.
        scale_factor : float or None, optional
            ``ε``; ``None`` picks :func:`choose_scale_factor` for ``stat_security``.
        stat_security : float, optional
            Target failure probability ``2**-stat_security`` when ``scale_factor`` is None.

        Returns
        -------
        HashParams
            Parameters with ``num_bins = max(1, ceil(ε * k))``.

        Raises
        ------
        ValueError
            If an argument is out of range.
        """
        domain_size = _check_int("domain_size", domain_size, 1, _MAX_DOMAIN_SIZE)
        num_items = _check_int("num_items", num_items, 0, domain_size)
        if scale_factor is None:
            scale_factor = (
                choose_scale_factor(
                    num_items,
                    stat_security=stat_security,
                    num_hashes=num_hashes,
                    stash_size=stash_size,
                )
                if num_items > 0
                else 1.0
            )
        return cls(
            domain_size=domain_size,
            num_bins=num_bins_for(num_items, scale_factor),
            key=key,
            num_hashes=num_hashes,
            stash_size=stash_size,
        )
