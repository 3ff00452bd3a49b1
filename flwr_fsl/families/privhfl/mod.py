"""The client side of PrivHFL: its own model, queries and answers.

The server side is :class:`~flwr_fsl.families.privhfl.strategy.PrivHFL`.

In PrivHFL (Sun et al.) every client owns its own architecture and plays two roles each round:
**querier** (expand its private images into a pool, select queries, re-train on the soft labels
the others return) and **answerer** (predict on the other clients' queries). Weights never
leave the client; only predictions do.

Usage — your model and data, one line to register the three message types::

    client = PrivHFLClient(
        model_fn=lambda context: build_model(ARCHS[context.node_config["partition-id"] % 3]),
        data_fn=lambda context: PrivateData(x_train, y_train, x_test, y_test),
    )
    app = ClientApp()
    client.register(app)  # train.privhfl, query.privhfl, evaluate.privhfl

``model_fn(context)`` builds the node's (untrained) model — a ``torch.nn.Sequential`` ending in a
linear layer, e.g. one of :mod:`flwr_fsl.models.privhfl`; ``data_fn(context)`` returns its
:class:`PrivateData`. The trained weights live in ``Context.state`` between messages (as on a
SuperNode), and so does the round's query set.

**Messages** (``flwr_fsl.privhfl`` v1). Every server message carries a ``ConfigRecord`` under
:data:`PRIVHFL_KEY` that :meth:`PhaseConfig.from_record` reads strictly (exact field set and
types, ranges, the phase matching the message type). Phases:

============  =====================  ===============================================================
phase         message type           what the client does / replies
============  =====================  ===============================================================
``local``     ``train.privhfl``      train a fresh model on the private data (SGD as the paper,
                                     or Adam; the local phase, the baseline) -> nothing (an
                                     empty reply; ``num-examples``, ``train-loss`` only if the
                                     node config opts in: :data:`REPORT_TRAIN_METRICS_KEY`)
``generate``  ``query.privhfl``      expand (mixup / cutmix / cutout / private), select
                                     ``num-queries`` (random / active learning on its own model),
                                     keep them -> the queries under :data:`QUERIES_KEY`
``answer``    ``query.privhfl``      logits of its model on the queries it is sent (
                                     :data:`QUERIES_KEY`) -> under :data:`LOGITS_KEY`
``retrain``   ``train.privhfl``      softmax(sum of the answerers' logits / T) as soft labels,
                                     Adam on queries + private data (``answerers = 0``: private
                                     data only) -> nothing (as ``local``)
``evaluate``  ``evaluate.privhfl``   its own model on its evaluation data -> ``num-examples``,
                                     ``accuracy``, ``loss``, ``num-parameters``
``keys``      ``query.privhfl``      secure arm: fresh X25519 key, architecture
``step``      ``query.privhfl``      secure arm: this answerer's half of one op per session
``sign``      ``query.privhfl``      secure arm, paper's DReLU: the querier's sign shares
============  =====================  ===============================================================

**Answering.** In the secure arm (``answering="secure"`` on the strategy, its default) the
``generate`` reply, the ``answer`` phase and the ``retrain`` message are replaced by the
secret-shared protocol: phases ``keys``, ``step`` and (paper's DReLU) ``sign``
(``query.privhfl``) and byte messages
under :data:`~flwr_fsl.families.privhfl.messages.SECURE_KEY`
(:mod:`flwr_fsl.families.privhfl.messages`);
the query set never leaves the querier and the querier opens only the sum of the answers.
In the plaintext arm (``answering="plaintext"``, only by explicit choice) queries and logits
cross the server in the clear, so the server sees every query image (mixup images show their
source images, PrivHFL App. G) and every answerer's predictions on them.

**Training replies carry nothing by default.** PrivHFL has no aggregate, so the server has no
use for a node's number of private images or its training loss: the ``local`` and ``retrain``
replies are empty unless the node opts in through its own node config,
``privhfl-report-train-metrics = true`` (:data:`REPORT_TRAIN_METRICS_KEY`; then the round's
train metrics hold the example-weighted mean ``train-loss`` of the nodes that reported) — the
node's config, not the ClientApp's code or the run config, which the server's side writes in a
deployment. The ``evaluate`` reply does carry its metrics: there is no server-side model to
evaluate instead.

**Query seeds are the querier's own.** The pool (which private images a mixup query mixes,
with which ``lam``; the cutmix boxes, the cutout rectangles) and the random selection come
from a seed the querier draws itself (:meth:`PrivHFLClient.query_seed`): 8 bytes of
``os.urandom`` per ``generate`` by default, or, for reproducible runs, HMAC-SHA256 under the
node's own :attr:`PrivateData.query_key` (from ``data_fn``, e.g. read from its node config) of
its node id, the round and the server's phase seed. The server's ``seed`` field never
decides the queries, so a server that knows a node's data size — or even its data, as with a
public partition in simulation — cannot recompute the query set
(``tests/attacks/test_privhfl_query_seed.py``). A ``query_key`` written into the ClientApp's
code is known to whoever built the app (in a Flower deployment, usually the server's side):
read it from the node's own configuration instead.

**Dispatch.** :class:`PrivHFLClient` is a :class:`~flwr_fsl.core.phases.PhaseMod` over
:data:`~flwr_fsl.families.privhfl.records.PRIVHFL_PHASES`, the typed phases the strategy sends:
:meth:`PrivHFLClient.phase_of` reads the phase from the :data:`PRIVHFL_KEY` record
(:meth:`PhaseConfig.from_record`, checked against the message type) and each phase is answered by
``on_<phase>(request, context)``. :meth:`PrivHFLClient.register` registers the three message
types on a ``ClientApp``; the instance itself is also a mod that passes every other message on.

Malformed server input (a bad record, queries of the wrong shape, type or range, logits that do
not match the stored queries) raises :class:`~flwr_fsl.core.errors.ClientInputError`: Flower turns
it into an error reply and the server drops this client from the round. Error texts name the check,
never a value.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from numpy.typing import NDArray
from torch import nn

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.phases import Phase, PhaseMod
from flwr_fsl.families.privhfl.client import QueryFailedError, SecureAnswerer, SecureQuerier
from flwr_fsl.families.privhfl.inference import SecureModel, from_torch
from flwr_fsl.families.privhfl.messages import KEY_SLOT, QuerierState
from flwr_fsl.families.privhfl.queries import expand, select, softmax
from flwr_fsl.families.privhfl.records import (
    ACTION,
    LOGITS_KEY,
    PHASE_TYPES,
    PRIVHFL_KEY,
    PRIVHFL_PHASES,
    QUERIES_KEY,
    PhaseConfig,
    PhaseReply,
    PhaseRequest,
    logits_record,
    queries_record,
    read_logits,
    read_queries,
)
from flwr_fsl.models.privhfl import (
    IMAGE_SHAPE,
    penultimate_features,
    predict_logits,
    resolve_device,
    retrain,
    train_private,
)

__all__ = [
    "ACTION",
    "LOGITS_KEY",
    "PHASE_TYPES",
    "PRIVHFL_KEY",
    "QUERIES_KEY",
    "REPORT_TRAIN_METRICS_KEY",
    "PhaseConfig",
    "PrivHFLClient",
    "PrivateData",
    "logits_record",
    "queries_record",
    "read_logits",
    "read_queries",
    "reports_train_metrics",
]

_MODEL_SLOT = "fsl.privhfl.model"
_QUERY_SLOT = "fsl.privhfl.query-set"
_QUERY_ROUND_SLOT = "fsl.privhfl.query-round"
_QSTATE_SLOT = "fsl.privhfl.secure-querier"
_ASTATE_SLOT = "fsl.privhfl.secure-answerer"
_MESSAGE_TYPES = frozenset(PHASE_TYPES.values())


_QUERY_SEED_LABEL = b"flwr_fsl/privhfl/query-seed/v1/"


def _no_record(msg: Message, context: Context) -> Message:
    """End a registered function's chain: its message carried no PrivHFL record."""
    raise ClientInputError("the message has no PrivHFL record")


