"""A PrivHFL client's side of secure answering, Flower-free: the querier and the answerer.

The byte messages are those of :mod:`flwr_fsl.families.privhfl.messages`; the server side is
:class:`~flwr_fsl.families.privhfl.server.PrivHFLServer`. Each handler takes the request bytes
and returns the reply bytes; between messages a party's state is kept in the existing byte
codecs (:class:`~flwr_fsl.families.privhfl.messages.QuerierState`, one
:class:`~flwr_fsl.families.privhfl.flow.AnswererState` per querier, the round's X25519 private
key), as attributes a transport may store and restore between messages:
:class:`~flwr_fsl.families.privhfl.mod.PrivHFLClient` keeps them in ``Context.state``;
:func:`~flwr_fsl.families.privhfl.server.run_secure_query` keeps the objects in memory.

* :class:`SecureAnswerer` — ``keys`` (a fresh X25519 key pair; the public key and the model's
  public architecture) and ``step`` (its half of one interactive op of every session it
  answers; step 1 opens the sealed ``Sk_QA``);
* :class:`SecureQuerier` — ``generate`` (its queries, secret-shared, and every deal of each
  session; ``Sk_QA`` sealed to each answerer), ``sign`` (paper's DReLU: its sign shares) and
  ``retrain`` (opens the sum of its answerers' logits from the server's ``agg-S``).

**What each party learns** (the threat model of
:mod:`flwr_fsl.families.privhfl.strategy`): the answerer sees masked words only (its own model
in the clear); the querier learns only the sum of its answerers' logits and, with the paper's
DReLU, ``r x`` for every hidden activation of every answerer's model on its queries. The
server sees the architectures, the batch sizes, who answers whom, and protocol words each
masked by randomness it does not hold.

Malformed input raises :class:`~flwr_fsl.core.errors.ClientInputError` (texts name the check,
never a value): a transport turns it into an error reply and the server drops this node.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.crypto.channel import SealingKeyPair, client_party
from flwr_fsl.crypto.sealing import open_from, seal_for
from flwr_fsl.families.privhfl.flow import (
    AnswererState,
    QuerierDeals,
    answerer_open,
    answerer_step,
    architecture_from_bytes,
    architecture_to_bytes,
    querier_session,
    querier_sign,
    schedule,
    unheld_seed,
)
from flwr_fsl.families.privhfl.inference import SecureModel, to_nhwc
from flwr_fsl.families.privhfl.messages import (
    SEED_PURPOSE,
    GenerateRequest,
    KeysReply,
    KeysRequest,
    QuerierSessionState,
    QuerierState,
    RetrainRequest,
    SignReply,
    SignRequest,
    StepReply,
    StepRequest,
    binding,
    encode_generate_reply,
)
from flwr_fsl.families.privhfl.protocol import Querier, ServerMessageError, SessionSeeds, agg_step

__all__ = ["QueryFailedError", "SecureAnswerer", "SecureQuerier"]


class QueryFailedError(ClientInputError):
    """The opened logit sum is out of range: the query failed, not through the querier.

    The sum mixes every answerer's session, so the querier cannot tell which answerer (or the
    relay) deviated; it reports the failure and re-trains on its private data only
    (:meth:`SecureQuerier.on_retrain`), and the server records the failed query naming the
    querier and its answerers without dropping anyone.
    """


def _seeds(s: QuerierSessionState) -> SessionSeeds:
    return SessionSeeds(
        s.querier_answerer, unheld_seed(s.querier_answerer, s.server_querier), s.server_querier
    )


class SecureAnswerer:
    """An answerer's ``keys`` and ``step`` handlers (module docstring).

    Parameters
    ----------
    node : int
        This node's id (the sealing binds ``Sk_QA`` to it).
    model : SecureModel or Callable[[], SecureModel]
        Its model (:func:`~flwr_fsl.families.privhfl.inference.from_torch`), or a function
        that builds it (called after the request is read).
    max_answer : int
        Most queries this node answers in one session.
    keypair : tuple[int, bytes], optional
        Stored state: the round and the X25519 private key of the ``keys`` phase.
    sessions : tuple[int, dict[int, bytes]], optional
        Stored state: the round and, per querier, its session's
        :class:`~flwr_fsl.families.privhfl.flow.AnswererState` bytes.

    Attributes
    ----------
    keypair, sessions
        As the parameters, updated by every handler (None: nothing kept). After the last
        step nothing is kept; the key opens step 1's seeds only.
    """

    def __init__(
        self,
        node: int,
        model: SecureModel | Callable[[], SecureModel],
        *,
        max_answer: int = 100_000,
        keypair: tuple[int, bytes] | None = None,
        sessions: tuple[int, dict[int, bytes]] | None = None,
    ) -> None:
        self.node = node
        self._model = model
        self.max_answer = max_answer
        self.keypair = keypair
        self.sessions = sessions

    @property
    def model(self) -> SecureModel:
        """The node's model as the protocol evaluates it (built on first use)."""
        if not isinstance(self._model, SecureModel):
            self._model = self._model()
        return self._model

    def on_keys(self, server_round: int, request: bytes) -> bytes:
        """``keys``: a fresh X25519 key pair for the round; reply its public key and arch."""
        KeysRequest.from_bytes(request)
        keypair = SealingKeyPair.generate()
        self.keypair = (server_round, keypair.private_bytes())
        arch = architecture_to_bytes(self.model.architecture)
        return KeysReply(keypair.public_bytes, arch).to_bytes()

    def _key(self, server_round: int) -> SealingKeyPair:
        if self.keypair is None or self.keypair[0] != server_round:
            raise ClientInputError("no key pair of this round (the keys phase did not run)")
        return SealingKeyPair.from_private_bytes(self.keypair[1])

    def on_step(self, server_round: int, request: bytes) -> bytes:
        """``step``: this answerer's half of step ``k`` of every querier's session."""
        req = StepRequest.from_bytes(request)
        cfg = req.config
        secure = self.model
        states: dict[int, bytes]
        if req.step == 1:
            keypair = self._key(server_round)
            bind = binding(req.run_session, server_round, cfg, req.session)
            me = client_party(self.node)
            states = {}
            for e in req.entries:
                if e.batch > self.max_answer:
                    raise ClientInputError("a session holds more queries than this node answers")
                qa = open_from(
                    keypair, e.sealed_seed, purpose=SEED_PURPOSE, binding=bind,
                    sender=client_party(e.querier), recipient=me,
                )  # fmt: skip
                if len(qa) != 16 or qa == e.server_answerer:
                    raise ClientInputError("the sealed seed is malformed")
                st = answerer_open(cfg, secure, e.batch, qa, e.server_answerer, req.session)
                states[e.querier] = st.to_bytes()
        else:
            if self.sessions is None or self.sessions[0] != server_round:
                raise ClientInputError("a step arrived but no session of this round is open")
            named = {e.querier for e in req.entries}
            if not named <= set(self.sessions[1]):
                raise ClientInputError("the step names a session that is not open")
            # A session left out was closed by the server (its querier left the round).
            states = {q: v for q, v in self.sessions[1].items() if q in named}
        replies = []
        last = len(schedule(secure.architecture, 1)) - 1
        for e in req.entries:
            before = AnswererState.from_bytes(states[e.querier])
            after, reply = answerer_step(cfg, secure, before, req.step, e.data)
            states[e.querier] = after.to_bytes()
            replies.append((e.querier, reply))
        self.keypair = None  # the key opens step 1's seeds only
        # after the last step nothing is kept
        self.sessions = (server_round, states) if req.step < last else None
        return StepReply(tuple(replies)).to_bytes()


