"""Sealed channel: one-shot public-key encryption to a pinned X25519 key (RFC 9180 HPKE).

Clients talk only to S0 (the Flower ServerApp). Material meant for the helper server S1 (a
client's DPF master seed, Cui et al. 2023 §4) is *sealed* to S1's pinned X25519 public key and
relayed by S0; S1's private-retrieval answers are sealed to a fresh per-query client key and
relayed back the same way. This module is that sealed box, built only from ``cryptography``.

**Construction.** RFC 9180 HPKE, base mode, single shot, with the suite
DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 / AES-256-GCM (``cryptography``'s
:class:`~cryptography.hazmat.primitives.hpke.Suite`): a fresh ephemeral X25519 key per message,
the KEM binds both public keys (``kem_context = enc || pkR``), the key schedule derives the
AES-256-GCM key and nonce. The caller's associated data is bound through HPKE's ``info``
(``info = INFO_LABEL || header || associated_data``): any change to it, to the blob header or to
the recipient key changes the derived key, so the AEAD tag check fails. (``cryptography`` exposes
single-shot HPKE with ``info`` only; for a single message ``info`` and AEAD associated data give
the same binding.)

**Blob format, version 1** (:func:`seal`)::

    magic  b"FSSB"      4 bytes   (flwr_fsl sealed box)
    version             1 byte    (1)
    suite               1 byte    (1: DHKEM-X25519-HKDF-SHA256 / HKDF-SHA256 / AES-256-GCM)
    reserved            2 bytes   (zero)
    enc                 32 bytes  (ephemeral X25519 public key)
    ciphertext || tag   len(plaintext) + 16 bytes

so a blob is exactly ``len(plaintext) + OVERHEAD`` (56) bytes: its length depends on the
plaintext length only, never on its content.

**Associated data** (:func:`associated_data`): ``b"FSAD" || 0x02`` then ``purpose``, ``sender``,
``recipient`` (each a u16 little-endian byte length + UTF-8; parties are ``S0``, ``S1`` or
``client:<node id>``), the run's 16-byte ``session``, ``round`` (u64) and the SHA-256 of the round's
public parameters (v1 bound only round and client id). Fields are length-prefixed or of fixed
length and in a fixed order, so the encoding is injective.

**Key file** (:meth:`SealingKeyPair.save`): the X25519 private key as unencrypted PKCS#8 PEM
(``-----BEGIN PRIVATE KEY-----``), created with mode 0600; :meth:`SealingKeyPair.load` refuses a
POSIX file readable or writable by group or others (like ``ssh``).

**Threat model.** Two non-colluding semi-honest servers. S0 relays every sealed blob and knows
everything but S1's private key (the public key, the associated data, the plaintext length): it
can neither read a blob (IND-CCA2 of HPKE) nor alter it, reorder it to another round/client or
replay it under other associated data undetected (AEAD integrity; the associated data binds
purpose, session, round, round parameters, sender and recipient). Leakage to S0: the plaintext
length and the fact that a message was sent. Public keys are authenticated by pinning: S0 and
clients compare S1's key to a SHA-256 fingerprint from the run config
(:func:`verify_fingerprint`). There is no sender authentication (base mode): S1 knows a blob was
sealed by *someone* holding the associated data, which is what a semi-honest relay model needs.

**Errors.** Every failure — truncated or malformed blob, unknown version or suite, wrong key,
tampered ciphertext, wrong associated data, bad key material or key file, fingerprint mismatch
— raises :class:`SealedBoxError` (a :class:`ValueError`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.hpke import AEAD, KDF, KEM, Suite
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from flwr_fsl.core.errors import ClientInputError
from flwr_fsl.core.wireformat import Writer, register_magic

__all__ = [
    "AD_MAGIC",
    "DIGEST_BYTES",
    "INFO_LABEL",
    "KEY_BYTES",
    "MAX_KEY_FILE_BYTES",
    "OVERHEAD",
    "SEALED_MAGIC",
    "SEALED_VERSION",
    "SESSION_BYTES",
    "SealedBoxError",
    "SealingKeyPair",
    "agree_key",
    "associated_data",
    "client_party",
    "open_sealed",
    "public_key_fingerprint",
    "read_private_pem",
    "seal",
    "verify_fingerprint",
    "write_private_pem",
]

KEY_BYTES = 32
"""Bytes in an X25519 public (and raw private) key."""
SEALED_MAGIC = register_magic(b"FSSB", "sealed box, HPKE blob (flwr_fsl.crypto.channel)")
"""First four bytes of every sealed blob."""
SEALED_VERSION = 1
"""Blob format version written by :func:`seal` (and the only one :func:`open_sealed` reads)."""
SUITE_ID = 1
"""Suite byte: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-256-GCM."""
INFO_LABEL = b"flwr_fsl/sealed-box/v1\x00"
"""Domain-separation prefix of HPKE ``info``."""
AD_MAGIC = register_magic(b"FSAD", "sealed-box associated data (flwr_fsl.crypto.channel)") + b"\x02"
"""Prefix (magic + version) of the canonical associated-data encoding."""
SESSION_BYTES = 16
"""Length of a session id."""
DIGEST_BYTES = 32
"""Length of a round-parameter digest (SHA-256)."""

_HEADER = SEALED_MAGIC + bytes([SEALED_VERSION, SUITE_ID, 0, 0])
_TAG_BYTES = 16
OVERHEAD = len(_HEADER) + KEY_BYTES + _TAG_BYTES
"""Bytes a sealed blob adds to its plaintext (header 8 + enc 32 + tag 16 = 56)."""
_MAX_AD_FIELD = 1024
_SUITE = Suite(KEM.X25519, KDF.HKDF_SHA256, AEAD.AES_256_GCM)


class SealedBoxError(ClientInputError):
    """A sealed blob, associated data, key or key file is malformed, unauthentic or unusable.

    It is a :class:`ValueError`, so callers may catch either. Opening failures deliberately share
    one message per cause class and never include key material.
    """


# ------------------------------------------------------------------------------------------------
# Keys
# ------------------------------------------------------------------------------------------------


def _public_key(public: bytes) -> X25519PublicKey:
    if not isinstance(public, bytes | bytearray | memoryview):
        raise SealedBoxError(f"public key must be bytes, got {type(public).__name__}")
    if len(public) != KEY_BYTES:
        raise SealedBoxError(f"public key must be {KEY_BYTES} bytes, got {len(public)}")
    return X25519PublicKey.from_public_bytes(bytes(public))


@dataclass(frozen=True, eq=False)
class SealingKeyPair:
    """An X25519 key pair that sealed blobs are opened with.

    Build one with :meth:`generate`, :meth:`load` or :meth:`from_private_bytes`.

    Parameters
    ----------
    private_key : X25519PrivateKey
        The private key.

    Attributes
    ----------
    public_bytes : bytes
        The raw 32-byte public key (what senders seal to and fingerprints hash).
    """

    private_key: X25519PrivateKey = field(repr=False)
    public_bytes: bytes = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.private_key, X25519PrivateKey):
            raise SealedBoxError(
                f"private_key must be an X25519PrivateKey, got {type(self.private_key).__name__}"
            )
        raw = self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        object.__setattr__(self, "public_bytes", raw)

    def __repr__(self) -> str:
        return f"SealingKeyPair(fingerprint={self.fingerprint!r})"

    @classmethod
    def generate(cls) -> SealingKeyPair:
        """Return a fresh random key pair.

        Returns
        -------
        SealingKeyPair
            A new key pair from the operating system's CSPRNG.
        """
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, private: bytes) -> SealingKeyPair:
        """Return the key pair of a raw 32-byte X25519 private key (for test vectors).

        Parameters
        ----------
        private : bytes
            The raw private key.

        Returns
        -------
        SealingKeyPair
            The key pair.

        Raises
        ------
        SealedBoxError
            If ``private`` is not 32 bytes.
        """
        if not isinstance(private, bytes | bytearray) or len(private) != KEY_BYTES:
            raise SealedBoxError(f"private key must be {KEY_BYTES} raw bytes")
        return cls(X25519PrivateKey.from_private_bytes(bytes(private)))

    def private_bytes(self) -> bytes:
        """Return the raw 32-byte private key (the inverse of :meth:`from_private_bytes`).

        For state that stays with its owner (e.g. a client's per-query answer key in its
        Flower ``Context.state``); never send it.

        Returns
        -------
        bytes
            The raw X25519 private key.
        """
        return self.private_key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    @property
    def fingerprint(self) -> str:
        """Hex SHA-256 of :attr:`public_bytes` (see :func:`public_key_fingerprint`)."""
        return public_key_fingerprint(self.public_bytes)

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the private key as unencrypted PKCS#8 PEM to a new file with mode 0600.

        Parameters
        ----------
        path : str or PathLike
            Destination file. Its directory must exist.
        overwrite : bool (default: False)
            Replace an existing file. Without it an existing file is an error (a key file is
            never clobbered by accident).

        Returns
        -------
        Path
            The path written.

        Raises
        ------
        SealedBoxError
            If the file exists and ``overwrite`` is false, or it cannot be written.
        """
        return write_private_pem(
            self.private_key, path, overwrite=overwrite, what="key file", error=SealedBoxError
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SealingKeyPair:
        """Read a key file written by :meth:`save`.

        Parameters
        ----------
        path : str or PathLike
            The PEM (PKCS#8, unencrypted) X25519 private key file.

        Returns
        -------
        SealingKeyPair
            The key pair.

        Raises
        ------
        SealedBoxError
            If the file is missing or unreadable, is readable or writable by group or others
            (POSIX), or does not hold an unencrypted X25519 private key.
        """
        key = read_private_pem(path, what="key file", error=SealedBoxError)
        if not isinstance(key, X25519PrivateKey):
            raise SealedBoxError(
                f"key file {str(Path(path))!r} holds a {type(key).__name__}, not an X25519 key"
            )
        return cls(key)


MAX_KEY_FILE_BYTES = 64 * 1024
"""A private-key PEM file larger than this is refused before it is read."""


def write_private_pem(
    private_key: Any,
    path: str | os.PathLike[str],
    *,
    overwrite: bool,
    what: str,
    error: type[Exception],
) -> Path:
    """Write ``private_key`` as unencrypted PKCS#8 PEM to a file with mode 0600.

    Not overwriting: ``O_EXCL`` on the target itself (no race with another writer).
    Overwriting: a private temporary file, then an atomic rename over the target.

    Parameters
    ----------
    private_key : a ``cryptography`` private key
        The key to write.
    path : str or PathLike
        Destination file; its directory must exist.
    overwrite : bool
        Replace an existing file; without it an existing file is an error.
    what : str
        What the file is, for messages (``"key file"``, ``"signing key file"``).
    error : type of Exception
        The exception raised on failure.

    Returns
    -------
    Path
        The path written.

    Raises
    ------
    Exception
        ``error``, if the file exists (and ``overwrite`` is false) or cannot be written.
    """
    target = Path(path)
    pem = private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    dest = target.with_name(f".{target.name}.{os.getpid()}.tmp") if overwrite else target
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise error(f"{what} {str(target)!r} exists; pass overwrite=True to replace it") from None
    except OSError as exc:
        raise error(f"cannot write {what} {str(target)!r}: {exc}") from None
    try:
        try:
            os.write(fd, pem)
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(dest, target)
    except OSError as exc:
        try:
            dest.unlink()
        except OSError:
            pass
        raise error(f"cannot write {what} {str(target)!r}: {exc}") from None
    return target


def read_private_pem(path: str | os.PathLike[str], *, what: str, error: type[Exception]) -> Any:
    """Read an unencrypted PKCS#8 PEM private key from a file only its owner can access.

    Parameters
    ----------
    path : str or PathLike
        The key file.
    what : str
        What the file is, for messages.
    error : type of Exception
        The exception raised on failure.

    Returns
    -------
    a ``cryptography`` private key
        The key, of whatever type the file holds (the caller checks the type).

    Raises
    ------
    Exception
        ``error``, if the file is missing or unreadable, larger than
        :data:`MAX_KEY_FILE_BYTES`, accessible by group or others (POSIX), or not an
        unencrypted PKCS#8 PEM private key.
    """
    source = Path(path)
    try:
        info = source.stat()
        if info.st_size > MAX_KEY_FILE_BYTES:
            raise error(f"{what} {str(source)!r} is too large")
        data = source.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} {str(source)!r}: {exc}") from None
    if os.name == "posix" and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise error(
            f"{what} {str(source)!r} has mode {stat.S_IMODE(info.st_mode):04o}: it must "
            "not be accessible by group or others (chmod 600)"
        )
    try:
        return serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise error(
            f"{what} {str(source)!r} is not an unencrypted PKCS#8 PEM private key"
        ) from None


