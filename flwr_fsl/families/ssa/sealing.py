"""What SSA/PSR clients seal to S1, and what S1 seals back: plaintext layouts and purposes.

Built on :mod:`flwr_fsl.crypto.channel`; Flower- and gRPC-free, so a client seals without
loading S1's server code. Every sealed message is bound by its associated data
(:func:`~flwr_fsl.crypto.channel.associated_data`) to its purpose, sender and recipient party
ids and a :class:`RoundBinding` — the run's session id, the round and the SHA-256 of the
round's public parameters — so a blob from one run, round or parameter set never opens in
another. Three messages of the two-server protocols:

==============  ========================  ====================================================
message         associated data           plaintext
==============  ========================  ====================================================
SSA upload      ``ssa``, client -> S1     master seed (16) || SHA-256(public part) (32)
PSR query       ``psr-query``, client->S1 master seed (16) || SHA-256(public part) (32)
                                          || client's per-query X25519 public key (32)
PSR answer      ``psr-answer``, S1->client  magic ``FSPA`` v1 + one array field
                                          (:mod:`flwr_fsl.core.wireformat`; the answer rows)
==============  ========================  ====================================================

Sealing itself, :class:`~flwr_fsl.crypto.sealing.RoundBinding` and the generic
:func:`~flwr_fsl.crypto.sealing.seal_for` / :func:`~flwr_fsl.crypto.sealing.open_from` are
the platform's (:mod:`flwr_fsl.crypto.sealing`).

The public part of the client's DPF keys travels in the clear through S0 (S0 needs the same
bytes); the hash inside the sealed plaintext lets S1 detect any change S0 makes to it.

**Threat model.** Two non-colluding semi-honest servers; S0 relays everything. S0 cannot read
a client's S1 master seed or S1's answers (so it cannot add S1's answer to its own and recover
the retrieved rows), cannot alter the public part or the sealed bytes, and cannot move
material to another run, round, parameter set, client or purpose undetected. S1 learns its
master seed and the public part — pseudorandom by DPF security — and the answer it computes itself.

**Errors.** Every failure raises :class:`~flwr_fsl.crypto.channel.SealedBoxError` (a
:class:`ValueError`), with a message naming the cause class (authentication, length, hash).
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np
from numpy.typing import NDArray

from flwr_fsl.core.wireformat import Reader, WireFormatError, Writer, register_magic
from flwr_fsl.crypto.channel import (
    KEY_BYTES,
    SealedBoxError,
    SealingKeyPair,
    associated_data,
    client_party,
    open_sealed,
    seal,
)
from flwr_fsl.crypto.sealing import RoundBinding

__all__ = [
    "HELPER",
    "MASTER_SEED_BYTES",
    "PSR_ANSWER",
    "PSR_QUERY",
    "SSA",
    "UDPF_HINT",
    "open_psr_answer",
    "open_psr_query",
    "open_ssa_upload",
    "open_udpf_hint",
    "seal_psr_answer",
    "seal_psr_query",
    "seal_ssa_upload",
    "seal_udpf_hint",
]

SSA = "ssa"
"""Purpose of a client's SSA upload to S1."""
PSR_QUERY = "psr-query"
"""Purpose of a client's PSR query to S1."""
PSR_ANSWER = "psr-answer"
"""Purpose of S1's PSR answer to a client."""
UDPF_HINT = "udpf-hint"
"""Purpose of a client's binding of its U-DPF hint for S1."""
HELPER = "S1"
"""Sender/recipient name of the helper server."""
MASTER_SEED_BYTES = 16
_DIGEST_BYTES = 32
# Sealed PSR answer plaintext, v1 (magic + version byte): one wireformat array field.
_ANSWER_MAGIC = (
    register_magic(b"FSPA", "sealed PSR answer plaintext (flwr_fsl.families.ssa.sealing)") + b"\x01"
)


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
    helper_public: bytes,
    *,
    binding: RoundBinding,
    client_id: int,
    public_part: bytes,
    master_seed: bytes,
) -> bytes:
    """Client side: seal S1's master seed, bound to the public part, round and client.

    Parameters
    ----------
    helper_public : bytes
        S1's pinned raw X25519 public key.
    binding : RoundBinding
        The run's session, the round and its parameters' digest.
    client_id : int
        This client's id (as S0 and S1 know it).
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
        purpose=SSA, sender=client_party(client_id), recipient=HELPER, **binding.fields()
    )
    return seal(helper_public, _seed(master_seed) + _digest(public_part), associated_data=ad)


def open_ssa_upload(
    keypair: SealingKeyPair,
    sealed: bytes,
    *,
    binding: RoundBinding,
    client_id: int,
    public_part: bytes,
) -> bytes:
    """S1 side: open an SSA upload and check it was made for this public part.

    Parameters
    ----------
    keypair : SealingKeyPair
        S1's key pair.
    sealed : bytes
        The blob from :func:`seal_ssa_upload`.
    binding : RoundBinding
        The run's session, the round and its parameters' digest.
    client_id : int
        The client (its Flower node id).
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
        purpose=SSA, sender=client_party(client_id), recipient=HELPER, **binding.fields()
    )
    plaintext = open_sealed(keypair, sealed, associated_data=ad)
    _check_binding(plaintext, public_part, MASTER_SEED_BYTES + _DIGEST_BYTES)
    return plaintext[:MASTER_SEED_BYTES]


