"""The round engine's reply machinery: a phase's messages out, its replies checked on the way in.

Split out of :mod:`flwr_fsl.core.engine`, whose :class:`~flwr_fsl.core.engine.PhasedStrategy`
methods ``prepare`` / ``receive`` / ``stream`` / ``send_phase`` / ``stream_phase`` delegate here
(they stay the overridable entry points). This module holds the part that must be the same for
every strategy: tagging each message with its round and counting the bytes each way
(:func:`prepare_messages`), and checking every reply before it is accepted, both for a whole
phase at once (:func:`receive_replies`) and one pull at a time (:func:`stream_replies`).
Rejected nodes are dropped with their reason in
:attr:`RoundState.dropped <flwr_fsl.core.engine.RoundState.dropped>`.

**Which reply is a node's answer.** Each reply is counted for a node
(:func:`reply_node`: its source, or for the SuperLink's own error replies the node its
request went to) and checked against the round and phase: an error reply, a reply tagged
for another round, of another message type, or from a node that was not asked is not an
answer. Such a reply blocks nothing: the node's valid reply is still taken when it comes, and
the node is dropped with that reason only if none does (a node that was not asked is dropped
at once). Among a node's replies that pass the checks:

- identical replies (one content, sent twice: a duplicate) are taken once; harmless;
- different replies to one request (equivocation: a stale or replayed reply beside the fresh
  one) drop the node: neither can be told to be the genuine one, and keeping either could
  put a stale update into the aggregate;
- the one reply taken is parsed (``parse``); a :class:`~flwr_fsl.core.errors.ClientInputError`
  drops the node with the reason.

Streamed phases sort each pull whole before parsing any of it, so a duplicate or an
equivocation inside a pull costs at most that node; a Flower grid forgets a request once a
reply to it came, so no later pull brings another reply of it (were one to come, it is ignored:
the reply taken first may already be in the aggregate). A duplicated reply never fails a round.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import TYPE_CHECKING, TypeVar

from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.serde import recorddict_to_proto
from flwr.serverapp import Grid
from flwr.supercore import log

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.phases import Phase, PhaseBody
from flwr_fsl.core.traffic import content_bytes

if TYPE_CHECKING:  # the engine imports this module; RoundState is only an annotation here
    from flwr_fsl.core.engine import RoundState

__all__ = [
    "aggregate_client_metrics",
    "client_error_line",
    "phase_contents",
    "prepare_messages",
    "receive_replies",
    "reject",
    "reply_node",
    "reply_parser",
    "stream_replies",
]

T = TypeVar("T")
Req = TypeVar("Req", bound=PhaseBody)
Rep = TypeVar("Rep", bound=PhaseBody)


def prepare_messages(
    state: RoundState, phase: str, contents: Mapping[int, RecordDict], message_type: str
) -> list[Message]:
    """Build a phase's messages, tag them with the round, count the bytes.

    The body of :meth:`PhasedStrategy.prepare <flwr_fsl.core.engine.PhasedStrategy.prepare>`,
    which documents it.
    """
    sizes: dict[int, int] = {}
    messages = []
    for node, content in contents.items():
        key = id(content)
        if key not in sizes:
            sizes[key] = content_bytes(content)
        state.phase(phase).down_bytes[node] = sizes[key]
        # Replies inherit the group id, so a reply to an earlier round is recognisable.
        messages.append(
            Message(
                content,
                dst_node_id=node,
                message_type=message_type,
                group_id=str(state.server_round),
            )
        )
    state._asked[phase] = (message_type, set(contents))
    # Their ids are set when the grid pushes them: reply_node maps error replies back.
    state._sent.extend(m.metadata for m in messages)
    return messages


def receive_replies(
    state: RoundState,
    phase: str,
    replies: Iterable[Message],
    parse: Callable[[int, RecordDict], T] | None = None,
    *,
    shrink: bool = True,
) -> dict[int, T]:
    """Validate a phase's replies; drop the bad ones with a reason; shrink the survivors.

    The body of :meth:`PhasedStrategy.receive <flwr_fsl.core.engine.PhasedStrategy.receive>`,
    which documents it; the rules for several replies of one node are the module's.
    """
    book = _ReplyBook(state, phase, shrink)
    accepted: dict[int, T] = {}
    for node, reply in book.sort(list(replies)):
        value, reason = _parsed(node, reply, parse)
        if reason is None:
            accepted[node] = value  # type: ignore[assignment]
        else:
            reject(state, node, f"{phase}: {reason}", shrink)
    book.finish(list(accepted))
    return accepted


def stream_replies(
    grid: Grid,
    state: RoundState,
    phase: str,
    messages: list[Message],
    parse: Callable[[int, RecordDict], T] | None = None,
    timeout: float | None = None,
) -> Iterator[tuple[int, T]]:
    """Push a phase's messages and yield each accepted, parsed reply as it arrives.

    The body of :meth:`PhasedStrategy.stream <flwr_fsl.core.engine.PhasedStrategy.stream>`,
    which documents it. Each pull is sorted whole (:class:`_ReplyBook`) before any of its
    replies is parsed, so two replies of one node in one pull are told apart before either
    reaches the caller; a node's request leaves the pending set with its first reply, so a
    later pull cannot bring another reply of it from a Flower grid.
    """
    book = _ReplyBook(state, phase, True)
    pending = set(grid.push_messages(messages)) if messages else set()
    del messages
    wait = state.timeout if timeout is None else timeout
    deadline = None if wait is None else time.monotonic() + wait
    interval = float(getattr(grid, "pull_interval", 0.1))
    synchronous = bool(getattr(grid, "synchronous", False))
    pause: Callable[[float], None] = getattr(grid, "pause", time.sleep)
    yielded: list[int] = []
    while pending:
        replies = list(grid.pull_messages(pending))
        pending.difference_update(r.metadata.reply_to_message_id for r in replies)
        batch = book.sort(replies)
        del replies
        while batch:
            node, reply = batch.pop(0)
            value, reason = _parsed(node, reply, parse)
            del reply
            if reason is None:
                yielded.append(node)
                yield node, value  # type: ignore[misc]
            else:
                reject(state, node, f"{phase}: {reason}", True)
        if pending:
            # A synchronous grid (InProcessGrid) had every reply it will ever have at once.
            if synchronous or (deadline is not None and time.monotonic() >= deadline):
                break
            pause(interval)
    book.finish(yielded)


def _parsed(
    node: int, reply: Message, parse: Callable[[int, RecordDict], T] | None
) -> tuple[T | RecordDict | None, str | None]:
    """Parse one reply that passed the checks: ``(value, None)`` or ``(None, reason)``."""
    try:
        return (parse(node, reply.content) if parse else reply.content), None
    except ClientInputError as err:
        return None, str(err) or type(err).__name__


def reply_node(state: RoundState, reply: Message) -> int:
    """Return the node a reply answers for.

    A Flower error reply that the SuperLink makes for a node that did not answer ("Node
    Unavailable", "Reply Message Unavailable") carries the SuperLink's own node id (1) as its
    source; it is counted for the node its request was sent to, found by
    ``reply_to_message_id`` among this round's messages. Any other reply counts for its
    ``src_node_id``.

    Parameters
    ----------
    state : RoundState
        The round (its sent messages' metadata).
    reply : Message
        A reply.

    Returns
    -------
    int
        The node id.
    """
    src = reply.metadata.src_node_id
    if reply.has_error():
        target = state._targets.get(reply.metadata.reply_to_message_id)
        if target is None:  # ids are set when the grid pushed: index them once, lazily
            for meta in state._sent:
                if meta.message_id:
                    state._targets[meta.message_id] = meta.dst_node_id
            target = state._targets.get(reply.metadata.reply_to_message_id)
        return src if target is None else target
    return src


@dataclass
class _ReplyBook:
    """One phase's bookkeeping of which node answered, and how (the module's rules)."""

    state: RoundState
    phase: str
    shrink: bool
    asked: set[int] = field(init=False)
    message_type: str = field(init=False)
    taken: set[int] = field(default_factory=set)  # nodes whose one reply went to parsing
    refused: dict[int, str] = field(default_factory=dict)  # asked nodes' failed tag checks

    def __post_init__(self) -> None:
        self.message_type, self.asked = self.state._asked.get(self.phase, ("", set()))

    def sort(self, replies: list[Message]) -> list[tuple[int, Message]]:
        """Check one pull's replies; return each new node's one reply, in arrival order."""
        valid: dict[int, list[Message]] = {}
        for reply in replies:
            node = reply_node(self.state, reply)
            if reply.has_content():
                traffic = self.state.phase(self.phase)
                traffic.up_bytes[node] = traffic.up_bytes.get(node, 0) + content_bytes(
                    reply.content
                )
            reason = _reply_problem(self.state, node, reply, self.message_type, self.asked)
            if reason is not None and node in self.asked:
                # Not this request's answer: it blocks nothing; it is the node's reason to be
                # dropped only if no valid reply of it comes.
                self.refused.setdefault(node, reason)
                log(WARNING, "round %s %s: node %s: ignoring a reply: %s",
                    self.state.server_round, self.phase, node, reason)  # fmt: skip
            elif reason is not None:
                reject(self.state, node, f"{self.phase}: {reason}", self.shrink)
            elif node in self.taken:
                log(WARNING, "round %s %s: node %s: ignoring a reply after the one taken",
                    self.state.server_round, self.phase, node)  # fmt: skip
            else:
                valid.setdefault(node, []).append(reply)
        out = []
        for node, group in valid.items():
            self.taken.add(node)
            if len(group) > 1 and len({_digest(r.content) for r in group}) > 1:
                reject(self.state, node, f"{self.phase}: {len(group)} different replies to "
                       "one request (equivocation: neither can be told to be the genuine one)",
                       self.shrink)  # fmt: skip
                continue
            if len(group) > 1:
                log(INFO, "round %s %s: node %s: %d identical replies taken once",
                    self.state.server_round, self.phase, node, len(group))  # fmt: skip
            out.append((node, group[0]))
        return out

    def finish(self, accepted: list[int]) -> None:
        """Drop the asked nodes that gave no valid reply; the survivors become ``accepted``."""
        for node in self.asked - self.taken:
            reason = self.refused.get(node, "no reply before the timeout")
            reject(self.state, node, f"{self.phase}: {reason}", self.shrink)
        if self.shrink:
            self.state.survivors = list(accepted)
        log(
            INFO,
            "round %s %s: %d accepted, %d asked",
            self.state.server_round,
            self.phase,
            len(accepted),
            len(self.asked),
        )


def _digest(content: RecordDict) -> bytes:
    """SHA-256 of a content's deterministic protobuf encoding (equal contents, equal digest)."""
    encoded = recorddict_to_proto(content).SerializeToString(deterministic=True)
    return hashlib.sha256(encoded).digest()


def reject(state: RoundState, node: int, reason: str, shrink: bool) -> None:
    """Drop ``node`` with ``reason`` (``shrink``), or only log it (evaluation)."""
    if shrink:
        state.drop(node, reason)
    else:
        log(WARNING, "round %s: ignoring node %s: %s", state.server_round, node, reason)


def reply_parser(
    phase: Phase[Req, Rep], accept: Callable[[int, Rep], object] | None
) -> Callable[[int, RecordDict], Rep]:
    """Return the ``parse`` of a typed phase: its reply codec, then ``accept`` (if any)."""

    def parse(node: int, content: RecordDict) -> Rep:
        reply = phase.parse_reply(content)
        if accept is not None:
            accept(node, reply)  # inside the engine's parse: its ClientInputError drops the node
        return reply

    return parse


def phase_contents(phase: Phase[Req, Rep], requests: Mapping[int, Req]) -> dict[int, RecordDict]:
    """Node id -> content built by ``phase.build``; one content per distinct request object."""
    # One content per distinct request object: shared requests are built and sized once.
    built: dict[int, RecordDict] = {}
    contents = {}
    for node, request in requests.items():
        key = id(request)
        if key not in built:
            built[key] = phase.build(request)
        contents[node] = built[key]
    return contents


_FLOWER_REASON = re.compile(r"<class '([^']+)'>:<'(.*)'>", re.DOTALL)
_RAY_MESSAGE = "occurred. Message: "


def client_error_line(reason: str | None, limit: int = 300) -> str:
    """Return a client's error reply reason as one line: the exception and its message.

    Flower reports a ClientApp's exception as ``<class 'pkg.Error'>:<'message'>``; under
    Ray the message is the actor's whole traceback ending in ``... occurred. Message:
    <the exception's message>``. Either way the line kept is the exception's own message
    (e.g. a :class:`~flwr_fsl.core.errors.ConfigurationError` naming its key), with the
    class name when Flower kept it.

    Parameters
    ----------
    reason : str
        ``reply.error.reason``.
    limit : int
        Longest line returned (longer ones end in ``...``).

    Returns
    -------
    str
        One line.
    """
    reason = reason or ""
    match = _FLOWER_REASON.fullmatch(reason.strip())
    kind, text = (match.group(1).rsplit(".", 1)[-1], match.group(2)) if match else ("", reason)
    if _RAY_MESSAGE in text:  # Ray's traceback: the class is lost, the message is last
        kind, text = "", text.rsplit(_RAY_MESSAGE, 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        line = f"{kind}: (no message)" if kind else "(no reason given)"
    elif lines[0].startswith("Traceback"):  # a formatted traceback: its last line says it
        line = lines[-1]
    else:
        line = f"{kind}: {lines[0]}" if kind else lines[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _reply_problem(
    state: RoundState, node: int, reply: Message, message_type: str, asked: set[int]
) -> str | None:
    """Why a reply is not an answer to this phase's request to ``node`` (None: it is)."""
    if reply.has_error():
        return f"client error: {client_error_line(reply.error.reason)}"
    if reply.metadata.group_id != str(state.server_round):
        return f"late reply for round {reply.metadata.group_id!r}"
    if node not in asked:
        return "reply from a node that was not asked in this phase"
    if reply.metadata.message_type != message_type:
        return f"reply of type {reply.metadata.message_type!r} to a {message_type!r} message"
    return None


def aggregate_client_metrics(
    aggregate: Callable[[list[RecordDict], str], MetricRecord],
    contents: list[RecordDict],
    weighted_by_key: str,
) -> MetricRecord:
    """Aggregate the replies' metrics as ``FedAvg`` does; inconsistent ones are refused.

    Flower's ``FedAvg`` checks that every reply's MetricRecord has the same keys before it
    averages (its ``aggregate_metricrecords`` would otherwise divide a metric that only some
    clients report by every client's weight: a true mean of 1.0 reported as 0.5) and raises
    ``InconsistentMessageReplies``, which ends the run. The same check runs here, but the key
    set is client input, so it must not end the run: the result is an empty record, with a
    warning naming the keys. The same holds when ``aggregate`` raises (a metric a list in one
    reply and a number in another, or lists of other lengths).

    Parameters
    ----------
    aggregate : Callable[[list[RecordDict], str], MetricRecord]
        The strategy's ``train_metrics_aggr_fn`` or ``evaluate_metrics_aggr_fn``.
    contents : list[RecordDict]
        The accepted replies' contents.
    weighted_by_key : str
        The weight's metric name.

    Returns
    -------
    MetricRecord
        The aggregate, or an empty record when the replies disagree.
    """
    key_sets = [frozenset(k for r in c.metric_records.values() for k in r.keys()) for c in contents]
    if len(set(key_sets)) > 1:
        differ = sorted(frozenset().union(*key_sets) - frozenset.intersection(*key_sets))
        log(
            WARNING,
            "client metrics not aggregated: the replies' MetricRecords have different keys "
            "(%s reported by some clients only; FedAvg raises InconsistentMessageReplies)",
            differ,
        )
        return MetricRecord()
    try:
        return aggregate(contents, weighted_by_key)
    except (TypeError, ValueError) as err:
        log(WARNING, "client metrics not aggregated (inconsistent across replies): %s", err)
        return MetricRecord()
