"""The round engine's reply machinery: a phase's messages out, its replies checked on the way in.

Split out of :mod:`flwr_fsl.core.engine`, whose :class:`~flwr_fsl.core.engine.PhasedStrategy`
methods ``prepare`` / ``receive`` / ``stream`` / ``send_phase`` / ``stream_phase`` delegate here
(they stay the overridable entry points). This module holds the part that must be the same for
every strategy: tagging each message with its round and counting the bytes each way
(:func:`prepare_messages`), and checking every reply — an error, late (another round), for
another phase, a duplicate, from a node that was not asked, or rejected by ``parse`` with a
:class:`~flwr_fsl.core.errors.ClientInputError` — before it is accepted
(:func:`check_reply`), both for a whole phase at once (:func:`receive_replies`) and one reply
at a time (:func:`stream_replies`). Rejected nodes are dropped with their reason in
:attr:`RoundState.dropped <flwr_fsl.core.engine.RoundState.dropped>`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from logging import INFO, WARNING
from typing import TYPE_CHECKING, TypeVar

from flwr.app import Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from flwr_fsl.core.errors import ClientInputError, RoundFailedError
from flwr_fsl.core.phases import Phase, PhaseBody
from flwr_fsl.core.traffic import content_bytes

if TYPE_CHECKING:  # the engine imports this module; RoundState is only an annotation here
    from flwr_fsl.core.engine import RoundState

__all__ = [
    "aggregate_client_metrics",
    "check_reply",
    "finish_phase",
    "phase_contents",
    "prepare_messages",
    "receive_replies",
    "reject",
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
    which documents it.
    """
    asked = state._asked.get(phase, ("", set()))[1]
    accepted: dict[int, T] = {}
    seen: set[int] = set()
    for reply in replies:
        node, value, reason = check_reply(state, phase, reply, parse, asked, seen)
        if reason is None:
            accepted[node] = value  # type: ignore[assignment]
            continue
        # Two replies from one node: neither can be told to be the genuine one.
        accepted.pop(node, None)
        reject(state, node, f"{phase}: {reason}", shrink)
    finish_phase(state, phase, asked, seen, list(accepted), shrink)
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
    which documents it.
    """
    asked = state._asked.get(phase, ("", set()))[1]
    pending = set(grid.push_messages(messages)) if messages else set()
    del messages
    wait = state.timeout if timeout is None else timeout
    deadline = None if wait is None else time.monotonic() + wait
    interval = float(getattr(grid, "pull_interval", 0.1))
    synchronous = bool(getattr(grid, "synchronous", False))
    pause: Callable[[float], None] = getattr(grid, "pause", time.sleep)
    seen: set[int] = set()
    yielded: list[int] = []
    while pending:
        replies = list(grid.pull_messages(pending))
        pending.difference_update(r.metadata.reply_to_message_id for r in replies)
        while replies:
            reply = replies.pop(0)
            node, value, reason = check_reply(state, phase, reply, parse, asked, seen)
            del reply
            if reason is None:
                yielded.append(node)
                yield node, value  # type: ignore[misc]
                continue
            if node in yielded:
                raise RoundFailedError(
                    f"{phase}: node {node} replied again after its reply was used: {reason}"
                )
            reject(state, node, f"{phase}: {reason}", True)
        if pending:
            # A synchronous grid (InProcessGrid) had every reply it will ever have at once.
            if synchronous or (deadline is not None and time.monotonic() >= deadline):
                break
            pause(interval)
    finish_phase(state, phase, asked, seen, yielded, True)


def check_reply(
    state: RoundState,
    phase: str,
    reply: Message,
    parse: Callable[[int, RecordDict], T] | None,
    asked: set[int],
    seen: set[int],
) -> tuple[int, T | RecordDict | None, str | None]:
    """Count a reply's bytes and check it: ``(node, parsed value, None)`` or a reason."""
    message_type = state._asked.get(phase, ("", set()))[0]
    node = reply.metadata.src_node_id
    if reply.has_content():
        traffic = state.phase(phase)
        traffic.up_bytes[node] = traffic.up_bytes.get(node, 0) + content_bytes(reply.content)
    reason = _reply_problem(state, reply, message_type, asked, seen)
    if node in asked:
        seen.add(node)
    if reason is not None:
        return node, None, reason
    try:
        return node, parse(node, reply.content) if parse else reply.content, None
    except ClientInputError as err:
        return node, None, str(err) or type(err).__name__


def finish_phase(
    state: RoundState,
    phase: str,
    asked: set[int],
    seen: set[int],
    accepted: list[int],
    shrink: bool,
) -> None:
    """Drop the asked nodes that never replied; the survivors become ``accepted``."""
    for node in asked - seen:
        reject(state, node, f"{phase}: no reply before the timeout", shrink)
    if shrink:
        state.survivors = list(accepted)
    log(
        INFO,
        "round %s %s: %d accepted, %d asked",
        state.server_round,
        phase,
        len(accepted),
        len(asked),
    )


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


def _reply_problem(
    state: RoundState, reply: Message, message_type: str, asked: set[int], seen: set[int]
) -> str | None:
    node = reply.metadata.src_node_id
    if reply.has_error():
        return f"client error: {reply.error.reason}"
    if reply.metadata.group_id != str(state.server_round):
        return f"late reply for round {reply.metadata.group_id!r}"
    if node not in asked:
        return "reply from a node that was not asked in this phase"
    if reply.metadata.message_type != message_type:
        return f"reply of type {reply.metadata.message_type!r} to a {message_type!r} message"
    if node in seen:
        return "second reply from the same node"
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
