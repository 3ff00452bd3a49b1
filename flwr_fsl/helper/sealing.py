"""What clients seal to S1, and what S1 seals back: plaintext layouts and associated data.

Built on :mod:`flwr_fsl.crypto.channel`. Three sealed messages, each bound by its associated
data (:func:`~flwr_fsl.crypto.channel.associated_data`) to purpose, round, client, sender and
recipient:

==============  ========================  ====================================================
message         associated data           plaintext
==============  ========================  ====================================================
SSA upload      ``ssa``, client -> S1     master seed (16) || SHA-256(public part) (32)
PSR query       ``psr-query``, client->S1 master seed (16) || SHA-256(public part) (32)
                                          || client's per-query X25519 public key (32)
PSR answer      ``psr-answer``, S1->client  helper wire ``ARRAY`` message (the answer rows)
==============  ========================  ====================================================

The public part of the client's DPF keys travels in the clear through S0 (S0 needs the same
bytes); the hash inside the sealed plaintext lets S1 detect any change S0 makes to it.

**Threat model.** Two non-colluding semi-honest servers; S0 relays everything. S0 cannot read
a client's S1 master seed or S1's answers (so it cannot add S1's answer to its own and recover
the retrieved rows), cannot alter the public part or the sealed bytes, and cannot move
material to another round, client or purpose undetected. S1 learns its master seed and the
public part — pseudorandom by DPF security — and the answer it computes itself.

**Errors.** Every failure raises :class:`~flwr_fsl.crypto.channel.SealedBoxError` (a
:class:`ValueError`), with a message naming the cause class (authentication, length, hash).
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.crypto.channel import (
    KEY_BYTES,
    SealedBoxError,
    SealingKeyPair,
    associated_data,
    open_sealed,
    seal,
)
from flwr_fsl.helper import wire

__all__ = [
    "CLIENT",
    "HELPER",
    "MASTER_SEED_BYTES",
    "PSR_ANSWER",
    "PSR_QUERY",
    "SSA",
    "open_psr_answer",
    "open_psr_query",
    "open_ssa_upload",
    "seal_psr_answer",
    "seal_psr_query",
    "seal_ssa_upload",
]

SSA = "ssa"
"""Purpose of a client's SSA upload to S1."""
PSR_QUERY = "psr-query"
"""Purpose of a client's PSR query to S1."""
PSR_ANSWER = "psr-answer"
"""Purpose of S1's PSR answer to a client."""
CLIENT = "client"
"""Sender/recipient name of a client."""
HELPER = "S1"
"""Sender/recipient name of the helper server."""
MASTER_SEED_BYTES = 16
_DIGEST_BYTES = 32


def _digest(public_part: bytes) -> bytes:
    if not isinstance(public_part, bytes | bytearray | memoryview):
        raise SealedBoxError(f"public part must be bytes, got {type(public_part).__name__}")
    return hashlib.sha256(bytes(public_part)).digest()


def _seed(master_seed: bytes) -> bytes:
    if not isinstance(master_seed, bytes | bytearray) or len(master_seed) != MASTER_SEED_BYTES:
        raise SealedBoxError(f"master seed must be {MASTER_SEED_BYTES} bytes")
    return bytes(master_seed)


def _check_binding(plaintext: bytes, public_part: bytes, size: int) -> None:
    if len(plaintext) != size:
        raise SealedBoxError(f"sealed plaintext has {len(plaintext)} bytes, expected {size}")
    digest = plaintext[MASTER_SEED_BYTES : MASTER_SEED_BYTES + _DIGEST_BYTES]
    if not hmac.compare_digest(digest, _digest(public_part)):
        raise SealedBoxError("public part does not match the sealed hash (altered in transit)")


def seal_ssa_upload(
    helper_public: bytes, *, round_id: int, client_id: int, public_part: bytes, master_seed: bytes
) -> bytes:
    """Client side: seal S1's master seed, bound to the public part, round and client.

    Parameters
    ----------
    helper_public : bytes
        S1's pinned raw X25519 public key.
    round_id, client_id : int
        The round and this client's id (as S0 and S1 know it).
    public_part : bytes
        The public part of the client's DPF keys (sent in the clear beside the blob).
    master_seed : bytes
        The 16-byte master seed for S1.

    Returns
    -------
    bytes
        The sealed blob (48 + 56 bytes).

    Raises
    ------
    SealedBoxError
        If an argument is malformed.
    """
    ad = associated_data(
        purpose=SSA, round=round_id, client=client_id, sender=CLIENT, recipient=HELPER
    )
    return seal(helper_public, _seed(master_seed) + _digest(public_part), associated_data=ad)


