"""SecAgg's Flower records: the record key, the four typed phases and their messages.

Every SecAgg message is a ``train`` message (so it reaches the mods in front of the user's
``@app.train`` without another registered function) carrying one ConfigRecord under
:data:`SECAGG_KEY` with ``phase`` (one of :data:`SECAGG_PHASES`), ``instance`` (the
aggregation's name within a round: ``"model"``, or SFSL's ``"union"`` / ``"rows"``),
``params`` (``SecAggParams.to_bytes()``) and the phase's fields, each one bytes value of a
format of :mod:`flwr_fsl.families.secagg.protocol` or
:mod:`flwr_fsl.families.secagg.messages`:

=============  ===========================================  ==================================
phase          request fields (besides phase/instance/params)  reply
=============  ===========================================  ==================================
``advertise``  (none)                                        ``advertise``: two public keys
``share``      ``roster``                                    ``shares``: the sealed bundle
``train``      ``sharers`` (``U2``), ``settings``            the masked input (below)
               (:class:`SecAggSettings`), beside the user's
               model and config records
``unmask``     ``request`` (``U3`` and the mailbox)          ``unmask``: the shares
=============  ===========================================  ==================================

The masked input goes back as one uint64 Array ``"masked"`` under :data:`SECAGG_KEY` in the
reply's ArrayRecord, and nothing else. Each phase is a :class:`~flwr_fsl.core.phases.Phase`
(:data:`ADVERTISE`, :data:`SHARE`, :data:`TRAIN`, :data:`UNMASK`) over the request and reply
classes below; their ``from_record`` raise :class:`~flwr_fsl.core.errors.ClientInputError`
subclasses on anything malformed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.phases import Phase
from flwr_fsl.core.records import array_loader, bytes_field
from flwr_fsl.families.secagg.messages import SecAggParams, SecAggSettings, decode_ids, encode_ids
from flwr_fsl.submodel.codec import SubmodelFormatError

__all__ = [
    "ADVERTISE",
    "MODEL_INSTANCE",
    "SECAGG_KEY",
    "SECAGG_PHASES",
    "SHARE",
    "TRAIN",
    "UNMASK",
    "AdvertiseReply",
    "AdvertiseRequest",
    "MaskedInputReply",
    "MaskedInputRequest",
    "SecAggSettings",
    "ShareReply",
    "ShareRequest",
    "UnmaskReply",
    "UnmaskSharesRequest",
    "masked_input_record",
    "read_secagg_bytes",
    "record_instance",
]

SECAGG_KEY = "fsl.secagg"
SECAGG_PHASES = ("advertise", "share", "train", "unmask")
MODEL_INSTANCE = "model"
"""The SecAgg instance of ``SecAggFedAvg`` (answered by ``secagg_mod``)."""


def record_instance(record: ConfigRecord) -> str:
    """Return the SecAgg instance a message's SecAgg record names (``"model"`` if none).

    Raises
    ------
    ClientInputError
        If the ``instance`` field is not a string that is a Python identifier.
    """
    instance = record.get("instance", MODEL_INSTANCE)
    if not isinstance(instance, str) or not instance.isidentifier():
        raise ClientInputError("the SecAgg record names no valid instance")
    return instance


def _record(content: RecordDict) -> ConfigRecord:
    record = content.config_records.get(SECAGG_KEY)
    if record is None:
        raise SubmodelFormatError("the message carries no SecAgg record")
    return record


def _header(content: RecordDict) -> tuple[str, SecAggParams]:
    """Return the instance and parameters every SecAgg request carries."""
    instance = record_instance(_record(content))
    return instance, SecAggParams.from_bytes(read_secagg_bytes(content, "params"))


def _request(instance: str, params: SecAggParams, **fields: bytes) -> ConfigRecord:
    # Field order as the records always had it: instance, params, then the phase's fields.
    return ConfigRecord({"instance": instance, "params": params.to_bytes(), **fields})


def _reply(**fields: bytes) -> RecordDict:
    return RecordDict({SECAGG_KEY: ConfigRecord(dict(fields))})


@dataclass(frozen=True)
class AdvertiseRequest:
    """``advertise``: the round's parameters."""

    params: SecAggParams
    instance: str = MODEL_INSTANCE

    def to_record(self) -> RecordDict:
        """Return the request's content."""
        return RecordDict({SECAGG_KEY: _request(self.instance, self.params)})

    @classmethod
    def from_record(cls, content: RecordDict) -> AdvertiseRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        instance, params = _header(content)
        return cls(params, instance)


