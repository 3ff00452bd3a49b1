"""``PrivHFL``: heterogeneous federated learning through queries (Sun et al.), on the round engine.

Clients own different architectures (:mod:`flwr_fsl.models.privhfl`); there is no global model
and no weight ever leaves a client. Knowledge moves through predictions: each round every
sampled client, as a **querier**, expands its private images into a pool (mixup, cutmix,
cutout, or the private images themselves: :mod:`flwr_fsl.families.privhfl.queries`), selects
queries, and has them answered by other clients, the **answerers**; it then re-trains on the queries
with the aggregated predictions as soft labels plus its private data (Alg. 1). The client side
is :class:`~flwr_fsl.families.privhfl.mod.PrivHFLClient`.

A round is a sequence of phases of :class:`~flwr_fsl.core.engine.PhasedStrategy`
(message types ``train.privhfl``, ``query.privhfl``, ``evaluate.privhfl``), each one of the
typed phases of :mod:`flwr_fsl.families.privhfl.records` that the client mod dispatches on
(:data:`~flwr_fsl.families.privhfl.records.PRIVHFL_PHASES`; requests built by ``Phase.build``):

1. ``local`` (``train``): every node that has no model yet — all of them in round 1 — trains
   its own architecture on its private data (Alg. 1 lines 1-3). With ``evaluate_local`` the
   models are then evaluated (kept as round 0 of :attr:`PrivHFL.node_metrics`: the *local
   baseline*);
2. ``generate`` (``query``): the sampled queriers build their query sets (``expansion``,
   ``pool_size``, ``num_queries``, ``selection``), each from a seed it draws itself and the
   server never sees (:meth:`~flwr_fsl.families.privhfl.mod.PrivHFLClient.query_seed`);
3. ``answer`` (``query``): each querier's queries go to ``fraction_answer`` of the other
   trained nodes (at least one, a seeded draw per querier and round — Alg. 1's ``C``); an
   answerer gets every query set it answers in one message and returns its logits;
4. ``retrain`` (``train``): per querier the server adds the logits of the answerers that
   replied (the paper's Π_Agg sums logits, no normalization: App. B.3) and sends the sum; the
   querier re-trains on ``softmax(sum / temperature)`` plus its private data;

then ``evaluate`` (``evaluate``): each sampled node reports its own model's accuracy on its
evaluation data; per-node results are in :attr:`PrivHFL.node_metrics`.

``expansion="none"`` skips phases 2-3 and re-trains on the private data alone with the same
settings: the *equal-effort local baseline* (the models see as many optimizer steps on private
data as a querier does, without the others' knowledge).

**Answering.** ``answering="secure"``, the default, runs
:mod:`flwr_fsl.families.privhfl.protocol` with the server as the third
computing party ``S`` and the leak-free DCF comparison (``comparison="dcf"``, the default) or,
by explicit choice, the paper's DReLU (``comparison="drelu"``: the querier learns ``z = r x``
for every hidden activation of every answerer's model on its queries — every sign, and the
magnitude up to a divisor of ``z``: :class:`~flwr_fsl.families.privhfl.config.PrivHFLConfig` —
and is online in every comparison). Phases 2-4 become
(messages: :mod:`flwr_fsl.families.privhfl.messages`; schedule and party state:
:mod:`flwr_fsl.families.privhfl.flow`):

* ``keys`` (``query``): every answerer of the round makes a fresh X25519 key pair
  and replies its public key and its model's public architecture;
* ``generate`` (``query``): each querier gets its answerers' keys and architectures and the
  server's seeds ``Sk_SQ``; it keeps its queries and replies, per answerer, ``Sk_QA`` sealed to
  the answerer, the secret share ``[x]_1`` of its queries and every deal of the session;
* ``step-1`` ... ``step-K`` (``query``): per answerer one message per interactive op (linear
  layer or batched comparison), carrying the server's half of that op for every querier it
  answers (step 1 also the sealed ``Sk_QA`` and ``Sk_SA``); the answerer replies its half and
  keeps its share state as bytes in ``Context.state``; the server holds its share state
  (:class:`~flwr_fsl.families.privhfl.protocol.ServerParty`) in memory for the round. The last reply
  carries Π_Agg's masked output share. Paper's DReLU: before each comparison step, a
  ``sign-k`` message to each querier with the server's ``drelu-z`` per session; the querier
  replies its sign shares (the answerer's first messages of the comparison ride on its reply
  to step ``k - 1``);
* ``retrain`` (``train``): each querier gets ``agg-S`` (the masked sum and which answerers
  are in it), opens ``sum_j y_j`` with its masks and re-trains on ``softmax(sum / T)``.

What the server sees in the secure arm: the architectures, the batch sizes, who answers whom,
and protocol words each masked by randomness it does not hold (no query image, no logit, no
soft label; tested). The answerers see masked words only; the querier learns only the sum of
its answerers' logits. ``Sk_SQ`` and ``Sk_SA`` are drawn by the server and sent on each
client's link; the public keys are relayed unauthenticated (honest-but-curious server).

``answering="plaintext"``, only by explicit choice, is the baseline arm and **leaks**: queries
and logits cross the server in the clear, so the server sees every query image (a mixup image
shows its two private source images, App. G), every answerer's logits on it and the sums
(``tests/families/privhfl/test_strategy.py::test_what_crosses_the_server``). It is much
cheaper (a query costs a CNN answerer tens of MB of protocol words in the secure arm), so the
accuracy benchmark and the replay tests use it.

**Training replies.** The ``local`` and ``retrain`` replies of a default
:class:`~flwr_fsl.families.privhfl.mod.PrivHFLClient` are empty: PrivHFL has no aggregate to
weight, so the server has no use for a node's number of private images or its training loss.
A node whose own node config sets ``privhfl-report-train-metrics = true``
(:data:`~flwr_fsl.families.privhfl.mod.REPORT_TRAIN_METRICS_KEY`) replies both; the round's
train metrics then hold their example-weighted mean ``train-loss`` (over the nodes that
reported).

**Failures.** A node whose reply is an error, late, malformed or out of range (queries of the
wrong shape or count or beyond ``max_abs_input``; logits of the wrong shape, non-finite or
beyond ``max_abs_logit``) is dropped from the round with the reason in
:attr:`~flwr_fsl.core.engine.RoundState.dropped`: a dropped querier's queries are not
answered, a dropped answerer's logits are not in any sum (each querier's sum holds the
answerers that replied; the count goes with it). A querier left with no answer keeps its model
this round. A node whose ``local`` phase fails is dropped for that round (it tries again in the
next). With secure answering, a querier whose opened sum is out of range (an answerer's
corrupted step reply, which the masked sum cannot pin on one answerer) is not dropped: its
query fails, recorded in :attr:`PrivHFL.failed_queries` naming it and its answerers, and it
re-trains on its private data only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from logging import INFO, WARNING
from typing import Any, TypeVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from flwr_fsl.core.checks import check_bool
from flwr_fsl.core.engine import MultiPhaseStrategy, RoundState
from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.families.privhfl.config import COMPARISONS
from flwr_fsl.families.privhfl.protocol import PrivHFLConfig
from flwr_fsl.families.privhfl.queries import EXPANSIONS, STRATEGIES
from flwr_fsl.families.privhfl.records import (
    ANSWER,
    EVALUATE,
    GENERATE,
    LOCAL,
    PRIVHFL_PHASES,
    RETRAIN,
    PhaseConfig,
    PhaseRequest,
    PrivHFLPhase,
    logits_record,
    node_seed,
    queries_record,
    read_logits,
    read_queries,
    read_query_failure,
    secure_record,
)
from flwr_fsl.families.privhfl.server import PrivHFLServer, failed_query_reason
from flwr_fsl.models.privhfl import IMAGE_SHAPE

__all__ = ["ANSWERING", "COMPARISONS", "PrivHFL"]

T = TypeVar("T")

ANSWERING = ("plaintext", "secure")
"""The answering arms: queries and logits in the clear, or secret-shared (module docstring)."""


def _positive_int(name: str, value: int, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigurationError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def _positive_float(name: str, value: float) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise ConfigurationError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class PrivHFL(MultiPhaseStrategy):
    """PrivHFL's rounds: local training, query generation, answering, re-training (module doc).

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, sampling_seed
        As in :class:`~flwr_fsl.core.engine.PhasedStrategy` (``fraction_train`` samples
        the queriers of a round).
    expansion : str
        ``"mixup"`` (the paper's), ``"cutmix"``, ``"cutout"``, ``"private"`` (query with the
        private images) or ``"none"`` (no queries: the equal-effort local baseline).
    pool_size : int
        Size of each querier's expanded pool.
    num_queries : int
        Queries per querier and round (at most ``pool_size``; a ``"private"`` pool may hold
        fewer).
    selection : str
        ``"random"`` (Table 1's) or an active-learning strategy of
        :data:`~flwr_fsl.families.privhfl.queries.STRATEGIES`.
    fraction_answer : float
        Fraction of the other trained nodes that answer each querier, in ``(0, 1]``.
    temperature : float
        Soft labels are ``softmax(logit sum / temperature)`` (1: the paper's).
    local_epochs, local_lr, local_batch_size, local_optimizer : int, float, int, str
        Local phase: ``"sgd"`` (momentum 0.9, the paper's) or ``"adam"``.
    retrain_epochs, retrain_lr, retrain_batch_size : int, float, int
        Re-training phase (Adam, lr / 10 halfway).
    num_classes : int
        Width of the logits.
    image_shape : tuple[int, ...]
        Shape of one query image.
    max_abs_input, max_abs_logit : float
        Largest ``|pixel|`` of a query and ``|logit|`` of an answer accepted.
    evaluate_local : bool
        Evaluate every model after its local phase (round 0 of :attr:`node_metrics`).
    answering : str
        One of :data:`ANSWERING`: ``"secure"`` (default) or ``"plaintext"`` (the server sees
        every query image and every answer: module docstring).
    comparison : str
        Secure arm: ``"dcf"`` (default, leak-free) or ``"drelu"`` (the paper's; leaks every
        hidden value's sign and its magnitude up to a divisor to the querier:
        :class:`~flwr_fsl.families.privhfl.config.PrivHFLConfig`).
    frac_bits, bound_bits : int
        Secure arm: fixed-point fraction bits and comparison bound bits
        (:class:`~flwr_fsl.families.privhfl.protocol.PrivHFLConfig`).
    seed : int
        Seed of the per-node training seeds and of the answerer draws (not of the queries:
        each querier draws its own).

    Raises
    ------
    ConfigurationError
        If a setting is invalid (named).

    Attributes
    ----------
    trained : set[int]
        Nodes that hold a locally trained model.
    node_metrics : dict[int, dict[int, dict[str, float]]]
        Round (0: after local training) -> node -> its evaluation metrics (``accuracy``,
        ``loss``, ``num-examples``, ``num-parameters``).
    """

    PHASES = ("local", "generate", "answer", "retrain")

    def __init__(  # noqa: C901, PLR0913
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        *,
        expansion: str = "mixup",
        pool_size: int = 5000,
        num_queries: int = 1000,
        selection: str = "random",
        fraction_answer: float = 1.0,
        temperature: float = 1.0,
        local_epochs: int = 10,
        local_lr: float = 0.02,
        local_batch_size: int = 32,
        local_optimizer: str = "sgd",
        retrain_epochs: int = 5,
        retrain_lr: float = 2e-3,
        retrain_batch_size: int = 64,
        num_classes: int = 10,
        image_shape: tuple[int, ...] = IMAGE_SHAPE,
        max_abs_input: float = 1e3,
        max_abs_logit: float = 1e4,
        evaluate_local: bool = True,
        answering: str = "secure",
        comparison: str = "dcf",
        frac_bits: int = 20,
        bound_bits: int = 40,
        seed: int = 0,
        sampling_seed: int | None = None,
    ) -> None:
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            sampling_seed=sampling_seed,
        )
        if expansion != "none" and expansion not in EXPANSIONS:
            raise ConfigurationError(f"expansion must be 'none' or one of {EXPANSIONS}")
        if selection not in STRATEGIES:
            raise ConfigurationError(f"selection must be one of {STRATEGIES}")
        if answering not in ANSWERING:
            raise ConfigurationError(f"answering must be one of {ANSWERING}, got {answering!r}")
        if not (isinstance(fraction_answer, int | float) and 0 < fraction_answer <= 1):
            raise ConfigurationError(f"fraction_answer must be in (0, 1], got {fraction_answer}")
        self.expansion = expansion
        self.pool_size = _positive_int("pool_size", pool_size)
        self.num_queries = _positive_int("num_queries", num_queries)
        if self.num_queries > self.pool_size:
            raise ConfigurationError("num_queries must not exceed pool_size")
        self.selection = selection
        self.fraction_answer = float(fraction_answer)
        self.temperature = _positive_float("temperature", temperature)
        self.local_epochs = _positive_int("local_epochs", local_epochs, 0)
        self.local_lr = _positive_float("local_lr", local_lr)
        self.local_batch_size = _positive_int("local_batch_size", local_batch_size)
        if local_optimizer not in ("sgd", "adam"):
            raise ConfigurationError("local_optimizer must be 'sgd' or 'adam'")
        self.local_optimizer = local_optimizer
        self.retrain_epochs = _positive_int("retrain_epochs", retrain_epochs, 0)
        self.retrain_lr = _positive_float("retrain_lr", retrain_lr)
        self.retrain_batch_size = _positive_int("retrain_batch_size", retrain_batch_size)
        self.num_classes = _positive_int("num_classes", num_classes, 2)
        if not image_shape or any(
            isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in image_shape
        ):
            raise ConfigurationError(f"image_shape must be positive ints, got {image_shape!r}")
        self.image_shape = tuple(image_shape)
        self.max_abs_input = _positive_float("max_abs_input", max_abs_input)
        self.max_abs_logit = _positive_float("max_abs_logit", max_abs_logit)
        self.evaluate_local = check_bool("evaluate_local", evaluate_local)
        self.answering = answering
        if comparison not in COMPARISONS:
            raise ConfigurationError(f"comparison must be one of {COMPARISONS}, got {comparison!r}")
        try:
            self.secure_config = PrivHFLConfig(
                comparison="dcf" if comparison == "dcf" else "drelu",  # the Literal type
                frac_bits=frac_bits,
                bound_bits=bound_bits,
            )
        except (ConfigurationError, ValueError, TypeError) as err:
            raise ConfigurationError(f"PrivHFL secure settings: {err}") from err
        self.secure_server = PrivHFLServer(
            self.secure_config,
            num_classes=self.num_classes,
            image_shape=self.image_shape,
            max_batch=self.num_queries,
        )
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigurationError(f"seed must be an int >= 0, got {seed!r}")
        self.seed = seed
        # Every phase record is built once here, so a bad combination fails before round 1
        # (PhaseConfig raises ConfigurationError naming the setting).
        self._phase("generate", 1, 0)
        self._phase("local", 1, 0)
        self._phase("retrain", 1, 0)
        self.trained: set[int] = set()
        # round -> querier -> why its secure query failed; querier -> its answerers this round
        self.failed_queries: dict[int, dict[int, str]] = {}
        self.node_metrics: dict[int, dict[int, dict[str, float]]] = {}

    # -- messages ---------------------------------------------------------------------------
    def _phase(self, phase: str, server_round: int, node: int, **extra: Any) -> PhaseConfig:
        training = {
            "local": (self.local_epochs, self.local_lr, self.local_batch_size),
            "retrain": (self.retrain_epochs, self.retrain_lr, self.retrain_batch_size),
        }
        epochs, lr, batch = training.get(phase, (1, 0.01, 32))
        return PhaseConfig(
            phase=phase,
            server_round=server_round,
            seed=node_seed(self.seed, server_round, node, phase),
            epochs=epochs,
            lr=lr,
            batch_size=batch,
            expansion=self.expansion if self.expansion != "none" else "private",
            pool_size=self.pool_size,
            num_queries=self.num_queries,
            selection=self.selection,
            temperature=self.temperature,
            optimizer=self.local_optimizer,
            **extra,
        )

    def _send(
        self,
        grid: Grid,
        state: RoundState,
        phase: PrivHFLPhase,
        requests: Mapping[int, PhaseRequest],
        parse: Callable[[int, RecordDict], T],
        *,
        label: str | None = None,
        shrink: bool = True,
    ) -> dict[int, T]:
        """Send a typed phase (its contents by ``phase.build``); return the parsed replies."""
        contents = {n: phase.build(request) for n, request in requests.items()}
        return self.send(
            grid, state, label or phase.name, contents, phase.message_type, parse, shrink=shrink
        )

    # -- Flower's single-phase pair is not how PrivHFL runs -----------------------------------

    def run(self, grid: Grid, num_rounds: int = 1, timeout: float = 3600) -> Result:
        """Run ``num_rounds`` PrivHFL iterations (``start`` with an empty model record)."""
        return self.start(grid, ArrayRecord(), num_rounds=num_rounds, timeout=timeout)

    # -- the phases -------------------------------------------------------------------------
    def _train_metrics(self, node: int, content: RecordDict) -> tuple[float, float] | None:
        """Read a train reply: None if empty (the default client), else weight and loss."""
        if len(content) == 0:
            return None
        weight = self.weight_of(content)
        loss = next(iter(content.metric_records.values())).get("train-loss")
        if isinstance(loss, bool) or not isinstance(loss, int | float) or not math.isfinite(loss):
            raise ClientInputError("the train reply lacks a finite 'train-loss'")
        return weight, float(loss)

    def _retrain_reply(
        self, state: RoundState
    ) -> Callable[[int, RecordDict], tuple[float, float] | None]:
        """Return the ``retrain`` parser: a querier's failed query is recorded, not dropped."""

        def parse(node: int, content: RecordDict) -> tuple[float, float] | None:
            why, rest = read_query_failure(content)
            if why is not None:
                plan: dict[int, list[int]] = getattr(self, "_answerers", {})
                suspects = [a for a in plan.get(node, []) if a not in state.dropped]
                reason = failed_query_reason(node, suspects, why)
                self.failed_queries.setdefault(state.server_round, {})[node] = reason
                log(WARNING, "round %s: %s", state.server_round, reason)
            return self._train_metrics(node, rest)

        return parse

    def local(self, grid: Grid, state: RoundState) -> None:
        """Train every node that has no model yet (the local phase) and evaluate it."""
        new = sorted(n for n in grid.get_node_ids() if n not in self.trained)
        if not new:
            return
        requests = {n: PhaseRequest(self._phase("local", state.server_round, n)) for n in new}
        # A node whose local phase fails is dropped from this round (it tries again next round).
        done = self._send(grid, state, LOCAL, requests, self._train_metrics)
        self.trained.update(done)
        if self.evaluate_local and done:
            self.node_metrics.setdefault(0, {}).update(
                self._evaluate(grid, state, "evaluate-local", sorted(done))
            )

    def round_minimum(self, sampled: int) -> tuple[int, str] | None:
        """Return 2 with query expansion: a querier needs an answerer (checked up front)."""
        return None if self.expansion == "none" else (2, "expansion (a querier and an answerer)")

    def answerers_for(self, server_round: int, querier: int, candidates: list[int]) -> list[int]:
        """Return the answerers of ``querier`` this round: a seeded draw from ``candidates``."""
        others = sorted(n for n in candidates if n != querier)
        if not others:
            return []
        size = max(1, math.floor(self.fraction_answer * len(others) + 1e-9))
        rng = random.Random(f"privhfl-answerers/{self.seed}/{server_round}/{querier}")
        return sorted(rng.sample(others, size))

    def train_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run one PrivHFL iteration (module docstring); the returned arrays are always None."""
        sampled = self.sample(state, grid)
        self.local(grid, state)
        queriers = [n for n in sampled if n in self.trained]
        state.survivors = list(queriers)
        if not queriers:
            log(WARNING, "round %s: no trained querier", state.server_round)
            return None, None
        r = state.server_round
        sums: dict[int, tuple[dict[str, Any], int]]  # querier -> (its PhaseRequest records, count)
        if self.expansion == "none":
            sums = dict.fromkeys(queriers, ({}, 0))
        elif self.answering == "secure":
            sums = self._secure_query(grid, state, queriers)
        else:
            sums = self._query(grid, state, queriers)
        requests = {}
        for q, (records, count) in sums.items():
            if count == 0 and self.expansion != "none":
                log(WARNING, "round %s: querier %s got no answer; its model is kept", r, q)
                continue
            requests[q] = PhaseRequest(self._phase("retrain", r, q, answerers=count), **records)
        done = self._send(grid, state, RETRAIN, requests, self._retrain_reply(state))
        metrics: dict[str, int | float | list[int] | list[float]] = {"queriers": len(done)}
        if self.failed_queries.get(r):
            metrics["failed-queries"] = len(self.failed_queries[r])
        if done:
            metrics["answers-per-querier"] = float(np.mean([sums[q][1] for q in done]))
        reported = [m for m in done.values() if m is not None]  # nodes that opted in
        if reported:
            weights = np.array([w for w, _ in reported])
            losses = np.array([loss for _, loss in reported])
            metrics["train-loss"] = float((weights * losses).sum() / weights.sum())
        return None, MetricRecord(metrics)

    def _query(
        self, grid: Grid, state: RoundState, queriers: list[int]
    ) -> dict[int, tuple[dict[str, Any], int]]:
        """Generate and answer (plaintext): per querier, the sum of logits and its count."""
        r = state.server_round
        requests = {q: PhaseRequest(self._phase("generate", r, q)) for q in queriers}
        queries = self._send(
            grid, state, GENERATE, requests,
            lambda _n, c: read_queries(c, self.num_queries, self.image_shape, self.max_abs_input),
        )  # fmt: skip
        candidates = sorted(n for n in self.trained if n not in state.dropped)
        answered_by: dict[int, list[int]] = {}
        for q in sorted(queries):
            for a in self.answerers_for(r, q, candidates):
                answered_by.setdefault(a, []).append(q)
        payloads: dict[int, PhaseRequest] = {}
        for a, qs in answered_by.items():
            x = np.concatenate([queries[q] for q in qs])
            payloads[a] = PhaseRequest(self._phase("answer", r, a), queries=queries_record(x))
        rows = {a: sum(len(queries[q]) for q in qs) for a, qs in answered_by.items()}
        answers = self._send(
            grid, state, ANSWER, payloads,
            lambda n, c: read_logits(c, rows[n], self.num_classes, self.max_abs_logit),
        )  # fmt: skip
        sums: dict[int, tuple[dict[str, Any], int]] = {}
        totals = {q: np.zeros((len(queries[q]), self.num_classes)) for q in queries}
        counts = dict.fromkeys(queries, 0)
        for a, logits in answers.items():
            offset = 0
            for q in answered_by[a]:
                b = len(queries[q])
                totals[q] += logits[offset : offset + b]
                counts[q] += 1
                offset += b
        for q in queries:
            if q in state.dropped:
                continue  # it failed as an answerer: it leaves the round
            sums[q] = ({"logits": logits_record(totals[q])}, counts[q])
        log(
            INFO,
            "round %s: %d query sets answered by %d answerers",
            r,
            len(sums),
            len(answers),
        )
        return sums

    # -- secure answering (flwr_fsl.families.privhfl.server) --------------------------------
    def _secure_query(
        self, grid: Grid, state: RoundState, queriers: list[int]
    ) -> dict[int, tuple[dict[str, Any], int]]:
        """Generate and answer securely (module docstring): per querier, the agg-S record."""
        r = state.server_round

        def exchange(
            label: str, requests: Mapping[int, bytes], parse: Callable[[int, bytes], T], /
        ) -> dict[int, T]:
            phase = PRIVHFL_PHASES[label.split("-")[0]]  # "step-3" is a step
            payloads = {
                n: PhaseRequest(self._phase(phase.name, r, n), secure=secure_record(blob))
                for n, blob in requests.items()
            }
            return self._send(
                grid, state, phase, payloads,
                lambda n, c: parse(n, phase.parse_reply(c).blob()), label=label,
            )  # fmt: skip

        candidates = sorted(n for n in self.trained if n not in state.dropped)
        plan = {q: self.answerers_for(r, q, candidates) for q in queriers}
        self._answerers = {q: list(a) for q, a in plan.items()}
        answers = self.secure_server.query(r, plan, exchange, state.drop, state.dropped)
        sums: dict[int, tuple[dict[str, Any], int]] = {
            q: ({} if blob is None else {"secure": secure_record(blob)}, count)
            for q, (blob, count) in answers.items()
        }
        log(INFO, "round %s: %d query sets answered securely", r, len(sums))
        return sums

    # -- evaluation -------------------------------------------------------------------------
    def _eval_metrics(self, node: int, content: RecordDict) -> dict[str, float]:
        weight = self.weight_of(content)
        record = next(iter(content.metric_records.values()))
        out = {"num-examples": weight}
        for key, low, high in (
            ("accuracy", 0.0, 1.0),
            ("loss", 0.0, math.inf),
            ("num-parameters", 1.0, 1e12),
        ):
            value = record.get(key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ClientInputError(f"the evaluate reply lacks a numeric {key!r}")
            if not (math.isfinite(value) and low <= value <= high):
                raise ClientInputError(f"the evaluate reply's {key!r} is out of range")
            out[key] = float(value)
        return out

    def _evaluate(
        self, grid: Grid, state: RoundState, phase: str, nodes: list[int]
    ) -> dict[int, dict[str, float]]:
        requests = {n: PhaseRequest(self._phase("evaluate", state.server_round, n)) for n in nodes}
        return self._send(
            grid, state, EVALUATE, requests, self._eval_metrics, label=phase, shrink=False
        )

    def evaluate_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> MetricRecord | None:
        """Evaluate the sampled trained nodes' own models; keep per-node results."""
        if self.fraction_evaluate == 0.0:
            return None
        nodes = [n for n in self.sample(state, grid, purpose="evaluate") if n in self.trained]
        results = self._evaluate(grid, state, "evaluate", nodes)
        self.node_metrics[state.server_round] = results
        return self.mean_metrics(results)

    @staticmethod
    def mean_metrics(results: Mapping[int, Mapping[str, float]]) -> MetricRecord | None:
        """Example-weighted mean ``accuracy`` and ``loss`` over nodes (None when empty)."""
        if not results:
            return None
        w = np.array([m["num-examples"] for m in results.values()])
        acc = np.array([m["accuracy"] for m in results.values()])
        loss = np.array([m["loss"] for m in results.values()])
        return MetricRecord(
            {
                "accuracy": float((w * acc).sum() / w.sum()),
                "loss": float((w * loss).sum() / w.sum()),
                "nodes": len(results),
            }
        )
