"""Client identities S1 can check: Ed25519 signing keys and the enrollment list of public keys.

Flower-free. A client signs the material it seals for the helper server S1 with its own Ed25519
key (:class:`SigningIdentity`); S1 knows the public keys it accepts from an **enrollment list**
(:class:`Enrollment`, read from a text file by :func:`load_enrollment`). S0 relays the sealed
material but never sees the signature or the signer (both are inside the sealed plaintext,
:mod:`flwr_fsl.families.ssa.sealing`), so S0 cannot invent clients S1 counts, nor reuse one
client's material under another id.

**Signatures.** Pure Ed25519 (RFC 8032, deterministic) over a domain-separated input
(:func:`signing_input`)::

    "flwr-fsl/identity/v1" || 0x00 || u16-be len(purpose) || purpose || message

so a signature made for one purpose (``ssa``, ``udpf-hint``) never verifies for another, and
no signature of this package is a valid signature of any other protocol's raw message.
:func:`verify` raises :class:`SignatureError` (a
:class:`~flwr_fsl.core.errors.ClientInputError`: one client's bytes).

**Key files.** Unencrypted PKCS#8 PEM, written atomically with mode 0600 (a private temporary
file renamed over the target, or ``O_EXCL`` on the target), and refused on load when the group
or others can access them (POSIX). :func:`load_or_create_identity` creates a missing file (the
client's default key, ``$FLWR_HOME/fsl/identity/partition-<partition-id>.pem``, or
``node-<node id>.pem`` without a partition); an explicit path given in
the node config (``fsl-signing-key``) must already exist (:func:`node_identity`).

**Enrollment list format** (:data:`ENROLLMENT_FORMAT`), defined here once; the parser
(:func:`parse_enrollment`) checks the syntax line by line, the validation
(:meth:`Enrollment.of`) the content (no key twice, at least one key)::

    # comment lines and blank lines are ignored; '#' starts a comment anywhere
    <64 hex digits: the raw Ed25519 public key>  [label]   # optional comment

A label is one token of ``[A-Za-z0-9._:@/+-]``, at most 64 characters (e.g. the node's name);
a line holds at most one key and one label. The file is at most 4 MiB, a line at most 1024
characters, and the list at most 100,000 keys. Every error is a
:class:`~flwr_fsl.core.errors.ConfigurationError` naming the file and the line.
``python -m flwr_fsl.crypto.identity KEYFILE --generate --label NAME`` (console script
``flwr-fsl-identity``) makes a key and prints its enrollment line (:func:`main`).

**Flower's SuperNode authentication keys** (``flower-supernode --auth-supernode-private-key``,
Flower 1.42) do not serve here: they are ECDSA keys (OpenSSH format, ``ec.EllipticCurvePrivateKey``,
SECP384R1 in Flower's docs), not Ed25519, and the SuperNode keeps them to itself: it uses the key
only in its connection to the SuperLink, and the ClientApp (a separate ``flwr-clientapp``
process under the default subprocess isolation) receives no path or handle to it in its
``Context``. Reusing a transport-authentication key to sign protocol messages would also mix two
purposes. So each node has its own Ed25519 key, named by the node config (``fsl-signing-key``).

**Threat model.** The private key file is the client's only identity secret: whoever reads it
can sign as the client. The enrollment list is S1's trust anchor: whoever writes it decides
which clients S1 counts. Neither is secret from S1's operator; S0 never needs either.
"""

from __future__ import annotations

import argparse
import os
import re
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.crypto.channel import read_private_pem, write_private_pem

__all__ = [
    "DOMAIN",
    "ENROLLMENT_FORMAT",
    "NODE_SIGNING_KEY",
    "PARTITION_KEY",
    "PUBLIC_KEY_BYTES",
    "SIGNATURE_BYTES",
    "Enrollment",
    "EnrollmentEntry",
    "SignatureError",
    "SigningIdentity",
    "default_identity_path",
    "load_enrollment",
    "load_or_create_identity",
    "main",
    "node_identity",
    "parse_enrollment",
    "signing_input",
    "verify",
]

PUBLIC_KEY_BYTES = 32
"""Length of a raw Ed25519 public key."""
SIGNATURE_BYTES = 64
"""Length of an Ed25519 signature."""
PRIVATE_KEY_BYTES = 32
DOMAIN = b"flwr-fsl/identity/v1\x00"
"""Prefix of every signed input (:func:`signing_input`)."""
NODE_SIGNING_KEY = "fsl-signing-key"
PARTITION_KEY = "partition-id"
"""The node-config key of a node's data partition (Flower's simulation sets it per node)."""
"""Node-config key: absolute path of the client's Ed25519 key file (PKCS#8 PEM, mode 0600)."""