@dataclass(frozen=True)
class AdvertiseReply:
    """The client's two public keys (``SecAggClient.advertise()``)."""

    advertise: bytes

    def to_record(self) -> RecordDict:
        """Return the reply's content."""
        return _reply(advertise=self.advertise)

    @classmethod
    def from_record(cls, content: RecordDict) -> AdvertiseReply:
        """Parse a reply (raises a ClientInputError subclass)."""
        return cls(read_secagg_bytes(content, "advertise"))


@dataclass(frozen=True)
class ShareRequest:
    """``share``: the roster ``U1`` with its public keys."""

    params: SecAggParams
    roster: bytes
    instance: str = MODEL_INSTANCE

    def to_record(self) -> RecordDict:
        """Return the request's content."""
        return RecordDict({SECAGG_KEY: _request(self.instance, self.params, roster=self.roster)})

    @classmethod
    def from_record(cls, content: RecordDict) -> ShareRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        instance, params = _header(content)
        return cls(params, read_secagg_bytes(content, "roster"), instance)


@dataclass(frozen=True)
class ShareReply:
    """The client's sealed share bundle (``SecAggClient.share_keys()``)."""

    shares: bytes

    def to_record(self) -> RecordDict:
        """Return the reply's content."""
        return _reply(shares=self.shares)

    @classmethod
    def from_record(cls, content: RecordDict) -> ShareReply:
        """Parse a reply (raises a ClientInputError subclass)."""
        return cls(read_secagg_bytes(content, "shares"))


@dataclass(frozen=True)
class MaskedInputRequest:
    """``train``: ``U2`` and the vector's settings, beside the user's model and config.

    ``beside`` holds the other records of the message (the model's ArrayRecord and the train
    config, as ``FedAvg`` sends them); they come first in the content.
    """

    params: SecAggParams
    sharers: tuple[int, ...]
    settings: SecAggSettings
    instance: str = MODEL_INSTANCE
    beside: RecordDict = field(default_factory=RecordDict, compare=False)

    def to_record(self) -> RecordDict:
        """Return the request's content."""
        content = RecordDict(dict(self.beside))
        content[SECAGG_KEY] = _request(
            self.instance, self.params,
            sharers=encode_ids(self.sharers), settings=self.settings.to_bytes(),
        )  # fmt: skip
        return content

    @classmethod
    def from_record(cls, content: RecordDict) -> MaskedInputRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        instance, params = _header(content)
        sharers, _ = decode_ids(read_secagg_bytes(content, "sharers"))
        settings = SecAggSettings.from_bytes(read_secagg_bytes(content, "settings"))
        beside = RecordDict({k: v for k, v in content.items() if k != SECAGG_KEY})
        return cls(params, tuple(sharers), settings, instance, beside)


@dataclass(frozen=True)
class MaskedInputReply:
    """The client's masked input ``y_u`` (uint64 words), and nothing else.

    A client builds it from its vector (``masked``); the server's parsed reply keeps the
    vector unparsed (``array``) until :meth:`words` is told its expected size, so a reply of
    another size is refused from its metadata, before its bytes are copied.
    """

    masked: NDArray[np.uint64] | None = None
    array: Array | None = field(default=None, repr=False, compare=False)

    def words(self, size: int) -> NDArray[np.uint64]:
        """Return exactly ``size`` uint64 words.

        Raises
        ------
        SubmodelFormatError
            If the reply holds another number of words.
        """
        if self.masked is not None:
            words = np.asarray(self.masked)
            if words.dtype != np.uint64 or words.shape != (size,):
                raise SubmodelFormatError(f"the masked input must be {size} uint64 words")
            return words
        if self.array is None:
            raise SubmodelFormatError("the reply holds no masked input")
        return _load_masked(ArrayRecord({"masked": self.array}), size)

    def to_record(self) -> RecordDict:
        """Return the reply's content."""
        if self.masked is None:  # a parsed reply: its array as it came
            return RecordDict({SECAGG_KEY: ArrayRecord({"masked": self.array})})
        return masked_input_record(self.masked)

    @classmethod
    def from_record(cls, content: RecordDict) -> MaskedInputReply:
        """Parse a reply's shape: one 1-D uint64 array (its words are read by :meth:`words`).

        Raises
        ------
        SubmodelFormatError
            If the reply holds anything else, or the array has another dtype or shape.
        """
        record = _masked_record(content)
        array = record["masked"]
        if array.dtype != "uint64" or len(tuple(array.shape)) != 1:
            raise SubmodelFormatError("the masked input must be uint64 words")
        return cls(array=array)


