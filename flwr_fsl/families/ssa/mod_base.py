"""One base for the protocol client mods: dispatch, round, S1 pin, weight, ``Context.state``.

A protocol's client mod (:data:`~flwr_fsl.families.ssa.mod.ssa_mod`,
:class:`~flwr_fsl.families.ssa.index_mod.PrivateRows`) subclasses :class:`ProtocolMod` and
implements only
its protocol steps (:meth:`ProtocolMod.on_train`, :meth:`ProtocolMod.on_query`); the protocol
itself lives Flower-free in :mod:`flwr_fsl.protocols`. The base does the Flower plumbing all
of them need:

- **dispatch** on the message type: a ``train`` (or ``train.<action>``) message carrying a
  round this mod handles goes to :meth:`~ProtocolMod.on_train`; ``query.<name>`` for a name in
  :attr:`~ProtocolMod.queries` to :meth:`~ProtocolMod.on_query`; everything else (evaluate,
  other queries, plaintext train rounds) passes through to ``call_next`` untouched;
- the **round**: SSA parameters, S1's key and the sealing binding, found in the message's
  config records by :func:`flwr_fsl.families.ssa.records.find_ssa_round`, with the record they came
  in (:class:`SSARound`); S1's key is checked against the fingerprint pinned in the run config
  (:func:`flwr_fsl.pinning.pinned_fingerprint`) before the mod sees the round;
- the reply's **weight** metric, under the key the strategy aggregates by: the server sends
  it as :data:`~flwr_fsl.families.ssa.records.WEIGHT_KEY_FIELD` in the train message's
  ``ConfigRecord``
  (default :data:`~flwr_fsl.families.ssa.records.DEFAULT_WEIGHT_KEY`), so both ends use one setting;
- typed **state** in ``Context.state`` (:class:`~flwr_fsl.core.state.StateSlot`): one object per
  slot, stored with the protocol's own versioned codec.

Client exceptions become the error reply's reason, which S0 reads: the texts here name fields
and checks, never an index, value or set size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.crypto.channel import verify_fingerprint
from flwr_fsl.crypto.sealing import RoundBinding, seal_ssa_upload
from flwr_fsl.families.ssa.protocol import SSAParams, SSAUpload
from flwr_fsl.families.ssa.records import (
    DEFAULT_WEIGHT_KEY,
    PARAMS_FIELD,
    WEIGHT_KEY_FIELD,
    find_ssa_round,
    ssa_upload_record,
)
from flwr_fsl.pinning import pinned_fingerprint
from flwr_fsl.submodel.codec import SubmodelFormatError

__all__ = ["ProtocolMod", "SSARound", "find_round", "weight_key_of"]

_DEFAULT_ACTION = "default"  # Flower's action of a bare "train" / "query" message type


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

    The round is read by :func:`~flwr_fsl.families.ssa.records.find_ssa_round`.

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
        The train message's content (:data:`~flwr_fsl.families.ssa.records.WEIGHT_KEY_FIELD` in one
        of its config records).

    Returns
    -------
    str
        The key, or :data:`~flwr_fsl.families.ssa.records.DEFAULT_WEIGHT_KEY` when the message names
        none.

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


class ProtocolMod:
    """Base class of the protocol client mods (see the module docstring).

    An instance is a Flower mod: ``ClientApp(mods=[instance])`` (or ``mods=[instance.mod]``).
    Subclasses implement :meth:`on_train` and, for each name in :attr:`queries`,
    :meth:`on_query`; :meth:`handles` narrows which rounds are theirs.
    """

    queries: ClassVar[frozenset[str]] = frozenset()
    """The ``query.<name>`` message actions this mod answers."""

    def __call__(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Run :meth:`mod` (an instance is itself a Flower mod)."""
        return self.mod(msg, context, call_next)

    def mod(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Client mod: dispatch on the message type.

        Parameters
        ----------
        msg : Message
            The incoming message.
        context : Context
            The node's context (run config with the pinned S1 key, state).
        call_next : ClientAppCallable
            The inner mods and the user's function.

        Returns
        -------
        Message
            The protocol's reply, or the inner reply for messages this mod does not handle.

        Raises
        ------
        SealedBoxError
            If S1's key does not match the pinned fingerprint.
        SubmodelFormatError
            If the round fields are malformed.
        """
        category, _, action = msg.metadata.message_type.partition(".")
        if category == MessageType.TRAIN:
            found = find_round(msg.content)
            if found is None or not self.handles(found):
                return call_next(msg, context)  # a plaintext round: nothing to hide
            self.check_helper(found, context)
            return self.on_train(msg, context, call_next, found)
        if category == MessageType.QUERY and (action or _DEFAULT_ACTION) in self.queries:
            return self.answer_query(msg, context)
        return call_next(msg, context)

    def answer_query(self, msg: Message, context: Context) -> Message:
        """Answer a ``query.<name>`` message; also usable as a Flower query handler.

        Parameters
        ----------
        msg : Message
            The query message; it must carry the round.
        context : Context
            The node's context.

        Returns
        -------
        Message
            The reply of :meth:`on_query`.

        Raises
        ------
        ClientInputError
            If the message carries no round, or its action is not in :attr:`queries`.
        SealedBoxError
            If S1's key does not match the pinned fingerprint.
        """
        _, _, action = msg.metadata.message_type.partition(".")
        name = action or _DEFAULT_ACTION
        if name not in self.queries:
            raise ClientInputError(f"this mod answers no {msg.metadata.message_type!r} messages")
        found = find_round(msg.content)
        if found is None:
            raise ClientInputError("the query message carries no SSA round parameters")
        self.check_helper(found, context)
        return self.on_query(name, msg, context, found)

    # -- hooks ------------------------------------------------------------------------------
    def handles(self, found: SSARound) -> bool:
        """Return True if a train round is this mod's (default: every SSA round)."""
        return True

    def on_train(
        self, msg: Message, context: Context, call_next: ClientAppCallable, found: SSARound
    ) -> Message:
        """Handle a train message of a round this mod handles (S1's key already checked).

        Raises
        ------
        NotImplementedError
            In the base class.
        """
        raise NotImplementedError

    def on_query(self, name: str, msg: Message, context: Context, found: SSARound) -> Message:
        """Answer a ``query.<name>`` message (S1's key already checked).

        Raises
        ------
        NotImplementedError
            In the base class.
        """
        raise NotImplementedError

    # -- shared steps -----------------------------------------------------------------------
    @staticmethod
    def check_helper(found: SSARound, context: Context) -> None:
        """Check S1's key against the fingerprint pinned in the run config.

        Raises
        ------
        SealedBoxError
            If it does not match (or the pin is malformed).
        ConfigurationError
            If the run config pins no key and no default key file exists.
        """
        verify_fingerprint(found.helper_key, pinned_fingerprint(context.run_config))

    @staticmethod
    def reply_weight(msg: Message, reply: Message) -> tuple[str, MetricRecord, float]:
        """Return the reply's one ``MetricRecord`` (name, record) and its weight.

        Parameters
        ----------
        msg : Message
            The train message (it names the weight key, see :func:`weight_key_of`).
        reply : Message
            The inner train reply.

        Returns
        -------
        tuple[str, MetricRecord, float]
            The record's name, the record, and the weight (finite, > 0).

        Raises
        ------
        ConfigurationError
            If the reply has not exactly one MetricRecord with a positive finite weight.
        """
        key = weight_key_of(msg.content)
        metrics = list(reply.content.metric_records.items())
        if len(metrics) != 1 or key not in metrics[0][1]:
            raise ConfigurationError(f"the train reply needs one MetricRecord with {key!r}")
        name, record = metrics[0]
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigurationError(f"the reply's {key!r} must be a number")
        if not (math.isfinite(value) and value > 0):
            raise ConfigurationError(f"the reply's {key!r} must be finite and > 0")
        return name, record, float(value)

    @staticmethod
    def sealed_upload(upload: SSAUpload, found: SSARound, context: Context) -> ConfigRecord:
        """Seal S1's master seed to S1 and build the upload record for S0.

        Parameters
        ----------
        upload : SSAUpload
            The fresh keys' public part and master seeds.
        found : SSARound
            The round (S1's key, already checked, and the binding).
        context : Context
            The node's context (its node id is the client id the seal is bound to).

        Returns
        -------
        ConfigRecord
            ``public``, S0's ``seed`` and S1's ``sealed`` material.
        """
        sealed = seal_ssa_upload(
            found.helper_key,
            binding=found.binding,
            client_id=int(context.node_id),
            public_part=upload.public_part,
            master_seed=upload.master_seeds[1],
        )
        return ssa_upload_record(upload.public_part, upload.master_seeds[0], sealed)