def open_ssa_upload(
    keypair: SealingKeyPair, sealed: bytes, *, round_id: int, client_id: int, public_part: bytes
) -> bytes:
    """S1 side: open an SSA upload and check it was made for this public part.

    Parameters
    ----------
    keypair : SealingKeyPair
        S1's key pair.
    sealed : bytes
        The blob from :func:`seal_ssa_upload`.
    round_id, client_id : int
        The round and client S0 says the blob belongs to.
    public_part : bytes
        The public part S0 relayed.

    Returns
    -------
    bytes
        The 16-byte master seed.

    Raises
    ------
    SealedBoxError
        If the blob fails authentication (other round, client, purpose or key; tampered), has
        the wrong length, or the public part's hash differs.
    """
    ad = associated_data(
        purpose=SSA, round=round_id, client=client_id, sender=CLIENT, recipient=HELPER
    )
    plaintext = open_sealed(keypair, sealed, associated_data=ad)
    _check_binding(plaintext, public_part, MASTER_SEED_BYTES + _DIGEST_BYTES)
    return plaintext[:MASTER_SEED_BYTES]


def seal_psr_query(
    helper_public: bytes, *, round_id: int, client_id: int, public_part: bytes, master_seed: bytes
) -> tuple[bytes, SealingKeyPair]:
    """Client side: seal S1's PSR master seed with a fresh key for the answer.

    Parameters
    ----------
    helper_public : bytes
        S1's pinned raw X25519 public key.
    round_id, client_id : int
        The round and this client's id.
    public_part : bytes
        The public part of the query's DPF keys.
    master_seed : bytes
        The 16-byte master seed for S1.

    Returns
    -------
    tuple[bytes, SealingKeyPair]
        The sealed blob (80 + 56 bytes) and the per-query key pair to open S1's answer with
        (keep it; never reuse it for another query).

    Raises
    ------
    SealedBoxError
        If an argument is malformed.
    """
    answer_key = SealingKeyPair.generate()
    ad = associated_data(
        purpose=PSR_QUERY, round=round_id, client=client_id, sender=CLIENT, recipient=HELPER
    )
    plaintext = _seed(master_seed) + _digest(public_part) + answer_key.public_bytes
    return seal(helper_public, plaintext, associated_data=ad), answer_key


def open_psr_query(
    keypair: SealingKeyPair, sealed: bytes, *, round_id: int, client_id: int, public_part: bytes
) -> tuple[bytes, bytes]:
    """S1 side: open a PSR query.

    Parameters
    ----------
    keypair : SealingKeyPair
        S1's key pair.
    sealed : bytes
        The blob from :func:`seal_psr_query`.
    round_id, client_id : int
        The round and client S0 says the blob belongs to.
    public_part : bytes
        The public part S0 relayed.

    Returns
    -------
    tuple[bytes, bytes]
        The 16-byte master seed and the client's 32-byte answer public key.

    Raises
    ------
    SealedBoxError
        As :func:`open_ssa_upload`.
    """
    ad = associated_data(
        purpose=PSR_QUERY, round=round_id, client=client_id, sender=CLIENT, recipient=HELPER
    )
    plaintext = open_sealed(keypair, sealed, associated_data=ad)
    _check_binding(plaintext, public_part, MASTER_SEED_BYTES + _DIGEST_BYTES + KEY_BYTES)
    return plaintext[:MASTER_SEED_BYTES], plaintext[MASTER_SEED_BYTES + _DIGEST_BYTES :]


def seal_psr_answer(
    client_public: bytes, answer: NDArray[np.uint64], *, round_id: int, client_id: int
) -> bytes:
    """S1 side: seal an answer to the client's per-query key.

    Parameters
    ----------
    client_public : bytes
        The answer key from the client's query.
    answer : numpy.ndarray
        S1's answer (uint64 rows).
    round_id, client_id : int
        The round and client.

    Returns
    -------
    bytes
        The sealed blob.

    Raises
    ------
    SealedBoxError
        If the key is malformed or low-order, or the answer cannot be encoded.
    """
    ad = associated_data(
        purpose=PSR_ANSWER, round=round_id, client=client_id, sender=HELPER, recipient=CLIENT
    )
    try:
        plaintext = wire.encode(wire.ArrayMessage(np.asarray(answer, np.uint64)))
    except wire.WireFormatError as err:
        raise SealedBoxError(f"cannot encode the answer: {err}") from None
    return seal(client_public, plaintext, associated_data=ad)


def open_psr_answer(
    answer_key: SealingKeyPair, sealed: bytes, *, round_id: int, client_id: int
) -> NDArray[np.uint64]:
    """Client side: open S1's answer.

    Parameters
    ----------
    answer_key : SealingKeyPair
        The key pair :func:`seal_psr_query` returned.
    sealed : bytes
        S1's sealed answer (relayed by S0).
    round_id, client_id : int
        The round and this client's id.

    Returns
    -------
    numpy.ndarray
        S1's answer, uint64.

    Raises
    ------
    SealedBoxError
        If the blob fails authentication or does not hold a uint64 array.
    """
    ad = associated_data(
        purpose=PSR_ANSWER, round=round_id, client=client_id, sender=HELPER, recipient=CLIENT
    )
    plaintext = open_sealed(answer_key, sealed, associated_data=ad)
    try:
        arr = wire.decode(plaintext, wire.ArrayMessage).array
    except wire.WireFormatError as err:
        raise SealedBoxError(f"sealed answer is not a wire array: {err}") from None
    if arr.dtype != np.uint64:
        raise SealedBoxError(f"sealed answer must be uint64, got {arr.dtype}")
    return arr.astype(np.uint64, copy=False)