@dataclass(frozen=True)
class UnmaskSharesRequest:
    """``unmask``: ``U3`` and the sealed shares addressed to the client (``request`` bytes)."""

    params: SecAggParams
    request: bytes
    instance: str = MODEL_INSTANCE

    def to_record(self) -> RecordDict:
        """Return the request's content."""
        return RecordDict({SECAGG_KEY: _request(self.instance, self.params, request=self.request)})

    @classmethod
    def from_record(cls, content: RecordDict) -> UnmaskSharesRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        instance, params = _header(content)
        return cls(params, read_secagg_bytes(content, "request"), instance)


@dataclass(frozen=True)
class UnmaskReply:
    """The client's shares for the server (``SecAggClient.unmask()``)."""

    unmask: bytes

    def to_record(self) -> RecordDict:
        """Return the reply's content."""
        return _reply(unmask=self.unmask)

    @classmethod
    def from_record(cls, content: RecordDict) -> UnmaskReply:
        """Parse a reply (raises a ClientInputError subclass)."""
        return cls(read_secagg_bytes(content, "unmask"))


ADVERTISE: Phase[AdvertiseRequest, AdvertiseReply] = Phase(
    SECAGG_KEY, "advertise", AdvertiseRequest, AdvertiseReply
)
SHARE: Phase[ShareRequest, ShareReply] = Phase(SECAGG_KEY, "share", ShareRequest, ShareReply)
TRAIN: Phase[MaskedInputRequest, MaskedInputReply] = Phase(
    SECAGG_KEY, "train", MaskedInputRequest, MaskedInputReply, runs_train=True
)
UNMASK: Phase[UnmaskSharesRequest, UnmaskReply] = Phase(
    SECAGG_KEY, "unmask", UnmaskSharesRequest, UnmaskReply
)


def read_secagg_bytes(content: RecordDict, field: str) -> bytes:
    """Return the bytes ``field`` of the SecAgg ConfigRecord in ``content``.

    Raises
    ------
    SubmodelFormatError
        If the record or the field is missing or not bytes, or is over :data:`MAX_UPLOAD_BYTES`.
    """
    value = bytes_field(content, SECAGG_KEY, field)
    if value is None:
        raise SubmodelFormatError(f"SecAgg message lacks the bytes field {field!r}")
    return value


def _masked_record(content: RecordDict) -> ArrayRecord:
    if set(content.keys()) != {SECAGG_KEY} or SECAGG_KEY not in content.array_records:
        raise SubmodelFormatError("a SecAgg reply must hold only its masked input")
    record = content.array_records[SECAGG_KEY]
    if list(record.keys()) != ["masked"]:
        raise SubmodelFormatError("a SecAgg reply must hold only its masked input")
    return record


def _load_masked(record: ArrayRecord, length: int) -> NDArray[np.uint64]:
    array = record["masked"]
    # Checked before the bytes are parsed: nothing of another size is allocated.
    if array.dtype != "uint64" or tuple(array.shape) != (length,):
        raise SubmodelFormatError(f"the masked input must be {length} uint64 words")
    words = array_loader(record)("masked")
    if words.dtype != np.uint64 or words.shape != (length,):
        raise SubmodelFormatError(f"the masked input must be {length} uint64 words")
    if len(array.data) != _npy_header_bytes(array.data) + 8 * length:
        raise SubmodelFormatError("the masked input has bytes after its words")
    return words.astype(np.uint64, copy=False)


def _npy_header_bytes(data: bytes) -> int:
    """Bytes of the ``.npy`` header that precedes an array's data (it was parsed already)."""
    # .npy: 6 magic bytes, major and minor version, then the header length (u16 in version 1,
    # u32 after) and the header itself.
    if len(data) < 12:
        raise SubmodelFormatError("the masked input's array header is truncated")
    if data[6] == 1:
        return 10 + int.from_bytes(data[8:10], "little")
    return 12 + int.from_bytes(data[8:12], "little")


def masked_input_record(masked: NDArray[np.uint64]) -> RecordDict:
    """Return the SecAgg train reply: the masked input only."""
    return RecordDict({SECAGG_KEY: ArrayRecord({"masked": Array(masked.astype(np.uint64))})})