REPORT_TRAIN_METRICS_KEY = "privhfl-report-train-metrics"
"""Node-config key: true to reply ``num-examples`` and ``train-loss`` to ``local``/``retrain``."""


def reports_train_metrics(node_config: Mapping[str, object]) -> bool:
    """Return whether this node reports its training metrics (:data:`REPORT_TRAIN_METRICS_KEY`).

    Parameters
    ----------
    node_config : Mapping[str, object]
        The node's own configuration (``Context.node_config``).

    Returns
    -------
    bool
        The key's value: a bool, or the string ``"true"`` / ``"false"``; False if absent.

    Raises
    ------
    ConfigurationError
        If the value is anything else (the message names the key).
    """
    value = node_config.get(REPORT_TRAIN_METRICS_KEY, False)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise ConfigurationError(
            f"node config {REPORT_TRAIN_METRICS_KEY} must be true or false, got {value!r}"
        )
    return value


# -- the client -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PrivateData:
    """A client's private data.

    Attributes
    ----------
    x_train, y_train : numpy.ndarray
        Private training images (anything :func:`flwr_fsl.models.privhfl.as_images` reads)
        and int labels — the source of its query pool.
    x_eval, y_eval : numpy.ndarray, optional
        Evaluation data (e.g. the test set) for ``evaluate.privhfl``.
    query_key : bytes, optional
        A secret of this node (at least 16 bytes) from which its query seeds are derived
        (:meth:`PrivHFLClient.query_seed`), for repeatable query sets; read it from the node's
        own configuration, never from the app's code or run config (which the server's side
        writes). None (default): every query set comes from a fresh ``os.urandom`` seed.

    Raises
    ------
    ConfigurationError
        If ``query_key`` is neither None nor bytes of at least 16 bytes.
    """

    x_train: NDArray[Any]
    y_train: NDArray[Any]
    x_eval: NDArray[Any] | None = None
    y_eval: NDArray[Any] | None = None
    query_key: bytes | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        key = self.query_key
        if key is not None and (not isinstance(key, bytes) or len(key) < 16):
            raise ConfigurationError("query_key must be bytes of at least 16 bytes (a node secret)")


