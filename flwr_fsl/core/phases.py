"""The typed phase contract: one :class:`Phase` per protocol message, one :class:`PhaseMod` base.

A multi-phase protocol round is a sequence of request/reply exchanges between the strategy
and a client mod. A :class:`Phase` names one exchange once, for both ends:

* ``family`` — the record key the family's messages carry (e.g. ``"fsl.secagg"``): the content
  holds one ``ConfigRecord`` under it whose ``phase`` field is the phase's ``name``;
* ``request`` / ``reply`` — classes implementing :class:`PhaseBody`: ``to_record()`` builds the
  whole message content, ``from_record(content)`` parses it strictly and raises a
  :class:`~flwr_fsl.core.errors.ClientInputError` subclass on anything malformed;
* ``message_type`` — the Flower message type the request travels as (``"train"`` so that the
  mods in front of the user's ``@app.train`` see it without another registered function);
* ``runs_train`` — the phase calls the user's train function (``call_next``) on the client.

The server sends a phase with :meth:`PhasedStrategy.send_phase
<flwr_fsl.core.engine.PhasedStrategy.send_phase>` (``{node: request} -> {node: reply}``; bad
replies are dropped with a reason by the engine). The client side subclasses
:class:`PhaseMod`, which reads the ``phase`` field (:meth:`PhaseMod.phase_of`, which a family
that names its phases otherwise overrides), parses the request and calls
``self.on_<name>(request, context)`` (plus a ``train()`` callable for ``runs_train`` phases);
messages of other families, and of instances the mod does not own (:meth:`PhaseMod.owns`),
pass through to the next mod untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from flwr_fsl.core.errors import ClientInputError, ConfigurationError

__all__ = ["PHASE_FIELD", "Phase", "PhaseBody", "PhaseError", "PhaseMod", "phase_name"]

PHASE_FIELD = "phase"
"""The field of the family's ConfigRecord that names the phase."""

_B = TypeVar("_B", bound="PhaseBody")
Req = TypeVar("Req", bound="PhaseBody")
Rep = TypeVar("Rep", bound="PhaseBody")


class PhaseError(ClientInputError):
    """A message names no phase, an unknown phase, or another phase than expected."""


class PhaseBody(Protocol):
    """What a phase's request or reply class implements: a strict record codec."""

    def to_record(self) -> RecordDict:
        """Return the message content (the family's ConfigRecord without its phase field)."""
        ...

    @classmethod
    def from_record(cls: type[_B], content: RecordDict) -> _B:
        """Parse a message content; raise a ClientInputError subclass if it is malformed."""
        ...


def phase_name(content: RecordDict, family: str) -> str | None:
    """Return the phase a content's ``family`` record names (None: not the family's message).

    Raises
    ------
    PhaseError
        If the family's record is there but its ``phase`` field is not a string.
    """
    record = content.config_records.get(family)
    if record is None:
        return None
    name = record.get(PHASE_FIELD)
    if not isinstance(name, str):
        raise PhaseError(f"the {family} record names no phase")
    return name


@dataclass(frozen=True)
class Phase(Generic[Req, Rep]):
    """One request/reply exchange of a protocol family (module docstring).

    Parameters
    ----------
    family : str
        The record key of the family's messages.
    name : str
        The phase's name (the ``phase`` field; ``on_<name>`` on the client).
    request, reply : type
        The :class:`PhaseBody` classes of the request and the reply.
    message_type : str
        Flower message type of the request. Default ``"train"``.
    runs_train : bool
        Whether the client's handler runs the user's train function.
    """

    family: str
    name: str
    request: type[Req]
    reply: type[Rep]
    message_type: str = MessageType.TRAIN
    runs_train: bool = False

    def build(self, request: Req) -> RecordDict:
        """Return the request's content with the phase field first in the family's record.

        Raises
        ------
        ValueError
            If the request's content lacks the family's ConfigRecord (a bug, not bad input).
        """
        content = request.to_record()
        record = content.config_records.get(self.family)
        if record is None:
            raise ValueError(f"a {self.name} request must carry a {self.family} ConfigRecord")
        # Rebuilt rather than updated so ``phase`` keeps its place as the record's first field.
        content[self.family] = ConfigRecord({PHASE_FIELD: self.name, **dict(record)})
        return content

    def parse_request(self, content: RecordDict) -> Req:
        """Parse a request content of this phase.

        Raises
        ------
        ClientInputError
            If the content is not this phase's request or is malformed.
        """
        if phase_name(content, self.family) != self.name:
            raise PhaseError(f"not a {self.family} {self.name} message")
        return self.request.from_record(content)

    def parse_reply(self, content: RecordDict) -> Rep:
        """Parse a reply content of this phase (raises a ClientInputError subclass)."""
        return self.reply.from_record(content)


