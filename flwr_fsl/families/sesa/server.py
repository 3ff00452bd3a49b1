"""The SESA round without Flower: :class:`SesaRoundServer`, the client steps and :func:`run_round`.

One SESA round (Sami & Güler §IV) is four exchanges of the server with the sampled clients:

1. ``advertise`` (:class:`AdvertiseAsk`): the round's parameters and settings; each client
   picks its shards secretly (:func:`choose_shards`) and answers an X25519 public key;
2. ``offline`` (:class:`OfflineAsk`): the roster; each client answers its sealed selector and
   mask evaluations for every other client;
3. ``train`` (:class:`TrainAsk`): the whole global model and ``U2``; each client trains its
   narrow model and answers only its masked shard vectors (:func:`masked_shard_update`);
4. ``decode`` (:class:`DecodeAsk`): ``U3``, every masked update and the evaluations sealed to
   the client; each answers ``ψ(α_i)``. The server decodes the per-shard sums and applies
   ``w += Σ c·Δ / Σ c`` shard by shard (:meth:`SesaRoundServer.apply`).

The server never talks to a client itself: every message goes through an :data:`Exchange`,
``exchange(label, {node: ask}, accept) -> {node: reply}``, which delivers the asks of one phase,
calls ``accept(node, reply)`` on each reply (a :class:`~flwr_fsl.core.errors.ClientInputError`
it raises drops that node, as does a client's own error or silence) and returns the accepted
replies (each reply is the phase's one bytes value). The Flower strategy's exchange is
:meth:`~flwr_fsl.core.engine.PhasedStrategy.send_phase` over the typed phases of
:mod:`flwr_fsl.families.sesa.records`; :func:`run_round` hands the asks to :class:`SesaParty`
objects in this process. The client steps (:func:`choose_shards`, :func:`narrow_model`,
:func:`masked_shard_update`) are the ones ``sesa_mod`` runs.

Threat model and leakage: :mod:`flwr_fsl.families.sesa.strategy`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.core.exchange import Exchange, local_exchange
from flwr_fsl.crypto.fixedpoint import FixedPoint
from flwr_fsl.families.sesa.attribution import check_plausible, unopened
from flwr_fsl.families.sesa.layout import SesaLayout, check_selection, group_slots
from flwr_fsl.families.sesa.protocol import SesaClient, SesaParams, SesaServer, ShardVector
from flwr_fsl.families.sesa.settings import SesaSettings
from flwr_fsl.families.width.rules import select_shards
from flwr_fsl.submodel.layout import WidthLayout

__all__ = [
    "AdvertiseAsk",
    "DecodeAsk",
    "Exchange",
    "LazyAsks",
    "OfflineAsk",
    "SesaParty",
    "SesaResult",
    "SesaRoundServer",
    "TrainAsk",
    "check_mailbox",
    "choose_shards",
    "masked_shard_update",
    "narrow_model",
    "run_round",
]

log = logging.getLogger(__name__)

Model = dict[str, NDArray[Any]]


@dataclass(frozen=True)
class AdvertiseAsk:
    """``advertise``: the round's parameters and settings (with the layer structure)."""

    params: SesaParams
    settings: SesaSettings


@dataclass(frozen=True)
class OfflineAsk:
    """``offline``: the roster."""

    params: SesaParams
    roster: bytes


@dataclass(frozen=True)
class TrainAsk:
    """``train``: ``U2``, the settings, the whole global model and the client's mailbox."""

    params: SesaParams
    sharers: tuple[int, ...]
    settings: SesaSettings
    model: Mapping[str, NDArray[Any]]
    mailbox: bytes = b""


@dataclass(frozen=True)
class DecodeAsk:
    """``decode``: the client's evaluation request (``U3``, masked updates, its mailbox)."""

    params: SesaParams
    request: bytes