ENROLLMENT_FORMAT = (
    "one enrolled client per line: <64 hex digits of its raw Ed25519 public key> [label]; "
    "'#' starts a comment; blank lines are ignored"
)
"""One-line statement of the enrollment list format (the module docstring has the details)."""
MAX_ENROLLMENT_BYTES = 4 << 20
MAX_LINE_CHARS = 1024
MAX_ENROLLED = 100_000
MAX_LABEL_CHARS = 64
_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")
_LABEL = re.compile(r"[A-Za-z0-9._:@/+\-]{1,64}")


class SignatureError(ClientInputError):
    """A signer key or signature is malformed or does not verify (one client's bytes)."""


def signing_input(purpose: str, message: bytes) -> bytes:
    """Return the domain-separated bytes a signature covers (see the module docstring).

    Parameters
    ----------
    purpose : str
        What is signed (ASCII, 1-255 characters), e.g. ``"ssa"``.
    message : bytes
        The message.

    Returns
    -------
    bytes
        ``DOMAIN || u16 len(purpose) || purpose || message``.

    Raises
    ------
    SignatureError
        If ``purpose`` is not 1-255 ASCII characters or ``message`` is not bytes.
    """
    if not isinstance(purpose, str) or not 0 < len(purpose) < 256 or not purpose.isascii():
        raise SignatureError("a signature purpose must be 1-255 ASCII characters")
    if not isinstance(message, bytes | bytearray | memoryview):
        raise SignatureError(f"a signed message must be bytes, got {type(message).__name__}")
    tag = purpose.encode("ascii")
    return DOMAIN + struct.pack(">H", len(tag)) + tag + bytes(message)


def _public_key(public: bytes) -> Ed25519PublicKey:
    if not isinstance(public, bytes | bytearray) or len(public) != PUBLIC_KEY_BYTES:
        raise SignatureError(f"a signer public key must be {PUBLIC_KEY_BYTES} raw bytes")
    try:
        return Ed25519PublicKey.from_public_bytes(bytes(public))
    except ValueError:  # pragma: no cover - OpenSSL accepts any 32 bytes here
        raise SignatureError("the signer public key is not a valid Ed25519 key") from None


def verify(public: bytes, purpose: str, message: bytes, signature: bytes) -> None:
    """Check an Ed25519 signature made by :meth:`SigningIdentity.sign`.

    Parameters
    ----------
    public : bytes
        The signer's raw 32-byte Ed25519 public key.
    purpose : str
        The purpose it was signed for.
    message : bytes
        The signed message.
    signature : bytes
        The 64-byte signature.

    Raises
    ------
    SignatureError
        If a key or signature is malformed, or the signature does not verify.
    """
    key = _public_key(public)
    if not isinstance(signature, bytes | bytearray) or len(signature) != SIGNATURE_BYTES:
        raise SignatureError(f"a signature must be {SIGNATURE_BYTES} bytes")
    try:
        key.verify(bytes(signature), signing_input(purpose, message))
    except InvalidSignature:
        raise SignatureError(
            "the signature does not verify (other signer, purpose or bytes)"
        ) from None