class PhaseMod:
    """Base of a family's client mod: dispatch each phase to ``self.on_<name>``.

    Subclasses set :attr:`phases` and define, per phase, ``on_<name>(request, context)``
    returning the reply object, or, for a ``runs_train`` phase,
    ``on_<name>(request, context, train)`` where ``train()`` runs the rest of the ClientApp on
    the message (``train({key: record})`` first replaces those records of the message); such
    a handler may return the train function's own :class:`Message` (an error reply) instead
    of a reply object, and it is passed back unchanged.

    An instance is a Flower mod: ``ClientApp(mods=[MyMod()])``.
    """

    family: ClassVar[str]
    phases: ClassVar[Mapping[str, Phase[Any, Any]]]
    title: ClassVar[str] = ""
    """The protocol's name in error texts (default: :attr:`family`)."""

    def owns(self, content: RecordDict) -> bool:
        """Whether this mod answers a message of its family (default: all of them).

        A family that runs several instances in one round (SecAgg's ``"model"``,
        ``"union"``, ``"rows"``) overrides it so another mod can answer the others.
        """
        return True

    def phase_of(self, msg: Message, context: Context) -> Phase[Any, Any] | None:
        """Return the phase a message is, or None to pass it through to the next mod.

        The default reads the ``phase`` field of the family's record, for a message of one of
        the phases' message types that this mod :meth:`owns`. A family whose messages name
        their phase otherwise (SSA: by the message type and a field of the round's config
        record, no family record) overrides it; it may refuse a message (raise a
        :class:`~flwr_fsl.core.errors.ClientInputError`) before any handler runs.

        Raises
        ------
        PhaseError
            If a message of the family that this mod owns names no phase or an unknown one.
        """
        content = msg.content
        # Evaluation and queries carry no phase of the family even if a record is there.
        types = {p.message_type for p in self.phases.values()}
        if msg.metadata.message_type not in types:
            return None
        if self.family not in content.config_records or not self.owns(content):
            return None
        name = phase_name(content, self.family)
        phase = self.phases.get(name or "")
        if phase is None or phase.name != name:
            raise PhaseError(f"unknown {self.title or self.family} phase")
        return phase

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Answer a phase message of the family (:meth:`phase_of`); pass any other through.

        Raises
        ------
        ClientInputError
            If a message of the family that this mod owns names an unknown phase or its
            request is malformed (Flower turns it into an error reply; the server drops
            this client from the round).
        """
        phase = self.phase_of(msg, context)
        if phase is None:
            return call_next(msg, context)
        request = phase.request.from_record(msg.content)
        handler: Callable[..., Any] = getattr(self, f"on_{phase.name}")
        if phase.runs_train:

            def train(records: Mapping[str, Any] | None = None) -> Message:
                for key, record in (records or {}).items():
                    msg.content[key] = record  # e.g. the narrow model in place of the global
                return call_next(msg, context)

            answer = handler(request, context, train)
            if isinstance(answer, Message):
                return answer
        else:
            answer = handler(request, context)
        return Message(answer.to_record(), reply_to=msg)


def refuse_uncalled_overrides(
    cls: type, base: type, methods: tuple[str, ...], phases: tuple[str, ...]
) -> None:
    """Refuse a strategy class that overrides methods its multi-phase round never calls.

    Overriding ``configure_train`` / ``aggregate_train`` is the customization pattern of
    Flower's docs (e.g. a per-round learning rate added in ``configure_train``), but a round of
    several phases is run by ``train_round`` and never calls them: the override would be
    silently ignored. Checked at construction.

    Parameters
    ----------
    cls : type
        The class being instantiated.
    base : type
        The class whose versions of ``methods`` are the only ones allowed.
    methods : tuple of str
        The methods the round never calls.
    phases : tuple of str
        The round's phases (named in the message).

    Raises
    ------
    ConfigurationError
        If ``cls`` overrides one of ``methods``, naming it and what to do instead.
    """
    for method in methods:
        if getattr(cls, method) is not getattr(base, method):
            name = cls.__name__
            raise ConfigurationError(
                f"{name} overrides {method}, which a {name} round never calls: its round is "
                f"several message phases ({', '.join(phases) or 'several'}) run by "
                "train_round. Override train_round instead, or pass per-run settings through "
                "start(..., train_config=...)"
            )
