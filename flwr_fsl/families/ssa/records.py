"""Record-field names and wire records of the Flower messages (``flwr_fsl.ssa`` v1): one module.

Server -> client, in the train message's ``ConfigRecord`` (next to the usual config):

- ``fsl.ssa.params``: ``SSAParams.to_bytes()`` of the round;
- ``fsl.ssa.helper-key``: S1's raw X25519 public key (the client checks it against the
  fingerprint pinned in its run config before sealing anything to it);
- ``fsl.ssa.session``: the 16-byte session id of S0's connection to S1 (one per run); every
  sealed blob is bound to it, the round and the SHA-256 of ``fsl.ssa.params``.

Client -> server, a ``ConfigRecord`` under :data:`SSA_UPLOAD_KEY` next to the reply's metrics:

- ``public``: the DPF keys' public part (S0 relays it to S1);
- ``seed``: S0's 16-byte master seed;
- ``sealed``: S1's material (master seed + public-part digest) sealed to S1;
- or, in a U-DPF round, only ``hint``: the update hint for both servers' stored keys.

Index mode adds a private-retrieval phase (message type ``query.psr``): the query reply has the
same three fields under :data:`PSR_UPLOAD_KEY` (S1's part also carries the client's answer key);
the train message then carries ``fsl.psr.answer0`` (S0's answer, raw uint64 rows) and
``fsl.psr.answer1`` (S1's answer sealed to the client) and ``fsl.index.table`` (the name of the
row table the client's submodel is cut from).

:func:`read_ssa_upload` validates types and sizes and raises
:class:`~flwr_fsl.submodel.codec.SubmodelFormatError`; the keys themselves are checked by the
protocol (:class:`~flwr_fsl.families.ssa.protocol.SSAInputError`).

The client side's typed phases (:data:`SSA_TRAIN`, :data:`PSR_QUERY`, for
:class:`~flwr_fsl.core.phases.PhaseMod`) carry these records unchanged: SSA messages have no
family record of their own, their phase is recognised by the message type and the round's
``fsl.ssa.params`` field (:meth:`~flwr_fsl.families.ssa.mod_base.ProtocolMod.phase_of`).
"""

from __future__ import annotations

from dataclasses import dataclass

from flwr.app import ConfigRecord, MessageType, RecordDict

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.phases import Phase
from flwr_fsl.core.records import MAX_UPLOAD_BYTES
from flwr_fsl.crypto.sealing import RoundBinding
from flwr_fsl.families.ssa.protocol import SSAParams
from flwr_fsl.submodel.codec import (
    SubmodelFormatError,
)

PARAMS_FIELD = "fsl.ssa.params"
HELPER_KEY_FIELD = "fsl.ssa.helper-key"
SESSION_FIELD = "fsl.ssa.session"
SSA_UPLOAD_KEY = "fsl.ssa.upload"
PSR_QUERY_TYPE = "query.psr"
PSR_UPLOAD_KEY = "fsl.psr.query"
TABLE_FIELD = "fsl.index.table"
UDPF_FIELD = "fsl.index.udpf"
# Per client, in its own train message: the digest of the U-DPF keys S0 holds for it (absent:
# none). The client sends a hint only against exactly these keys.
UDPF_HELD_FIELD = "fsl.udpf.held"
ANSWER0_FIELD = "fsl.psr.answer0"
ANSWER1_FIELD = "fsl.psr.answer1"
# The metric key the strategy weights replies by (its ``weighted_by_key``), sent with each train
# message so client mods read the same weight the server aggregates with.
WEIGHT_KEY_FIELD = "fsl.weight-key"
DEFAULT_WEIGHT_KEY = "num-examples"


def find_ssa_round(content: RecordDict) -> tuple[SSAParams, bytes, RoundBinding] | None:
    """Return the round's SSA parameters, S1's public key and the sealing binding, if present.

    Raises
    ------
    SubmodelFormatError
        If the fields are present but malformed (or the session id is missing).
    """
    for record in content.config_records.values():
        if PARAMS_FIELD in record:
            params, key = record[PARAMS_FIELD], record.get(HELPER_KEY_FIELD)
            session = record.get(SESSION_FIELD)
            if not isinstance(params, bytes) or not isinstance(key, bytes) or len(key) != 32:
                raise SubmodelFormatError("malformed SSA round fields")
            if not isinstance(session, bytes):
                raise SubmodelFormatError(f"missing or malformed {SESSION_FIELD!r}")
            try:
                decoded = SSAParams.from_bytes(params)
                return decoded, key, RoundBinding.of(session, decoded.round_id, params)
            except ValueError as err:
                raise SubmodelFormatError(f"bad SSA parameters: {err}") from None
    return None


