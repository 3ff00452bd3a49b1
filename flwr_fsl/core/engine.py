"""The round engine: one state object per round and one ``send`` that validates replies.

Every strategy of this package is a :class:`PhasedStrategy`. A round is a plain sequence of
phases, each a call to :meth:`PhasedStrategy.send`::

    def train_round(self, grid, state, arrays, config):
        nodes = self.sample(state, grid)
        queries = self.send(grid, state, "psr", {n: query for n in nodes}, "query.psr", parse=...)
        uploads = self.send(grid, state, "train", {n: train_msg(n) for n in queries}, ...)
        return aggregate(uploads)

:meth:`~PhasedStrategy.send` is the one place that tags messages with the round, records the
bytes each way, and drops a node whose reply is an error, late (another round), for another
phase, two different replies, from a node that was not asked, or that ``parse`` rejects with a
:class:`~flwr_fsl.core.errors.ClientInputError` — each with its reason in
:attr:`RoundState.dropped` — and shrinks :attr:`RoundState.survivors` to the nodes whose reply
was accepted. A node that does not answer before the timeout is dropped the same way. A phase
may send a different message to each node.
The checks themselves and the pull loop behind :meth:`~PhasedStrategy.stream` live in
:mod:`flwr_fsl.core.replies`; the methods here are the entry points strategies call or override.

:meth:`~PhasedStrategy.start` keeps the signature and :class:`~flwr.serverapp.strategy.Result`
of Flower's ``Strategy.start``: per round it runs :meth:`~PhasedStrategy.train_round` and
:meth:`~PhasedStrategy.evaluate_round`, then the centralized ``evaluate_fn``. A
:class:`~flwr_fsl.core.errors.RoundFailedError` raised inside a round fails that round (logged,
kept in :attr:`RoundState.failure`, :meth:`~PhasedStrategy.round_failed` called) and leaves
the global model unchanged; the run goes on. Single-phase strategies also keep Flower's
``configure_train`` / ``aggregate_train`` pair (the default ``train_round`` is exactly those
two around one ``send``), so Flower's own wrappers and loops can drive them too.

Client sampling is reproducible with ``sampling_seed``: round ``r`` samples with
``random.Random(seed * 1_000_003 + r)`` over the grid's node list (evaluation with its own
stream), independent of whatever else draws from the module-level :mod:`random` (Flower's
heartbeat and retry code do).
"""

from __future__ import annotations

import io
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from logging import INFO, WARNING
from typing import Any, TypeVar

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import log_strategy_start_info
from flwr.supercore import log

from flwr_fsl.core.checks import (
    check_callable,
    check_federation,
    check_int,
    check_optional_int,
    check_real,
    check_sampling,
    check_str,
)
from flwr_fsl.core.errors import (
    ClientInputError,
    ConfigurationError,
    RoundFailedError,
    RunFailedError,
)
from flwr_fsl.core.phases import Phase, PhaseBody, refuse_uncalled_overrides
from flwr_fsl.core.privacy import PrivacyAccount
from flwr_fsl.core.progress import report_round
from flwr_fsl.core.replies import (
    aggregate_client_metrics,
    phase_contents,
    prepare_messages,
    receive_replies,
    reply_parser,
    stream_replies,
)
from flwr_fsl.core.rounds import RoundState, wait_for_nodes
from flwr_fsl.core.traffic import RoundTraffic, traffic_table

__all__ = ["MultiPhaseStrategy", "PhasedStrategy", "RoundState"]

T = TypeVar("T")
Req = TypeVar("Req", bound=PhaseBody)
Rep = TypeVar("Rep", bound=PhaseBody)


