"""Sealing between two parties of a round, bound to the round: the one sealing every family uses.

Built on :mod:`flwr_fsl.crypto.channel`; Flower- and gRPC-free. :func:`seal_for` /
:func:`open_from` seal a payload from one party to another so that a relay (S0, the ServerApp)
can neither read nor alter it: the associated data
(:func:`~flwr_fsl.crypto.channel.associated_data`) binds it to its purpose, sender and
recipient party ids and a :class:`RoundBinding` — the run's session id, the round and the
SHA-256 of the round's public parameters — so a blob from one run, round or parameter set
never opens in another. SecAgg's and SESA's client-to-client shares, PrivHFL's seeds and the
two-server SSA/PSR messages (:mod:`flwr_fsl.families.ssa.sealing`) are all sealed this way.

**Errors.** Every failure raises :class:`~flwr_fsl.crypto.channel.SealedBoxError` (a
:class:`ValueError`), with a message naming the cause class (authentication, length, hash).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from flwr_fsl.crypto.channel import (
    DIGEST_BYTES,
    SESSION_BYTES,
    SealedBoxError,
    SealingKeyPair,
    associated_data,
    open_sealed,
    seal,
)

__all__ = ["RoundBinding", "open_from", "seal_for"]


@dataclass(frozen=True)
class RoundBinding:
    """What every sealed message of a round is bound to: session, round, round parameters.

    Parameters
    ----------
    session : bytes
        The 16-byte session id S1 drew for the run (``helper.session_id``; sent to clients in
        the train config as ``fsl.ssa.session``).
    round_id : int
        The server round.
    params_digest : bytes
        SHA-256 of the round's public parameters (``SSAParams.to_bytes()``), as the sealer saw
        them: S0 cannot show S1 other parameters than the clients used.

    Raises
    ------
    SealedBoxError
        If a field has the wrong type or length.
    """

    session: bytes = field(repr=False)
    round_id: int
    params_digest: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.session, bytes) or len(self.session) != SESSION_BYTES:
            raise SealedBoxError(f"session id must be {SESSION_BYTES} bytes")
        if isinstance(self.round_id, bool) or not isinstance(self.round_id, int):
            raise SealedBoxError("round id must be an int")
        if not isinstance(self.params_digest, bytes) or len(self.params_digest) != DIGEST_BYTES:
            raise SealedBoxError(f"parameter digest must be {DIGEST_BYTES} bytes")

    @classmethod
    def of(cls, session: bytes, round_id: int, params: bytes) -> RoundBinding:
        """Bind to ``session``, ``round_id`` and the SHA-256 of the encoded ``params``."""
        if not isinstance(params, bytes):
            raise SealedBoxError("round parameters must be bytes")
        return cls(session, round_id, hashlib.sha256(params).digest())

    def fields(self) -> dict[str, Any]:
        """Keyword arguments of :func:`~flwr_fsl.crypto.channel.associated_data`."""
        return {
            "session": self.session,
            "round": self.round_id,
            "params_digest": self.params_digest,
        }


def seal_for(
    recipient_public: bytes,
    plaintext: bytes,
    *,
    purpose: str,
    binding: RoundBinding,
    sender: str,
    recipient: str,
) -> bytes:
    """Seal a payload from one party to another under the round's binding.

    Parameters
    ----------
    recipient_public : bytes
        The recipient's raw X25519 public key (pinned, or relayed and authenticated by the
        protocol that uses this function).
    plaintext : bytes
        The payload.
    purpose : str
        What the payload is (distinct per message of a protocol).
    binding : RoundBinding
        Session, round and round-parameter digest.
    sender, recipient : str
        Party ids: ``"S0"``, ``"S1"`` or :func:`~flwr_fsl.crypto.channel.client_party`.

    Returns
    -------
    bytes
        The sealed blob.

    Raises
    ------
    SealedBoxError
        If an argument is malformed.
    """
    ad = associated_data(purpose=purpose, sender=sender, recipient=recipient, **binding.fields())
    return seal(recipient_public, plaintext, associated_data=ad)


def open_from(
    keypair: SealingKeyPair,
    sealed: bytes,
    *,
    purpose: str,
    binding: RoundBinding,
    sender: str,
    recipient: str,
) -> bytes:
    """Open a blob from :func:`seal_for`; every argument must match what the sender bound.

    Raises
    ------
    SealedBoxError
        If the blob fails authentication (other purpose, party, session, round, parameters or
        key; tampered) or is malformed.
    """
    ad = associated_data(purpose=purpose, sender=sender, recipient=recipient, **binding.fields())
    return open_sealed(keypair, sealed, associated_data=ad)
