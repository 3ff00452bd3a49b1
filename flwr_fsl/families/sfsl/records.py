"""SFSL's Flower records: its SecAgg instances and typed phases.

SFSL runs two SecAgg instances per round under :data:`~flwr_fsl.families.secagg.records.SECAGG_KEY`
(told apart by the record's ``instance`` field): the private set union (``"union"``), then the
perturb phase and the count-weighted rows round (``"rows"``). Their ``advertise``, ``share``
and ``unmask`` phases are SecAgg's own (:mod:`flwr_fsl.families.secagg.records`); SFSL adds
three typed phases, each record holding ``phase``, ``instance``, ``params``
(``SecAggParams.to_bytes()``) and:

===================  ============================================  ==========================
phase                request fields                                reply
===================  ============================================  ==========================
:data:`UNION_TRAIN`  ``sharers``, ``settings``                     the masked Bloom filter
                     (:class:`~flwr_fsl.families.sfsl.messages.
                     SFSLSettings` with the round's PSU parameters)
:data:`PERTURB`      ``union`` (``<i8`` rows), beside the round's  ``perturbed`` (``<i8``)
                     train config
:data:`ROWS_TRAIN`   ``sharers``, ``rows`` (``S''``), ``shared``,  the masked rows vector
                     ``union``, ``settings``, beside the submodel
                     and the train config
===================  ============================================  ==========================

The masked inputs go back as SecAgg's :class:`~flwr_fsl.families.secagg.records.MaskedInputReply`.
Every ``from_record`` raises a :class:`~flwr_fsl.core.errors.ClientInputError` subclass on
anything malformed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from numpy.typing import NDArray

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.phases import Phase
from flwr_fsl.families.secagg.protocol import (
    SecAggParams,
    decode_ids,
    encode_ids,
)
from flwr_fsl.families.secagg.records import (
    SECAGG_KEY,
    MaskedInputReply,
    read_secagg_bytes,
    record_instance,
)
from flwr_fsl.families.sfsl.messages import (
    ROWS_INSTANCE,
    SFSL_INSTANCES,
    UNION_INSTANCE,
    SFSLSettings,
    decode_shared_runs,
    encode_shared_runs,
)

__all__ = [
    "PERTURB",
    "ROWS_INSTANCE",
    "ROWS_TRAIN",
    "SFSL_INSTANCES",
    "UNION_INSTANCE",
    "UNION_TRAIN",
    "PerturbReply",
    "PerturbRequest",
    "RowsInputRequest",
    "UnionInputRequest",
]


def _indices(raw: bytes, what: str) -> NDArray[np.int64]:
    if len(raw) % 8:
        raise ClientInputError(f"{what} has a bad length")
    return np.frombuffer(raw, dtype="<i8").astype(np.int64)


def _rows_bytes(rows: NDArray[np.int64]) -> bytes:
    return np.asarray(rows).astype("<i8").tobytes()


def _header(content: RecordDict, instance: str) -> SecAggParams:
    record = content.config_records.get(SECAGG_KEY)
    if record is None or record_instance(record) != instance:
        raise ClientInputError(f"not a message of the SecAgg instance {instance!r}")
    return SecAggParams.from_bytes(read_secagg_bytes(content, "params"))


def _request(instance: str, params: SecAggParams, **fields: bytes) -> ConfigRecord:
    return ConfigRecord({"instance": instance, "params": params.to_bytes(), **fields})


def _beside(content: RecordDict) -> RecordDict:
    return RecordDict({k: v for k, v in content.items() if k != SECAGG_KEY})


@dataclass(frozen=True)
class UnionInputRequest:
    """``union`` ``train``: ``U2`` and the settings with the round's PSU parameters."""

    params: SecAggParams
    sharers: tuple[int, ...]
    settings: SFSLSettings

    def to_record(self) -> RecordDict:
        """Return the request's content."""
        record = _request(
            UNION_INSTANCE, self.params,
            sharers=encode_ids(self.sharers), settings=self.settings.to_bytes(),
        )  # fmt: skip
        return RecordDict({SECAGG_KEY: record})

    @classmethod
    def from_record(cls, content: RecordDict) -> UnionInputRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        params = _header(content, UNION_INSTANCE)
        sharers, _ = decode_ids(read_secagg_bytes(content, "sharers"))
        settings = SFSLSettings.from_bytes(read_secagg_bytes(content, "settings"))
        if settings.psu is None or settings.union_length() != params.vector_length:
            raise ClientInputError("the PSU vector does not match the round's length")
        return cls(params, tuple(sharers), settings)