@dataclass(frozen=True)
class SigningIdentity:
    """A client's Ed25519 signing key (private).

    Parameters
    ----------
    private_key : Ed25519PrivateKey
        The key (use :meth:`generate`, :meth:`load` or :meth:`from_private_bytes`).

    Raises
    ------
    ConfigurationError
        If ``private_key`` is not an Ed25519 private key.
    """

    private_key: Ed25519PrivateKey = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.private_key, Ed25519PrivateKey):
            raise ConfigurationError(
                f"private_key must be an Ed25519PrivateKey, got {type(self.private_key).__name__}"
            )

    @classmethod
    def generate(cls) -> SigningIdentity:
        """Return a fresh random identity."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, private: bytes) -> SigningIdentity:
        """Return the identity of a raw 32-byte Ed25519 private key (seed; test vectors).

        Raises
        ------
        ConfigurationError
            If ``private`` is not 32 bytes.
        """
        if not isinstance(private, bytes | bytearray) or len(private) != PRIVATE_KEY_BYTES:
            raise ConfigurationError(f"an Ed25519 private key must be {PRIVATE_KEY_BYTES} bytes")
        return cls(Ed25519PrivateKey.from_private_bytes(bytes(private)))

    @property
    def public_bytes(self) -> bytes:
        """The raw 32-byte Ed25519 public key (what the enrollment list names)."""
        return self.private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def enrollment_line(self, label: str = "") -> str:
        """Return this key's line of an enrollment list (hex public key, then the label).

        Raises
        ------
        ConfigurationError
            If ``label`` is not a valid label (see the module docstring).
        """
        if label and not _LABEL.fullmatch(label):
            raise ConfigurationError(
                f"label {label!r} must be 1-{MAX_LABEL_CHARS} characters of [A-Za-z0-9._:@/+-]"
            )
        return f"{self.public_bytes.hex()} {label}".rstrip()

    def sign(self, purpose: str, message: bytes) -> bytes:
        """Sign ``message`` for ``purpose`` (Ed25519 over :func:`signing_input`).

        Returns
        -------
        bytes
            The 64-byte signature.

        Raises
        ------
        SignatureError
            If ``purpose`` or ``message`` is malformed.
        """
        return self.private_key.sign(signing_input(purpose, message))

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the key as unencrypted PKCS#8 PEM, mode 0600, atomically.

        Parameters
        ----------
        path : str or PathLike
            The key file; its directory must exist.
        overwrite : bool (default: False)
            Replace an existing file (through a private temporary file and a rename); without
            it an existing file is an error and the file is created with ``O_EXCL``.

        Returns
        -------
        Path
            The path written.

        Raises
        ------
        ConfigurationError
            If the file exists (and ``overwrite`` is false) or cannot be written.
        """
        return write_private_pem(
            self.private_key,
            path,
            overwrite=overwrite,
            what="signing key file",
            error=ConfigurationError,
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningIdentity:
        """Read a key file written by :meth:`save`.

        Raises
        ------
        ConfigurationError
            If the file is missing, unreadable, larger than 64 KiB, accessible by group or
            others (POSIX), or does not hold an unencrypted Ed25519 private key.
        """
        key = read_private_pem(path, what="signing key file", error=ConfigurationError)
        if not isinstance(key, Ed25519PrivateKey):
            raise ConfigurationError(
                f"signing key file {str(Path(path))!r} holds a {type(key).__name__}, not an "
                "Ed25519 key"
            )
        return cls(key)


def load_or_create_identity(path: Path) -> tuple[SigningIdentity, bool]:
    """Load the key at ``path``, creating it (and its directory, mode 0700) when missing.

    Two processes creating the same file at once both end with the same key: the loser of the
    ``O_EXCL`` race loads the winner's file.

    Returns
    -------
    tuple[SigningIdentity, bool]
        The identity and whether it was just created.

    Raises
    ------
    ConfigurationError
        As :meth:`SigningIdentity.load` and :meth:`SigningIdentity.save`.
    """
    if path.exists():
        return SigningIdentity.load(path), False
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigurationError(f"cannot create {str(path.parent)!r}: {err}") from None
    identity = SigningIdentity.generate()
    try:
        identity.save(path)
    except ConfigurationError:
        if path.exists():  # another process created it first
            return SigningIdentity.load(path), False
        raise
    return identity, True


def default_identity_path(
    node_id: int, environ: Mapping[str, str] | None = None, partition_id: int | None = None
) -> Path:
    """Return a node's default key file under ``$FLWR_HOME/fsl/identity/``.

    ``partition-<partition_id>.pem`` when the node config names its data partition (a
    simulation's nodes get new random node ids every run, but keep their partition, so their
    keys — and S1's per-client privacy accounts, kept per key — stay the same from run to run
    instead of piling up), else ``node-<node_id>.pem`` (a SuperNode's id follows its own key).
    ``FLWR_HOME`` defaults to ``~/.flwr``.
    """
    env = os.environ if environ is None else environ
    home = Path(env.get("FLWR_HOME", "~/.flwr")).expanduser()
    name = f"node-{int(node_id)}" if partition_id is None else f"partition-{int(partition_id)}"
    return home / "fsl" / "identity" / f"{name}.pem"


_CACHE: dict[Path, SigningIdentity] = {}


def node_identity(node_config: Mapping[str, Any], node_id: int) -> SigningIdentity:
    """Return a client node's signing identity from its node config.

    ``fsl-signing-key`` (:data:`NODE_SIGNING_KEY`), when set, is the absolute path of an
    existing key file (the operator enrolled its public key; a missing file is an error, never
    silently replaced by a fresh unenrolled key). When unset, the node's default key
    (:func:`default_identity_path`: by its ``partition-id`` when the node config has one, else
    by its node id) is used and created on first use; its public key must then
    be enrolled at S1 (``flwr-fsl-identity <path>`` prints the line). Loaded keys are cached
    per path for the life of the process.

    Parameters
    ----------
    node_config : Mapping
        The node's config (``Context.node_config``).
    node_id : int
        The node's Flower id (names the default key file).

    Returns
    -------
    SigningIdentity
        The node's identity.

    Raises
    ------
    ConfigurationError
        If ``fsl-signing-key`` is not a non-empty absolute path string, or its file is missing,
        too permissive or not an Ed25519 key; one line naming the key.
    """
    value = node_config.get(NODE_SIGNING_KEY)
    if value is None:
        partition = node_config.get(PARTITION_KEY)
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            partition = None  # no (usable) partition: the node id names the key
        path = default_identity_path(node_id, partition_id=partition)
    else:
        if not isinstance(value, str) or not value or not Path(value).is_absolute():
            raise ConfigurationError(
                f"node config {NODE_SIGNING_KEY} must be the absolute path of an Ed25519 key "
                f"file, got {value!r}"
            )
        path = Path(value)
    cached = _CACHE.get(path)
    if cached is not None:
        return cached
    try:
        if value is None:
            identity, _ = load_or_create_identity(path)
        elif not path.exists():
            raise ConfigurationError(f"{str(path)!r} does not exist")
        else:
            identity = SigningIdentity.load(path)
    except ConfigurationError as err:
        raise ConfigurationError(f"node config {NODE_SIGNING_KEY}: {err}") from None
    _CACHE[path] = identity
    return identity


# ---- enrollment list ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EnrollmentEntry:
    """One line of an enrollment list: the public key, its label and where it was."""

    public_key: bytes = field(repr=False)
    label: str
    line: int

    @property
    def name(self) -> str:
        """The label, or the key's first 16 hex digits when it has none."""
        return self.label or self.public_key.hex()[:16]


def parse_enrollment(text: str, source: str = "<enrollment>") -> list[EnrollmentEntry]:
    """Parse an enrollment list's syntax (see the module docstring); no content checks.

    Parameters
    ----------
    text : str
        The file's text.
    source : str
        The file's name, for error messages.

    Returns
    -------
    list[EnrollmentEntry]
        One entry per key line, in file order.

    Raises
    ------
    ConfigurationError
        If the text is too long, or a line is too long, holds a malformed key, a malformed
        label, or more than a key and a label; the message names ``source`` and the line.
    """
    if not isinstance(text, str):
        raise ConfigurationError(f"{source}: an enrollment list must be text")
    if len(text) > MAX_ENROLLMENT_BYTES:
        raise ConfigurationError(f"{source}: longer than {MAX_ENROLLMENT_BYTES} characters")
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        entry = _parse_line(raw, number, f"{source}, line {number}")
        if entry is not None:
            entries.append(entry)
            if len(entries) > MAX_ENROLLED:
                raise ConfigurationError(f"{source}, line {number}: more than {MAX_ENROLLED} keys")
    return entries


def _parse_line(raw: str, number: int, where: str) -> EnrollmentEntry | None:
    """Parse one line (None for a blank or comment line); raise naming ``where``."""
    if len(raw) > MAX_LINE_CHARS:
        raise ConfigurationError(f"{where}: longer than {MAX_LINE_CHARS} characters")
    if not raw.isascii() or not raw.replace("\t", " ").isprintable():
        raise ConfigurationError(f"{where}: only printable ASCII is allowed")
    tokens = raw.split("#", 1)[0].split()
    if not tokens:
        return None
    if len(tokens) > 2:
        raise ConfigurationError(
            f"{where}: expected '<hex public key> [label]', got {len(tokens)} fields"
        )
    if not _HEX_KEY.fullmatch(tokens[0]):
        raise ConfigurationError(
            f"{where}: the public key must be 64 hex digits (a raw Ed25519 key), got "
            f"{len(tokens[0])} characters"
        )
    label = tokens[1] if len(tokens) == 2 else ""
    if label and not _LABEL.fullmatch(label):
        raise ConfigurationError(
            f"{where}: the label must be 1-{MAX_LABEL_CHARS} characters of [A-Za-z0-9._:@/+-]"
        )
    return EnrollmentEntry(bytes.fromhex(tokens[0]), label, number)


@dataclass(frozen=True)
class Enrollment:
    """The signers S1 accepts: an enrolled set of Ed25519 public keys, or open enrollment.

    Build it with :meth:`of` (validated) or :meth:`open` (any signer; insecure: S0 can then
    invent clients, since it can make keys itself).

    Attributes
    ----------
    labels : Mapping[bytes, str]
        Enrolled public key -> label (``""`` when none); empty for open enrollment.
    is_open : bool
        Whether any valid signer is accepted.
    source : str
        Where the list came from (for logs).
    """

    labels: Mapping[bytes, str] = field(repr=False)
    is_open: bool = False
    source: str = ""

    @classmethod
    def of(cls, entries: Iterable[EnrollmentEntry], source: str = "<enrollment>") -> Enrollment:
        """Validate parsed entries into an enrollment set.

        Raises
        ------
        ConfigurationError
            If there is no key, or a key is listed twice (naming both lines). (Any 32 bytes
            decode as an Ed25519 key; a key that is no curve point never verifies.)
        """
        labels: dict[bytes, str] = {}
        lines: dict[bytes, int] = {}
        for entry in entries:
            if entry.public_key in lines:
                raise ConfigurationError(
                    f"{source}, line {entry.line}: the key of line {lines[entry.public_key]} "
                    "again (each client is enrolled once)"
                )
            labels[entry.public_key] = entry.label
            lines[entry.public_key] = entry.line
        if not labels:
            raise ConfigurationError(f"{source}: no enrolled key (use open enrollment explicitly)")
        return cls(labels, False, source)

    @classmethod
    def open(cls) -> Enrollment:
        """Return open enrollment: every valid signer is accepted (insecure, see the class)."""
        return cls({}, True, "open enrollment")

    def __len__(self) -> int:
        return len(self.labels)

    def check(self, public: bytes) -> str | None:
        """Return None if ``public`` may sign, else the reason it may not (for S1's log)."""
        if self.is_open or public in self.labels:
            return None
        return f"signer {public.hex()[:16]}... is not enrolled at S1"

    def describe(self) -> str:
        """One line for S1's startup output."""
        if self.is_open:
            return "OPEN ENROLLMENT (insecure): any signer is accepted, so S0 can invent clients"
        return f"{len(self.labels)} enrolled client keys from {self.source}"


def load_enrollment(path: str | os.PathLike[str]) -> Enrollment:
    """Read, parse and validate an enrollment list file.

    Raises
    ------
    ConfigurationError
        If the file cannot be read, is over 4 MiB or not UTF-8, or as :func:`parse_enrollment`
        and :meth:`Enrollment.of`.
    """
    source = Path(path)
    try:
        if source.stat().st_size > MAX_ENROLLMENT_BYTES:
            raise ConfigurationError(f"{source}: larger than {MAX_ENROLLMENT_BYTES} bytes")
        text = source.read_bytes().decode("utf-8")
    except OSError as err:
        raise ConfigurationError(f"cannot read enrollment list {str(source)!r}: {err}") from None
    except UnicodeDecodeError:
        raise ConfigurationError(f"{source}: not UTF-8 text") from None
    return Enrollment.of(parse_enrollment(text, str(source)), str(source))


def main(argv: Sequence[str] | None = None) -> int:
    """``flwr-fsl-identity KEYFILE [--generate] [--label NAME]``: print a key's enrollment line.

    With ``--generate`` a missing key file is created (mode 0600); the line
    ``<hex public key> [label]`` goes to stdout, to append to S1's ``--enrollment`` file.

    Returns
    -------
    int
        0 on success, 2 on a bad key file or argument.
    """
    p = argparse.ArgumentParser(
        prog="flwr-fsl-identity",
        description="Make or read a client's Ed25519 signing key (node config fsl-signing-key) "
        "and print its line for the helper's --enrollment file.",
    )
    p.add_argument("key_file", type=Path, help="the client's key file (PKCS#8 PEM, mode 0600)")
    p.add_argument("--generate", action="store_true", help="create the key file if missing")
    p.add_argument("--label", default="", help="label written after the key (e.g. node name)")
    args = p.parse_args(argv)
    try:
        if args.generate:
            identity, created = load_or_create_identity(args.key_file)
            if created:
                print(f"flwr-fsl-identity: created {args.key_file}", file=sys.stderr)
        else:
            identity = SigningIdentity.load(args.key_file)
        print(identity.enrollment_line(args.label))
    except ConfigurationError as err:
        print(f"flwr-fsl-identity: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