def ssa_upload_record(public: bytes, seed: bytes, sealed: bytes) -> ConfigRecord:
    """Build the client's upload record."""
    return ConfigRecord({"public": public, "seed": seed, "sealed": sealed})


def hint_upload_record(hint: bytes, sealed: bytes) -> ConfigRecord:
    """Build a U-DPF client's upload record: the hint and its binding sealed to S1.

    Both servers apply the same hint bytes; the sealed binding
    (:func:`~flwr_fsl.families.ssa.sealing.seal_udpf_hint`) keeps S0 from altering S1's copy.
    """
    return ConfigRecord({"hint": hint, "sealed": sealed})


def read_hint_upload(content: RecordDict, key: str = SSA_UPLOAD_KEY) -> tuple[bytes, bytes] | None:
    """Return ``(hint, sealed binding)`` of a U-DPF upload, or None for fresh keys.

    ``key``: the upload record's key (a mixed round's part: ``fsl.ssa.upload#<i>``).

    Raises
    ------
    SubmodelFormatError
        If the record is missing or a hint record is malformed.
    """
    record = content.config_records.get(key)
    if record is None:
        raise SubmodelFormatError(f"missing {key!r} record")
    if "hint" not in record:
        return None
    hint, sealed = record["hint"], record.get("sealed")
    if set(record.keys()) != {"hint", "sealed"} or not (
        isinstance(hint, bytes) and isinstance(sealed, bytes)
    ):
        raise SubmodelFormatError("a hint upload has exactly two bytes fields 'hint', 'sealed'")
    if len(hint) + len(sealed) > MAX_UPLOAD_BYTES:
        raise SubmodelFormatError("upload too large")
    return hint, sealed


def read_ssa_upload(content: RecordDict, key: str = SSA_UPLOAD_KEY) -> tuple[bytes, bytes, bytes]:
    """Return ``(public, seed, sealed)`` of a client's upload (SSA keys or a PSR query).

    Raises
    ------
    SubmodelFormatError
        If the record is missing, has other fields, wrong types or sizes.
    """
    record = content.config_records.get(key)
    if record is None:
        raise SubmodelFormatError(f"missing {key!r} record")
    if set(record.keys()) != {"public", "seed", "sealed"}:
        raise SubmodelFormatError(f"{key!r} fields must be public, seed, sealed")
    public, seed, sealed = record["public"], record["seed"], record["sealed"]
    if not all(isinstance(v, bytes) for v in (public, seed, sealed)):
        raise SubmodelFormatError("upload fields must be bytes")
    assert isinstance(public, bytes) and isinstance(seed, bytes) and isinstance(sealed, bytes)
    if len(seed) != 16:
        raise SubmodelFormatError("S0's master seed must be 16 bytes")
    if len(public) + len(sealed) > MAX_UPLOAD_BYTES:
        raise SubmodelFormatError("upload too large")
    return public, seed, sealed


# ---- the client's view of a round and its typed phases -------------------------------------------


@dataclass(frozen=True)
class SSARound:
    """The round parameters a message carries, and the config record they came in.

    Attributes
    ----------
    params : SSAParams
        The round's public parameters.
    helper_key : bytes
        S1's raw X25519 public key (checked against the pin before a mod gets the round).
    binding : RoundBinding
        Session, round and parameter digest that every sealed blob is bound to.
    config : ConfigRecord
        The config record holding the parameters (protocol fields live beside them).
    """

    params: SSAParams
    helper_key: bytes
    binding: RoundBinding
    config: ConfigRecord

    def bytes_field(self, name: str) -> bytes:
        """Return a bytes field of the round's config record.

        Parameters
        ----------
        name : str
            The field name.

        Returns
        -------
        bytes
            Its value.

        Raises
        ------
        SubmodelFormatError
            If the field is missing or not bytes.
        """
        value = self.config.get(name)
        if not isinstance(value, bytes):
            raise SubmodelFormatError(f"missing or malformed {name!r}")
        return value


