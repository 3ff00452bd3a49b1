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
SSA upload      ``ssa``, client -> S1     signed (below), body: master seed (16)
                                          || SHA-256(public part) (32)
U-DPF hint      ``udpf-hint``, client->S1 signed (below), body: SHA-256(hint) (32)
                                          || digest of the keys it updates (32)
PSR query       ``psr-query``, client->S1 master seed (16) || SHA-256(public part) (32)
                                          || client's per-query X25519 public key (32)
PSR answer      ``psr-answer``, S1->client  magic ``FSPA`` v1 + one array field
                                          (:mod:`flwr_fsl.core.wireformat`; the answer rows)
==============  ========================  ====================================================

**Signed plaintexts** (v2 of the SSA upload and the U-DPF hint binding; v1 was the bare body,
which S1 now refuses): magic ``FSSG``, version byte 1, the client's raw Ed25519 public key (32),
its signature (64), then the body (fixed length per purpose)::

    b"FSSG" 0x01 || signer (32) || signature (64) || body

The signature (:mod:`flwr_fsl.crypto.identity`, purpose ``ssa`` or ``udpf-hint``) covers
``u32-be len(AD) || AD || body``: the channel's associated data — purpose, client id (sender),
S1 (recipient), session, round and parameter digest — and the body. It sits *inside* the sealed
plaintext, so S0 never sees who signed; S1 checks the signer against its enrollment list
(:class:`~flwr_fsl.crypto.identity.Enrollment`). :func:`decode_signed` is the strict decoder
(lengths only); :func:`open_ssa_upload` / :func:`open_udpf_hint` verify the signature.

**Why PSR queries are not signed.** Retrieval privacy does not depend on who asks: a PSR query
reveals nothing about any other client (S1 answers it from the table S0 itself supplied), and
a query S0 invents only retrieves rows of S0's own table, which S0 already has. S1 counts no
PSR participant toward anything (its minimum participation counts SSA uploads), so an invented
query gains S0 nothing but S1's work, which S1's limits bound.

Sealing itself, :class:`~flwr_fsl.crypto.sealing.RoundBinding` and the generic
:func:`~flwr_fsl.crypto.sealing.seal_for` / :func:`~flwr_fsl.crypto.sealing.open_from` are
the platform's (:mod:`flwr_fsl.crypto.sealing`).

The public part of the client's DPF keys travels in the clear through S0 (S0 needs the same
bytes); the hash inside the sealed plaintext lets S1 detect any change S0 makes to it.

**Threat model.** Two non-colluding servers; S0 relays everything and may deviate. S0 cannot read
a client's S1 master seed or S1's answers (so it cannot add S1's answer to its own and recover
the retrieved rows), cannot alter the public part or the sealed bytes, and cannot move
material to another run, round, parameter set, client or purpose undetected. S0 cannot make
an SSA upload or hint S1 accepts as an enrolled client's without that client's signing key
(it cannot invent clients), and does not learn which key signed. S1 learns its master seed and
the public part — pseudorandom by DPF security —, the signer's public key (the client's
enrolled identity) and the answer it computes itself.

**Errors.** Every failure raises :class:`~flwr_fsl.crypto.channel.SealedBoxError` (a
:class:`ValueError`), with a message naming the cause class (authentication, length, hash,
unsigned v1 layout), or :class:`~flwr_fsl.crypto.identity.SignatureError` for a signature
that does not verify; both are :class:`~flwr_fsl.core.errors.ClientInputError`.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass, field

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
from flwr_fsl.crypto.identity import (
    PUBLIC_KEY_BYTES,
    SIGNATURE_BYTES,
    SigningIdentity,
    verify,
)
from flwr_fsl.crypto.sealing import RoundBinding