def public_key_fingerprint(public: bytes) -> str:
    """Return the fingerprint that pins a public key: lowercase hex SHA-256 of its 32 raw bytes.

    Parameters
    ----------
    public : bytes
        A raw X25519 public key.

    Returns
    -------
    str
        64 hex characters.

    Raises
    ------
    SealedBoxError
        If ``public`` is not 32 bytes.
    """
    _public_key(public)
    return hashlib.sha256(bytes(public)).hexdigest()


def verify_fingerprint(public: bytes, pinned: str) -> bytes:
    """Check a public key against a pinned fingerprint (constant-time comparison).

    Parameters
    ----------
    public : bytes
        The raw X25519 public key to check (e.g. the one S1 announced).
    pinned : str
        The expected fingerprint, hex SHA-256 (case and surrounding spaces are ignored; an
        optional ``"sha256:"`` prefix is accepted).

    Returns
    -------
    bytes
        ``public``, for chaining.

    Raises
    ------
    SealedBoxError
        If the key is malformed, the fingerprint is not 64 hex digits, or they do not match.
    """
    if not isinstance(pinned, str):
        raise SealedBoxError(f"pinned fingerprint must be a str, got {type(pinned).__name__}")
    expected = pinned.strip().lower().removeprefix("sha256:")
    if len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected):
        raise SealedBoxError("pinned fingerprint must be 64 hex digits (SHA-256)")
    actual = public_key_fingerprint(public)
    if not hmac.compare_digest(actual, expected):
        raise SealedBoxError(
            f"public key fingerprint {actual} does not match the pinned {expected}"
        )
    return bytes(public)


