"""Width extraction for heterogeneous clients: capacities, index rules, layer structure, layouts.

Flower-free. A client of capacity ``rate`` trains a *narrower* copy of the global model: every
hidden layer of width ``K`` keeps ``k = ceil(K * rate / global_rate)`` of its output channels;
the next layer keeps the matching input channels; the first layer's inputs and the last
layer's outputs are kept whole. Which ``k`` channels is the *extraction rule*:

* ``"rolling"`` (FedRolex, Alam et al. 2022; the official ``ResnetServerRoll.split_model``):
  ``roll(arange(K), r % K)[:k]`` where ``r`` is the server's 0-based round counter
  (``server_round - 1`` for Flower's 1-based rounds) and ``roll`` is ``torch.roll``'s
  (``numpy.roll``'s) shift to the right. Every client of a round shares the shift, which
  advances one channel per round and wraps (e.g. ``K = 4``, ``k = 2``, round 2:
  ``[3, 0]``). The official code computes ``k`` as ``int(np.ceil(K * (rate / global_rate)))``;
  :func:`local_width` does exactly that.
* ``"static"`` (HeteroFL, Diao et al. 2021): the prefix ``arange(k)``.
* ``"random"``: ``k`` channels drawn uniformly without replacement, independently per client,
  round and layer (FedRolex's ``ResnetServerRandom``: ``randperm(K)[:k]``), from a seeded
  stream so a run is reproducible; returned ascending (the order of a width slice's channels
  is immaterial as long as consecutive layers agree, which :class:`WidthSpec` guarantees).
* ``"shards"`` (SESA, Sami & Güler, §IV): the ``K`` nodes are split into ``S`` equal shards
  of ``K / S`` consecutive channels (``S = 1 / B_min``); a client of rate ``B`` picks
  ``B * S`` shards uniformly at random without replacement, per layer.
  :func:`select_shards` returns the shard ids and the channels; a SESA client draws them with
  OS randomness (``rng=None``) so that nobody else knows its choice.

The *layer structure* (:class:`WidthSpec`, :class:`WidthLayer`) is in
:mod:`flwr_fsl.families.width.spec`; what the server tells one client in one round
(:class:`WidthAssignment`, its ``FSLW`` codec, and the rule names :data:`EXTRACTIONS`) is in
:mod:`flwr_fsl.families.width.messages`. This module re-exports both.

Capacities: :data:`RATE_LEVELS` are HeteroFL's ``a..e`` (1, 1/2, 1/4, 1/8, 1/16).
:class:`CapacityMix` parses a mix such as ``"a6-b10-c11-d18-e55"`` and either assigns rates to
clients in fixed blocks (HeteroFL's and FedRolex's ``"fix"`` mode, :meth:`CapacityMix.fixed`)
or draws a rate per client and round (their ``"dynamic"`` mode, :meth:`CapacityMix.draw`).

Privacy: width extraction by itself hides nothing; under ``rolling``/``static``/``random``
the server chooses (hence knows) every client's channels. SESA's secure aggregation builds
on ``shards`` (the client's choice stays secret there).

Errors: a bad setting or a layer structure that does not fit the model raises
:class:`ValueError`; bytes or index sets that came from a client raise
:class:`~flwr_fsl.core.errors.ClientInputError`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.width.messages import (
    EXTRACTIONS,
    Extraction,
    WidthAssignment,
    _check_width,
    _frozen,
    check_rate,
)
from flwr_fsl.families.width.spec import WidthLayer, WidthSpec

__all__ = [
    "EXTRACTIONS",
    "RATE_LEVELS",
    "CapacityMix",
    "Extraction",
    "ShardSelection",
    "WidthAssignment",
    "WidthLayer",
    "WidthRule",
    "WidthSpec",
    "assignment_of",
    "check_rate",
    "local_width",
    "parse_rate",
    "random_indices",
    "rolling_indices",
    "select_shards",
    "shard_channels",
    "shards_for_rate",
    "static_indices",
]

RATE_LEVELS: dict[str, float] = {"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.125, "e": 0.0625}
"""HeteroFL's / FedRolex's capacity levels (``model_split_rate``)."""

# Domain tags of the seeded streams (so the random rule, shard draws and capacity draws of the
# same seed, round and client are independent).
_TAG_RANDOM = 0x52414E44  # "RAND"
_TAG_SHARDS = 0x53485244  # "SHRD"
_TAG_CAPACITY = 0x43415041  # "CAPA"
_RATE_TOLERANCE = 1e-9


# -- rates and widths ------------------------------------------------------------------------


def parse_rate(value: object, name: str = "rate") -> float:
    """Read a capacity given as a number or as one of HeteroFL's letters ``a``..``e``.

    Parameters
    ----------
    value : object
        ``0.25``, ``"0.25"`` or ``"c"``.
    name : str
        What to call it in the error message.

    Returns
    -------
    float
        The rate, in ``(0, 1]``.

    Raises
    ------
    ConfigurationError
        If the value is neither a letter of :data:`RATE_LEVELS` nor a number in ``(0, 1]``.
    """
    if isinstance(value, str):
        text = value.strip().lower()
        if text in RATE_LEVELS:
            return RATE_LEVELS[text]
        try:
            value = float(text)
        except ValueError:
            raise ConfigurationError(
                f"{name} must be a number in (0, 1] or one of {sorted(RATE_LEVELS)}, got {text!r}"
            ) from None
    return check_rate(value, name)


def local_width(width: int, rate: float, global_rate: float = 1.0) -> int:
    """Width a client of capacity ``rate`` keeps of a layer whose global width is ``width``.

    ``int(np.ceil(width * (rate / global_rate)))`` — FedRolex's and HeteroFL's formula
    (``local_output_size``), always at least 1 and at most ``width``.

    Parameters
    ----------
    width : int
        The global model's width ``K`` of the layer (>= 1).
    rate : float
        The client's capacity, in ``(0, global_rate]``.
    global_rate : float
        The global model's rate (1 unless the global model is itself scaled).

    Returns
    -------
    int
        ``k``.

    Raises
    ------
    ValueError
        If ``width < 1`` or a rate is out of range.
    """
    _check_width(width)
    g = check_rate(global_rate, "global_rate")
    r = check_rate(rate, "rate", upper=g)
    return min(width, max(1, int(np.ceil(width * (r / g)))))


def _check_local(width: int, local: int) -> tuple[int, int]:
    _check_width(width)
    _check_width(local, "local width")
    if local > width:
        raise ConfigurationError(f"local width {local} exceeds the layer's width {width}")
    return int(width), int(local)


# -- index rules ---------------------------------------------------------------------------


def rolling_indices(width: int, local: int, round_index: int) -> NDArray[np.int64]:
    """FedRolex's rolling window: ``roll(arange(width), round_index % width)[:local]``.

    Parameters
    ----------
    width : int
        The layer's global width ``K``.
    local : int
        The kept width ``k`` (:func:`local_width`).
    round_index : int
        The server's 0-based round counter (FedRolex's ``self.rounds``; Flower's
        ``server_round - 1``).

    Returns
    -------
    numpy.ndarray
        ``k`` read-only int64 channel indices, in window order (wrapping, e.g. ``[3, 0]``).

    Raises
    ------
    ConfigurationError
        If a width is out of range or ``round_index`` is negative.
    """
    width, local = _check_local(width, local)
    if isinstance(round_index, bool) or not isinstance(round_index, int | np.integer):
        raise ConfigurationError(f"round_index must be an int, got {round_index!r}")
    if round_index < 0:
        raise ConfigurationError(f"round_index must be >= 0, got {round_index}")
    shift = int(round_index) % width
    # roll right by `shift`: position j holds (j - shift) mod K.
    return _frozen((np.arange(local, dtype=np.int64) - shift) % width)


def static_indices(width: int, local: int) -> NDArray[np.int64]:
    """HeteroFL's static prefix ``arange(local)`` (read-only int64)."""
    _, local = _check_local(width, local)
    return _frozen(np.arange(local, dtype=np.int64))


