"""SESA's Flower records: the record key, the four typed phases and their messages.

Every SESA message is a ``train`` message carrying one ConfigRecord under :data:`SESA_KEY`
with ``phase`` (one of :data:`SESA_PHASES`), ``params`` (``SesaParams.to_bytes()``) and the
phase's fields, each one bytes value of a format of :mod:`flwr_fsl.families.sesa.protocol` or
:mod:`flwr_fsl.families.sesa.messages`:

=============  ==============================================  ============================
phase          request fields (besides phase/params)            reply (one bytes field)
=============  ==============================================  ============================
``advertise``  ``settings`` (:class:`SesaSettings`)             ``advertise``: a public key
``offline``    ``roster``                                       ``bundle``: the sealed
                                                                evaluations
``train``      ``sharers`` (``U2``), ``settings``, ``mailbox``  ``masked``: the masked
               (the pieces sealed to the client), beside the    shard vectors and the
               whole global model and the train config          complaint
``decode``     ``request`` (``U3``, masked updates, mailbox)    ``evaluation``: ``ψ(α_i)``
=============  ==============================================  ============================

A reply holds its one field under :data:`SESA_KEY` and nothing else (nothing in the clear).
Each phase is a :class:`~flwr_fsl.core.phases.Phase` (:data:`ADVERTISE`, :data:`OFFLINE`,
:data:`TRAIN`, :data:`DECODE`); the ``from_record`` of the classes below raise
:class:`~flwr_fsl.core.errors.ClientInputError` subclasses on anything malformed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flwr.app import ConfigRecord, RecordDict

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.phases import Phase
from flwr_fsl.core.records import bytes_field
from flwr_fsl.families.sesa.protocol import SesaParams, decode_ids, encode_ids
from flwr_fsl.families.sesa.settings import SesaSettings

__all__ = [
    "ADVERTISE",
    "DECODE",
    "OFFLINE",
    "SESA_KEY",
    "SESA_PHASES",
    "TRAIN",
    "AdvertiseReply",
    "AdvertiseRequest",
    "DecodeReply",
    "DecodeRequest",
    "MaskedUpdateReply",
    "MaskedUpdateRequest",
    "OfflineReply",
    "OfflineRequest",
    "SesaSettings",
    "read_sesa_bytes",
]

SESA_KEY = "fsl.sesa"
"""The ``ConfigRecord`` of the SESA protocol, in both directions."""
SESA_PHASES = ("advertise", "offline", "train", "decode")


def read_sesa_bytes(content: RecordDict, name: str) -> bytes:
    """Return the bytes field ``name`` of the SESA ConfigRecord in ``content``.

    Raises
    ------
    ClientInputError
        If the record or the field is missing, not bytes, or over :data:`MAX_UPLOAD_BYTES`.
    """
    value = bytes_field(content, SESA_KEY, name)
    if value is None:
        raise ClientInputError(f"the SESA record lacks a valid {name!r}")
    return value


def _params(content: RecordDict) -> SesaParams:
    return SesaParams.from_bytes(read_sesa_bytes(content, "params"))


def _request(params: SesaParams, **fields: bytes) -> ConfigRecord:
    return ConfigRecord({"params": params.to_bytes(), **fields})


def _reply(**fields: bytes) -> RecordDict:
    return RecordDict({SESA_KEY: ConfigRecord(dict(fields))})


@dataclass(frozen=True)
class AdvertiseRequest:
    """``advertise``: the round's parameters and settings (with the layer structure)."""

    params: SesaParams
    settings: SesaSettings

    def to_record(self) -> RecordDict:
        """Return the request's content."""
        record = _request(self.params, settings=self.settings.to_bytes())
        return RecordDict({SESA_KEY: record})

    @classmethod
    def from_record(cls, content: RecordDict) -> AdvertiseRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        params = _params(content)
        return cls(params, SesaSettings.from_bytes(read_sesa_bytes(content, "settings")))


@dataclass(frozen=True)
class AdvertiseReply:
    """The client's X25519 public key (``SesaClient.advertise()``)."""

    advertise: bytes

    def to_record(self) -> RecordDict:
        """Return the reply's content."""
        return _reply(advertise=self.advertise)

    @classmethod
    def from_record(cls, content: RecordDict) -> AdvertiseReply:
        """Parse a reply (raises a ClientInputError subclass)."""
        return cls(read_sesa_bytes(content, "advertise"))