__all__ = [
    "HELPER",
    "MASTER_SEED_BYTES",
    "PSR_ANSWER",
    "PSR_QUERY",
    "SSA",
    "UDPF_HINT",
    "OpenedHint",
    "OpenedUpload",
    "SignedPlaintext",
    "decode_signed",
    "encode_signed",
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

# Signed sealed plaintext, v2 of the SSA upload / U-DPF hint (v1: the bare body).
_SIGNED_MAGIC = (
    register_magic(b"FSSG", "signed sealed plaintext (flwr_fsl.families.ssa.sealing)") + b"\x01"
)
_SIGNED_HEADER = len(_SIGNED_MAGIC) + PUBLIC_KEY_BYTES + SIGNATURE_BYTES
_UPLOAD_BODY = MASTER_SEED_BYTES + _DIGEST_BYTES
_HINT_BODY = 2 * _DIGEST_BYTES


@dataclass(frozen=True)
class SignedPlaintext:
    """A decoded signed plaintext: the signer's public key, its signature and the body."""

    signer: bytes
    signature: bytes = field(repr=False)
    body: bytes = field(repr=False)


@dataclass(frozen=True)
class OpenedUpload:
    """What S1 gets from an SSA upload: its master seed and the (verified) signer."""

    master_seed: bytes = field(repr=False)
    signer: bytes


@dataclass(frozen=True)
class OpenedHint:
    """What S1 gets from a U-DPF hint binding: the held-keys digest and the (verified) signer."""

    held: bytes = field(repr=False)
    signer: bytes


def _signed_message(ad: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(ad)) + ad + body


def encode_signed(signer: SigningIdentity, purpose: str, ad: bytes, body: bytes) -> bytes:
    """Return the signed plaintext of ``body`` for a channel with associated data ``ad``.

    Parameters
    ----------
    signer : SigningIdentity
        The client's Ed25519 key.
    purpose : str
        The channel's purpose (:data:`SSA` or :data:`UDPF_HINT`); also the signature's.
    ad : bytes
        The channel's associated data.
    body : bytes
        The purpose's body.

    Returns
    -------
    bytes
        ``FSSG 0x01 || signer || signature || body``.

    Raises
    ------
    SealedBoxError
        If ``signer`` is not a :class:`~flwr_fsl.crypto.identity.SigningIdentity`.
    """
    if not isinstance(signer, SigningIdentity):
        raise SealedBoxError(f"signer must be a SigningIdentity, got {type(signer).__name__}")
    signature = signer.sign(purpose, _signed_message(ad, body))
    return _SIGNED_MAGIC + signer.public_bytes + signature + body


def decode_signed(plaintext: bytes, body_size: int) -> SignedPlaintext:
    """Strictly decode a signed plaintext (lengths and version; the signature is not checked).

    Parameters
    ----------
    plaintext : bytes
        An opened plaintext.
    body_size : int
        The purpose's exact body length.

    Returns
    -------
    SignedPlaintext
        The signer, signature and body.

    Raises
    ------
    SealedBoxError
        If the plaintext is not bytes, is an unsigned (v1) body, has another magic or
        version, or has the wrong length.
    """
    if not isinstance(plaintext, bytes | bytearray):
        raise SealedBoxError("a sealed plaintext must be bytes")
    data = bytes(plaintext)
    if len(data) == body_size and data[:4] != _SIGNED_MAGIC[:4]:
        raise SealedBoxError("unsigned (v1) sealed material: S1 requires a client signature")
    if data[: len(_SIGNED_MAGIC) - 1] != _SIGNED_MAGIC[:-1]:
        raise SealedBoxError("sealed plaintext is not a signed layout (bad magic)")
    if data[len(_SIGNED_MAGIC) - 1 : len(_SIGNED_MAGIC)] != _SIGNED_MAGIC[-1:]:
        raise SealedBoxError("signed sealed plaintext of an unknown version")
    if len(data) != _SIGNED_HEADER + body_size:
        raise SealedBoxError(
            f"signed sealed plaintext has {len(data)} bytes, expected {_SIGNED_HEADER + body_size}"
        )
    at = len(_SIGNED_MAGIC)
    return SignedPlaintext(
        data[at : at + PUBLIC_KEY_BYTES],
        data[at + PUBLIC_KEY_BYTES : _SIGNED_HEADER],
        data[_SIGNED_HEADER:],
    )


def _open_signed(
    keypair: SealingKeyPair, sealed: bytes, purpose: str, ad: bytes, body_size: int
) -> SignedPlaintext:
    """Open, decode and verify a signed sealed message; return it (signature checked)."""
    signed = decode_signed(open_sealed(keypair, sealed, associated_data=ad), body_size)
    verify(signed.signer, purpose, _signed_message(ad, signed.body), signed.signature)
    return signed


def _digest(public_part: bytes) -> bytes:
    if not isinstance(public_part, bytes | bytearray | memoryview):
        raise SealedBoxError(f"public part must be bytes, got {type(public_part).__name__}")
    if isinstance(public_part, memoryview) and not public_part.c_contiguous:
        public_part = public_part.tobytes()
    return hashlib.sha256(public_part).digest()  # hashed where it lies (no copy)


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
    signer: SigningIdentity,
) -> bytes:
    """Client side: seal S1's master seed, bound to the public part, round and client, signed.

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
    signer : SigningIdentity
        The client's Ed25519 key (its public key is on S1's enrollment list).

    Returns
    -------
    bytes
        The sealed blob (101 + 48 + 56 bytes).

    Raises
    ------
    SealedBoxError
        If an argument is malformed.
    """
    ad = associated_data(
        purpose=SSA, sender=client_party(client_id), recipient=HELPER, **binding.fields()
    )
    body = _seed(master_seed) + _digest(public_part)
    return seal(helper_public, encode_signed(signer, SSA, ad, body), associated_data=ad)