class PhasedStrategy(FedAvg):
    """Flower ``FedAvg``'s knobs and ``start`` with rounds made of validated phases.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes, \
min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key, \
train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in :class:`flwr.serverapp.strategy.FedAvg`.
    sampling_seed : int, optional
        Seed of reproducible client sampling (None: Flower's unseeded sampling).
    max_weight : float
        Largest ``weighted_by_key`` (and per-index count) a reply may carry; a client above it
        is dropped. A finite but huge weight (``1e308``) would otherwise overflow the
        weighted sums and fail the round for everyone.

    Raises
    ------
    ConfigurationError
        If an argument has the wrong type or range (a fraction not a number in [0, 1], a
        minimum not an int >= 0, a key not a non-empty string, an aggregation function not
        callable, ``sampling_seed`` not an int or None, ``max_weight`` not finite in
        (0, 1e300]); the message names the argument (:mod:`flwr_fsl.core.checks`).

    Attributes
    ----------
    rounds : dict[int, RoundState]
        Round number -> its state (:attr:`traffic`, :attr:`dropped` and
        :attr:`failed_rounds` are views of it).
    progress : bool or None
        One line per round on stdout (:mod:`flwr_fsl.core.progress`); None: on unless
        ``FLWR_FSL_PROGRESS=0``.
    """

    progress: bool | None = None

    def __init__(  # noqa: PLR0913
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        evaluate_metrics_aggr_fn: Callable[[list[RecordDict], str], MetricRecord] | None = None,
        *,
        sampling_seed: int | None = None,
        max_weight: float = 1e9,
    ) -> None:
        # Every argument is checked here, before round 1, by name (flwr_fsl.core.checks).
        sampling = check_sampling(
            fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
            min_available_nodes,
        )  # fmt: skip
        keys = {"weighted_by_key": weighted_by_key, "arrayrecord_key": arrayrecord_key}
        for name, key in {**keys, "configrecord_key": configrecord_key}.items():
            check_str(name, key)
        check_callable("train_metrics_aggr_fn", train_metrics_aggr_fn)
        check_callable("evaluate_metrics_aggr_fn", evaluate_metrics_aggr_fn)
        sampling_seed = check_optional_int("sampling_seed", sampling_seed)
        # Bounded well below float64's range so the sum of many clients' weights is finite.
        max_weight = check_real("max_weight", max_weight, 0.0, 1e300, low_open=True)
        super().__init__(
            *sampling, weighted_by_key=weighted_by_key, arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key, train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )  # fmt: skip
        self.check_overrides()
        self.sampling_seed = sampling_seed
        self.max_weight = float(max_weight)
        self.privacy_account: PrivacyAccount | None = None
        self.rounds: dict[int, RoundState] = {}
        self._timeout = 3600.0

    def check_overrides(self) -> None:
        """Refuse, at construction, overrides of methods this strategy never calls (none)."""

    # -- views of the round states ------------------------------------------------------------
    @property
    def traffic(self) -> list[RoundTraffic]:
        """Bytes per node for every phase of every round, in order."""
        return [t for state in self.rounds.values() for t in state.traffic]

    @property
    def dropped(self) -> dict[int, dict[int, str]]:
        """Round -> node id -> why the node left the round."""
        return {r: dict(state.dropped) for r, state in self.rounds.items()}

    @property
    def failed_rounds(self) -> dict[int, str]:
        """Round -> why it failed (the model was left unchanged)."""
        return {r: s.failure for r, s in self.rounds.items() if s.failure is not None}

    def round_state(self, server_round: int) -> RoundState:
        """Return the state of ``server_round``, creating it on first use."""
        if server_round not in self.rounds:
            self.rounds[server_round] = RoundState(server_round, self._timeout)
        return self.rounds[server_round]

    # -- the building blocks of a round -------------------------------------------------------
    def sample(
        self,
        state: RoundState,
        grid: Grid,
        *,
        fraction: float | None = None,
        min_nodes: int | None = None,
        purpose: str = "train",
    ) -> list[int]:
        """Sample nodes as Flower's ``FedAvg`` does, reproducibly under ``sampling_seed``.

        Parameters
        ----------
        state : RoundState
            The round; for ``purpose="train"`` its :attr:`~RoundState.sampled` and
            :attr:`~RoundState.survivors` are set to the sample.
        grid : Grid
            Where the nodes are (waits until ``min_available_nodes`` are connected).
        fraction, min_nodes : float, int, optional
            Default to ``fraction_train`` / ``min_train_nodes`` (or the evaluate ones).
        purpose : str
            ``"train"`` or ``"evaluate"``: separate random streams.

        Returns
        -------
        list[int]
            The sampled node ids.
        """
        train = purpose == "train"
        if fraction is None:
            fraction = self.fraction_train if train else self.fraction_evaluate
        if min_nodes is None:
            min_nodes = self.min_train_nodes if train else self.min_evaluate_nodes
        if fraction == 0.0:
            return []
        all_nodes = list(grid.get_node_ids())
        size = max(int(len(all_nodes) * fraction), min_nodes)
        needed = max(self.min_available_nodes, size)
        if len(all_nodes) < needed:
            all_nodes = wait_for_nodes(grid, needed, state.timeout)
            if len(all_nodes) < needed:  # nodes left since start's check: fail, do not hang
                raise RoundFailedError(f"{len(all_nodes)} nodes connected, {needed} needed")
        rng: random.Random | Any = random  # Flower's behaviour without a seed
        if self.sampling_seed is not None:
            r = state.server_round
            rng = random.Random(
                self.sampling_seed * 1_000_003 + r
                if train
                else f"{purpose}/{self.sampling_seed}/{r}"
            )
        nodes: list[int] = rng.sample(all_nodes, size)
        log(INFO, "%s: sampled %d nodes (out of %d)", purpose, len(nodes), len(all_nodes))
        if train:
            state.sampled, state.survivors = list(nodes), list(nodes)
        return nodes

    def prepare(
        self,
        state: RoundState,
        phase: str,
        contents: Mapping[int, RecordDict],
        message_type: str,
    ) -> list[Message]:
        """Build a phase's messages (one per node), tag them with the round, count the bytes.

        Parameters
        ----------
        state : RoundState
            The round.
        phase : str
            The phase's name (a traffic row, and the key replies are matched against).
        contents : Mapping[int, RecordDict]
            Node id -> the content sent to it (shared objects are sized once).
        message_type : str
            Flower message type (``"train"``, ``"evaluate"``, ``"query.<name>"``).

        Returns
        -------
        list[Message]
            The messages, ready for ``grid.send_and_receive``.
        """
        return prepare_messages(state, phase, contents, message_type)

    def receive(
        self,
        state: RoundState,
        phase: str,
        replies: Iterable[Message],
        parse: Callable[[int, RecordDict], T] | None = None,
        *,
        shrink: bool = True,
    ) -> dict[int, T]:
        """Validate a phase's replies; drop the bad ones with a reason; shrink the survivors.

        Parameters
        ----------
        state : RoundState
            The round.
        phase : str
            The phase the replies answer (as given to :meth:`prepare`).
        replies : Iterable[Message]
            What the grid returned.
        parse : Callable[[int, RecordDict], T], optional
            Turns a reply's content into the phase's value; raises
            :class:`~flwr_fsl.core.errors.ClientInputError` to drop the node (nothing broader is
            caught: a bug is not a bad client). Default: the content itself.
        shrink : bool
            False for phases whose failures do not remove a node from the round (evaluation):
            problems are only logged.

        Returns
        -------
        dict[int, T]
            Node id -> parsed reply, for the accepted nodes (in reply order).
        """
        return receive_replies(state, phase, replies, parse, shrink=shrink)

    def stream(
        self,
        grid: Grid,
        state: RoundState,
        phase: str,
        messages: list[Message],
        parse: Callable[[int, RecordDict], T] | None = None,
        timeout: float | None = None,
    ) -> Iterator[tuple[int, T]]:
        """Push a phase's messages and yield each accepted, parsed reply as it arrives.

        The same checks as :meth:`receive`, one pull at a time, so the caller can process
        (and free) each reply before the next is pulled: a round's uploads never have to be in
        memory together. When the generator is exhausted, nodes that did not reply are dropped
        and the survivors are the nodes yielded.

        It pulls every ``grid.pull_interval`` seconds (0.1 if the grid has none) until every
        node replied or the timeout passed, waiting through ``grid.pause(seconds)`` where the
        grid has one (so a metering grid counts the wait as grid time); a grid whose
        ``synchronous`` attribute is true (:class:`~flwr_fsl.testing.InProcessGrid`) is
        pulled once.

        Parameters
        ----------
        grid : Grid
            The Flower grid (``push_messages`` / ``pull_messages``).
        state, phase
            As in :meth:`prepare`, which built ``messages``.
        messages : list[Message]
            The phase's messages (from :meth:`prepare` or ``configure_train``).
        parse : Callable[[int, RecordDict], T], optional
            As in :meth:`receive`.
        timeout : float, optional
            Seconds to wait for all replies (default: the round's timeout).

        Yields
        ------
        tuple[int, T]
            Node id and parsed reply, for each accepted node.

        """
        replies = stream_replies(grid, state, phase, messages, parse, timeout)
        del messages  # the generator pushes them and lets go; so does this frame
        yield from replies

    def send(
        self,
        grid: Grid,
        state: RoundState,
        phase: str,
        contents: Mapping[int, RecordDict],
        message_type: str,
        parse: Callable[[int, RecordDict], T] | None = None,
        timeout: float | None = None,
        *,
        shrink: bool = True,
    ) -> dict[int, T]:
        """Send one phase and return the accepted, parsed replies.

        :meth:`prepare`, then ``grid.send_and_receive``, then :meth:`receive`.

        Parameters
        ----------
        grid : Grid
            The Flower grid.
        state, phase, contents, message_type
            As in :meth:`prepare`.
        parse, shrink
            As in :meth:`receive`.
        timeout : float, optional
            Seconds to wait (default: the round's timeout).

        Returns
        -------
        dict[int, T]
            Node id -> parsed reply, for the accepted nodes.
        """
        messages = self.prepare(state, phase, contents, message_type)
        replies = (
            grid.send_and_receive(messages, timeout=state.timeout if timeout is None else timeout)
            if messages
            else []
        )
        return self.receive(state, phase, replies, parse, shrink=shrink)

    def send_phase(
        self,
        grid: Grid,
        state: RoundState,
        phase: Phase[Req, Rep],
        requests: Mapping[int, Req],
        *,
        label: str | None = None,
        accept: Callable[[int, Rep], object] | None = None,
        timeout: float | None = None,
        shrink: bool = True,
    ) -> dict[int, Rep]:
        """Send a typed :class:`~flwr_fsl.core.phases.Phase`; return the parsed replies.

        :meth:`send` with the contents built by ``phase.build`` and the replies parsed by
        ``phase.reply.from_record`` (a reply it rejects drops its node with the reason).

        Parameters
        ----------
        grid : Grid
            The Flower grid.
        state : RoundState
            The round.
        phase : Phase
            The exchange.
        requests : Mapping[int, Req]
            Node id -> its request (one object given to many nodes is encoded once).
        label : str, optional
            The traffic row and reply-matching key (default: the phase's name); distinct
            labels let one round run the same phase for several instances.
        accept : Callable[[int, Rep], object], optional
            Called on each parsed reply before it is accepted (e.g. to add it to a protocol
            server); a :class:`~flwr_fsl.core.errors.ClientInputError` it raises drops the node.
        timeout, shrink
            As in :meth:`send`.

        Returns
        -------
        dict[int, Rep]
            Node id -> parsed reply, for the accepted nodes.
        """
        return self.send(
            grid, state, label or phase.name, phase_contents(phase, requests),
            phase.message_type, reply_parser(phase, accept), timeout, shrink=shrink,
        )  # fmt: skip

    def stream_phase(
        self,
        grid: Grid,
        state: RoundState,
        phase: Phase[Req, Rep],
        requests: Mapping[int, Req],
        *,
        label: str | None = None,
        accept: Callable[[int, Rep], object] | None = None,
        timeout: float | None = None,
    ) -> Iterator[tuple[int, Rep]]:
        """Send a typed phase and yield each accepted reply as it arrives (:meth:`stream`).

        Parameters are those of :meth:`send_phase`.

        Yields
        ------
        tuple[int, Rep]
            Node id and parsed reply, for each accepted node.
        """
        name = label or phase.name
        messages = self.prepare(state, name, phase_contents(phase, requests), phase.message_type)
        yield from self.stream(grid, state, name, messages, reply_parser(phase, accept), timeout)

    def phase_metrics(self, state: RoundState, phase: str = "train") -> MetricRecord:
        """Mean bytes per client of ``phase`` as metrics (down- and up-bytes-per-client)."""
        traffic = state.phase(phase)
        return MetricRecord(
            {
                "down-bytes-per-client": traffic.mean_down_bytes,
                "up-bytes-per-client": traffic.mean_up_bytes,
            }
        )

    def weight_of(self, content: RecordDict) -> float:
        """Return a reply's ``weighted_by_key`` metric.

        Raises
        ------
        ClientInputError
            If the reply has not exactly one MetricRecord, or the weight is missing,
            not a number, not finite, not positive or above ``max_weight``.
        """
        records = list(content.metric_records.values())
        if len(records) != 1:
            raise ClientInputError(f"expected one MetricRecord, got {len(records)}")
        value = records[0].get(self.weighted_by_key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ClientInputError(f"missing numeric {self.weighted_by_key!r} in metrics")
        if not (math.isfinite(value) and value > 0):
            raise ClientInputError(f"{self.weighted_by_key!r} must be finite and > 0")
        if value > self.max_weight:
            raise ClientInputError(f"{self.weighted_by_key!r} exceeds max_weight")
        return float(value)

    # -- a round ------------------------------------------------------------------------------
    def train_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Run one training round; return the new global arrays (None: unchanged) and metrics.

        The default is Flower's pair: ``configure_train``, one ``send``, ``aggregate_train``.
        Multi-phase strategies override it with their sequence of :meth:`send` calls.
        """
        messages = list(self.configure_train(state.server_round, arrays, config, grid))
        replies = grid.send_and_receive(messages, timeout=state.timeout) if messages else []
        return self.aggregate_train(state.server_round, replies)

    def evaluate_round(
        self, grid: Grid, state: RoundState, arrays: ArrayRecord, config: ConfigRecord
    ) -> MetricRecord | None:
        """Run federated evaluation (Flower's ``configure_evaluate`` / ``aggregate_evaluate``)."""
        messages = list(self.configure_evaluate(state.server_round, arrays, config, grid))
        replies = grid.send_and_receive(messages, timeout=state.timeout) if messages else []
        return self.aggregate_evaluate(state.server_round, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample nodes as ``FedAvg`` does and send them the model (bytes accounted)."""
        state = self.round_state(server_round)
        nodes = self.sample(state, grid, purpose="evaluate")
        if not nodes:
            return []
        content = RecordDict(
            {
                self.arrayrecord_key: arrays,
                self.configrecord_key: ConfigRecord({**dict(config), "server-round": server_round}),
            }
        )
        return self.prepare(state, "evaluate", dict.fromkeys(nodes, content), MessageType.EVALUATE)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Aggregate the metrics of well-formed replies (the others are logged and skipped)."""
        state = self.round_state(server_round)
        valid = self.receive(
            state, "evaluate", replies, lambda _n, c: (self.weight_of(c), c)[1], shrink=False
        )
        if not valid:
            return None
        return self.client_metrics(self.evaluate_metrics_aggr_fn, list(valid.values()))

    def client_metrics(
        self,
        aggregate: Callable[[list[RecordDict], str], MetricRecord],
        contents: list[RecordDict],
    ) -> MetricRecord:
        """Aggregate as ``FedAvg``; inconsistent keys give ``{}`` and a warning, not a raise.

        See :func:`~flwr_fsl.core.replies.aggregate_client_metrics`.
        """
        return aggregate_client_metrics(aggregate, contents, self.weighted_by_key)

    def round_failed(self, state: RoundState, error: RoundFailedError) -> None:
        """Release what the failed round holds (override: e.g. abort it on a helper)."""

    def fail_round(self, state: RoundState, error: RoundFailedError) -> None:
        """Record ``error`` as the round's failure and release what the round holds."""
        state.fail(f"{type(error).__name__}: {error}")
        self.round_failed(state, error)

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run ``num_rounds`` rounds of :meth:`train_round` and :meth:`evaluate_round`.

        Same signature and :class:`~flwr.serverapp.strategy.Result` as Flower's
        ``Strategy.start``; ``result.arrays`` is the initial model when no round produced
        an aggregate (Flower would leave it empty).

        Raises
        ------
        ConfigurationError
            Before round 1: ``num_rounds`` or ``timeout`` is invalid, or the federation is
            too small for the sampling or the protocol (:meth:`check_federation`).
        RunFailedError
            After the final results are logged, if clients were sampled but no round produced
            a result (every round failed or no client answered): the ServerApp ends non-zero
            instead of "completed" with an untrained model (``err.result`` is the Result).
        """
        num_rounds = check_int("num_rounds", num_rounds, 0)
        self._timeout = check_real("timeout", timeout, 0.0, low_open=True)
        log(INFO, "Starting %s strategy:", type(self).__name__)
        log_strategy_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
        self.summary()
        log(INFO, "")
        if num_rounds:
            self.check_federation(grid)
        attempted: dict[int, str | None] = {}  # round that sampled -> failure (None: result)
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result = Result()
        t_start = time.time()
        if evaluate_fn:
            res = evaluate_fn(0, initial_arrays)
            log(INFO, "Initial global evaluation results: %s", res)
            if res is not None:
                result.evaluate_metrics_serverapp[0] = res
        arrays = initial_arrays
        for current in range(1, num_rounds + 1):
            log(INFO, "")
            log(INFO, "[ROUND %s/%s]", current, num_rounds)
            if not self._spend_privacy(current):
                break
            configs, began = (train_config, evaluate_config), time.time()
            arrays = self._run_round(grid, current, arrays, configs, evaluate_fn, result, attempted)
            report_round(self.rounds[current], num_rounds, result, began, self.progress)
        if not result.arrays:
            result.arrays = initial_arrays
        log(INFO, "Strategy execution finished in %.2fs", time.time() - t_start)
        self.log_privacy()
        log(INFO, "\nFinal results:\n")
        for line in [*io.StringIO(str(result)), *self.traffic_table().splitlines()]:
            log(INFO, "\t%s", line.strip("\n"))
        if attempted and all(reason is not None for reason in attempted.values()):
            reasons = "; ".join(f"round {r}: {why}" for r, why in attempted.items())
            raise RunFailedError(
                f"{type(self).__name__}: no round produced a result, the model is untrained "
                f"({reasons})",
                result,
            )
        return result

    def _run_round(
        self,
        grid: Grid,
        current: int,
        arrays: ArrayRecord,
        configs: tuple[ConfigRecord, ConfigRecord],
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
        result: Result,
        attempted: dict[int, str | None],
    ) -> ArrayRecord:
        """Run round ``current`` of :meth:`start`; return the global arrays after it."""
        self.rounds.pop(current, None)  # a fresh state per run of start()
        state = self.round_state(current)
        try:
            new_arrays, metrics = self.train_round(grid, state, arrays, configs[0])
        except RoundFailedError as err:
            self.fail_round(state, err)
            new_arrays, metrics = None, None
        if state.failure is not None:
            new_arrays, metrics = None, None
        if state.sampled or state.failure is not None:  # round -> why it produced nothing
            produced = bool(state.survivors) and (new_arrays is not None or metrics is not None)
            attempted[current] = None if produced else (state.failure or "no client answered")
        if new_arrays is not None:
            result.arrays = arrays = new_arrays
        if metrics is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", metrics)
            result.train_metrics_clientapp[current] = metrics
        evaluated = self.evaluate_round(grid, state, arrays, configs[1])
        if evaluated is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", evaluated)
            result.evaluate_metrics_clientapp[current] = evaluated
        if evaluate_fn:
            res = evaluate_fn(current, arrays)
            log(INFO, "\t└──> MetricRecord: %s", res)
            if res is not None:
                result.evaluate_metrics_serverapp[current] = res
        return arrays

    def round_minimum(self, sampled: int) -> tuple[int, str] | None:
        """Return the fewest clients a round of ``sampled`` needs, and the setting that says so.

        None: no minimum. Threshold protocols override it (SecAgg's ``t``, SESA's ``K_max + T``)
        so :meth:`check_federation` refuses a federation on which every round would fail.
        """
        return None

    def check_federation(self, grid: Grid) -> None:
        """Wait (at most ``timeout``) for ``min_available_nodes``; refuse a too small federation.

        Raises
        ------
        ConfigurationError
            If fewer than ``min_available_nodes`` nodes connected, a round would sample more
            nodes than are connected, or fewer than :meth:`round_minimum` (naming the setting).
        """
        nodes = wait_for_nodes(grid, self.min_available_nodes, self._timeout)
        check_federation(self, len(nodes), self.round_minimum)

    # -- privacy budget -----------------------------------------------------------------------
    def round_noise_multiplier(self) -> float | None:
        """Effective noise multiplier of the next round's release (``None``: this run adds none).

        Families with differential privacy override it; :meth:`start` spends it on
        :attr:`privacy_account` before each round and stops the run when the budget would be
        exceeded.
        """
        return None

    def privacy_stop_reason(self) -> str | None:
        """Why the run must stop though its account allows a round (e.g. SSA's S1 refused one).

        :meth:`start` then stops the run instead of failing every later round (None: go on).
        """
        return None

    def _spend_privacy(self, server_round: int) -> bool:
        """Spend the next round on the account; False (and a log line) when the budget is out."""
        stop = self.privacy_stop_reason()
        if stop is not None:
            log(WARNING, "stopping the run before round %s: %s", server_round, stop)
            return False
        account = self.privacy_account
        z = self.round_noise_multiplier()
        if account is None or z is None:
            return True
        reason = account.refusal(z)
        if reason is not None:
            log(WARNING, "stopping the run before round %s: %s", server_round, reason)
            return False
        # Spent before the round runs: a round that fails after the release still released.
        account.spend(z)
        return True

    def log_privacy(self) -> None:
        """Log the run's ``(ε, δ)``: from the account, or that no noise protects the release."""
        account = self.privacy_account
        if account is not None and self.round_noise_multiplier() is not None:
            log(INFO, "Differential privacy of this run: %s", account.describe())
        else:
            log(INFO, "Differential privacy of this run: none (epsilon = inf: no noise is added)")

    def traffic_table(self) -> str:
        """Return the per-round communication summary as a text table (MB per client)."""
        return traffic_table(self.traffic)


class MultiPhaseStrategy(PhasedStrategy):
    """A strategy whose round is several message phases, run by its own :meth:`train_round`.

    Flower's ``configure_train`` / ``aggregate_train`` pair describes a round of one train
    message and its replies; a multi-phase round (key advertisement before training, unmasking
    after it, a retrieval phase first) cannot be split into that pair without skipping a step
    or running it where a caller does not expect it. So the pair is refused with a
    :class:`~flwr_fsl.core.errors.ConfigurationError` that names the strategy, its phases and
    what to do instead, raised by the first call — before anything is sent. A Flower wrapper
    or loop that drives the pair (Flower's DP strategy wrappers, a custom ``Strategy.start``)
    therefore stops at round 1 with that message instead of running a partial protocol
    (e.g. noise added to an aggregate whose clipping never ran). :meth:`start`,
    ``configure_evaluate`` / ``aggregate_evaluate`` and ``summary`` work as in
    :class:`PhasedStrategy`.
    """

    PHASES: tuple[str, ...] = ()
    """The round's message phases, named in the refusal."""

    def check_overrides(self) -> None:
        """Refuse overriding the pair (:func:`~flwr_fsl.core.phases.refuse_uncalled_overrides`)."""
        methods = ("configure_train", "aggregate_train")
        refuse_uncalled_overrides(type(self), MultiPhaseStrategy, methods, self.PHASES)

    def _refusal(self, method: str) -> ConfigurationError:
        name = type(self).__name__
        phases = ", ".join(self.PHASES) or "several phases"
        return ConfigurationError(
            f"{name}.{method} is not available: a {name} round is several message phases "
            f"({phases}) that one configure_train/aggregate_train pair cannot carry. Run it with "
            f"{name}.start(grid, initial_arrays, num_rounds, ...); Flower's strategy wrappers "
            "(e.g. its DP wrappers) and loops that drive configure_train/aggregate_train "
            "cannot wrap it"
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Refuse: the round has several phases (class docstring).

        Raises
        ------
        ConfigurationError
            Always, naming the strategy and its phases.
        """
        raise self._refusal("configure_train")

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Refuse: the round has several phases (class docstring).

        Raises
        ------
        ConfigurationError
            Always, naming the strategy and its phases.
        """
        raise self._refusal("aggregate_train")