@dataclass(frozen=True)
class OfflineRequest:
    """``offline``: the roster ``U1`` with its public keys."""

    params: SesaParams
    roster: bytes

    def to_record(self) -> RecordDict:
        """Return the request's content."""
        return RecordDict({SESA_KEY: _request(self.params, roster=self.roster)})

    @classmethod
    def from_record(cls, content: RecordDict) -> OfflineRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        return cls(_params(content), read_sesa_bytes(content, "roster"))


@dataclass(frozen=True)
class OfflineReply:
    """The client's sealed selector and mask evaluations (``SesaClient.offline()``)."""

    bundle: bytes

    def to_record(self) -> RecordDict:
        """Return the reply's content."""
        return _reply(bundle=self.bundle)

    @classmethod
    def from_record(cls, content: RecordDict) -> OfflineReply:
        """Parse a reply (raises a ClientInputError subclass)."""
        return cls(read_sesa_bytes(content, "bundle"))


@dataclass(frozen=True)
class MaskedUpdateRequest:
    """``train``: ``U2`` and the settings, beside the whole global model and the train config.

    ``beside`` holds the other records of the message; they come first in the content.
    """

    params: SesaParams
    sharers: tuple[int, ...]
    settings: SesaSettings
    beside: RecordDict = field(default_factory=RecordDict, compare=False)
    mailbox: bytes = b""

    def to_record(self) -> RecordDict:
        """Return the request's content (``mailbox`` only when there is one)."""
        content = RecordDict(dict(self.beside))
        extra = {"mailbox": self.mailbox} if self.mailbox else {}
        content[SESA_KEY] = _request(
            self.params,
            sharers=encode_ids(self.sharers),
            settings=self.settings.to_bytes(),
            **extra,
        )
        return content

    @classmethod
    def from_record(cls, content: RecordDict) -> MaskedUpdateRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        params = _params(content)
        sharers = decode_ids(read_sesa_bytes(content, "sharers"))
        settings = SesaSettings.from_bytes(read_sesa_bytes(content, "settings"))
        record = content.config_records.get(SESA_KEY)
        mailbox = read_sesa_bytes(content, "mailbox") if record and "mailbox" in record else b""
        beside = RecordDict({k: v for k, v in content.items() if k != SESA_KEY})
        return cls(params, tuple(sharers), settings, beside, mailbox)


@dataclass(frozen=True)
class MaskedUpdateReply:
    """The client's masked shard vectors (``SesaClient.masked_update()``), and nothing else."""

    masked: bytes

    def to_record(self) -> RecordDict:
        """Return the reply's content."""
        return _reply(masked=self.masked)

    @classmethod
    def from_record(cls, content: RecordDict) -> MaskedUpdateReply:
        """Parse a reply (raises a ClientInputError subclass)."""
        return cls(read_sesa_bytes(content, "masked"))


@dataclass(frozen=True)
class DecodeRequest:
    """``decode``: ``U3``, every masked update and the evaluations sealed to the client."""

    params: SesaParams
    request: bytes

    def to_record(self) -> RecordDict:
        """Return the request's content."""
        return RecordDict({SESA_KEY: _request(self.params, request=self.request)})

    @classmethod
    def from_record(cls, content: RecordDict) -> DecodeRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        return cls(_params(content), read_sesa_bytes(content, "request"))


@dataclass(frozen=True)
class DecodeReply:
    """The client's evaluation ``ψ(α_i)`` (``SesaClient.evaluate()``)."""

    evaluation: bytes

    def to_record(self) -> RecordDict:
        """Return the reply's content."""
        return _reply(evaluation=self.evaluation)

    @classmethod
    def from_record(cls, content: RecordDict) -> DecodeReply:
        """Parse a reply (raises a ClientInputError subclass)."""
        return cls(read_sesa_bytes(content, "evaluation"))


ADVERTISE: Phase[AdvertiseRequest, AdvertiseReply] = Phase(
    SESA_KEY, "advertise", AdvertiseRequest, AdvertiseReply
)
OFFLINE: Phase[OfflineRequest, OfflineReply] = Phase(
    SESA_KEY, "offline", OfflineRequest, OfflineReply
)
TRAIN: Phase[MaskedUpdateRequest, MaskedUpdateReply] = Phase(
    SESA_KEY, "train", MaskedUpdateRequest, MaskedUpdateReply, runs_train=True
)
DECODE: Phase[DecodeRequest, DecodeReply] = Phase(SESA_KEY, "decode", DecodeRequest, DecodeReply)
