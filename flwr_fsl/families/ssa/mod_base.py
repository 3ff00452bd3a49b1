"""One base for the SSA client mods: a :class:`~flwr_fsl.core.phases.PhaseMod` over SSA's phases.

A protocol's client mod (:data:`~flwr_fsl.families.ssa.mod.ssa_mod`,
:class:`~flwr_fsl.families.ssa.index_mod.PrivateRows`) subclasses :class:`ProtocolMod`, lists
its :attr:`~flwr_fsl.core.phases.PhaseMod.phases` (:data:`~flwr_fsl.families.ssa.records.SSA_TRAIN`,
:data:`~flwr_fsl.families.ssa.records.PSR_QUERY`) and implements only its protocol steps
(``on_train(request, context, train)``, ``on_psr(request, context)``); the protocol itself
lives Flower-free in :mod:`flwr_fsl.families.ssa.protocol`. The dispatch is
:class:`~flwr_fsl.core.phases.PhaseMod`'s; what the base adds is SSA's:

- **which phase**: SSA messages carry no family record, so :meth:`ProtocolMod.phase_of`
  recognises them by the message type. A ``train`` (or ``train.<action>``) message carrying a
  round this mod :meth:`~ProtocolMod.handles` is the ``train`` phase; ``query.<name>`` is the
  phase of that name, if the mod has one; everything else (evaluate, other queries, plaintext
  train rounds) passes through to ``call_next`` untouched;
- the **round**: SSA parameters, S1's key and the sealing binding, found in the message's
  config records by :func:`~flwr_fsl.families.ssa.records.find_round`, with the record they
  came in (:class:`SSARound`, the request's ``round``); S1's key is checked against the
  fingerprint pinned in the run config (:func:`flwr_fsl.pinning.pinned_fingerprint`) before
  the mod sees the round;
- the **promised noise**: the round's DP noise multiplier (0 without DP) must reach the
  client's floor, node config ``fsl-min-noise-multiplier`` (default :attr:`ProtocolMod.noise_floor`:
  0 in top-k mode, 1 in index mode), and a DP round must name this client's own Flower run
  (S1 keeps its privacy account by that run id); otherwise the mod refuses the round with one
  line naming the key or field (:meth:`ProtocolMod.check_privacy`), before anything is sent;
- the client's **weight**: 1 in a round with unit weights (``SSAParams.weighted`` False, the
  strategies' default: the reply's metrics are not read); in a weighted round the reply's
  metric under the key the strategy aggregates by, which the server sends as
  :data:`~flwr_fsl.families.ssa.records.WEIGHT_KEY_FIELD` in the train message's
  ``ConfigRecord`` (default :data:`~flwr_fsl.families.ssa.records.DEFAULT_WEIGHT_KEY`). The
  client uses only ``num-examples`` or a key its own node config allows
  (:data:`~flwr_fsl.core.privacy.NODE_WEIGHT_KEYS_KEY`): a round naming another key is
  refused before training, the error naming the key (:meth:`ProtocolMod.check_weight_key`,
  :meth:`ProtocolMod.round_weight`);
- the client's **identity**: every SSA upload and U-DPF hint binding sealed to S1 is signed
  with the node's Ed25519 key (:mod:`flwr_fsl.crypto.identity`), so S1 counts only clients on
  its enrollment list and S0 cannot invent any. The key file is the node config's
  ``fsl-signing-key`` (an absolute path; the file must exist), else
  ``$FLWR_HOME/fsl/identity/partition-<partition-id>.pem`` (``node-<node id>.pem`` without a
  ``partition-id``), created on first use (enroll its public key:
  ``flwr-fsl-identity <path>`` prints the line). :meth:`ProtocolMod.signer` loads it when the
  first SSA round arrives, before anything is trained or sent, and a bad key refuses the round
  with one line naming ``fsl-signing-key``. Flower's SuperNode authentication key cannot serve:
  it is an ECDSA key the ClientApp never sees (see :mod:`flwr_fsl.crypto.identity`). PSR
  queries are not signed (:mod:`flwr_fsl.families.ssa.sealing` says why);
- typed **state** in ``Context.state`` (:class:`~flwr_fsl.core.state.StateSlot`): one object per
  slot, stored with the protocol's own versioned codec.

Client exceptions become the error reply's reason, which S0 reads: the texts here name fields
and checks, never an index, value or set size.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from flwr.app import ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.core.phases import Phase, PhaseMod
from flwr_fsl.core.privacy import check_noise_floor, check_weight_key, node_noise_floor
from flwr_fsl.crypto.channel import verify_fingerprint
from flwr_fsl.crypto.identity import SigningIdentity, node_identity
from flwr_fsl.families.ssa.dp import TOPK_MODE_NOISE_FLOOR
from flwr_fsl.families.ssa.protocol import SSAUpload
from flwr_fsl.families.ssa.records import (
    SSA_FAMILY,
    RoundRequest,
    SSARound,
    find_round,
    ssa_upload_record,
    weight_key_of,
)
from flwr_fsl.families.ssa.sealing import seal_ssa_upload
from flwr_fsl.pinning import pinned_fingerprint

__all__ = ["ProtocolMod", "SSARound", "find_round", "weight_key_of"]

_DEFAULT_ACTION = "default"  # Flower's action of a bare "train" / "query" message type


def _refuse(msg: Message, context: Context) -> Message:
    raise ClientInputError(f"this mod answers no {msg.metadata.message_type!r} messages")


class ProtocolMod(PhaseMod):
    """Base class of the SSA client mods (see the module docstring).

    An instance is a Flower mod: ``ClientApp(mods=[instance])`` (or ``mods=[instance.mod]``).
    Subclasses set :attr:`phases` (a ``runs_train`` phase named ``"train"``, query phases
    named by their ``query.<name>`` action) and define ``on_<name>`` per phase, as for any
    :class:`~flwr_fsl.core.phases.PhaseMod`; the request of each is a
    :class:`~flwr_fsl.families.ssa.records.RoundRequest` whose round's S1 key is already
    checked. :meth:`handles` narrows which train rounds are theirs.
    """

    family: ClassVar[str] = SSA_FAMILY
    title: ClassVar[str] = "SSA"
    phases: ClassVar[Mapping[str, Phase[Any, Any]]] = {}
    noise_floor: ClassVar[float] = TOPK_MODE_NOISE_FLOOR
    """The client's noise floor when its node config sets none (:meth:`check_privacy`)."""

    def mod(self, msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        """Client mod: the instance itself (:meth:`phase_of` says what it answers).

        Raises
        ------
        SealedBoxError
            If S1's key does not match the pinned fingerprint.
        SubmodelFormatError
            If the round fields are malformed.
        """
        return self(msg, context, call_next)

    def phase_of(self, msg: Message, context: Context) -> Phase[Any, Any] | None:
        """Return the SSA phase a message is (None: pass it through), S1's key checked.

        Raises
        ------
        ClientInputError
            If a query of one of its phases carries no round.
        SealedBoxError
            If S1's key does not match the pinned fingerprint.
        SubmodelFormatError
            If the round fields are malformed.
        """
        category, _, action = msg.metadata.message_type.partition(".")
        if category == MessageType.TRAIN:
            phase = self.phases.get(MessageType.TRAIN)
            if phase is None:
                return None
            found = find_round(msg.content)
            if found is None or not self.handles(found):
                return None  # a plaintext round: nothing to hide
        elif category == MessageType.QUERY:
            phase = self.phases.get(action or _DEFAULT_ACTION)
            if phase is None or phase.runs_train:
                return None
            found = find_round(msg.content)
            if found is None:
                raise ClientInputError("the query message carries no SSA round parameters")
        else:
            return None
        self.check_helper(found, context)
        self.check_privacy(found, context)
        self.signer(context)  # a bad fsl-signing-key refuses the round before anything runs
        return phase

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
            The reply of the query phase's handler.

        Raises
        ------
        ClientInputError
            If the message carries no round, or is no query phase of this mod.
        SealedBoxError
            If S1's key does not match the pinned fingerprint.
        """
        if msg.metadata.message_type.partition(".")[0] != MessageType.QUERY:
            return _refuse(msg, context)
        return self(msg, context, _refuse)

    # -- hooks ------------------------------------------------------------------------------
    def handles(self, found: SSARound) -> bool:
        """Return True if a train round is this mod's (default: every SSA round)."""
        return True

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
    def signer(context: Context) -> SigningIdentity:
        """Return this node's Ed25519 signing key (node config ``fsl-signing-key``).

        Raises
        ------
        ConfigurationError
            If ``fsl-signing-key`` is malformed, names a missing file, or its file is too
            permissive or no Ed25519 key; one line naming the key.
        """
        return node_identity(context.node_config, int(context.node_id))

    def check_privacy(self, found: SSARound, context: Context) -> None:
        """Refuse a round that promises less noise than this client accepts, or another run.

        The round's noise multiplier (0 without DP) must be at least the node-config floor
        ``fsl-min-noise-multiplier`` (default :attr:`noise_floor`), and a DP round must name
        this client's own Flower run (:attr:`~flwr_fsl.families.ssa.dp.RunScope.run_id`): S1
        accounts the round's noise under that id, so a round naming another run would spend
        another account.

        Raises
        ------
        ConfigurationError
            If the round is below the floor (naming the node-config key) or names another
            run; malformed node config (naming the key).
        """
        params = found.params
        floor = node_noise_floor(context.node_config, self.noise_floor)
        z = 0.0 if params.dp is None else params.dp.noise_multiplier
        check_noise_floor(z, floor, what=f"the {self.title} round's")
        if params.dp is not None:
            named = None if params.run is None else params.run.run_id
            if named != str(context.run_id):
                raise ConfigurationError(
                    f"the {self.title} round's DP account names run {named!r}, not this "
                    f"client's run {context.run_id}; refusing the round"
                )

    @staticmethod
    def check_weight_key(request: RoundRequest, context: Context) -> None:
        """Refuse a weighted round whose weight key this client's node config does not allow.

        Call it before training. Rounds with unit weights name no key and pass.

        Raises
        ------
        ConfigurationError
            If the round is weighted by a key other than ``num-examples`` that the node config
            (:data:`~flwr_fsl.core.privacy.NODE_WEIGHT_KEYS_KEY`) does not list; one line
            naming the key.
        SubmodelFormatError
            If the weight-key field is malformed.
        """
        if request.round.params.weighted:
            check_weight_key(weight_key_of(request.content), context.node_config)

    def round_weight(self, request: RoundRequest, reply: Message, context: Context) -> float:
        """Return the client's weight for this round: 1 with unit weights, else the reply's.

        Parameters
        ----------
        request : RoundRequest
            The train request (its round says whether it is weighted and by which key).
        reply : Message
            The inner train reply.
        context : Context
            The node's context (its node config allows weight keys).

        Returns
        -------
        float
            1.0 in a round with unit weights (the reply's metrics are not read); else the
            reply's metric under the round's weight key (:meth:`reply_weight`).

        Raises
        ------
        ConfigurationError
            If the key is not allowed (:meth:`check_weight_key`) or the reply has no valid
            weight.
        """
        if not request.round.params.weighted:
            return 1.0
        self.check_weight_key(request, context)
        return self.reply_weight(request.content, reply)[2]

    @staticmethod
    def reply_weight(msg: Message | RecordDict, reply: Message) -> tuple[str, MetricRecord, float]:
        """Return the reply's one ``MetricRecord`` (name, record) and its weight.

        Parameters
        ----------
        msg : Message or RecordDict
            The train message or its content (it names the weight key, see
            :func:`weight_key_of`).
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
        key = weight_key_of(msg.content if isinstance(msg, Message) else msg)
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

    @classmethod
    def sealed_upload(cls, upload: SSAUpload, found: SSARound, context: Context) -> ConfigRecord:
        """Seal S1's master seed to S1, signed with the node's key; build S0's upload record.

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
            signer=cls.signer(context),
        )
        return ssa_upload_record(upload.public_part, upload.master_seeds[0], sealed)
