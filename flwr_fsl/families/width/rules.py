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

The *layer structure* (:class:`WidthSpec`, one :class:`WidthLayer` per layer) says which
tensors of a torch ``Linear`` / ``Conv2d`` / ``BatchNorm`` state dict are a layer's weight,
bias and per-channel extras (batch-norm scale and shift, running statistics) and how the
channel axes chain (``in_group``: how many input features one channel of the previous layer
spans, e.g. ``H * W`` after flattening a conv feature map). :meth:`WidthSpec.layout` turns a
client's kept channels into the platform's :class:`~flwr_fsl.submodel.layout.WidthLayout`,
whose element space is the global model's flat space, so the one count-weighted apply
(:mod:`flwr_fsl.submodel.aggregate`) averages every coordinate over the clients holding it —
FedRolex's and HeteroFL's ``combine`` with its default unweighted mean.

Capacities: :data:`RATE_LEVELS` are HeteroFL's ``a..e`` (1, 1/2, 1/4, 1/8, 1/16).
:class:`CapacityMix` parses a mix such as ``"a6-b10-c11-d18-e55"`` and either assigns rates to
clients in fixed blocks (HeteroFL's and FedRolex's ``"fix"`` mode, :meth:`CapacityMix.fixed`)
or draws a rate per client and round (their ``"dynamic"`` mode, :meth:`CapacityMix.draw`).

:class:`WidthAssignment` is what the server tells one client in one round (rate, rule, kept
channels per scaled layer); its strict versioned codec (:meth:`WidthAssignment.from_bytes`)
rejects malformed bytes with a :class:`~flwr_fsl.core.wireformat.WireFormatError`.

