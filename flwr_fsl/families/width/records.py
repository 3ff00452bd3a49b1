"""The width family's Flower records: the record keys and its two typed phases.

Both phases are ``train`` messages carrying one ConfigRecord under :data:`WIDTH_KEY`:

============  ==========================================  ====================================
phase         request fields (besides ``phase``)          reply (under :data:`WIDTH_KEY`)
============  ==========================================  ====================================
``capacity``  (none)                                      ``phase``, ``rate`` (float)
``train``     ``assignment`` (``FSLW``,                   ``phase``, ``digest`` (the
              :class:`~flwr_fsl.families.width.rules.     assignment's SHA-256), beside the
              WidthAssignment`), ``settings``             train function's own records
              (:class:`~flwr_fsl.families.width.messages.
              WidthSettings`), beside the narrow model
              and the train config
============  ==========================================  ====================================

Each phase is a :class:`~flwr_fsl.core.phases.Phase` (:data:`CAPACITY`, :data:`TRAIN`); the
``from_record`` of the classes below raise :class:`~flwr_fsl.core.errors.ClientInputError`
subclasses on anything malformed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flwr.app import ConfigRecord, RecordDict

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.phases import Phase
from flwr_fsl.families.width.rules import WidthAssignment
from flwr_fsl.families.width.settings import WidthSettings

__all__ = [
    "CAPACITY",
    "RATE_CONFIG_KEY",
    "RATE_NODE_CONFIG_KEY",
    "TRAIN",
    "WIDTH_KEY",
    "CapacityReply",
    "CapacityRequest",
    "WidthTrainReply",
    "WidthTrainRequest",
]

WIDTH_KEY = "fsl.width"
"""The ``ConfigRecord`` of the width protocol, in both directions."""
RATE_CONFIG_KEY = "width-rate"
"""Where the train function finds its rate, in the message's config record."""
RATE_NODE_CONFIG_KEY = "width-rate"
"""Node config key of the node's capacity (``--node-config "width-rate=0.25"``)."""


@dataclass(frozen=True)
class CapacityRequest:
    """``capacity``: ask the node's capacity (no fields)."""

    def to_record(self) -> RecordDict:
        """Return the request's content."""
        return RecordDict({WIDTH_KEY: ConfigRecord()})

    @classmethod
    def from_record(cls, content: RecordDict) -> CapacityRequest:
        """Parse a request (it has no fields)."""
        return cls()


@dataclass(frozen=True)
class CapacityReply:
    """The node's capacity (its rate; the strategy checks it against the rule)."""

    rate: float

    def to_record(self) -> RecordDict:
        """Return the reply's content."""
        record = ConfigRecord({"phase": "capacity", "rate": float(self.rate)})
        return RecordDict({WIDTH_KEY: record})

    @classmethod
    def from_record(cls, content: RecordDict) -> CapacityReply:
        """Parse a reply.

        Raises
        ------
        ClientInputError
            If the reply has no capacity record or no numeric rate.
        """
        record = content.config_records.get(WIDTH_KEY)
        rate = None if record is None else record.get("rate")
        if record is None or record.get("phase") != "capacity":
            raise ClientInputError("the capacity reply has no width record (install width_mod)")
        if isinstance(rate, bool) or not isinstance(rate, int | float):
            raise ClientInputError("the capacity reply carries no numeric rate")
        return cls(float(rate))


@dataclass(frozen=True)
class WidthTrainRequest:
    """``train``: the client's assignment and the round's settings, beside its narrow model.

    ``beside`` holds the other records of the message (the narrow model's ArrayRecord and the
    train config); they come first in the content.
    """

    assignment: WidthAssignment
    settings: WidthSettings
    beside: RecordDict = field(default_factory=RecordDict, compare=False)

    def to_record(self) -> RecordDict:
        """Return the request's content."""
        content = RecordDict(dict(self.beside))
        content[WIDTH_KEY] = ConfigRecord(
            {"assignment": self.assignment.to_bytes(), "settings": self.settings.to_bytes()}
        )
        return content

    @classmethod
    def from_record(cls, content: RecordDict) -> WidthTrainRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        record = content.config_records[WIDTH_KEY]
        assignment = WidthAssignment.from_bytes(record.get("assignment"))
        settings = WidthSettings.from_bytes(record.get("settings"))
        beside = RecordDict({k: v for k, v in content.items() if k != WIDTH_KEY})
        return cls(assignment, settings, beside)


@dataclass(frozen=True)
class WidthTrainReply:
    """The train function's reply with the assignment's digest added (``beside``: its records)."""

    digest: bytes
    beside: RecordDict = field(default_factory=RecordDict, compare=False)

    def to_record(self) -> RecordDict:
        """Return the reply's content: the train function's records, then the width record."""
        content = RecordDict(dict(self.beside))
        content[WIDTH_KEY] = ConfigRecord({"phase": "train", "digest": self.digest})
        return content

    @classmethod
    def from_record(cls, content: RecordDict) -> WidthTrainReply:
        """Parse a reply (its arrays and weight are the strategy's to check).

        Raises
        ------
        ClientInputError
            If the reply has no width record naming a digest.
        """
        record = content.config_records.get(WIDTH_KEY)
        digest = None if record is None else record.get("digest")
        if not isinstance(digest, bytes):
            raise ClientInputError(
                "the reply does not name this round's width assignment (install width_mod)"
            )
        beside = RecordDict({k: v for k, v in content.items() if k != WIDTH_KEY})
        return cls(digest, beside)


CAPACITY: Phase[CapacityRequest, CapacityReply] = Phase(
    WIDTH_KEY, "capacity", CapacityRequest, CapacityReply
)
TRAIN: Phase[WidthTrainRequest, WidthTrainReply] = Phase(
    WIDTH_KEY, "train", WidthTrainRequest, WidthTrainReply, runs_train=True
)