# -- the client steps (sesa_mod and SesaParty) -------------------------------------------------
def choose_shards(
    node: int,
    params: SesaParams,
    settings: SesaSettings,
    rate: float,
    rng: np.random.Generator | None = None,
) -> tuple[SesaClient, tuple[tuple[int, ...], ...]]:
    """Pick ``rate · S`` shards of every hidden layer; return the round's client and the picks.

    ``rng`` None draws from operating-system randomness (what ``sesa_mod`` does).

    Raises
    ------
    ClientInputError
        If the rate admits no choice or the settings do not fit the round's parameters.
    """
    s = settings.num_shards
    try:
        picks = [select_shards(int(w), s, rate, rng).shards for w in settings.widths]
    except ValueError as err:
        raise ClientInputError(f"no SESA shard choice for this node: {err}") from err
    selection = tuple(tuple(int(x) for x in p) for p in picks)
    layers = list(settings.layers)
    choice = check_selection(dict(zip(layers, selection, strict=True)), layers, s)
    slots = group_slots(list(settings.groups), s, choice)
    if len(slots) != len(params.groups):
        raise ClientInputError("the SESA record's groups do not match the round's parameters")
    try:
        client = SesaClient(int(node), params, slots)
    except ConfigurationError as err:
        raise ClientInputError(f"the SESA groups do not fit the round: {err}") from err
    return client, selection


def narrow_model(
    params: SesaParams,
    settings: SesaSettings,
    layers: Sequence[str],
    choice: Mapping[str, Sequence[int]],
    model: Mapping[str, NDArray[Any]],
) -> tuple[SesaLayout, WidthLayout]:
    """Return the global model's shard layout and the narrow model the chosen shards span.

    Raises
    ------
    ClientInputError
        If the model does not split into the round's shard groups or hidden layers.
    """
    try:
        layout = SesaLayout.of(dict(model), settings.num_shards)
    except ConfigurationError as err:
        raise ClientInputError(f"the global model does not split into SESA shards: {err}") from err
    if layout.descriptors != settings.groups or layout.sesa_groups() != tuple(params.groups):
        raise ClientInputError("the global model's shard groups differ from the round's")
    if tuple(layout.widths) != tuple(layers):
        raise ClientInputError("the global model's hidden layers differ from the advertised ones")
    return layout, layout.width_layout(dict(model), dict(choice))


def _codec(settings: SesaSettings, params: SesaParams) -> FixedPoint:
    try:
        return settings.codec(params.field)
    except ConfigurationError as err:
        raise ClientInputError(f"the SESA fixed point settings are invalid: {err}") from err


def masked_shard_update(  # noqa: PLR0913
    client: SesaClient,
    params: SesaParams,
    settings: SesaSettings,
    sharers: Sequence[int],
    layout: SesaLayout,
    choice: Mapping[str, Sequence[int]],
    model: Mapping[str, NDArray[Any]],
    trained: Mapping[str, NDArray[Any]],
    weight: object,
    complaint: Sequence[int] = (),
) -> bytes:
    """Encode ``trained - model`` of the chosen shards as ``(c·Δ, c)`` in ``F_p``, masked.

    ``weight`` is the reply's ``weight_key`` metric (ignored unless ``settings.weighted``);
    ``complaint`` the senders whose sealed evaluations did not open (:func:`check_mailbox`).

    Raises
    ------
    ClientInputError
        If the weight is not a number in ``(0, max_weight]`` or the update does not encode.
    """
    codec = _codec(settings, params)
    c = 1.0
    if settings.weighted:
        key = settings.weight_key
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ClientInputError(f"the train reply lacks a numeric {key!r}")
        if not (np.isfinite(weight) and 0 < weight <= settings.max_weight):
            raise ClientInputError(f"{key!r} must be in (0, max-weight]")
        c = float(weight) / settings.max_weight
    deltas, clipped = [], 0
    for d in layout.shard_deltas(dict(model), dict(trained), dict(choice)):
        clipped += int(np.count_nonzero(np.abs(d) > settings.clip))
        deltas.append(np.clip(d, -settings.clip, settings.clip))
    if clipped:
        log.warning("sesa_mod: %d update coordinates clipped to the clipping range", clipped)
    updates = [
        ShardVector(g.length, codec).encode(d, c)
        for g, d in zip(layout.groups, deltas, strict=True)
    ]
    return client.masked_update(sharers, updates, complaint)


