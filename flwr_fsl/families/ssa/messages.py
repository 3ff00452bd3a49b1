"""SSA's byte formats: :class:`SSAParams` (JSON), the client upload and the client state.

Flower-free. :class:`SSAParams` travels as canonical JSON (``format`` ``flwr_fsl/ssa-params``,
version 1, 2 with a ``dp`` object, 3 with ``dp`` and a ``run`` object, 4 with
``"weighted": false`` and, optionally, ``dp`` and ``run``, or 5 with ``"verify": true`` and,
optionally, ``"weighted": false``, ``dp`` and ``run``, or 6 with version 5's and
``"range_check": true`` (the exact value check), 7 with version 5's and ``"value_check":
"projected"`` and ``"projections"``, or 8 with version 7's and ``"projected_digest": 2``) and
is decoded strictly
(:meth:`SSAParams.from_bytes`: every field's type checked, NaN and infinities rejected).
:class:`SSAUpload` is what a client sends (the DPF keys' public part and one master seed per
server); :class:`Placement` and the ``FSCS`` client-state codec (:func:`_state_to_bytes`, the
format table in :class:`~flwr_fsl.families.ssa.protocol.SSAClientState`) keep a client's keys
between U-DPF rounds. The parties (client encoding, server share, reconstruction) are in
:mod:`flwr_fsl.families.ssa.protocol`, which re-exports these names. Decoders raise
:class:`SSAInputError` (a :class:`~flwr_fsl.core.errors.ClientInputError`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.crypto.dpf import DPFKeyBatch, DPFKeyError, DPFPublicBatch
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.crypto.hashing import EMPTY, CuckooTable, HashParams
from flwr_fsl.families.ssa.dp import DistributedDP, RunScope

__all__ = ["Placement", "SSAInputError", "SSAParams", "SSAUpload"]

_MAGIC = "flwr_fsl/ssa-params"
_VERSION = 1
_DP_VERSION = (
    2  # the same JSON plus a "dp" object (:class:`~flwr_fsl.families.ssa.dp.DistributedDP`)
)
_RUN_VERSION = 3  # version 2 plus a "run" object (:class:`~flwr_fsl.families.ssa.dp.RunScope`)
# Version 1's fields plus "weighted" (bool; written only when false, unit weights) and,
# optionally, version 2's "dp" object and, with it, version 3's "run" object.
_WEIGHTING_VERSION = 4
# Version 4's shape ("weighted" written only when false) plus "verify": true: the servers check
# every client's keys (:mod:`flwr_fsl.families.ssa.verify`). Versions 1 to 4 mean verify=False.
_VERIFY_VERSION = 5
# Version 5's shape plus "range_check": true: the servers also check every value word's range
# (range_check module). Decoders of versions 1 to 5 refuse it.
_RANGE_VERSION = 6
# Version 5's shape plus "value_check": "projected" and "projections": r: the servers check the
# value words' projected range (projected_check module). Decoders of versions 1 to 6 refuse it.
_PROJECTED_VERSION = 7
# Version 7's shape plus "projected_digest": 2: the projected check binds the keys' public part
# by its digest version 2 (projected_check.public_digest_v2). Decoders of 1 to 7 refuse it.
_DIGEST2_VERSION = 8
# Fields an unchecked round (versions 1 to 4) carries only when they differ from their defaults:
# the projected check's settings of the round's checked variant (``replace(p, verify=True)``).
_CHECKED_VARIANT = ("projections", "projected_digest")
VALUE_CHECKS = ("off", "projected", "exact")
"""The value checks of a checked round, weakest first (:attr:`SSAParams.value_check_mode`)."""
DEFAULT_PROJECTIONS = 64
"""Default number ``r`` of random projections of the projected value check."""
PROJECTED_DIGESTS = (1, 2)
"""Versions of the projected check's digest of the public part (``SSAParams.projected_digest``)."""
DEFAULT_PROJECTED_DIGEST = 2
"""The digest version of a round with the projected check, unless set (parameter version 8)."""
MAX_PROJECTIONS = 1024
PROJECTION_SLACK = 4
"""``c``: the projected check's bound is ``T = c * B2`` (:attr:`SSAParams.value_l2_bound`)."""
_MAX_CHECK_BOUND = 1 << 60  # the range machinery's bound must stay below 2^61
# SSAClientState binary format (see its docstring).
_STATE_MAGIC = register_magic(b"FSCS", "SSA client state (flwr_fsl.families.ssa.messages)")
_STATE_VERSION = 1
_MAX_PARAMS_BYTES = 64 * 1024  # the JSON is a few hundred bytes
_MAX_PARAM_INT = 1 << 62  # largest integer (and float) a parameter set may carry
MAX_SCALE_FACTOR = float(1 << 40)
"""Largest cuckoo ``scale_factor`` a decoded parameter set may carry (real ones are 1.2-2)."""