def open_ssa_upload(
    keypair: SealingKeyPair,
    sealed: bytes,
    *,
    binding: RoundBinding,
    client_id: int,
    public_part: bytes,
) -> OpenedUpload:
    """S1 side: open an SSA upload, check its signature and that it was made for this public part.

    Whether the signer is enrolled is the caller's check (S1's
    :class:`~flwr_fsl.crypto.identity.Enrollment`).

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
    OpenedUpload
        The 16-byte master seed and the signer's public key.

    Raises
    ------
    SealedBoxError
        If the blob fails authentication (other round, client, purpose or key; tampered), is
        unsigned or malformed (:func:`decode_signed`), or the public part's hash differs.
    SignatureError
        If the signature does not verify.
    """
    ad = associated_data(
        purpose=SSA, sender=client_party(client_id), recipient=HELPER, **binding.fields()
    )
    signed = _open_signed(keypair, sealed, SSA, ad, _UPLOAD_BODY)
    _check_binding(signed.body, public_part, _UPLOAD_BODY)
    return OpenedUpload(signed.body[:MASTER_SEED_BYTES], signed.signer)


def seal_udpf_hint(
    helper_public: bytes,
    *,
    binding: RoundBinding,
    client_id: int,
    hint: bytes,
    held: bytes,
    signer: SigningIdentity,
) -> bytes:
    """Client side: bind a U-DPF hint, and the keys it updates, for S1.

    The hint itself travels in the clear (both servers apply the same bytes); the sealed blob
    carries its SHA-256 and the digest of the keys it was made for
    (:func:`~flwr_fsl.families.ssa.protocol.held_digest`), so S0 cannot alter S1's copy and S1
    applies the hint only to exactly those keys. Signed by ``signer`` (the client's Ed25519
    key; S1 applies the hint only if it is the key that signed the keys S1 holds).

    Returns
    -------
    bytes
        The sealed blob (101 + 64 + 56 bytes).

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
    body = _digest(hint) + bytes(held)
    return seal(helper_public, encode_signed(signer, UDPF_HINT, ad, body), associated_data=ad)


def open_udpf_hint(
    keypair: SealingKeyPair, sealed: bytes, *, binding: RoundBinding, client_id: int, hint: bytes
) -> OpenedHint:
    """S1 side: check a relayed hint against the client's signed sealed binding.

    Returns
    -------
    OpenedHint
        The 32-byte digest of the keys the hint updates (S1 compares it with its own) and the
        signer's public key (S1 compares it with the signer of those keys).

    Raises
    ------
    SealedBoxError
        If the blob fails authentication, is unsigned or malformed, or the hint was altered.
    SignatureError
        If the signature does not verify.
    """
    ad = associated_data(
        purpose=UDPF_HINT, sender=client_party(client_id), recipient=HELPER, **binding.fields()
    )
    signed = _open_signed(keypair, sealed, UDPF_HINT, ad, _HINT_BODY)
    if not hmac.compare_digest(signed.body[:_DIGEST_BYTES], _digest(hint)):
        raise SealedBoxError("hint does not match the sealed hash (altered in transit)")
    return OpenedHint(signed.body[_DIGEST_BYTES:], signed.signer)


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