def check_mailbox(client: SesaClient, sharers: Sequence[int], mailbox: bytes) -> tuple[int, ...]:
    """Open the pieces relayed with ``train``; return the complaint (empty mailbox: none).

    Raises
    ------
    ClientInputError
        If the mailbox itself is malformed (the server's message).
    """
    if not mailbox:
        return ()
    return unopened(client.node, client.key, client.params, sharers, mailbox)


# -- the server ----------------------------------------------------------------------------------
class LazyAsks(Mapping[int, Any]):
    """Node -> ask, each built by ``make(node)`` when it is looked up (and not kept).

    The relays of a round (a client's mailbox, its evaluation request) are ``O(N K d)`` words
    per client; building them lazily lets an exchange send them in batches, so no more than a
    batch of them is in memory at once instead of ``O(N² K d)``. Each lookup builds a new
    object: hold the asks of a batch while they are encoded (the engine's ``encode_once``
    shares requests by object identity).

    Parameters
    ----------
    nodes : Sequence[int]
        The nodes, in order.
    make : Callable[[int], Any]
        Node -> its ask.
    """

    def __init__(self, nodes: Sequence[int], make: Callable[[int], Any]) -> None:
        self._nodes = tuple(nodes)
        self._members = frozenset(self._nodes)
        self._make = make

    def __getitem__(self, node: int) -> Any:
        if node not in self._members:
            raise KeyError(node)
        return self._make(node)

    def __contains__(self, node: object) -> bool:
        return node in self._members

    def __iter__(self) -> Iterator[int]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)


@dataclass(frozen=True)
class SesaResult:
    """One round's outcome.

    Attributes
    ----------
    model : dict[str, numpy.ndarray]
        The new model.
    params : SesaParams
        The round's parameters.
    clients : tuple[int, ...]
        The survivors whose updates the aggregate holds.
    evaluators : tuple[int, ...]
        The clients whose evaluations decoded it.
    """

    model: Model
    params: SesaParams
    clients: tuple[int, ...]
    evaluators: tuple[int, ...]


