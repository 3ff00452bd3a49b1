"""The server's side of PrivHFL's secure answering, Flower-free, and an in-process round driver.

:class:`PrivHFLServer` is the third computing party ``S`` of
:mod:`flwr_fsl.families.privhfl.protocol` for one run: per round it relays the answerers' keys
and architectures, draws ``Sk_SQ`` and ``Sk_SA``, holds its half of every querier-answerer
session (:class:`~flwr_fsl.families.privhfl.flow.ServerSession`), drives the steps (and, the
paper's DReLU, the ``sign`` exchanges with the queriers) and runs Π_Agg per querier. It talks
to the clients through an :class:`Exchange`: one call per phase (``"keys"``, ``"generate"``,
``"step-k"``, ``"sign-k"``) with the request bytes per node
(:mod:`flwr_fsl.families.privhfl.messages`), returning the parsed replies of the nodes that
answered well; a node whose reply is refused is dropped by the transport, and ``S`` drops the
nodes whose protocol words fail (``drop(node, reason)``). The Flower strategy
(:class:`~flwr_fsl.families.privhfl.strategy.PrivHFL`) implements the exchange with its grid;
:func:`run_secure_query` with direct calls to the client handlers of
:mod:`flwr_fsl.families.privhfl.client`, so a secure round runs without Flower.

**What each party learns** (as in :mod:`flwr_fsl.families.privhfl.strategy`): the server sees
the architectures, the batch sizes, who answers whom, and protocol words each masked by
randomness it does not hold (no query image, no logit, no soft label). The answerers see
masked words only; the querier learns only the sum of its answerers' logits (and, with the
paper's DReLU, ``r x`` for every hidden activation of every answerer's model on its queries).
``Sk_SQ`` and ``Sk_SA`` are drawn by the server and sent on each client's link; the public keys
are relayed unauthenticated (honest-but-curious server).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.crypto.prg import SEED_BYTES
from flwr_fsl.families.privhfl.client import QueryFailedError, SecureAnswerer, SecureQuerier
from flwr_fsl.families.privhfl.flow import (
    ServerSession,
    architecture_from_bytes,
    schedule,
    unheld_seed,
)
from flwr_fsl.families.privhfl.inference import Architecture, SecureModel
from flwr_fsl.families.privhfl.messages import (
    AnswererInfo,
    GenerateReply,
    GenerateRequest,
    KeysReply,
    KeysRequest,
    RetrainRequest,
    SessionDeal,
    SignReply,
    SignRequest,
    StepEntry,
    StepReply,
    StepRequest,
)
from flwr_fsl.families.privhfl.protocol import (
    PrivHFLConfig,
    QuerierMessageError,
    SessionSeeds,
    agg_step,
    server_aggregate,
)
from flwr_fsl.families.privhfl.queries import softmax

__all__ = [
    "Exchange",
    "PrivHFLServer",
    "SecureQueryResult",
    "failed_query_reason",
    "run_secure_query",
]

T = TypeVar("T")


def failed_query_reason(querier: int, answerers: Sequence[int], why: str) -> str:
    """Return why a secure query failed, naming the querier and every answerer in its sum.

    Π_Agg opens only the sum of the answerers' logits, so an out-of-range sum cannot be
    pinned on one answerer (nor, by the server, told from a querier that lies about it): the
    query fails, nobody is dropped, and the querier re-trains on its private data only.
    """
    return (
        f"the query of client {querier} failed ({why}): one of its answerers {list(answerers)} "
        f"or client {querier} itself deviated (the sum cannot tell which); nobody is dropped"
    )


class Exchange(Protocol):
    """One phase's round trip: ``exchange(phase, {node: request}, parse) -> {node: parsed}``.

    ``parse(node, reply)`` raises :class:`~flwr_fsl.core.errors.ClientInputError` for a reply
    that is refused; the transport then drops the node with ``"<phase>: <reason>"`` (as it does
    a node that fails or does not reply) and leaves it out of the result.
    """

    def __call__(
        self, phase: str, requests: Mapping[int, bytes], parse: Callable[[int, bytes], T], /
    ) -> dict[int, T]:
        """Send ``requests`` as ``phase``; return the accepted replies, parsed."""
        ...


class PrivHFLServer:
    """``S`` of secure answering for one run (module docstring).

    Parameters
    ----------
    config : PrivHFLConfig
        The protocol's settings (the comparison, fixed-point bits).
    num_classes : int
        Width of the logits (an answerer's architecture must output it).
    image_shape : tuple[int, ...]
        Shape of one query image (an answerer's architecture must take it).
    max_batch : int
        Most queries a querier may share per round.
    run_session : bytes, optional
        The run's 16-byte session id (bound into every sealing; default: random).

    Attributes
    ----------
    sessions : dict[tuple[int, int], tuple[ServerSession, SessionDeal]]
        ``(querier, answerer)`` -> ``S``'s half of that session and the querier's deal, for
        the round being (or last) run.
    """

    def __init__(
        self,
        config: PrivHFLConfig,
        *,
        num_classes: int,
        image_shape: tuple[int, ...],
        max_batch: int,
        run_session: bytes | None = None,
    ) -> None:
        self.config = config
        self.num_classes = num_classes
        self.image_shape = tuple(image_shape)
        self.max_batch = max_batch
        self.run_session = os.urandom(16) if run_session is None else run_session
        self.sessions: dict[tuple[int, int], tuple[ServerSession, SessionDeal]] = {}

    def query(  # noqa: C901, PLR0915
        self,
        server_round: int,
        plan: Mapping[int, Sequence[int]],
        exchange: Exchange,
        drop: Callable[[int, str], None],
        dropped: Container[int],
    ) -> dict[int, tuple[bytes | None, int]]:
        """Answer every querier's queries securely; per querier, Π_Agg's ``agg-S`` message.

        Parameters
        ----------
        server_round : int
            The round (its low 32 bits are the session number).
        plan : Mapping[int, Sequence[int]]
            Querier -> its answerers, in the order the queriers are asked.
        exchange : Exchange
            The transport.
        drop : Callable[[int, str], None]
            Removes a node from the round with a reason (the first reason is kept).
        dropped : Container[int]
            The nodes out of the round so far, kept current by ``drop`` and ``exchange``.

        Returns
        -------
        dict[int, tuple[bytes | None, int]]
            For each querier that generated and is still in the round: the
            :class:`~flwr_fsl.families.privhfl.messages.RetrainRequest` bytes and the number
            of answerers in its sum (``(None, 0)``: no answer).
        """
        cfg = self.config
        session = server_round & 0xFFFFFFFF
        run_session = self.run_session
        involved = sorted({a for answer in plan.values() for a in answer})
        self.sessions = {}
        # 1. keys: every answerer advertises a fresh X25519 key and its architecture.
        keys_req = KeysRequest(run_session).to_bytes()

        def parse_keys(_n: int, blob: bytes) -> tuple[bytes, bytes, Architecture]:
            reply = KeysReply.from_bytes(blob)
            arch = architecture_from_bytes(reply.architecture)
            if arch.input_shape != self.image_shape or arch.num_outputs != self.num_classes:
                raise ClientInputError("the advertised architecture does not fit the queries")
            try:
                steps = schedule(arch, 1)  # it must have an interactive op ...
            except ConfigurationError as err:
                raise ClientInputError(f"the advertised architecture: {err}") from err
            if (
                cfg.comparison == "drelu" and steps[1].kind == "compare"
            ):  # ... and a linear one first
                raise ClientInputError("DReLU needs a linear layer before the first comparison")
            return reply.public_key, reply.architecture, arch

        keys = exchange("keys", dict.fromkeys(involved, keys_req), parse_keys)
        # 2. generate: each querier gets its answerers' keys, architectures and Sk_SQ.
        sq: dict[tuple[int, int], bytes] = {}
        requests: dict[int, bytes] = {}
        asked: dict[int, tuple[AnswererInfo, ...]] = {}
        for q in plan:
            answerers = [a for a in plan[q] if a in keys]
            if q in dropped or not answerers:
                continue
            infos = []
            for a in answerers:
                sq[q, a] = os.urandom(SEED_BYTES)
                infos.append(AnswererInfo(a, keys[a][0], keys[a][1], sq[q, a]))
            asked[q] = tuple(infos)
            requests[q] = GenerateRequest(cfg, session, run_session, asked[q]).to_bytes()

        def parse_generate(q: int, blob: bytes) -> GenerateReply:
            reply = GenerateReply.from_bytes(blob)
            wanted = {a.node for a in asked[q]}
            if {s.node for s in reply.sessions} != wanted or reply.batch > self.max_batch:
                raise ClientInputError("the generate reply names other answerers or too many")
            for s in reply.sessions:
                if len(s.messages) != len(schedule(keys[s.node][2], reply.batch)):
                    raise ClientInputError("the generate reply has the wrong number of deals")
            return reply

        generated = exchange("generate", requests, parse_generate)
        # 3. the server's half of every session; step 0 takes the querier's share.
        sessions = self.sessions
        sa: dict[tuple[int, int], bytes] = {}
        for q, reply in generated.items():
            for deal in reply.sessions:
                a = deal.node
                sa[q, a] = os.urandom(SEED_BYTES)
                seeds = SessionSeeds(unheld_seed(sa[q, a], sq[q, a]), sa[q, a], sq[q, a])
                try:
                    run = ServerSession(cfg, keys[a][2], reply.batch, seeds, session, deal.messages)
                except ClientInputError as err:
                    drop(q, f"generate: querier message: {err}")
                    break
                sessions[q, a] = (run, deal)
        # 4. the steps: one message per answerer and step, every session of it at once (and,
        #    paper's DReLU, one message per querier and comparison step before it).
        k = 1
        while True:
            active = {
                key: v
                for key, v in sessions.items()
                if key[0] not in dropped and key[1] not in dropped and k < len(v[0].steps)
            }
            if not active:
                break
            signs = self._signs(k, session, active, exchange, drop, dropped)
            payloads: dict[int, list[StepEntry]] = {}
            for (q, a), (run, deal) in sorted(active.items()):
                if q in dropped or a in dropped:
                    continue
                try:
                    data = run.to_answerer(k, signs.get((q, a)))
                except ClientInputError as err:  # Q's deal (or sign share) for this step
                    drop(q, f"step {k}: querier message: {err}")
                    continue
                entry = (
                    StepEntry(q, data, deal.sealed_seed, sa[q, a], run.batch)
                    if k == 1
                    else StepEntry(q, data)
                )
                payloads.setdefault(a, []).append(entry)
            steps: dict[int, bytes] = {}
            sent: dict[int, set[int]] = {}
            for a, entries in payloads.items():
                entries = [e for e in entries if e.querier not in dropped]
                if not entries or a in dropped:
                    continue
                sent[a] = {e.querier for e in entries}
                steps[a] = StepRequest(cfg, k, session, run_session, tuple(entries)).to_bytes()

            def parse_step(
                a: int, blob: bytes, k: int = k, active: dict = active,
                sent: dict[int, set[int]] = sent,
            ) -> int:  # fmt: skip
                reply = StepReply.from_bytes(blob)
                if {q for q, _ in reply.entries} != sent[a]:
                    raise ClientInputError("the step reply names other sessions")
                for q, data in reply.entries:
                    active[q, a][0].from_answerer(k, data)
                return len(reply.entries)

            exchange(f"step-{k}", steps, parse_step)
            k += 1
        parts = {
            key: run.part
            for key, (run, _) in sessions.items()
            if run.part is not None and key[1] not in dropped
        }
        # 5. Π_Agg: per querier, the masked sum over the answerers whose sessions finished.
        sums: dict[int, tuple[bytes | None, int]] = {}
        for q in generated:
            if q in dropped:
                continue
            mine = {a: v for (p, a), v in parts.items() if p == q}
            if not mine:
                sums[q] = (None, 0)
                continue
            agg = server_aggregate(mine, agg_step(session))
            sums[q] = (RetrainRequest(cfg, session, agg).to_bytes(), len(mine))
        return sums

    def _signs(  # noqa: C901
        self,
        k: int,
        session: int,
        active: dict[tuple[int, int], tuple[ServerSession, SessionDeal]],
        exchange: Exchange,
        drop: Callable[[int, str], None],
        dropped: Container[int],
    ) -> dict[tuple[int, int], bytes]:
        """Paper's DReLU: ``S -> Q`` ``drelu-z`` of step ``k``, ``Q -> S`` the sign shares."""
        asks: dict[int, list[tuple[int, bytes]]] = {}
        for (q, a), (run, _) in sorted(active.items()):
            if not run.needs_querier(k):
                continue
            try:
                data = run.to_querier(k)
            except QuerierMessageError as err:
                drop(q, f"step {k}: querier message: {err}")
                continue
            except ClientInputError as err:  # the answerer's openings of step k - 1
                drop(a, f"step {k - 1}: answerer message: {err}")
                continue
            asks.setdefault(q, []).append((a, data))
        requests: dict[int, bytes] = {}
        for q, entries in asks.items():
            entries = [(a, d) for a, d in entries if a not in dropped]
            if q in dropped or not entries:
                continue
            requests[q] = SignRequest(self.config, k, session, tuple(entries)).to_bytes()
            asks[q] = entries
        signs: dict[tuple[int, int], bytes] = {}

        def parse_sign(q: int, blob: bytes) -> int:
            reply = SignReply.from_bytes(blob)
            if {a for a, _ in reply.entries} != {a for a, _ in asks[q]}:
                raise ClientInputError("the sign reply names other sessions")
            for a, data in reply.entries:
                signs[q, a] = data
            return len(reply.entries)

        if requests:
            exchange(f"sign-{k}", requests, parse_sign)
        return signs


# ------------------------------------------------------------------- the in-process round


@dataclass
class SecureQueryResult:
    """What :func:`run_secure_query` returns.

    Attributes
    ----------
    soft_labels : dict[int, numpy.ndarray]
        Querier -> ``softmax(logit sum / temperature)`` as it opened it (queriers with at
        least one answer).
    logits : dict[int, numpy.ndarray]
        Querier -> the opened sum of its answerers' logits.
    answerers : dict[int, int]
        Querier -> how many answerers are in its sum (0: no answer; it is not in the others).
    dropped : dict[int, str]
        Node -> why it left the round (the first reason), as the Flower strategy records it.
    failed_queries : dict[int, str]
        Querier -> why its query failed (its opened sum out of range: one of its answerers
        deviated, which the sum cannot tell); the querier stays in the round.
    phases : list[str]
        The phases exchanged, in order (``keys``, ``generate``, ``step-k``, ``sign-k``,
        ``retrain``).
    """

    soft_labels: dict[int, NDArray[np.float64]] = field(default_factory=dict)
    logits: dict[int, NDArray[np.float64]] = field(default_factory=dict)
    answerers: dict[int, int] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    failed_queries: dict[int, str] = field(default_factory=dict)
    phases: list[str] = field(default_factory=list)


def run_secure_query(  # noqa: C901, PLR0915
    config: PrivHFLConfig,
    models: Mapping[int, SecureModel | SecureAnswerer],
    queries: Mapping[int, NDArray[Any]],
    plan: Mapping[int, Sequence[int]] | None = None,
    *,
    server_round: int = 1,
    temperature: float = 1.0,
    max_abs_logit: float = 1e6,
    relay: Callable[[str, int, bytes], bytes] | None = None,
) -> SecureQueryResult:
    """Run one round of secure answering in one process: the server and the clients' handlers.

    The same :class:`PrivHFLServer` as the Flower strategy, with an :class:`Exchange` that
    calls each node's handler (:class:`~flwr_fsl.families.privhfl.client.SecureAnswerer`,
    :class:`~flwr_fsl.families.privhfl.client.SecureQuerier`) directly; a handler raising
    :class:`~flwr_fsl.core.errors.ClientInputError` drops its node with
    ``"<phase>: client error: ClientInputError: <reason>"``, and a reply the server refuses
    with ``"<phase>: <reason>"``, as on Flower. Then each querier opens its sum (the
    ``retrain`` phase without the re-training).

    Parameters
    ----------
    config : PrivHFLConfig
        The protocol's settings.
    models : Mapping[int, SecureModel | SecureAnswerer]
        Answerer node -> its model (:func:`~flwr_fsl.families.privhfl.inference.from_torch`)
        or its handler.
    queries : Mapping[int, numpy.ndarray]
        Querier node -> its queries (``batch x image_shape``; a node may also answer).
    plan : Mapping[int, Sequence[int]], optional
        Querier -> its answerers (default: every node of ``models`` but itself).
    server_round : int
        The round number.
    temperature : float
        Soft labels are ``softmax(sum / temperature)``.
    max_abs_logit : float
        Largest ``|logit sum|`` a querier accepts.
    relay : Callable[[str, int, bytes], bytes], optional
        Every reply passes through ``relay(phase, node, reply)`` (a stand-in for the network,
        e.g. to corrupt one).

    Returns
    -------
    SecureQueryResult
        Per querier the soft labels, logit sums and answerer counts; the drops.
    """
    if not queries:
        raise ConfigurationError("run_secure_query needs at least one querier")
    shapes = {tuple(np.shape(x)[1:]) for x in queries.values()}
    if len(shapes) != 1:
        raise ConfigurationError("every querier's queries must have one image shape")
    image_shape = shapes.pop()
    answerers = {
        n: m if isinstance(m, SecureAnswerer) else SecureAnswerer(n, m) for n, m in models.items()
    }
    outputs = {a.model.architecture.num_outputs for a in answerers.values()}
    if len(outputs) != 1:
        raise ConfigurationError("every answerer's model must have one number of outputs")
    num_classes = outputs.pop()
    if plan is None:
        plan = {q: sorted(n for n in answerers if n != q) for q in queries}
    queriers = {
        q: SecureQuerier(
            q, num_classes=num_classes, image_shape=image_shape, max_abs_logit=max_abs_logit
        )
        for q in queries
    }
    result = SecureQueryResult()
    dropped = result.dropped

    def drop(node: int, reason: str) -> None:
        dropped.setdefault(node, reason)

    def handle(phase: str, node: int, request: bytes) -> bytes:
        kind = phase.split("-")[0]
        if kind == "keys":
            return answerers[node].on_keys(server_round, request)
        if kind == "step":
            return answerers[node].on_step(server_round, request)
        if kind == "generate":
            x = np.asarray(queries[node], dtype=np.float32)
            return queriers[node].on_generate(server_round, request, x)
        return queriers[node].on_sign(server_round, request)

    def exchange(
        phase: str, requests: Mapping[int, bytes], parse: Callable[[int, bytes], T], /
    ) -> dict[int, T]:
        result.phases.append(phase)
        out: dict[int, T] = {}
        for node, request in requests.items():
            try:
                blob = handle(phase, node, request)
            except ClientInputError as err:  # the error reply of a Flower client
                drop(node, f"{phase}: client error: {type(err).__name__}: {err}")
                continue
            if relay is not None:
                blob = relay(phase, node, blob)
            try:
                out[node] = parse(node, blob)
            except ClientInputError as err:
                drop(node, f"{phase}: {str(err) or type(err).__name__}")
        return out

    server = PrivHFLServer(
        config,
        num_classes=num_classes,
        image_shape=image_shape,
        max_batch=max(len(x) for x in queries.values()),
    )
    sums = server.query(server_round, plan, exchange, drop, dropped)
    result.phases.append("retrain")
    for q, (request, count) in sums.items():
        result.answerers[q] = count
        if request is None or count == 0:
            continue
        try:
            logits = queriers[q].on_retrain(server_round, request, count)
        except QueryFailedError as err:
            suspects = [a for a in plan[q] if a not in dropped]
            result.failed_queries[q] = failed_query_reason(q, suspects, str(err))
            continue
        except ClientInputError as err:
            drop(q, f"retrain: client error: {type(err).__name__}: {err}")
            continue
        result.logits[q] = logits
        result.soft_labels[q] = softmax(logits, temperature)
    return result