class SSAInputError(ClientInputError):
    """A client's keys or hint do not fit the round (malformed, wrong shape, replayed)."""


@dataclass(frozen=True)
class SSAParams:
    """Public parameters of one SSA (or PSR) round, known to clients and both servers.

    Parameters
    ----------
    round_id : int
        Round number (bound into the sealed channel; part of the public transcript).
    domain_size : int
        ``m``: number of elements (coordinates, or rows for mega-elements).
    num_items : int
        ``k``: elements per client (a client may choose fewer; unused bins are dummies).
    value_width : int
        Words per element's value: 1 for scalars, the row length for mega-elements.
    hash_key : bytes
        Fresh public 16-byte hash key of the round.
    count_weighted : bool
        Append a count word so the servers can divide by the chosen clients' total weight.
    num_hashes, stash_size : int
        Cuckoo ``η`` (default 3) and stash ``σ`` (default 0).
    scale_factor : float or None
        Cuckoo ``ε``; None chooses it for failure probability ``2**-40``.
    frac_bits, max_abs, max_summands : int, float, int
        Fixed-point format (see :class:`~flwr_fsl.crypto.fixedpoint.FixedPoint`); ``max_abs``
        bounds every payload word (``c * dw`` and ``c``) of one client.
    epoch : int
        U-DPF epoch of this round's keys: 0 for one-shot keys (the servers drop them after
        evaluating), ``>= 1`` in U-DPF runs (the servers keep each client's keys so that its
        next hint can update them).
    weighted : bool
        With ``count_weighted``: True, each client's count word ``c`` is its weight (sample
        count or per-element counts, the format's meaning before version 4); False, ``c = 1``
        for every element a client contributes (unit weights), so a count word is the number
        of clients that chose the element, not a sum of their weights. Clients enforce it
        (:func:`~flwr_fsl.families.ssa.protocol.payload_words`); the strategies default to
        False.
    dp : DistributedDP or None
        Distributed differential privacy of the round (:mod:`flwr_fsl.families.ssa.dp`): clients
        clip to its ``clip_norm`` / ``max_weight`` and each server adds Gaussian noise to its
        share. Requires ``count_weighted`` and ``max_weight * max(clip_norm, 1) <= max_abs``
        (a clipped client's payload words fit the codec).
    run : RunScope or None
        The run a DP round counts against and its budget (S1 keys its privacy account by the
        run id; clients check it against their own Flower run id). Only with ``dp``.
    verify : bool
        Both servers check every client's keys (default True;
        :mod:`flwr_fsl.families.ssa.verify`): verifiable DPF keys (at most one nonzero point
        per key), a dummy slot per bin, and with unit weights every key's count word exactly 1;
        a client that fails is dropped by both. False: the unchecked keys of versions 1 to 4
        (for comparison, e.g. ``benchmarks/ssa_bench.py``).
    value_check : str or None
        How both servers check the value words of a checked round; read the check in force from
        :attr:`value_check_mode`. None (the default) means ``"projected"`` in a checked round
        (``verify`` True) and ``"off"`` otherwise, resolved where it is read, so
        ``dataclasses.replace(SSAParams(verify=False, ...), verify=True)`` checks the value
        words. ``"projected"`` (:mod:`flwr_fsl.families.ssa.projected_check`: ``r`` random
        {-1, 0, 1} projections of all value words, each range-checked exactly against
        ``T = c * B2``, so every value word is within ``2T`` of zero except with probability
        ``2^-r``; a few thousand upload words, independent of the number of keys), ``"exact"``
        (:mod:`flwr_fsl.families.ssa.range_check`: every word within the fixed-point bound;
        ``8 * L`` upload bytes per value word per key, 2-3x the checked upload) or ``"off"``
        (value words unchecked). A round with ``verify`` False has no value check:
        ``"exact"`` is refused there. ``"projected"``, and any value equal to the default of the
        round's ``verify``, is stored as None (one representation per parameter set), so it
        too means "projected when the round is checked".
    projections : int
        ``r`` of the projected check (default 64, in ``[1, 1024]``). Ignored (stored as the
        default) with an explicit ``"off"`` or ``"exact"``; kept with ``value_check`` None, for
        the round's checked variant (an unchecked round's bytes carry it when it is not the
        default, so it survives a round trip).
    projected_digest : int
        How the projected check's seed binds the keys' public part
        (:mod:`flwr_fsl.families.ssa.projected_check`): 2 (the default,
        :data:`DEFAULT_PROJECTED_DIGEST`; parameter version 8) hashes only the fields that fix
        the value shares, in pieces on the encode's threads
        (:func:`~flwr_fsl.families.ssa.projected_check.public_digest_v2`: about 60% of the bytes
        at ``m = 2**20``); 1 (the default before session 31; parameter version 7) hashes every
        public field in one SHA-256 pass
        (:func:`~flwr_fsl.families.ssa.projected_check.public_digest`). Normalized and carried
        like ``projections``: an unchecked round writes it when it is not 1 (so the bytes of
        versions 1 to 4 without it keep their meaning, digest version 1, and a default unchecked
        round carries its checked variant's 2).

    Raises
    ------
    ConfigurationError
        If a field is out of range, or a value check is asked of an unchecked round.

    Notes
    -----
    **JSON format.** :meth:`to_bytes` writes ``{"format": "flwr_fsl/ssa-params", "version": 1,
    <every field but dp>}`` (sorted keys, hash key in hex) for a round without DP — byte for
    byte the format from before DP existed — and ``"version": 2`` with an extra ``"dp"``
    object (exactly ``noise_multiplier``, ``clip_norm``, ``max_weight``, ``delta``) for a
    round with DP, and ``"version": 3`` with ``"dp"`` and a ``"run"`` object (exactly ``id``,
    or ``id``, ``epsilon`` and ``delta``) for a DP round that names its run. A round with
    ``weighted=False`` is written as ``"version": 4``: version 1's fields plus
    ``"weighted": false`` and, with DP, the ``"dp"`` object and, when it names its run, the
    ``"run"`` object; a decoder of versions 1 to 3 refuses it (a client that cannot keep unit
    weights does not take part). :meth:`from_bytes` accepts exactly these shapes (version 4
    only with ``"weighted": false``, so each parameter set has one encoding); versions 1 to 3
    mean ``weighted=True``. A round with ``verify=True`` (the default) is written as
    ``"version": 5``: version 4's shape (``"weighted": false`` only with unit weights, ``dp`` and
    ``run`` when set) plus ``"verify": true``; versions 1 to 4 mean ``verify=False``, and their
    decoders refuse version 5 (a party that cannot check keys does not take part). A round with
    ``value_check="exact"`` is written as ``"version": 6``: version 5's shape plus
    ``"range_check": true``; a round with ``value_check="projected"`` (the default of a checked
    round) and ``projected_digest=1`` as ``"version": 7``: version 5's shape plus
    ``"value_check": "projected"`` and ``"projections": r``, and with ``projected_digest=2``
    (the default of a checked round) as ``"version": 8``: version 7's shape plus
    ``"projected_digest": 2`` (a version 7 round decodes with ``projected_digest=1``).
    Versions 1 to 5 mean ``value_check="off"``, version 6 ``"exact"``
    (:attr:`value_check_mode`; the bytes depend on the check in force, not on how it was
    asked). An unchecked round (versions 1 to 4) also carries ``"projections"`` and
    ``"projected_digest"`` when they are not 64 and 1 (its checked variant's settings; a
    decoder refuses them at their defaults, so each parameter set has one encoding).
    """

    round_id: int
    domain_size: int
    num_items: int
    value_width: int
    hash_key: bytes = field(repr=False)
    count_weighted: bool = True
    num_hashes: int = 3
    stash_size: int = 0
    scale_factor: float | None = None
    frac_bits: int = 24
    max_abs: float = 1e4
    max_summands: int = 1000
    epoch: int = 0
    dp: DistributedDP | None = None
    run: RunScope | None = None
    weighted: bool = True
    verify: bool = True
    value_check: str | None = None
    projections: int = DEFAULT_PROJECTIONS
    projected_digest: int = DEFAULT_PROJECTED_DIGEST

    def __post_init__(self) -> None:
        for name in ("round_id", "domain_size", "num_items", "value_width", "epoch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"{name} must be a non-negative integer, got {value!r}")
        if self.domain_size < 1 or self.value_width < 1:
            raise ConfigurationError("domain_size and value_width must be >= 1")
        if self.num_items > self.domain_size:
            raise ConfigurationError("num_items cannot exceed domain_size")
        for flag in ("weighted", "verify"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigurationError(f"{flag} must be a bool, got {getattr(self, flag)!r}")
        self.hash_params  # noqa: B018 - validates hashing fields
        self.fixed_point  # noqa: B018 - validates (and checks the overflow bound)
        self._check_privacy()
        self._check_value_check()  # last: its bound reads the fixed point and dp

    def _check_value_check(self) -> None:
        """Check ``value_check`` and ``projections``; store the round's default as None."""
        if self.value_check is not None and self.value_check not in VALUE_CHECKS:
            raise ConfigurationError(
                f"value_check must be None or one of {VALUE_CHECKS}, got {self.value_check!r}"
            )
        r = self.projections
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_PROJECTIONS:
            raise ConfigurationError(f"projections must be an integer in [1, 1024], got {r!r}")
        v = self.projected_digest
        if isinstance(v, bool) or v not in PROJECTED_DIGESTS:
            raise ConfigurationError(
                f"projected_digest must be one of {PROJECTED_DIGESTS}, got {v!r}"
            )
        if not self.verify and self.value_check == "exact":
            raise ConfigurationError(
                "value_check='exact' needs verify (the key check); an unchecked round has "
                "value_check 'off' (or None, its default)"
            )
        if self.value_check in ("projected", _default_value_check(self.verify)):
            object.__setattr__(self, "value_check", None)  # one representation per round
        if self.value_check is not None:  # an explicit "off" / "exact": r is not used
            object.__setattr__(self, "projections", DEFAULT_PROJECTIONS)
            object.__setattr__(self, "projected_digest", 1)
        if self.value_check_mode == "projected" and self.projection_bound >= _MAX_CHECK_BOUND:
            raise ConfigurationError(
                f"the projected value check's bound {self.projection_bound} is not below 2**60 "
                "(lower max_abs or frac_bits, or use value_check='exact')"
            )

    @property
    def value_check_mode(self) -> str:
        """The value check in force, one of :data:`VALUE_CHECKS` (read this, not the field).

        ``value_check`` if given, else ``"projected"`` with ``verify`` and ``"off"`` without.
        """
        return self.value_check or _default_value_check(self.verify)

    @property
    def value_bound(self) -> int:
        """``ceil(max_abs * 2^frac_bits)``: the largest value word an honest client writes."""
        return math.ceil(self.max_abs * 2.0**self.frac_bits)

    @property
    def value_l2_bound(self) -> int:
        """``B2``: an upper bound on the L2 norm of an honest client's value words (fixed point).

        A client fills at most ``k = num_items`` keys with ``value_width`` words each (the other
        keys' value words are 0), each at most :attr:`value_bound`: ``B2 <= sqrt(k w) bound``.
        In a DP round the client clips its values to L2 norm ``C`` (``dp.clip_norm``) and each
        weight to ``W`` (``dp.max_weight``; 1 with unit weights), so its value words ``c * dw``
        have norm at most ``W C``; stochastic rounding moves each word by less than one unit:
        ``B2 <= ceil(W C 2^f) + ceil(sqrt(k w))``. The smaller of the two (integers, +1).
        """
        words = self.num_items * self.value_width
        bound = self.value_bound
        plain = math.isqrt(words * bound * bound) + 1
        if self.dp is None:
            return plain
        weight = self.dp.max_weight if self.weighted else 1.0
        clipped = math.ceil(weight * self.dp.clip_norm * 2.0**self.frac_bits)
        return min(plain, clipped + math.isqrt(words) + 2)

    @property
    def projection_bound(self) -> int:
        """``T = c * B2``: the bound each projection of the projected check is held to."""
        return PROJECTION_SLACK * self.value_l2_bound

    def _check_privacy(self) -> None:
        """Check ``dp`` and ``run`` (types, count words, payload bound, run only with dp)."""
        if self.dp is not None:
            if not isinstance(self.dp, DistributedDP):
                raise ConfigurationError(
                    f"dp must be a DistributedDP, got {type(self.dp).__name__}"
                )
            if not self.count_weighted:
                raise ConfigurationError("dp needs count_weighted rounds")
            if self.num_items < 1:
                raise ConfigurationError("dp needs num_items >= 1 (its sensitivity is per item)")
            if self.dp.max_weight * max(self.dp.clip_norm, 1.0) > self.max_abs:
                raise ConfigurationError(
                    f"dp max_weight * max(clip_norm, 1) = "
                    f"{self.dp.max_weight * max(self.dp.clip_norm, 1.0):g} exceeds "
                    f"max_abs={self.max_abs:g}: clipped payload words would not fit"
                )
        if self.run is not None:
            if not isinstance(self.run, RunScope):
                raise ConfigurationError(f"run must be a RunScope, got {type(self.run).__name__}")
            if self.dp is None:
                raise ConfigurationError("run (the DP account's run) needs dp")

    @property
    def tau(self) -> int:
        """DPF output words per point: ``value_width`` (+1 count word when count-weighted)."""
        return self.value_width + int(self.count_weighted)

    @property
    def key_tau(self) -> int:
        """Words per point of the clients' DPF keys (``tau``, padded to even when verified).

        With ``verify`` and an odd ``tau`` the keys carry one zero padding word per point:
        verifiable keys never use early termination.
        """
        return self.tau + int(self.verify and self.tau % 2 == 1)

    @property
    def fixed_point(self) -> FixedPoint:
        """The fixed-point codec of payload words."""
        return FixedPoint(self.frac_bits, self.max_abs, self.max_summands)

    @property
    def hash_params(self) -> HashParams:
        """Cuckoo/simple hashing parameters (``B = ceil(ε k)`` bins)."""
        return HashParams.for_items(
            self.domain_size,
            self.num_items,
            self.hash_key,
            num_hashes=self.num_hashes,
            stash_size=self.stash_size,
            scale_factor=self.scale_factor,
        )

    @property
    def num_keys(self) -> int:
        """DPF keys per client: ``B`` bins plus ``σ`` stash slots."""
        return self.hash_params.num_bins + self.stash_size

    def to_bytes(self) -> bytes:
        """Serialize (canonical JSON; the hash key in hex)."""
        fields: dict[str, object] = {
            k: getattr(self, k)
            for k in self.__dataclass_fields__
            if k not in ("dp", "run", "weighted", "verify", "value_check", *_CHECKED_VARIANT)
        }
        fields["hash_key"] = self.hash_key.hex()
        version = _VERSION
        if self.dp is not None:
            fields["dp"] = self.dp.to_dict()
            version = _DP_VERSION
        if self.run is not None:
            fields["run"] = self.run.to_dict()
            version = _RUN_VERSION
        if not self.weighted:  # weighted rounds keep the bytes of versions 1 to 3
            fields["weighted"] = False
            version = _WEIGHTING_VERSION
        if self.verify:
            fields["verify"] = True
            version = _VERIFY_VERSION
        version = self._value_check_fields(fields, version)
        return json.dumps({"format": _MAGIC, "version": version, **fields}, sort_keys=True).encode()

    def _value_check_fields(self, fields: dict[str, object], version: int) -> int:
        """Add the value check's JSON fields to ``fields``; return the version they make."""
        mode = self.value_check_mode
        variant = {"projections": self.projections, "projected_digest": self.projected_digest}
        if mode == "exact":  # version 6's bytes
            fields["range_check"] = True
            return _RANGE_VERSION
        if mode == "projected":
            fields |= {"value_check": "projected", "projections": self.projections}
            if self.projected_digest == 1:
                return _PROJECTED_VERSION
            fields["projected_digest"] = self.projected_digest
            return _DIGEST2_VERSION
        if not self.verify:  # the checked variant's settings, when not the defaults
            fields |= {k: v for k, v in variant.items() if v != _VARIANT_DEFAULTS[k]}
        return version

    @classmethod
    def from_bytes(cls, data: bytes) -> SSAParams:
        """Parse :meth:`to_bytes` output strictly.

        Raises
        ------
        SSAInputError
            If the bytes are not a parameter set of this version (format, fields, types).
        ConfigurationError
            If a field's value is out of range (the dataclass's own checks).
        """
        raw = _load_json(data)
        if not isinstance(raw, dict) or raw.pop("format", None) != _MAGIC:
            raise SSAInputError("not an SSA parameter set")
        version = raw.pop("version", None)
        expected = _expected_fields(version, "dp" in raw, "run" in raw, "weighted" in raw)
        if version in _UNCHECKED_VERSIONS:  # the checked variant's non-default settings
            expected |= set(_CHECKED_VARIANT) & set(raw)
        if set(raw) != expected:
            raise SSAInputError(f"SSA parameter fields differ: {sorted(raw)}")
        # Types first, so every bad field is a ValueError (never a TypeError from deeper down).
        for name, value in raw.items():
            if not _FIELD_TYPES[name](value):
                raise SSAInputError(f"SSA parameter {name!r} has the wrong type")
            _check_range(name, value)
        _check_flags(raw, version)
        raw.setdefault("verify", False)  # versions 1 to 4: unchecked keys
        # versions 1 to 5: value words unchecked; 6: the exact check; 7: written
        raw.setdefault("value_check", "exact" if "range_check" in expected else "off")
        if version == _PROJECTED_VERSION or version in _UNCHECKED_VERSIONS:
            raw.setdefault("projected_digest", 1)  # their bytes without it: digest version 1
        try:
            raw["hash_key"] = bytes.fromhex(raw["hash_key"])
        except ValueError:
            raise SSAInputError("hash_key must be hex") from None
        return cls(**_nested(raw))


_UNCHECKED_VERSIONS = (_VERSION, _DP_VERSION, _RUN_VERSION, _WEIGHTING_VERSION)


_VARIANT_DEFAULTS = {"projections": DEFAULT_PROJECTIONS, "projected_digest": 1}


def _check_flags(raw: dict[str, Any], version: object) -> None:
    """Refuse a flag at a value its version never writes (one encoding per parameter set).

    ``range_check`` is popped (its version says it). An unchecked round's ``projections`` and
    ``projected_digest`` are written only when not their defaults.

    Raises
    ------
    SSAInputError
        Naming the field.
    """
    if raw.get("weighted") is True:
        raise SSAInputError("version 4 and 5 SSA parameters carry weighted=false only")
    if raw.get("verify") is False:
        raise SSAInputError("version 5 to 8 SSA parameters carry verify=true only")
    if raw.pop("range_check", True) is False:
        raise SSAInputError("version 6 SSA parameters carry range_check=true only")
    if "value_check" in raw and raw["value_check"] != "projected":
        raise SSAInputError("version 7 and 8 SSA parameters carry value_check='projected' only")
    if version == _DIGEST2_VERSION and raw["projected_digest"] == 1:
        raise SSAInputError("version 8 SSA parameters carry projected_digest=2 only")
    if version in _UNCHECKED_VERSIONS:
        for name, default in _VARIANT_DEFAULTS.items():
            if raw.get(name, default) == default and name in raw:
                raise SSAInputError(f"SSA parameter {name!r} is written only when not {default}")


def _default_value_check(verify: bool) -> str:
    """Return the check of a round whose ``value_check`` is None: projected iff ``verify``."""
    return "projected" if verify else "off"


def _check_range(name: str, value: object) -> None:
    """Refuse a number no round can use before it reaches arithmetic (naming the field).

    Integers must lie in ``[0, 2**62]``; ``scale_factor`` in ``[1, MAX_SCALE_FACTOR]``; every
    other float (``max_abs``, the ``dp`` and ``run`` numbers) must be finite, ``>= 0`` and at
    most ``2**62``. Finer bounds are the dataclasses' own checks. Objects are checked field by
    field (``dp.noise_multiplier``), so no huge or infinite value (JSON ``1e999`` parses as
    infinity) overflows deeper down.

    Raises
    ------
    SSAInputError
        Naming the field and the range.
    """
    if isinstance(value, dict):
        for key, inner in value.items():
            _check_range(f"{name}.{key}", inner)
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    top = MAX_SCALE_FACTOR if name == "scale_factor" else float(_MAX_PARAM_INT)
    low = 1.0 if name == "scale_factor" else 0.0
    if isinstance(value, int) and not low <= value <= _MAX_PARAM_INT:
        raise SSAInputError(f"SSA parameter {name!r} must be an integer in [0, 2**62]")
    if isinstance(value, float) and not (math.isfinite(value) and low <= value <= top):
        raise SSAInputError(f"SSA parameter {name!r} must be a finite number in [{low:g}, {top:g}]")


def _nested(raw: dict[str, Any]) -> dict[str, Any]:
    """Decode the ``dp`` and ``run`` objects of a parameter set in place (strictly)."""
    if "dp" in raw:
        raw["dp"] = DistributedDP.from_dict(raw["dp"])
    if "run" in raw:
        raw["run"] = RunScope.from_dict(raw["run"])
    return raw


def _expected_fields(
    version: object, has_dp: bool, has_run: bool, has_weighted: bool = False
) -> set[str]:
    """Return the JSON fields of :class:`SSAParams` at ``version``.

    ``has_dp`` / ``has_run``: the "dp" / "run" objects are there (optional in versions 4 and
    5 only); ``has_weighted``: the "weighted" field is there (optional in version 5 only).
    """
    versions = (
        _VERSION,
        _DP_VERSION,
        _RUN_VERSION,
        _WEIGHTING_VERSION,
        _VERIFY_VERSION,
        _RANGE_VERSION,
        _PROJECTED_VERSION,
        _DIGEST2_VERSION,
    )
    if version not in versions or isinstance(version, bool):
        raise SSAInputError(f"unsupported SSA parameter version (expected one of {versions})")
    checked = version in (_VERIFY_VERSION, _RANGE_VERSION, _PROJECTED_VERSION, _DIGEST2_VERSION)
    late = version == _WEIGHTING_VERSION or checked
    if late and has_run and not has_dp:
        raise SSAInputError(f"version {version} SSA parameters carry a run object only with dp")
    expected = set(SSAParams.__dataclass_fields__) - {
        "dp",
        "run",
        "weighted",
        "verify",
        "value_check",
        *_CHECKED_VARIANT,
    }
    if version in (_DP_VERSION, _RUN_VERSION) or (late and has_dp):
        expected.add("dp")
    if version == _RUN_VERSION or (late and has_run):
        expected.add("run")
    if version == _WEIGHTING_VERSION or (checked and has_weighted):
        expected.add("weighted")
    if checked:
        expected.add("verify")
    if version == _RANGE_VERSION:
        expected.add("range_check")
    if version in (_PROJECTED_VERSION, _DIGEST2_VERSION):
        expected |= {"value_check", "projections"}
    if version == _DIGEST2_VERSION:
        expected.add("projected_digest")
    return expected


def _load_json(data: object) -> object:
    """Parse the parameters' JSON: bytes of bounded size, no NaN/Infinity, no repeated key."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SSAInputError(f"SSA parameters must be bytes, got {type(data).__name__}")
    if len(data) > _MAX_PARAMS_BYTES:
        raise SSAInputError(f"SSA parameters exceed {_MAX_PARAMS_BYTES} bytes")
    try:
        # NaN/Infinity are not JSON numbers: reject them instead of letting them reach math.
        return json.loads(
            bytes(data).decode(), parse_constant=_reject_constant, object_pairs_hook=_unique_keys
        )
    except SSAInputError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # also over-long integers
        raise SSAInputError(f"SSA parameters are not valid JSON: {err}") from None


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise SSAInputError("SSA parameters repeat a key")
    return out


def _reject_constant(name: str) -> None:
    raise SSAInputError(f"{name} is not a valid parameter value")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return _is_int(v) or isinstance(v, float)


_FIELD_TYPES: dict[str, Callable[[object], bool]] = {
    **dict.fromkeys(
        (
            "round_id",
            "domain_size",
            "num_items",
            "value_width",
            "num_hashes",
            "stash_size",
            "frac_bits",
            "max_summands",
            "epoch",
            "projections",
            "projected_digest",
        ),
        _is_int,
    ),
    "hash_key": lambda v: isinstance(v, str),
    "count_weighted": lambda v: isinstance(v, bool),
    "weighted": lambda v: isinstance(v, bool),
    "verify": lambda v: isinstance(v, bool),
    "range_check": lambda v: isinstance(v, bool),
    "value_check": lambda v: isinstance(v, str),
    "scale_factor": lambda v: v is None or _is_number(v),
    "max_abs": _is_number,
    "dp": lambda v: isinstance(v, dict),
    "run": lambda v: isinstance(v, dict),
}


@dataclass
class Placement:
    """Where a client's indices went: the DPF points of all keys and each key's item slot.

    Attributes
    ----------
    alphas : numpy.ndarray
        ``(num_keys,)`` DPF points (0 for dummy keys).
    slots : numpy.ndarray
        ``(num_keys,)`` position in the client's index list of the element a key carries, or
        ``EMPTY``.
    cuckoo_table : CuckooTable or None
        The client's cuckoo table (None when restored from stored state).
    """

    alphas: NDArray[np.uint64]
    slots: NDArray[np.int64]
    cuckoo_table: CuckooTable | None = None


@dataclass
class SSAUpload:
    """What a client sends: the public part (to both servers) and one master seed per server.

    Attributes
    ----------
    public_part : bytes
        Serialized :class:`~flwr_fsl.crypto.dpf.DPFPublicBatch` of all ``B + σ`` keys.
    master_seeds : tuple[bytes, bytes]
        16-byte master seeds for S0 and S1 (S1's travels sealed).
    """

    public_part: bytes
    master_seeds: tuple[bytes, bytes] = field(repr=False)

    @property
    def public_digest(self) -> bytes:
        """SHA-256 of the public part (bound into S1's sealed material)."""
        return hashlib.sha256(self.public_part).digest()


def _state_to_bytes(
    params: SSAParams,
    indices: NDArray[np.int64],
    placement: Placement,
    keys: tuple[DPFKeyBatch, DPFKeyBatch],
) -> bytes:
    """``FSCS`` v1 (:class:`~flwr_fsl.families.ssa.protocol.SSAClientState`'s docstring).

    Raises
    ------
    ValueError
        If the two key shares do not share one public part or parties are swapped.
    """
    k0, k1 = keys
    public = k0.public.to_bytes()
    if (k0.party, k1.party) != (0, 1) or k1.public.to_bytes() != public:
        raise ValueError("the state's key shares are not S0's and S1's of the same keys")
    w = Writer()
    w.fixed(_STATE_MAGIC, len(_STATE_MAGIC))
    w.u8(_STATE_VERSION)
    w.raw(params.to_bytes())
    w.array(np.asarray(indices, np.int64))
    w.array(np.asarray(placement.alphas, np.uint64))
    w.array(np.asarray(placement.slots, np.int64))
    w.raw(public)
    w.array(k0.root_seeds)
    w.array(k1.root_seeds)
    return w.payload()


def _state_from_bytes(
    data: bytes,
) -> tuple[SSAParams, NDArray[np.int64], Placement, tuple[DPFKeyBatch, DPFKeyBatch]]:
    """Strict decoder of :func:`_state_to_bytes` (raises :class:`SSAInputError`).

    Every length is checked against the bytes left before anything is allocated, and the
    fields are checked against each other and the stored round; the text of an error names
    the failed check only, never a stored index, value or size (they are secret).
    """
    try:
        r = Reader.versioned(data, _STATE_MAGIC, _STATE_VERSION, "an SSA client state")
    except WireFormatError as err:
        raise SSAInputError(str(err)) from None  # the header holds no secret
    try:
        raw_params = r.raw("params")
        indices = r.vector("indices", np.int64)
        alphas = r.vector("alphas", np.uint64)
        slots = r.vector("slots", np.int64)
        public_bytes = r.raw("public part")
        seeds = (r.array_u64("S0's root seeds"), r.array_u64("S1's root seeds"))
        r.done()
    except WireFormatError:
        raise SSAInputError("malformed SSA client state") from None
    try:
        params = SSAParams.from_bytes(raw_params)
    except ValueError as err:
        raise SSAInputError(f"SSA client state: bad round parameters: {err}") from None
    try:
        public = DPFPublicBatch.from_bytes(public_bytes)
        keys = (DPFKeyBatch(0, seeds[0], public), DPFKeyBatch(1, seeds[1], public))
    except DPFKeyError:
        raise SSAInputError("SSA client state: malformed keys") from None
    _check_state(params, indices, alphas, slots, public)
    return params, indices, Placement(alphas, slots), keys


def _check_state(
    params: SSAParams,
    indices: NDArray[np.int64],
    alphas: NDArray[np.uint64],
    slots: NDArray[np.int64],
    public: DPFPublicBatch,
) -> None:
    """Check a decoded state's fields against each other and its round (cheap checks only)."""
    n = indices.size
    if n > params.num_items:
        raise SSAInputError("SSA client state: more indices than its round allows")
    if n and (indices.min() < 0 or indices.max() >= params.domain_size):
        raise SSAInputError("SSA client state: an index is outside the round's domain")
    if np.unique(indices).size != n:
        raise SSAInputError("SSA client state: repeated indices")
    num_keys = params.num_keys
    if alphas.size != num_keys or slots.size != num_keys or public.num_keys != num_keys:
        raise SSAInputError("SSA client state: key count differs from its round's")
    if public.tau != params.key_tau or np.any(public.epochs != np.uint64(params.epoch)):
        raise SSAInputError("SSA client state: keys do not match its round's tau or epoch")
    if np.any(alphas >> public.domain_bits.astype(np.uint64) != 0):
        raise SSAInputError("SSA client state: a DPF point lies outside its key's domain")
    used = slots[slots != EMPTY]
    # Every index is carried by exactly one key (a bin or a stash slot), as place_indices does.
    if not np.array_equal(np.sort(used), np.arange(n)):
        raise SSAInputError("SSA client state: slots do not place every index exactly once")