@dataclass
class SesaRoundServer:
    """The server side of SESA rounds (module docstring), over an :data:`Exchange`.

    Parameters
    ----------
    settings : SesaSettings
        The validated settings (the layer structure is filled in per round from the model).
    session : bytes
        Binds the rounds' parameters to this run (fresh random by default).
    """

    settings: SesaSettings
    session: bytes = field(default_factory=lambda: os.urandom(16))

    def params(self, layout: SesaLayout, nodes: int, server_round: int, t: int) -> SesaParams:
        """Return a round's parameters.

        Raises
        ------
        RoundFailedError
            If more than ``max_clients`` or fewer than ``K_max + T`` clients were sampled.
        """
        if nodes > self.settings.max_clients:
            raise RoundFailedError(
                f"{nodes} clients sampled, max_clients is {self.settings.max_clients}"
            )
        params = SesaParams(server_round, self.session, t, layout.sesa_groups())
        if nodes < params.threshold:
            raise RoundFailedError(
                f"{nodes} clients sampled, fewer than K_max + T = {params.threshold}"
            )
        return params

    def round_settings(self, layout: SesaLayout) -> SesaSettings:
        """Return the settings with the model's layer structure."""
        return replace(
            self.settings,
            layers=tuple(layout.widths),
            widths=tuple(layout.widths.values()),
            groups=layout.descriptors,
        )

    def aggregate(
        self,
        exchange: Exchange,
        model: Mapping[str, NDArray[Any]],
        nodes: Sequence[int],
        params: SesaParams,
        layout: SesaLayout,
        drop: Callable[[int, str], None] | None = None,
    ) -> tuple[list[NDArray[np.uint64]], SesaServer]:
        """Run the four exchanges; return the per-group sums in ``F_p`` and the protocol server.

        After each exchange only the nodes it returned (the engine's survivors) go on: a node
        dropped at any phase is never asked again and never aggregated. Clients the complaints
        exclude (:mod:`~flwr_fsl.families.sesa.attribution`) are reported to ``drop``.

        Raises
        ------
        RoundFailedError
            If too few clients are left at a phase, the evaluations are inconsistent or the
            decoded sums lie outside their bounds.
        """
        settings = self.round_settings(layout)
        server = SesaServer(params)
        advertise = AdvertiseAsk(params, settings)
        answered = exchange("advertise", dict.fromkeys(nodes, advertise), server.add_advertisement)
        offline = OfflineAsk(params, server.roster())
        members = [n for n in nodes if n in answered]
        server.keep(exchange("offline", dict.fromkeys(members, offline), server.add_bundle))
        sharers = server.sharers()
        # The train and decode asks carry each client's mailbox (O(N K d) words each): they
        # are built when the exchange reaches their node, never all at once (O(N² K d)).
        asks: Mapping[int, Any] = LazyAsks(
            sharers, lambda n: TrainAsk(params, sharers, settings, model, server.mailbox(n))
        )
        server.keep(exchange("train", asks, server.add_masked))
        for node, reason in server.settle().items():
            log.warning("SESA round %d: client %d excluded: %s", params.round_id, node, reason)
            if drop is not None:
                drop(node, f"train: {reason}")
        asks = LazyAsks(server.survivors, lambda n: DecodeAsk(params, server.evaluation_request(n)))
        server.keep(exchange("decode", asks, server.add_evaluation))
        del asks
        totals = server.result()
        for node, reason in server.rejected.items():
            log.warning("SESA round %d: client %d excluded: %s", params.round_id, node, reason)
            if drop is not None:
                drop(node, reason)
        check_plausible(
            params.groups, totals, _codec(settings, params), server.contributors(),
            settings.clip, weighted=settings.weighted,
        )  # fmt: skip
        return totals, server

    def apply(
        self,
        model: Mapping[str, NDArray[Any]],
        layout: SesaLayout,
        totals: Sequence[NDArray[np.uint64]],
        codec: FixedPoint | None = None,
    ) -> Model:
        """Decode the per-shard sums and apply ``w += Σ c·Δ / Σ c`` shard by shard.

        ``codec`` defaults to the settings' fixed point (the strategy passes its own).
        """
        codec = codec if codec is not None else self.settings.codec()
        sums, weights = [], []
        for group, total in zip(layout.groups, totals, strict=True):
            values = codec.decode(total)
            weight = values[:, group.length]
            weight[weight < 0.5 / codec.scale] = 0.0
            sums.append(values[:, : group.length])
            weights.append(weight)
        return layout.apply(dict(model), sums, weights)

    def run(
        self,
        exchange: Exchange,
        model: Mapping[str, NDArray[Any]],
        nodes: Sequence[int],
        server_round: int,
        t: int,
        layout: SesaLayout | None = None,
        drop: Callable[[int, str], None] | None = None,
    ) -> SesaResult:
        """One round: parameters, the four exchanges, decode and apply.

        Raises
        ------
        RoundFailedError
            If too few clients are left at any phase, or the evaluations are inconsistent;
            the model is then unchanged.
        ConfigurationError
            If the model does not split into shards (``layout`` None).
        """
        layout = (
            layout if layout is not None else SesaLayout.of(dict(model), self.settings.num_shards)
        )
        params = self.params(layout, len(nodes), server_round, t)
        totals, server = self.aggregate(exchange, model, nodes, params, layout, drop)
        new = self.apply(model, layout, totals)
        return SesaResult(new, params, server.survivors, server.evaluators)


# -- the in-process clients and driver ---------------------------------------------------------
TrainFn = Callable[[Model], tuple[Model, float]]
"""``train(narrow model) -> (trained narrow model, weight)``."""