def seal_udpf_hint(
    helper_public: bytes, *, binding: RoundBinding, client_id: int, hint: bytes, held: bytes
) -> bytes:
    """Client side: bind a U-DPF hint, and the keys it updates, for S1.

    The hint itself travels in the clear (both servers apply the same bytes); the sealed blob
    carries its SHA-256 and the digest of the keys it was made for
    (:func:`~flwr_fsl.families.ssa.protocol.held_digest`), so S0 cannot alter S1's copy and S1
    applies the hint only to exactly those keys.

    Returns
    -------
    bytes
        The sealed blob (64 + 56 bytes).

    Raises
    ------
    SealedBoxError
        If an argument is malformed (``held`` must be 32 bytes).
    """
    if len(held) != _DIGEST_BYTES:
        raise SealedBoxError("the held-keys digest must be 32 bytes")
    ad = associated_data(
        purpose=UDPF_HINT, sender=client_party(client_id), recipient=HELPER, **binding.fields()
    )
    return seal(helper_public, _digest(hint) + bytes(held), associated_data=ad)


def open_udpf_hint(
    keypair: SealingKeyPair, sealed: bytes, *, binding: RoundBinding, client_id: int, hint: bytes
) -> bytes:
    """S1 side: check a relayed hint against the client's sealed binding.

    Returns
    -------
    bytes
        The 32-byte digest of the keys the hint updates (S1 compares it with its own).

    Raises
    ------
    SealedBoxError
        If the blob fails authentication, has the wrong length, or the hint was altered.
    """
    ad = associated_data(
        purpose=UDPF_HINT, sender=client_party(client_id), recipient=HELPER, **binding.fields()
    )
    plaintext = open_sealed(keypair, sealed, associated_data=ad)
    if len(plaintext) != 2 * _DIGEST_BYTES:
        raise SealedBoxError(f"sealed plaintext has {len(plaintext)} bytes, expected 64")
    if not hmac.compare_digest(plaintext[:_DIGEST_BYTES], _digest(hint)):
        raise SealedBoxError("hint does not match the sealed hash (altered in transit)")
    return plaintext[_DIGEST_BYTES:]


def seal_psr_query(
    helper_public: bytes,
    *,
    binding: RoundBinding,
    client_id: int,
    public_part: bytes,
    master_seed: bytes,
) -> tuple[bytes, SealingKeyPair]:
    """Client side: seal S1's PSR master seed with a fresh key for the answer.

    Parameters
    ----------
    helper_public : bytes
        S1's pinned raw X25519 public key.
    binding : RoundBinding
        The run's session, the round and its parameters' digest.
    client_id : int
        The client (its Flower node id).
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
        purpose=PSR_QUERY, sender=client_party(client_id), recipient=HELPER, **binding.fields()
    )
    plaintext = _seed(master_seed) + _digest(public_part) + answer_key.public_bytes
    return seal(helper_public, plaintext, associated_data=ad), answer_key


def open_psr_query(
    keypair: SealingKeyPair,
    sealed: bytes,
    *,
    binding: RoundBinding,
    client_id: int,
    public_part: bytes,
) -> tuple[bytes, bytes]:
    """S1 side: open a PSR query.

    Parameters
    ----------
    keypair : SealingKeyPair
        S1's key pair.
    sealed : bytes
        The blob from :func:`seal_psr_query`.
    binding : RoundBinding
        The run's session, the round and its parameters' digest.
    client_id : int
        The client (its Flower node id).
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
        purpose=PSR_QUERY, sender=client_party(client_id), recipient=HELPER, **binding.fields()
    )
    plaintext = open_sealed(keypair, sealed, associated_data=ad)
    _check_binding(plaintext, public_part, MASTER_SEED_BYTES + _DIGEST_BYTES + KEY_BYTES)
    return plaintext[:MASTER_SEED_BYTES], plaintext[MASTER_SEED_BYTES + _DIGEST_BYTES :]


def seal_psr_answer(
    client_public: bytes, answer: NDArray[np.uint64], *, binding: RoundBinding, client_id: int
) -> bytes:
    """S1 side: seal an answer to the client's per-query key.

    Parameters
    ----------
    client_public : bytes
        The answer key from the client's query.
    answer : numpy.ndarray
        S1's answer (uint64 rows).
    binding : RoundBinding
        The run's session, the round and its parameters' digest.
    client_id : int
        The client (its Flower node id).

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
        purpose=PSR_ANSWER, sender=HELPER, recipient=client_party(client_id), **binding.fields()
    )
    try:
        w = Writer()
        w.array(np.asarray(answer, np.uint64))
        plaintext = _ANSWER_MAGIC + w.payload()
    except WireFormatError as err:
        raise SealedBoxError(f"cannot encode the answer: {err}") from None
    return seal(client_public, plaintext, associated_data=ad)


def open_psr_answer(
    answer_key: SealingKeyPair, sealed: bytes, *, binding: RoundBinding, client_id: int
) -> NDArray[np.uint64]:
    """Client side: open S1's answer.

    Parameters
    ----------
    answer_key : SealingKeyPair
        The key pair :func:`seal_psr_query` returned.
    sealed : bytes
        S1's sealed answer (relayed by S0).
    binding : RoundBinding
        The run's session, the round and its parameters' digest.
    client_id : int
        The client (its Flower node id).

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
        purpose=PSR_ANSWER, sender=HELPER, recipient=client_party(client_id), **binding.fields()
    )
    plaintext = open_sealed(answer_key, sealed, associated_data=ad)
    try:
        if plaintext[: len(_ANSWER_MAGIC)] != _ANSWER_MAGIC:
            raise WireFormatError("bad magic")
        r = Reader(plaintext, len(_ANSWER_MAGIC))
        arr = r.array("answer")
        r.done()
    except WireFormatError as err:
        raise SealedBoxError(f"sealed answer is not an encoded array: {err}") from None
    if arr.dtype != np.uint64:
        raise SealedBoxError(f"sealed answer must be uint64, got {arr.dtype}")
    return arr.astype(np.uint64, copy=False)