def find_round(content: RecordDict) -> SSARound | None:
    """Return the round a message carries, if any.

    The round is read by :func:`find_ssa_round`.

    Parameters
    ----------
    content : RecordDict
        The message content.

    Returns
    -------
    SSARound or None
        The round and its config record; None when no config record has SSA parameters.

    Raises
    ------
    SubmodelFormatError
        If the round fields are present but malformed.
    """
    for record in content.config_records.values():
        if PARAMS_FIELD in record:
            # find_ssa_round reads one record here, so the record the fields came in is known.
            found = find_ssa_round(RecordDict({"config": record}))
            if found is not None:
                return SSARound(*found, record)
    return None


def weight_key_of(content: RecordDict) -> str:
    """Return the metric key the strategy weights replies by, as the train message names it.

    Parameters
    ----------
    content : RecordDict
        The train message's content (:data:`WEIGHT_KEY_FIELD` in one of its config records).

    Returns
    -------
    str
        The key, or :data:`DEFAULT_WEIGHT_KEY` when the message names none.

    Raises
    ------
    SubmodelFormatError
        If the field is present but not a non-empty string.
    """
    for record in content.config_records.values():
        if WEIGHT_KEY_FIELD in record:
            key = record[WEIGHT_KEY_FIELD]
            if not isinstance(key, str) or not key:
                raise SubmodelFormatError(f"{WEIGHT_KEY_FIELD!r} must be a non-empty string")
            return key
    return DEFAULT_WEIGHT_KEY


@dataclass(frozen=True, eq=False)
class RoundRequest:
    """The request of both SSA phases: a message of an SSA round, as it came.

    Attributes
    ----------
    round : SSARound
        The round its config record carries.
    content : RecordDict
        The message's own content, not a copy: what a ``runs_train`` handler puts there
        before it calls ``train()`` is what the user's train function gets.
    """

    round: SSARound
    content: RecordDict

    def to_record(self) -> RecordDict:
        """Return the message content (the round's fields sit in the user's config record)."""
        return self.content

    @classmethod
    def from_record(cls, content: RecordDict) -> RoundRequest:
        """Parse a message of an SSA round.

        Raises
        ------
        ClientInputError
            If it carries no round (:class:`SubmodelFormatError` if the round is malformed).
        """
        found = find_round(content)
        if found is None:
            raise ClientInputError("the message carries no SSA round parameters")
        return cls(found, content)


@dataclass(frozen=True, eq=False)
class UploadReply:
    """The train reply to S0: the :data:`SSA_UPLOAD_KEY` record and nothing else.

    ``record`` is :func:`ssa_upload_record` (fresh keys) or :func:`hint_upload_record` (U-DPF).
    """

    record: ConfigRecord

    def to_record(self) -> RecordDict:
        """Return the reply content: no metrics in the clear (the weight is in the payload)."""
        return RecordDict({SSA_UPLOAD_KEY: self.record})

    @classmethod
    def from_record(cls, content: RecordDict) -> UploadReply:
        """Parse an upload (raises :class:`SubmodelFormatError` as :func:`read_ssa_upload`)."""
        if read_hint_upload(content) is None:
            read_ssa_upload(content)
        return cls(content.config_records[SSA_UPLOAD_KEY])


@dataclass(frozen=True, eq=False)
class PSRQueryReply:
    """The ``query.psr`` reply to S0: the :data:`PSR_UPLOAD_KEY` record (``ssa_upload_record``)."""

    record: ConfigRecord

    def to_record(self) -> RecordDict:
        """Return the reply content."""
        return RecordDict({PSR_UPLOAD_KEY: self.record})

    @classmethod
    def from_record(cls, content: RecordDict) -> PSRQueryReply:
        """Parse a PSR query (raises :class:`SubmodelFormatError` as :func:`read_ssa_upload`)."""
        read_ssa_upload(content, PSR_UPLOAD_KEY)
        return cls(content.config_records[PSR_UPLOAD_KEY])


SSA_FAMILY = "fsl.ssa"
"""The family's name in :class:`~flwr_fsl.core.phases.Phase` (no record of that key is sent)."""
SSA_TRAIN: Phase[RoundRequest, UploadReply] = Phase(
    SSA_FAMILY, MessageType.TRAIN, RoundRequest, UploadReply, runs_train=True
)
"""A train message (``train`` or ``train.<action>``) of an SSA round: train, upload."""
PSR_QUERY: Phase[RoundRequest, PSRQueryReply] = Phase(
    SSA_FAMILY, "psr", RoundRequest, PSRQueryReply, message_type=PSR_QUERY_TYPE
)
"""Index mode's retrieval phase (``query.psr``): the client's PSR keys."""


# ---- the sparse submodel codec (flwr_fsl.submodel.codec) inside a Flower message ----------------