def agree_key(
    private: X25519PrivateKey, peer_public: bytes, *, salt: bytes, info: bytes, length: int = 16
) -> bytes:
    """Derive a key two parties share: HKDF-SHA256 of the X25519 secret ``X25519(private, peer)``.

    Both ends get the same key from their own private key and the other's public key (e.g.
    SecAgg's pair-mask seeds). ``salt`` and ``info`` bind it to its use (RFC 5869).

    Parameters
    ----------
    private : X25519PrivateKey
        This party's private key.
    peer_public : bytes
        The other party's raw 32-byte public key.
    salt : bytes
        HKDF salt (e.g. the digest of the round's parameters).
    info : bytes
        HKDF info: a domain label and whatever else the key is bound to.
    length : int, optional
        Key bytes, 1..8160 (default 16, an AES-128 key).

    Returns
    -------
    bytes
        ``length`` bytes.

    Raises
    ------
    SealedBoxError
        If the public key is not 32 bytes or is a low-order point (all-zero shared secret), an
        argument has the wrong type, or ``length`` is out of range.
    """
    if not isinstance(private, X25519PrivateKey):
        raise SealedBoxError(f"private must be an X25519PrivateKey, got {type(private).__name__}")
    if not (isinstance(salt, bytes) and isinstance(info, bytes)):
        raise SealedBoxError("salt and info must be bytes")
    if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= 255 * 32:
        raise SealedBoxError(f"length must be an int in [1, 8160], got {length!r}")
    public = _public_key(peer_public)
    try:
        secret = private.exchange(public)
    except ValueError as exc:  # all-zero shared secret: a low-order public key
        raise SealedBoxError(f"key agreement failed (low-order public key): {exc}") from exc
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(secret)