@dataclass(frozen=True)
class PerturbRequest:
    """``rows`` ``perturb``: the union, beside the round's train config."""

    params: SecAggParams
    union: NDArray[np.int64]
    beside: RecordDict = field(default_factory=RecordDict, compare=False)

    def to_record(self) -> RecordDict:
        """Return the request's content (the SecAgg record first, then the config)."""
        content = RecordDict(
            {SECAGG_KEY: _request(ROWS_INSTANCE, self.params, union=_rows_bytes(self.union))}
        )
        for key, value in self.beside.items():
            content[key] = value
        return content

    @classmethod
    def from_record(cls, content: RecordDict) -> PerturbRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        params = _header(content, ROWS_INSTANCE)
        union = _indices(read_secagg_bytes(content, "union"), "the union")
        return cls(params, union, _beside(content))


@dataclass(frozen=True)
class PerturbReply:
    """``S''``: the client's perturbed rows of the union."""

    rows: NDArray[np.int64]

    def to_record(self) -> RecordDict:
        """Return the reply's content."""
        return RecordDict({SECAGG_KEY: ConfigRecord({"perturbed": _rows_bytes(self.rows)})})

    @classmethod
    def from_record(cls, content: RecordDict) -> PerturbReply:
        """Parse a reply (its rows are the server's to check against the union)."""
        raw = read_secagg_bytes(content, "perturbed")
        if len(raw) % 8:
            raise ClientInputError("the perturbed set has a bad length")
        # A view of the message, not a copy: the server checks the length against the union
        # (check_perturbed) before it makes anything of this size.
        return cls(np.frombuffer(raw, dtype="<i8"))


@dataclass(frozen=True)
class RowsInputRequest:
    """``rows`` ``train``: the subset round of ``S''``, beside the submodel and the config."""

    params: SecAggParams
    sharers: tuple[int, ...]
    rows: NDArray[np.int64]
    shared: Mapping[int, NDArray[np.int64]]
    union: NDArray[np.int64]
    settings: SFSLSettings
    beside: RecordDict = field(default_factory=RecordDict, compare=False)

    def to_record(self) -> RecordDict:
        """Return the request's content (the submodel and config first)."""
        content = RecordDict(dict(self.beside))
        content[SECAGG_KEY] = _request(
            ROWS_INSTANCE, self.params,
            sharers=encode_ids(self.sharers), rows=_rows_bytes(self.rows),
            shared_runs=encode_shared_runs(self.shared), union=_rows_bytes(self.union),
            settings=self.settings.to_bytes(),
        )  # fmt: skip
        return content

    @classmethod
    def from_record(cls, content: RecordDict) -> RowsInputRequest:
        """Parse a request (raises a ClientInputError subclass)."""
        params = _header(content, ROWS_INSTANCE)
        rows = _indices(read_secagg_bytes(content, "rows"), "the rows")
        union = _indices(read_secagg_bytes(content, "union"), "the union")
        sharers, _ = decode_ids(read_secagg_bytes(content, "sharers"))
        shared = decode_shared_runs(  # peers: the other sharers at most
            read_secagg_bytes(content, "shared_runs"), params.vector_length, len(sharers)
        )
        settings = SFSLSettings.from_bytes(read_secagg_bytes(content, "settings"))
        if settings.psu is None:  # its domain is the table's size the client rebuilds
            raise ClientInputError("the rows request's settings lack the round's PSU domain")
        return cls(params, tuple(sharers), rows, shared, union, settings, _beside(content))


UNION_TRAIN: Phase[UnionInputRequest, MaskedInputReply] = Phase(
    SECAGG_KEY, "train", UnionInputRequest, MaskedInputReply
)
PERTURB: Phase[PerturbRequest, PerturbReply] = Phase(
    SECAGG_KEY, "perturb", PerturbRequest, PerturbReply
)
ROWS_TRAIN: Phase[RowsInputRequest, MaskedInputReply] = Phase(
    SECAGG_KEY, "train", RowsInputRequest, MaskedInputReply, runs_train=True
)