Privacy: width extraction by itself hides nothing; under ``rolling``/``static``/``random``
the server chooses (hence knows) every client's channels. SESA's secure aggregation builds
on ``shards`` (the client's choice stays secret there).

Errors: a bad setting or a layer structure that does not fit the model raises
:class:`ValueError`; bytes or index sets that came from a client raise
:class:`~flwr_fsl.core.errors.ClientInputError`.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.submodel.layout import TensorSlice, WidthLayout

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

Extraction = Literal["rolling", "static", "random", "shards"]
EXTRACTIONS: tuple[Extraction, ...] = ("rolling", "static", "random", "shards")
"""The extraction rules, in the order of their wire codes (1-based)."""

RATE_LEVELS: dict[str, float] = {"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.125, "e": 0.0625}
"""HeteroFL's / FedRolex's capacity levels (``model_split_rate``)."""

# Domain tags of the seeded streams (so the random rule, shard draws and capacity draws of the
# same seed, round and client are independent).
_TAG_RANDOM = 0x52414E44  # "RAND"
_TAG_SHARDS = 0x53485244  # "SHRD"
_TAG_CAPACITY = 0x43415041  # "CAPA"
_RATE_TOLERANCE = 1e-9


# -- rates and widths ------------------------------------------------------------------------


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


def _check_width(width: object, name: str = "width") -> int:
    if isinstance(width, bool) or not isinstance(width, int | np.integer) or width < 1:
        raise ConfigurationError(f"{name} must be an int >= 1, got {width!r}")
    return int(width)


def _check_local(width: int, local: int) -> tuple[int, int]:
    _check_width(width)
    _check_width(local, "local width")
    if local > width:
        raise ConfigurationError(f"local width {local} exceeds the layer's width {width}")
    return int(width), int(local)


def _frozen(values: NDArray[np.int64]) -> NDArray[np.int64]:
    out = np.ascontiguousarray(values, dtype=np.int64)
    out.flags.writeable = False
    return out


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


# -- layer structure ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WidthLayer:
    """One layer of a width-scalable model and the tensors indexed by its output channels.

    Attributes
    ----------
    name : str
        The layer's name (keys the kept-channel index sets).
    weight : str
        Its weight tensor: ``(out, in)`` linear or ``(out, in, kh, kw)`` conv.
    bias : str or None
        Its bias ``(out,)``.
    extras : tuple[str, ...]
        Other ``(out,)`` tensors indexed by the layer's output channels: batch-norm weight and
        bias (and running statistics where tracked).
    scaled : bool
        Whether the layer's outputs are narrowed (hidden layers). The last layer keeps its
        outputs whole; so may any layer whose width must not change.
    in_group : int
        Input features per output channel of the previous layer (``H * W`` where a conv
        feature map is flattened channel-major into a linear layer; 1 otherwise).
    """

    name: str
    weight: str
    bias: str | None = None
    extras: tuple[str, ...] = ()
    scaled: bool = True
    in_group: int = 1

    @property
    def tensors(self) -> tuple[str, ...]:
        """Every tensor of the layer: weight, bias, extras."""
        return (self.weight, *((self.bias,) if self.bias else ()), *self.extras)


@dataclass(frozen=True)
class WidthSpec:
    """The layer structure of a width-scalable model: layers in forward order, chained.

    Layer ``l``'s input channels are layer ``l-1``'s output channels (each spanning
    ``in_group`` input features); the first layer's inputs are kept whole. Tensors in no layer
    are kept whole.

    Attributes
    ----------
    layers : tuple[WidthLayer, ...]
        The layers.

    Raises
    ------
    ConfigurationError
        If there is no layer, a layer name repeats or a tensor belongs to two layers.
    """

    layers: tuple[WidthLayer, ...]

    def __post_init__(self) -> None:
        layers = tuple(self.layers)
        object.__setattr__(self, "layers", layers)
        if not layers or not all(isinstance(layer, WidthLayer) for layer in layers):
            raise ConfigurationError("a width spec needs at least one WidthLayer")
        names = [layer.name for layer in layers]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"layer names must be unique, got {names}")
        tensors = [t for layer in layers for t in layer.tensors]
        if len(set(tensors)) != len(tensors):
            raise ConfigurationError("a tensor belongs to more than one layer")
        for layer in layers:
            _check_width(layer.in_group, f"{layer.name}: in_group")

    @classmethod
    def sequential(cls, arrays: Mapping[str, ArrayLike]) -> WidthSpec:
        """Infer the structure of a plain feed-forward model from its state dict's order.

        Every tensor with two or more axes starts a layer (its weight); each following 1-D
        floating tensor of the layer's output width is its bias (the first) or an extra
        (batch norm); other tensors (integer counters, scalars) are kept whole. A layer's
        ``in_group`` is its input width over the previous layer's output width. Every layer
        is scaled but the last. Works for MLPs and VGG-like CNNs (conv blocks, a flatten,
        linear layers), e.g. :class:`flwr_fsl.models.width.WidthMLP` / ``WidthCNN``.

        Parameters
        ----------
        arrays : Mapping[str, array_like]
            The global model (its tensors in forward order, as ``state_dict()`` lists them).

        Returns
        -------
        WidthSpec
            The layers.

        Raises
        ------
        ConfigurationError
            If there is no weight, a 1-D floating tensor does not match its layer's width, or
            an input width is not a multiple of the previous output width.
        """
        # Per layer: weight name, its shape, then its 1-D tensors (the first is the bias).
        drafts: list[tuple[str, tuple[int, ...], list[str]]] = []
        for name, value in arrays.items():
            shape = tuple(int(d) for d in np.shape(value))
            floating = np.issubdtype(np.asarray(value).dtype, np.floating)
            if len(shape) >= 2:
                drafts.append((name, shape, []))
                continue
            if len(shape) != 1 or not floating:
                continue  # integer counters, scalars: kept whole
            if not drafts:
                raise ConfigurationError(
                    f"{name!r} comes before any weight: not a sequential model"
                )
            weight, wshape, vectors = drafts[-1]
            if shape[0] != wshape[0]:
                raise ConfigurationError(
                    f"{name!r} has {shape[0]} entries, its layer {weight!r} {wshape[0]} "
                    "outputs: not a sequential model"
                )
            vectors.append(name)
        if not drafts:
            raise ConfigurationError("the model has no weight tensor (2 or more axes)")
        layers: list[WidthLayer] = []
        prev_out: int | None = None
        for i, (weight, shape, vectors) in enumerate(drafts):
            group = 1
            if prev_out is not None:
                if shape[1] % prev_out:
                    raise ConfigurationError(
                        f"{weight!r} has {shape[1]} inputs, not a multiple of the previous "
                        f"layer's {prev_out} outputs"
                    )
                group = shape[1] // prev_out
            layers.append(
                WidthLayer(
                    name=weight.removesuffix(".weight"),
                    weight=weight,
                    bias=vectors[0] if vectors else None,
                    extras=tuple(vectors[1:]),
                    scaled=i < len(drafts) - 1,
                    in_group=group,
                )
            )
            prev_out = shape[0]
        return cls(tuple(layers))

    @property
    def scaled_layers(self) -> tuple[WidthLayer, ...]:
        """The layers whose outputs are narrowed."""
        return tuple(layer for layer in self.layers if layer.scaled)

    def widths(self, arrays: Mapping[str, ArrayLike]) -> dict[str, int]:
        """Check the structure against a model; return each scaled layer's global width.

        Raises
        ------
        ConfigurationError
            If a tensor is missing, a weight has fewer than two axes, a bias or extra is not
            ``(out,)``, or a layer's input width is not ``in_group`` times the previous
            layer's output width.
        """
        out: dict[str, int] = {}
        prev: int | None = None
        for layer in self.layers:
            for t in layer.tensors:
                if t not in arrays:
                    raise ConfigurationError(f"layer {layer.name!r}: the model has no tensor {t!r}")
            shape = np.shape(arrays[layer.weight])
            if len(shape) < 2:
                raise ConfigurationError(
                    f"layer {layer.name!r}: weight {layer.weight!r} is {shape}"
                )
            for t in layer.tensors[1:]:
                if np.shape(arrays[t]) != (shape[0],):
                    raise ConfigurationError(
                        f"layer {layer.name!r}: {t!r} has shape {np.shape(arrays[t])}, "
                        f"expected ({shape[0]},)"
                    )
            if prev is not None and shape[1] != prev * layer.in_group:
                raise ConfigurationError(
                    f"layer {layer.name!r}: {shape[1]} inputs != {prev} channels of the previous "
                    f"layer x in_group {layer.in_group}"
                )
            if layer.scaled:
                out[layer.name] = int(shape[0])
            prev = int(shape[0])
        return out

    def slices(
        self, arrays: Mapping[str, ArrayLike], indices: Mapping[str, ArrayLike]
    ) -> dict[str, TensorSlice]:
        """Per tensor, the kept output / input channels of a client's width slice.

        Parameters
        ----------
        arrays : Mapping[str, array_like]
            The global model.
        indices : Mapping[str, array_like]
            Scaled layer name -> its kept output channels (any order; the narrow tensors
            follow it). Every scaled layer must be given, no other.

        Returns
        -------
        dict[str, TensorSlice]
            For :meth:`WidthLayout.of`.

        Raises
        ------
        ConfigurationError
            If the structure does not fit the model or the index sets name other layers.
        """
        self.widths(arrays)
        self._check_names(indices, ValueError)
        out: dict[str, TensorSlice] = {}
        prev: NDArray[np.int64] | None = None
        for layer in self.layers:
            in_idx = None
            if prev is not None:
                g = layer.in_group
                in_idx = (prev[:, None] * g + np.arange(g, dtype=np.int64)).reshape(-1)
            out_idx = None
            if layer.scaled:
                out_idx = np.asarray(indices[layer.name])
                if out_idx.ndim != 1 or not (
                    np.issubdtype(out_idx.dtype, np.integer) or out_idx.size == 0
                ):
                    raise ConfigurationError(
                        f"{layer.name}: kept channels must be a 1-D integer array"
                    )
                out_idx = out_idx.astype(np.int64)
            out[layer.weight] = TensorSlice(out_idx, in_idx)
            if out_idx is not None:
                for t in layer.tensors[1:]:
                    out[t] = TensorSlice(out_idx)
            prev = out_idx
        return out

    def _check_names(self, indices: Mapping[str, ArrayLike], error: type[ValueError]) -> None:
        scaled = [layer.name for layer in self.scaled_layers]
        if set(indices) != set(scaled):
            raise error(
                f"index sets must name exactly the scaled layers {scaled}, got {sorted(indices)}"
            )

    def layout(
        self,
        arrays: Mapping[str, NDArray[np.generic]],
        indices: Mapping[str, ArrayLike],
        *,
        from_client: bool = False,
    ) -> WidthLayout:
        """Build the :class:`WidthLayout` of a client's width slice (kept channels per layer).

        Parameters
        ----------
        arrays : Mapping[str, numpy.ndarray]
            The global model.
        indices : Mapping[str, array_like]
            Scaled layer name -> kept output channels (see :meth:`slices`).
        from_client : bool
            The index sets came from a client: a bad one raises
            :class:`~flwr_fsl.core.errors.ClientInputError`.

        Returns
        -------
        WidthLayout
            Its element space is the global model's flat space.

        Raises
        ------
        ValueError or ClientInputError
            If the structure does not fit the model or an index set is invalid.
        """
        error: type[ValueError] = ClientInputError if from_client else ValueError
        self._check_names(indices, error)
        for name in indices:
            idx = np.asarray(indices[name])
            if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
                raise error(f"{name}: kept channels must be a 1-D integer array")
        return WidthLayout.of(arrays, self.slices(arrays, indices), from_client=from_client)


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


# -- what a client is told -------------------------------------------------------------------

_MAGIC = register_magic(b"FSLW", "width assignment (flwr_fsl.families.width.rules)")
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