class SecureQuerier:
    """A querier's ``generate``, ``sign`` and ``retrain`` handlers (module docstring).

    Parameters
    ----------
    node : int
        This node's id (the sealing binds ``Sk_QA`` to it).
    num_classes : int
        Width of the logits.
    image_shape : tuple[int, ...]
        Shape of one query image (an answerer's architecture must take it).
    max_abs_logit : float
        Largest ``|logit sum|`` accepted when the sum is opened.
    state : QuerierState, optional
        Stored state: the round's sessions (from :meth:`on_generate`).

    Attributes
    ----------
    state : QuerierState or None
        The sessions of the round, set by :meth:`on_generate`.
    queries : numpy.ndarray or None
        The query set :meth:`on_generate` shared (it never leaves this node).
    """

    def __init__(
        self,
        node: int,
        *,
        num_classes: int,
        image_shape: tuple[int, ...],
        max_abs_logit: float = 1e6,
        state: QuerierState | None = None,
    ) -> None:
        self.node = node
        self.num_classes = num_classes
        self.image_shape = tuple(image_shape)
        self.max_abs_logit = float(max_abs_logit)
        self.state = state
        self.queries: NDArray[np.float32] | None = None

    def on_generate(
        self,
        server_round: int,
        request: bytes,
        queries: NDArray[np.float32] | Callable[[], NDArray[np.float32]],
    ) -> bytes:
        """``generate``: queries stay here; reply ``Sk_QA`` sealed, the share and the deals.

        ``queries`` is the query set, or a function that makes it (called once the request
        and the answerers' architectures are checked).
        """
        req = GenerateRequest.from_bytes(request)
        cfg = req.config
        archs = [architecture_from_bytes(a.architecture) for a in req.answerers]
        for arch in archs:
            if arch.input_shape != self.image_shape or arch.num_outputs != self.num_classes:
                raise ClientInputError("an answerer's architecture does not fit the queries")
        x = queries() if callable(queries) else queries
        if float(np.abs(x).max(initial=0.0)) >= cfg.max_input:
            raise ConfigurationError("the queries exceed the protocol's input range")
        encoded = cfg.codec().encode(to_nhwc(x.astype(np.float64)))  # Querier.encode
        bind = binding(req.run_session, server_round, cfg, req.session)
        me = client_party(self.node)
        sessions, qas = [], []
        for info, arch in zip(req.answerers, archs, strict=True):
            qa = os.urandom(16)
            if qa == info.server_querier:
                qa = os.urandom(16)
            seeds = SessionSeeds(qa, unheld_seed(qa, info.server_querier), info.server_querier)
            deals = QuerierDeals(cfg, arch, encoded, seeds, req.session)
            sealed = seal_for(
                info.public_key, qa, purpose=SEED_PURPOSE, binding=bind, sender=me,
                recipient=client_party(info.node),
            )  # fmt: skip
            sessions.append((info.node, sealed, deals.sizes, deals))
            qas.append(qa)
        # Each deal is written into the reply as it is made (never all of them and the reply).
        reply = encode_generate_reply(len(x), sessions)
        states = []
        for info, qa, (_, _, _, deals) in zip(req.answerers, qas, sessions, strict=True):
            assert deals.ops is not None  # every deal was made
            states.append(
                QuerierSessionState(
                    info.node, qa, info.server_querier, info.architecture, deals.ops
                )
            )
        self.state = QuerierState(server_round, req.session, len(x), tuple(states))
        self.queries = x
        return reply

    def on_sign(self, server_round: int, request: bytes) -> bytes:
        """``sign`` (paper's DReLU): open ``z = r x`` of each session's comparison (the leak)."""
        req = SignRequest.from_bytes(request)
        state = self.state
        if state is None:
            raise ClientInputError("a sign request arrived but this node holds no session")
        if state.server_round != server_round or req.session != state.session:
            raise ClientInputError("the sign request is for another round's session")
        mine = {s.node: s for s in state.sessions}
        replies = []
        for a, data in req.entries:
            s = mine.get(a)
            if s is None:
                raise ClientInputError("the sign request names an unknown answerer")
            arch = architecture_from_bytes(s.architecture)
            try:
                sign = querier_sign(
                    req.config, arch, state.batch, _seeds(s), state.session, req.step, data
                )
            except (ConfigurationError, ServerMessageError) as err:
                raise ClientInputError(f"sign request: {err}") from err
            replies.append((a, sign))
        return SignReply(tuple(replies)).to_bytes()

    def on_retrain(self, server_round: int, request: bytes, answerers: int) -> NDArray[np.float64]:
        """``retrain``: open ``sum_j y_j`` from the server's ``agg-S`` with this querier's masks.

        ``answerers`` is the count the server says is in the sum. Returns the logit sum
        (``batch x num_classes``); the soft labels are ``softmax(sum / T)``. The sessions are
        used once: :attr:`state` is cleared. A sum out of range (not finite or beyond
        ``max_abs_logit``) raises :class:`QueryFailedError`: a failed query, not a bad querier.
        """
        state, self.state = self.state, None
        if state is None:
            raise ClientInputError("soft labels arrived but this node holds no query set")
        req = RetrainRequest.from_bytes(request)
        if state.server_round != server_round or req.session != state.session:
            raise ClientInputError("the aggregate is for another round's queries")
        cfg = req.config
        sessions = {}
        for s in state.sessions:
            arch = architecture_from_bytes(s.architecture)
            sessions[s.node] = querier_session(
                cfg, arch, state.batch, _seeds(s), state.session, s.ops
            )
        querier = Querier(cfg, sessions)
        querier.prepare_aggregation()
        logits, included = querier.finish(
            req.aggregate, agg_step(state.session), (state.batch, self.num_classes)
        )
        if len(included) != answerers:
            raise ClientInputError("the aggregate's answerer count does not match the record")
        if not np.isfinite(logits).all() or float(np.abs(logits).max()) > self.max_abs_logit:
            raise QueryFailedError("the opened logit sum is out of range")
        return logits