def random_indices(width: int, local: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """``local`` channels of ``width`` drawn uniformly without replacement, ascending.

    Parameters
    ----------
    width, local : int
        The layer's global and kept width.
    rng : numpy.random.Generator
        The stream to draw from (see :class:`WidthRule` for the seeded one).

    Returns
    -------
    numpy.ndarray
        ``local`` distinct read-only int64 indices, ascending.
    """
    width, local = _check_local(width, local)
    chosen = rng.choice(width, size=local, replace=False)
    return _frozen(np.sort(chosen))


def shards_for_rate(rate: float, num_shards: int) -> int:
    """How many of ``num_shards`` shards a client of capacity ``rate`` selects: ``rate * S``.

    Raises
    ------
    ConfigurationError
        If ``num_shards < 1``, ``rate`` is not in ``(0, 1]`` or ``rate * num_shards`` is not a
        whole number (SESA needs every capacity to be a multiple of ``B_min = 1 / S``).
    """
    s = _check_width(num_shards, "num_shards")
    r = check_rate(rate)
    count = round(r * s)
    if count < 1 or abs(r * s - count) > _RATE_TOLERANCE * s:
        raise ConfigurationError(
            f"rate {r} is not a multiple of 1/num_shards = 1/{s}: a client must pick a whole "
            "number of shards"
        )
    return int(count)


def shard_channels(width: int, num_shards: int, shard_ids: ArrayLike) -> NDArray[np.int64]:
    """Channels of the given shards: shard ``s`` holds ``[s*K/S, (s+1)*K/S)``.

    Parameters
    ----------
    width : int
        The layer's width ``K``; a multiple of ``num_shards``.
    num_shards : int
        ``S``.
    shard_ids : array_like
        Distinct shard ids in ``[0, S)``; the channels come in this order.

    Returns
    -------
    numpy.ndarray
        ``len(shard_ids) * K / S`` read-only int64 channel indices.

    Raises
    ------
    ConfigurationError
        If ``K`` is not a multiple of ``S`` or a shard id is out of range or repeated.
    """
    width = _check_width(width)
    s = _check_width(num_shards, "num_shards")
    if width % s:
        raise ConfigurationError(f"a layer of width {width} does not split into {s} equal shards")
    ids = np.asarray(shard_ids)
    if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
        raise ConfigurationError("shard ids must be a 1-D integer array")
    if np.any(ids < 0) or np.any(ids >= s) or np.unique(ids).size != ids.size:
        raise ConfigurationError(f"shard ids must be distinct and within [0, {s})")
    size = width // s
    channels = ids.astype(np.int64)[:, None] * size + np.arange(size, dtype=np.int64)
    return _frozen(channels.reshape(-1))


@dataclass(frozen=True, eq=False)
class ShardSelection:
    """One client's SESA shard choice in one layer.

    Attributes
    ----------
    shards : numpy.ndarray
        The selected shard ids, ascending (read-only int64).
    channels : numpy.ndarray
        Their channels, shard by shard (read-only int64, ascending).
    num_shards : int
        ``S`` of the layer.
    shard_size : int
        ``K / S``.
    """

    shards: NDArray[np.int64]
    channels: NDArray[np.int64]
    num_shards: int
    shard_size: int


def select_shards(
    width: int, num_shards: int, rate: float, rng: np.random.Generator | None = None
) -> ShardSelection:
    """SESA's submodel selection in one layer: ``rate * S`` of ``S`` shards, uniformly.

    Parameters
    ----------
    width : int
        The layer's width ``K`` (a multiple of ``S``).
    num_shards : int
        ``S = 1 / B_min``.
    rate : float
        The client's capacity ``B_i`` (a multiple of ``1 / S``).
    rng : numpy.random.Generator, optional
        A seeded stream (plaintext baselines, tests). None draws from the operating system's
        CSPRNG (:class:`random.SystemRandom`), as a SESA client must: its choice is a secret.

    Returns
    -------
    ShardSelection
        The shard ids and their channels.

    Raises
    ------
    ValueError
        If ``K`` is not a multiple of ``S`` or ``rate * S`` is not a whole number.
    """
    width = _check_width(width)
    count = shards_for_rate(rate, num_shards)
    if rng is None:
        chosen = random.SystemRandom().sample(range(num_shards), count)
    else:
        chosen = [int(x) for x in rng.choice(num_shards, size=count, replace=False)]
    shards = _frozen(np.sort(np.asarray(chosen, dtype=np.int64)))
    return ShardSelection(
        shards, shard_channels(width, num_shards, shards), int(num_shards), width // num_shards
    )


def _stream(seed: int, tag: int, *keys: int) -> np.random.Generator:
    """Return a numpy stream keyed by (seed, domain tag, keys...), independent across keys."""
    return np.random.default_rng([int(seed), tag, *(int(k) for k in keys)])


# -- capacities ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityMix:
    """A distribution of client capacities (HeteroFL's / FedRolex's ``model_mode``).

    Attributes
    ----------
    rates : tuple[float, ...]
        The capacity levels, each in ``(0, 1]``, distinct.
    weights : tuple[int, ...]
        Their proportions (positive integers, as in ``"a6-b10"``).

    Raises
    ------
    ConfigurationError
        If the tuples are empty, differ in length, or hold an invalid rate or weight.
    """

    rates: tuple[float, ...]
    weights: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.rates or len(self.rates) != len(self.weights):
            raise ConfigurationError("a capacity mix needs as many weights as rates, at least one")
        for r in self.rates:
            check_rate(r, "capacity mix rate")
        if len(set(self.rates)) != len(self.rates):
            raise ConfigurationError(f"capacity mix rates must be distinct, got {self.rates}")
        for w in self.weights:
            if isinstance(w, bool) or not isinstance(w, int) or w < 1:
                raise ConfigurationError(
                    f"capacity mix weights must be ints >= 1, got {self.weights}"
                )

    @classmethod
    def parse(cls, text: str) -> CapacityMix:
        """Parse ``"a6-b10-c11-d18-e55"`` (letter of :data:`RATE_LEVELS`, then its weight).

        Raises
        ------
        ConfigurationError
            If a part is not a known letter followed by a positive integer.
        """
        if not isinstance(text, str) or not text.strip():
            raise ConfigurationError(f"a capacity mix must be a string like 'a6-b10', got {text!r}")
        rates: list[float] = []
        weights: list[int] = []
        for part in text.strip().lower().split("-"):
            letter, digits = part[:1], part[1:]
            if letter not in RATE_LEVELS or not digits.isdigit():
                raise ConfigurationError(
                    f"capacity mix part {part!r} must be one of {sorted(RATE_LEVELS)} followed "
                    "by a weight, e.g. 'a6'"
                )
            rates.append(RATE_LEVELS[letter])
            weights.append(int(digits))
        return cls(tuple(rates), tuple(weights))

    @property
    def probabilities(self) -> NDArray[np.float64]:
        """The weights normalized to sum to 1."""
        w = np.asarray(self.weights, dtype=np.float64)
        return w / w.sum()

    def fixed(self, num_clients: int) -> list[float]:
        """Rates of clients ``0..num_clients-1`` in HeteroFL's ``"fix"`` mode.

        ``num_clients // sum(weights)`` times each weight consecutive clients get each rate
        in order; the remaining clients get the last rate (``utils.process_control``).

        Raises
        ------
        ValueError
            If ``num_clients < 1``.
        """
        n = _check_width(num_clients, "num_clients")
        block = n // sum(self.weights)
        rates: list[float] = []
        for rate, weight in zip(self.rates, self.weights, strict=True):
            rates.extend([rate] * (block * weight))
        rates.extend([self.rates[-1]] * (n - len(rates)))
        return rates

    def draw(self, seed: int, server_round: int, client: int) -> float:
        """One client's rate for one round in the ``"dynamic"`` mode (seeded, reproducible).

        Parameters
        ----------
        seed : int
            The run's seed.
        server_round : int
            The round (each round draws afresh).
        client : int
            The client (node id).

        Returns
        -------
        float
            A rate of :attr:`rates`, drawn with :attr:`probabilities`.
        """
        rng = _stream(seed, _TAG_CAPACITY, server_round, client)
        return float(self.rates[int(rng.choice(len(self.rates), p=self.probabilities))])


# -- the rule of a run ---------------------------------------------------------------------


@dataclass(frozen=True)
class WidthRule:
    """An extraction rule with its settings: which channels each client keeps each round.

    Attributes
    ----------
    extraction : {"rolling", "static", "random", "shards"}
        The rule (module docstring).
    global_rate : float
        The global model's rate (local widths are ``ceil(K * rate / global_rate)``).
    num_shards : int or None
        ``S`` for ``"shards"`` (required there, unused otherwise).
    seed : int
        Seed of the ``"random"`` and (server-drawn) ``"shards"`` streams.

    Raises
    ------
    ConfigurationError
        If a setting is invalid (the message names it).
    """

    extraction: Extraction = "rolling"
    global_rate: float = 1.0
    num_shards: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.extraction not in EXTRACTIONS:
            raise ConfigurationError(
                f"extraction must be one of {list(EXTRACTIONS)}, got {self.extraction!r}"
            )
        check_rate(self.global_rate, "global_rate")
        if self.extraction == "shards":
            _check_width(self.num_shards, "num_shards")
        elif self.num_shards is not None:
            raise ConfigurationError("num_shards applies only to extraction='shards'")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigurationError(f"seed must be an int >= 0, got {self.seed!r}")

    def check_rate(self, rate: float) -> float:
        """Validate a client's capacity for this rule (and, for shards, its shard count).

        Raises
        ------
        ValueError
            If the rate is not in ``(0, global_rate]`` or (shards) not a multiple of ``1/S``.
        """
        r = check_rate(rate, "rate", upper=self.global_rate)
        if self.extraction == "shards":
            shards_for_rate(r / self.global_rate, self.num_shards)  # type: ignore[arg-type]
        return r

    def indices(
        self, widths: Mapping[str, int], rate: float, server_round: int, client: int
    ) -> dict[str, NDArray[np.int64]]:
        """Kept output channels of every scaled layer for one client in one round.

        Parameters
        ----------
        widths : Mapping[str, int]
            Scaled layer -> global width ``K`` (:meth:`WidthSpec.widths`), in layer order.
        rate : float
            The client's capacity.
        server_round : int
            Flower's 1-based round (the rolling shift is ``server_round - 1``).
        client : int
            The client (node id): keys the random and shard streams.

        Returns
        -------
        dict[str, numpy.ndarray]
            Layer -> read-only int64 channel indices.

        Raises
        ------
        ConfigurationError
            If the rate, the round or a width is invalid.
        """
        r = self.check_rate(rate)
        if isinstance(server_round, bool) or not isinstance(server_round, int) or server_round < 1:
            raise ConfigurationError(f"server_round must be an int >= 1, got {server_round!r}")
        out: dict[str, NDArray[np.int64]] = {}
        for position, (name, width) in enumerate(widths.items()):
            k = local_width(width, r, self.global_rate)
            if self.extraction == "rolling":
                out[name] = rolling_indices(width, k, server_round - 1)
            elif self.extraction == "static":
                out[name] = static_indices(width, k)
            elif self.extraction == "random":
                rng = _stream(self.seed, _TAG_RANDOM, server_round, client, position)
                out[name] = random_indices(width, k, rng)
            else:
                rng = _stream(self.seed, _TAG_SHARDS, server_round, client, position)
                s = self.num_shards
                out[name] = select_shards(width, s, r / self.global_rate, rng).channels  # type: ignore[arg-type]
        return out


def assignment_of(
    rule: WidthRule,
    widths: Mapping[str, int],
    rate: float,
    server_round: int,
    client: int,
) -> WidthAssignment:
    """Return one client's assignment in one round under ``rule`` (:meth:`WidthRule.indices`)."""
    return WidthAssignment(
        server_round, rate, rule.extraction, rule.indices(widths, rate, server_round, client)
    )