@dataclass
class SesaParty:
    """An in-process SESA client: what ``sesa_mod`` does, without Flower.

    Parameters
    ----------
    node : int
        Its id.
    rate : float
        Its capacity.
    train : Callable
        ``train(narrow) -> (trained, weight)`` on the narrow model its shards span.
    rng : numpy.random.Generator, optional
        Its shard choices' randomness (default: operating-system randomness, as the mod).
    """

    node: int
    rate: float
    train: TrainFn
    rng: np.random.Generator | None = None
    client: SesaClient | None = None
    layers: tuple[str, ...] = ()
    selection: tuple[tuple[int, ...], ...] = ()

    @property
    def choice(self) -> dict[str, tuple[int, ...]]:
        """Hidden layer -> its chosen shards (secret)."""
        return dict(zip(self.layers, self.selection, strict=True))

    def _client(self, params: SesaParams) -> SesaClient:
        if self.client is None or self.client.params != params:
            raise ClientInputError("no SESA state for this round (its advertisement was lost)")
        return self.client

    def answer(self, label: str, ask: Any) -> bytes:
        """Answer one ask (module docstring)."""
        if isinstance(ask, AdvertiseAsk):
            self.client, self.selection = choose_shards(
                self.node, ask.params, ask.settings, self.rate, self.rng
            )
            self.layers = ask.settings.layers
            return self.client.advertise()
        if isinstance(ask, OfflineAsk):
            return self._client(ask.params).offline(ask.roster)
        if isinstance(ask, TrainAsk):
            client = self._client(ask.params)
            layout, narrow = narrow_model(
                ask.params, ask.settings, self.layers, self.choice, ask.model
            )
            sub = narrow.extract(dict(ask.model))
            complaint = check_mailbox(client, ask.sharers, ask.mailbox)
            trained, weight = self.train({k: np.array(v) for k, v in sub.items()})
            if {k: np.shape(v) for k, v in trained.items()} != {k: v.shape for k, v in sub.items()}:
                raise ClientInputError(
                    f"the train reply does not match the narrow model at rate {self.rate}"
                )
            return masked_shard_update(
                client, ask.params, ask.settings, ask.sharers, layout, self.choice, ask.model,
                trained, weight, complaint,
            )  # fmt: skip
        if isinstance(ask, DecodeAsk):
            return self._client(ask.params).evaluate(ask.request)
        raise ClientInputError(f"unknown SESA ask {label!r}")


def run_round(
    model: Mapping[str, NDArray[Any]],
    parties: Mapping[int, SesaParty],
    settings: SesaSettings,
    *,
    server_round: int = 1,
    privacy: int | None = None,
    session: bytes | None = None,
    dropped: dict[int, str] | None = None,
    tamper: Callable[[str, int, bytes], bytes] | None = None,
) -> SesaResult:
    """Drive one SESA round in this process: the same exchanges as :class:`SesaFedAvg`.

    Parameters
    ----------
    model : Mapping[str, numpy.ndarray]
        The global model (every hidden width a multiple of ``settings.num_shards``).
    parties : Mapping[int, SesaParty]
        The round's clients.
    settings : SesaSettings
        The round's settings (the layer structure is filled in from the model).
    server_round : int
        The round number (binds the parameters).
    privacy : int, optional
        ``T`` (default ``max(1, n // 2)``, the strategy's default ``privacy=0.5``).
    session : bytes, optional
        The run's session (default fresh random).
    dropped : dict, optional
        Filled with node -> reason for every client dropped (as the strategy logs it).
    tamper : Callable[[str, int, bytes], bytes], optional
        ``tamper(label, node, reply) -> reply``: a test's hook on every reply (a deviating
        client); it may raise :class:`~flwr_fsl.core.errors.ClientInputError` to go silent.

    Returns
    -------
    SesaResult
        The new model and who took part.

    Raises
    ------
    RoundFailedError
        As :meth:`SesaRoundServer.run`.
    """
    drops = dropped if dropped is not None else {}

    exchange = local_exchange(parties, drops, tamper)
    nodes = list(parties)
    t = privacy if privacy is not None else max(1, len(nodes) // 2)
    server = SesaRoundServer(settings) if session is None else SesaRoundServer(settings, session)
    return server.run(exchange, model, nodes, server_round, t, drop=drops.__setitem__)