# ------------------------------------------------------------------------------------------------
# Associated data
# ------------------------------------------------------------------------------------------------


def _ad_text(w: Writer, name: str, value: str) -> None:
    if not isinstance(value, str):
        raise SealedBoxError(f"{name} must be a str, got {type(value).__name__}")
    raw = value.encode("utf-8")
    if not 0 < len(raw) <= _MAX_AD_FIELD:
        raise SealedBoxError(f"{name} must be 1..{_MAX_AD_FIELD} UTF-8 bytes, got {len(raw)}")
    w.u16(len(raw))
    w.fixed(raw, len(raw))


def _ad_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SealedBoxError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value < 1 << 64:
        raise SealedBoxError(f"{name} must be in [0, 2**64), got {value}")
    return value


def _ad_fixed(name: str, value: bytes, size: int) -> bytes:
    if not isinstance(value, bytes) or len(value) != size:
        raise SealedBoxError(f"{name} must be {size} bytes")
    return value


def associated_data(
    *,
    purpose: str,
    session: bytes,
    round: int,
    params_digest: bytes,
    sender: str,
    recipient: str,
) -> bytes:
    """Return the canonical associated data binding a sealed message to its context.

    Parameters
    ----------
    purpose : str
        What the message is, e.g. ``"ssa"``, ``"psr-query"``, ``"psr-answer"``.
    session : bytes
        The 16-byte session id S0 drew for the run (a blob from one run never opens in another).
    round : int
        Server round, in ``[0, 2**64)``.
    params_digest : bytes
        SHA-256 (32 bytes) of the round's public parameters as the sender saw them.
    sender : str
        Party id of who sealed it: ``"S0"``, ``"S1"`` or :func:`client_party` of a node id.
    recipient : str
        Party id of who opens it (same forms); client-to-client messages relayed through S0
        name both clients.

    Returns
    -------
    bytes
        :data:`AD_MAGIC` (``b"FSAD"`` and version byte 2), then purpose, sender, recipient (u16
        length + UTF-8 each), session (16 bytes), round (u64 little-endian) and parameter
        digest (32 bytes). Distinct arguments give distinct bytes.

    Raises
    ------
    SealedBoxError
        If a string is empty, not a str or longer than 1024 UTF-8 bytes, the session or digest
        has the wrong length, or the round is not an int in ``[0, 2**64)``.
    """
    w = Writer(SealedBoxError)
    w.fixed(AD_MAGIC, len(AD_MAGIC))  # magic and version byte
    _ad_text(w, "purpose", purpose)
    _ad_text(w, "sender", sender)
    _ad_text(w, "recipient", recipient)
    w.fixed(_ad_fixed("session", session, SESSION_BYTES), SESSION_BYTES)
    w.u64(_ad_int("round", round))
    w.fixed(_ad_fixed("params digest", params_digest, DIGEST_BYTES), DIGEST_BYTES)
    return w.payload()