class PrivHFLClient(PhaseMod):
    """One node of PrivHFL: its own model and data, the querier and answerer roles.

    A :class:`~flwr_fsl.core.phases.PhaseMod` over PrivHFL's phases (module docstring):
    :meth:`register` puts it on a ``ClientApp`` as the three ``privhfl`` message types.

    Parameters
    ----------
    model_fn : Callable[[Context], nn.Sequential]
        Builds this node's model (untrained); its trained weights are kept in
        ``Context.state``.
    data_fn : Callable[[Context], PrivateData]
        This node's data.
    num_classes : int
        Number of classes (the logits' width).
    image_shape : tuple[int, ...]
        Shape of one image.
    max_answer : int
        Most queries this node answers in one message.
    max_abs_input : float
        Largest ``|pixel|`` accepted in a query.
    max_abs_logit : float
        Largest ``|logit sum|`` accepted in a retrain message (default ``1e4``, the strategy's
        bound on a plaintext sum; a secure sum beyond it fails that query, reported to the
        server, and the node re-trains on its private data only).
    num_threads : int, optional
        torch intra-op threads to use (None: leave torch's setting).

    Attribute :attr:`device` (settable: ``client.device = "cpu"``) is where local training and
    re-training run: ``"auto"`` (default: CUDA when ``torch.cuda.is_available()``, else the
    CPU), ``"cpu"`` or ``"cuda[:N]"``, checked when set, i.e. before round 1
    (:func:`~flwr_fsl.models.privhfl.resolve_device`: a GPU that is not there is a
    :class:`~flwr_fsl.core.errors.ConfigurationError`). The model is kept, and answers, on
    the CPU.

    A node reports ``num-examples`` and ``train-loss`` in its ``local`` and ``retrain``
    replies only if its own node config sets :data:`REPORT_TRAIN_METRICS_KEY` to true
    (:func:`reports_train_metrics`); by default the replies are empty (module docstring).
    """

    family: ClassVar[str] = PRIVHFL_KEY
    title: ClassVar[str] = "PrivHFL"
    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = PRIVHFL_PHASES

    def __init__(
        self,
        model_fn: Callable[[Context], nn.Module],
        data_fn: Callable[[Context], PrivateData],
        *,
        num_classes: int = 10,
        image_shape: tuple[int, ...] = IMAGE_SHAPE,
        max_answer: int = 100_000,
        max_abs_input: float = 1e3,
        max_abs_logit: float = 1e4,
        num_threads: int | None = None,
    ) -> None:
        if not callable(model_fn) or not callable(data_fn):
            raise ConfigurationError("model_fn and data_fn must be callables of the Context")
        for name, value in (("num_classes", num_classes), ("max_answer", max_answer)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be an int >= 1, got {value!r}")
        if num_classes < 2:
            raise ConfigurationError("num_classes must be >= 2")
        if not image_shape or any(not isinstance(d, int) or d < 1 for d in image_shape):
            raise ConfigurationError(f"image_shape must be positive ints, got {image_shape!r}")
        for name, bound in (("max_abs_input", max_abs_input), ("max_abs_logit", max_abs_logit)):
            if not (isinstance(bound, int | float) and math.isfinite(bound) and bound > 0):
                raise ConfigurationError(f"{name} must be a finite number > 0")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ConfigurationError("num_threads must be None or an int >= 1")
        self.model_fn = model_fn
        self.data_fn = data_fn
        self.num_classes = num_classes
        self.image_shape = tuple(image_shape)
        self.max_answer = max_answer
        self.max_abs_input = float(max_abs_input)
        self.max_abs_logit = float(max_abs_logit)
        self.num_threads = num_threads
        self.device = "auto"

    @property
    def device(self) -> torch.device:
        """Where local training and re-training run (set ``"auto"``, ``"cpu"``, ``"cuda[:N]"``)."""
        return self._device

    @device.setter
    def device(self, value: str | torch.device) -> None:
        self._device = resolve_device(value)

    def register(self, app: ClientApp) -> None:
        """Register :meth:`train`, :meth:`query` and :meth:`evaluate` on ``app`` (``privhfl``)."""
        app.train(ACTION)(self.train)
        app.query(ACTION)(self.query)
        app.evaluate(ACTION)(self.evaluate)

    # -- dispatch (flwr_fsl.core.phases.PhaseMod) -------------------------------------------
    def phase_of(self, msg: Message, context: Context) -> Phase[Any, Any] | None:
        """Return the PrivHFL phase a message is (None: not a PrivHFL message, passed on).

        A message of a ``privhfl`` type that carries a :data:`PRIVHFL_KEY` record is read by
        :meth:`PhaseConfig.from_record` against its message type.

        Raises
        ------
        ClientInputError
            If the record is malformed, names an unknown phase or one of another message type.
        """
        message_type = msg.metadata.message_type
        record = msg.content.config_records.get(PRIVHFL_KEY)
        if message_type not in _MESSAGE_TYPES or record is None:
            return None
        if self.num_threads is not None and torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        return self.phases[PhaseConfig.from_record(record, message_type).phase]

    def train(self, msg: Message, context: Context) -> Message:
        """Answer ``train.privhfl``: the ``local`` or the ``retrain`` phase."""
        return self(msg, context, _no_record)

    def query(self, msg: Message, context: Context) -> Message:
        """Answer ``query.privhfl``: ``generate``, ``answer``, or ``keys``/``step``/``sign``."""
        return self(msg, context, _no_record)

    def evaluate(self, msg: Message, context: Context) -> Message:
        """Answer ``evaluate.privhfl``: this node's model on its evaluation data."""
        return self(msg, context, _no_record)

    # -- state ------------------------------------------------------------------------------
    def _model(self, context: Context, fresh: bool = False) -> nn.Module:
        model = self.model_fn(context)
        if not isinstance(model, nn.Module):
            raise TypeError("model_fn must return a torch.nn.Module")
        if fresh:
            return model
        stored = context.state.array_records.get(_MODEL_SLOT)
        if stored is None:
            raise ClientInputError("no local model: this node has not run the local phase")
        model.load_state_dict(stored.to_torch_state_dict())
        return model

    @staticmethod
    def _store(context: Context, model: nn.Module) -> None:
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        context.state[_MODEL_SLOT] = ArrayRecord(state)

    def _data(self, context: Context) -> PrivateData:
        data = self.data_fn(context)
        if not isinstance(data, PrivateData):
            raise TypeError("data_fn must return a PrivateData")
        return data

    # -- the phases -------------------------------------------------------------------------
    def on_local(self, request: PhaseRequest, context: Context) -> PhaseReply:
        """``local``: train a fresh model on the private data."""
        config = request.config
        data = self._data(context)
        model = self._model(context, fresh=True)
        loss = train_private(
            model, data.x_train, data.y_train, config.epochs, config.lr,
            config.batch_size, config.seed, optimizer=config.optimizer, device=self.device,
        )  # fmt: skip
        return self._trained(context, model, data, loss)

    def on_retrain(self, request: PhaseRequest, context: Context) -> PhaseReply:
        """``retrain``: soft labels of the answers (plaintext or secure) plus private data."""
        config = request.config
        data = self._data(context)
        model = self._model(context)
        failed = None
        if request.secure is not None:
            try:
                x_query, soft = self._secure_soft_labels(request, context, config)
            except QueryFailedError as err:  # not this node's fault: report it, use no labels
                x_query, soft, failed = None, None, str(err)
        else:
            x_query, soft = self._soft_labels(request, context, config)
        loss = retrain(
            model, data.x_train, data.y_train, x_query, soft, config.epochs, config.lr,
            config.batch_size, config.seed, device=self.device,
        )  # fmt: skip
        reply = self._trained(context, model, data, loss)
        return reply if failed is None else reply.with_query_failure(failed)

    def _trained(
        self, context: Context, model: nn.Module, data: PrivateData, loss: float
    ) -> PhaseReply:
        self._store(context, model)
        if not reports_train_metrics(context.node_config):
            return PhaseReply.done()
        return PhaseReply.trained(len(data.x_train), float(np.nan_to_num(loss)))

    @staticmethod
    def _take_queries(
        context: Context, config: PhaseConfig
    ) -> tuple[NDArray[np.float32] | None, None]:
        """Remove the stored query set (used once); return it if it is of this round."""
        stored = context.state.array_records.get(_QUERY_SLOT)
        stored_round = context.state.config_records.get(_QUERY_ROUND_SLOT)
        for key in (_QUERY_SLOT, _QUERY_ROUND_SLOT):
            if key in context.state:
                del context.state[key]  # a query set is used once
        if stored is None or stored_round is None or config.answerers == 0:
            return None, None
        if stored_round.get("round") != config.server_round:
            raise ClientInputError("the soft labels are for another round's queries")
        return stored["x"].numpy(), None

    def _soft_labels(
        self, request: PhaseRequest, context: Context, config: PhaseConfig
    ) -> tuple[NDArray[np.float32] | None, NDArray[np.float64] | None]:
        x_query, _ = self._take_queries(context, config)
        if config.answerers == 0:
            return None, None
        if x_query is None:
            raise ClientInputError("soft labels arrived but this node holds no query set")
        total = request.read_logits(len(x_query), self.num_classes, self.max_abs_logit)
        return x_query, softmax(total, config.temperature)

    def on_generate(self, request: PhaseRequest, context: Context) -> PhaseReply:
        """``generate``: build and keep the query set; reply it (plaintext) or the secure deals."""
        config = request.config
        model = self._model(context)
        if request.secure is not None:
            return self._secure_generate(request, context, model, config)
        data = self._data(context)
        queries = self.generate(model, data, config, seed=self.query_seed(context, config, data))
        context.state[_QUERY_SLOT] = queries_record(queries)
        context.state[_QUERY_ROUND_SLOT] = ConfigRecord({"round": config.server_round})
        return PhaseReply.query_set(queries)

    def on_answer(self, request: PhaseRequest, context: Context) -> PhaseReply:
        """``answer``: this node's logits on the queries it is sent."""
        model = self._model(context)
        x = request.read_queries(self.max_answer, self.image_shape, self.max_abs_input)
        return PhaseReply.answer(predict_logits(model, x))

    def on_evaluate(self, request: PhaseRequest, context: Context) -> PhaseReply:
        """``evaluate``: this node's model on its evaluation data."""
        model = self._model(context)
        data = self._data(context)
        if data.x_eval is None or data.y_eval is None or len(data.x_eval) == 0:
            raise ConfigurationError("data_fn gave no evaluation data")
        logits = torch.from_numpy(predict_logits(model, data.x_eval))
        target = torch.as_tensor(np.asarray(data.y_eval), dtype=torch.long)
        loss = float(nn.functional.cross_entropy(logits, target))
        accuracy = float((logits.argmax(1) == target).float().mean())
        params = sum(p.numel() for p in model.parameters())
        return PhaseReply.evaluated(len(target), accuracy, loss, int(params))

    # -- secure answering (flwr_fsl.families.privhfl.messages) -----------------------------------
    def _secure_model(self, model: nn.Module) -> SecureModel:
        return from_torch(model.eval(), self.image_shape)

    def _answerer(self, context: Context, model: nn.Module) -> SecureAnswerer:
        """Return the answerer's handlers with its stored key and sessions (``Context.state``)."""
        keypair = sessions = None
        record = context.state.config_records.get(KEY_SLOT)
        if record is not None:
            key_round, private = record.get("round"), record.get("private")
            if not isinstance(key_round, int) or not isinstance(private, bytes):
                raise ClientInputError("the stored key pair is malformed")
            keypair = (key_round, private)
        stored = context.state.config_records.get(_ASTATE_SLOT)
        session_round = stored.get("round") if stored is not None else None
        if stored is not None and isinstance(session_round, int):
            states = {int(k): v for k, v in stored.items() if k != "round"}
            sessions = (session_round, states)
        return SecureAnswerer(
            context.node_id, lambda: self._secure_model(model), max_answer=self.max_answer,
            keypair=keypair, sessions=sessions,  # type: ignore[arg-type]
        )  # fmt: skip

    def _querier(self, context: Context, stored: bool = True) -> SecureQuerier:
        """Return the querier's handlers with its stored sessions (``Context.state``)."""
        record = context.state.config_records.get(_QSTATE_SLOT) if stored else None
        raw = record.get("state") if record is not None else None
        return SecureQuerier(
            context.node_id, num_classes=self.num_classes, image_shape=self.image_shape,
            max_abs_logit=self.max_abs_logit,
            state=QuerierState.from_bytes(raw) if isinstance(raw, bytes) else None,
        )  # fmt: skip

    def on_keys(self, request: PhaseRequest, context: Context) -> PhaseReply:
        """``keys``: a fresh X25519 key pair for the round; reply its public key and arch."""
        answerer = self._answerer(context, self._model(context))
        reply = answerer.on_keys(request.config.server_round, request.blob())
        assert answerer.keypair is not None
        key_round, private = answerer.keypair
        context.state[KEY_SLOT] = ConfigRecord({"private": private, "round": key_round})
        return PhaseReply.sealed(reply)

    def _secure_generate(
        self, request: PhaseRequest, context: Context, model: nn.Module, config: PhaseConfig
    ) -> PhaseReply:
        """``generate`` (secure): queries stay here; reply ``Sk_QA`` sealed, share, deals."""
        querier = self._querier(context, stored=False)
        reply = querier.on_generate(
            config.server_round,
            request.blob(),
            lambda: self._generate_own(context, model, config),
        )
        assert querier.queries is not None and querier.state is not None
        context.state[_QUERY_SLOT] = queries_record(querier.queries)
        context.state[_QUERY_ROUND_SLOT] = ConfigRecord({"round": config.server_round})
        context.state[_QSTATE_SLOT] = ConfigRecord({"state": querier.state.to_bytes()})
        return PhaseReply.sealed(reply)

    def on_step(self, request: PhaseRequest, context: Context) -> PhaseReply:
        """``step``: this answerer's half of step ``k`` of every querier's session."""
        answerer = self._answerer(context, self._model(context))
        reply = answerer.on_step(request.config.server_round, request.blob())
        for slot in (KEY_SLOT, _ASTATE_SLOT):
            if slot in context.state:
                del context.state[slot]  # the key opens step 1's seeds only
        if answerer.sessions is not None:  # after the last step nothing is kept
            session_round, states = answerer.sessions
            context.state[_ASTATE_SLOT] = ConfigRecord(
                {"round": session_round, **{str(q): v for q, v in states.items()}}
            )
        return PhaseReply.sealed(reply)

    def on_sign(self, request: PhaseRequest, context: Context) -> PhaseReply:
        """``sign`` (paper's DReLU): open ``z = r x`` of each session's comparison (the leak)."""
        self._model(context)  # as every query phase: only a node with a model takes part
        querier = self._querier(context)
        return PhaseReply.sealed(querier.on_sign(request.config.server_round, request.blob()))

    def _secure_soft_labels(
        self, request: PhaseRequest, context: Context, config: PhaseConfig
    ) -> tuple[NDArray[np.float32] | None, NDArray[np.float64] | None]:
        """Open ``sum_j y_j`` from the server's ``agg-S`` with this querier's masks."""
        stored = context.state.config_records.get(_QSTATE_SLOT)
        x_query, _ = self._take_queries(context, config)
        if _QSTATE_SLOT in context.state:
            del context.state[_QSTATE_SLOT]
        if config.answerers == 0:
            return None, None
        raw = stored.get("state") if stored is not None else None
        if x_query is None or not isinstance(raw, bytes):
            raise ClientInputError("soft labels arrived but this node holds no query set")
        querier = self._querier(context, stored=False)
        querier.state = QuerierState.from_bytes(raw)
        logits = querier.on_retrain(config.server_round, request.blob(), config.answerers)
        return x_query, softmax(logits, config.temperature)

    def query_seed(self, context: Context, config: PhaseConfig, data: PrivateData) -> int:
        """Return this node's seed of query expansion and selection for a ``generate`` request.

        Without a :attr:`PrivateData.query_key`: 63 bits of ``os.urandom``, fresh per call.
        With one: HMAC-SHA256 under the key of the node id, the round and the server's phase
        seed (the server knows those, not the key). The server's seed alone never decides the
        queries.
        """
        if data.query_key is None:
            return int.from_bytes(os.urandom(8), "big") >> 1
        message = f"{context.node_id}/{config.server_round}/{config.seed}".encode()
        digest = hmac.new(data.query_key, _QUERY_SEED_LABEL + message, hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "big") >> 1

    def _generate_own(
        self, context: Context, model: nn.Module, config: PhaseConfig
    ) -> NDArray[np.float32]:
        """Make the query set from this node's data with its own seed (:meth:`query_seed`)."""
        data = self._data(context)
        return self.generate(model, data, config, seed=self.query_seed(context, config, data))

    def generate(
        self, model: nn.Module, data: PrivateData, config: PhaseConfig, *, seed: int
    ) -> NDArray[np.float32]:
        """Expand the private images, select ``num_queries`` of the pool, return them.

        ``seed`` is the querier's own (:meth:`query_seed`), never the server's: it decides
        the pool (pairs and ``lam`` of mixup, boxes of cutmix and cutout) and the selection.
        Active-learning strategies use this node's own model: softmax probabilities for
        entropy / margin / least confidence / ICD, penultimate features for k-center (with the
        private images' features as the existing centers) and ICD.
        """
        x = np.asarray(data.x_train, dtype=np.float32).reshape(-1, *self.image_shape)
        pool = expand(x, config.expansion, config.pool_size, seed)
        k = min(config.num_queries, len(pool))
        probs = features = existing = None
        if config.selection in ("entropy", "margin", "least_confidence", "icd"):
            probs = softmax(predict_logits(model, pool.images))
        if config.selection in ("kcenter", "icd"):
            if not isinstance(model, nn.Sequential):
                raise TypeError("k-center / ICD selection needs an nn.Sequential model")
            features = penultimate_features(model, pool.images)
            if config.selection == "kcenter":
                existing = penultimate_features(model, x)
        chosen = select(
            config.selection, k, len(pool), probs=probs, features=features,
            existing=existing, seed=seed,
        )  # fmt: skip
        return np.ascontiguousarray(pool.images[chosen], dtype=np.float32)