def client_party(node_id: int) -> str:
    """Return the party id of a client (Flower node) for :func:`associated_data`.

    Raises
    ------
    SealedBoxError
        If ``node_id`` is not an int in ``[0, 2**64)``.
    """
    _ad_int("client id", node_id)
    return f"client:{int(node_id)}"


def _check_ad(ad: bytes) -> bytes:
    if not isinstance(ad, bytes | bytearray | memoryview):
        raise SealedBoxError(f"associated_data must be bytes, got {type(ad).__name__}")
    return bytes(ad)


# ------------------------------------------------------------------------------------------------
# Seal / open
# ------------------------------------------------------------------------------------------------


def seal(recipient_public: bytes, plaintext: bytes, *, associated_data: bytes) -> bytes:
    """Encrypt and authenticate ``plaintext`` to the holder of ``recipient_public``.

    Parameters
    ----------
    recipient_public : bytes
        The recipient's raw 32-byte X25519 public key (pinned by the caller).
    plaintext : bytes
        The message (any length, including empty).
    associated_data : bytes
        Context the recipient must present to open the blob (see :func:`associated_data`);
        authenticated, not encrypted, not included in the blob.

    Returns
    -------
    bytes
        The versioned blob, ``len(plaintext) + OVERHEAD`` bytes (format in the module docstring).

    Raises
    ------
    SealedBoxError
        If the public key is not 32 bytes or is a low-order point, or an argument is not bytes.
    """
    ad = _check_ad(associated_data)
    if not isinstance(plaintext, bytes | bytearray | memoryview):
        raise SealedBoxError(f"plaintext must be bytes, got {type(plaintext).__name__}")
    public = _public_key(recipient_public)
    try:
        sealed = _SUITE.encrypt(bytes(plaintext), public, info=INFO_LABEL + _HEADER + ad)
    except ValueError as exc:  # all-zero shared secret: a low-order public key
        raise SealedBoxError(f"cannot seal to this public key: {exc}") from exc
    return _HEADER + sealed


def open_sealed(keypair: SealingKeyPair, blob: bytes, *, associated_data: bytes) -> bytes:
    """Check and decrypt a blob from :func:`seal`.

    Parameters
    ----------
    keypair : SealingKeyPair
        The recipient's key pair.
    blob : bytes
        The sealed blob.
    associated_data : bytes
        The same associated data the sender sealed with.

    Returns
    -------
    bytes
        The plaintext.

    Raises
    ------
    SealedBoxError
        If the blob is truncated, has another magic, version, suite or non-zero reserved bytes,
        or fails authentication (wrong key, tampered bytes, other associated data).
    """
    if not isinstance(keypair, SealingKeyPair):
        raise SealedBoxError(f"keypair must be a SealingKeyPair, got {type(keypair).__name__}")
    ad = _check_ad(associated_data)
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise SealedBoxError(f"sealed blob must be bytes, got {type(blob).__name__}")
    data = bytes(blob)
    if len(data) < OVERHEAD:
        raise SealedBoxError(f"sealed blob truncated: {len(data)} bytes < minimum {OVERHEAD}")
    if data[:4] != SEALED_MAGIC:
        raise SealedBoxError("not a sealed blob (bad magic)")
    if data[4] != SEALED_VERSION:
        raise SealedBoxError(
            f"unsupported sealed blob version {data[4]} (this build reads {SEALED_VERSION})"
        )
    if data[5] != SUITE_ID or data[6:8] != b"\0\0":
        raise SealedBoxError(f"unsupported sealed blob suite {data[5]} or reserved bytes")
    header = data[: len(_HEADER)]
    try:
        return _SUITE.decrypt(
            data[len(_HEADER) :], keypair.private_key, info=INFO_LABEL + header + ad
        )
    except (InvalidTag, ValueError) as exc:
        raise SealedBoxError(
            "sealed blob failed authentication (wrong key, tampered or other associated data)"
        ) from exc
