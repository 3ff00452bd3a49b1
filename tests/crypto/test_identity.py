"""Client identities (flwr_fsl.crypto.identity): RFC 8032 vectors through the Ed25519 layer, a
known domain-separated signature, key files (mode, atomic create, refusals), the node-config key,
every error path of the enrollment-list parser and validation, the operator CLI, and a
hypothesis fuzz of the signed sealed-plaintext decoder (flwr_fsl.families.ssa.sealing)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.crypto import identity
from flwr_fsl.crypto.channel import SealedBoxError, SealingKeyPair, associated_data
from flwr_fsl.crypto.identity import (
    NODE_SIGNING_KEY,
    Enrollment,
    EnrollmentEntry,
    SignatureError,
    SigningIdentity,
    load_enrollment,
    load_or_create_identity,
    node_identity,
    parse_enrollment,
    signing_input,
    verify,
)
from flwr_fsl.families.ssa import sealing as ssa_sealing

# RFC 8032 §7.1, TEST 1 and TEST 2 (secret key, public key, message, signature).
RFC8032 = [
    (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39"
        "701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    (
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f36"
        "13d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
]
# This package's signature of ("ssa", b"abc") with TEST 1's key (Ed25519 is deterministic).
KNOWN = (
    "5ba15fdd14aba66d99d7223ae0446c9ce620da65f4a0534570a644a6c96fa9de7c6c655b148e6df616777e89f"
    "826dc6c0990e926cca74c164a434e37d77ff307"
)


@pytest.mark.parametrize(("secret", "public", "message", "signature"), RFC8032)
def test_rfc8032_vectors(secret: str, public: str, message: str, signature: str) -> None:
    me = SigningIdentity.from_private_bytes(bytes.fromhex(secret))
    assert me.public_bytes.hex() == public
    # The raw Ed25519 layer under sign/verify gives RFC 8032's signature ...
    assert me.private_key.sign(bytes.fromhex(message)).hex() == signature
    # ... and sign() is exactly Ed25519 over the domain-separated input.
    ours = me.sign("ssa", bytes.fromhex(message))
    Ed25519PublicKey.from_public_bytes(me.public_bytes).verify(
        ours, signing_input("ssa", bytes.fromhex(message))
    )
    verify(me.public_bytes, "ssa", bytes.fromhex(message), ours)
    with pytest.raises(SignatureError):  # the raw RFC signature is not one of ours
        verify(me.public_bytes, "ssa", bytes.fromhex(message), bytes.fromhex(signature))


def test_known_domain_separated_signature() -> None:
    me = SigningIdentity.from_private_bytes(bytes.fromhex(RFC8032[0][0]))
    assert signing_input("ssa", b"abc") == b"flwr-fsl/identity/v1\x00\x00\x03ssaabc"
    assert me.sign("ssa", b"abc").hex() == KNOWN
    verify(me.public_bytes, "ssa", b"abc", bytes.fromhex(KNOWN))


def test_verify_refuses_other_purpose_message_signer_and_malformed_input() -> None:
    me, other = SigningIdentity.generate(), SigningIdentity.generate()
    sig = me.sign("ssa", b"body")
    for args in (
        (me.public_bytes, "udpf-hint", b"body", sig),
        (me.public_bytes, "ssa", b"body!", sig),
        (other.public_bytes, "ssa", b"body", sig),
        (me.public_bytes, "ssa", b"body", sig[:-1] + bytes([sig[-1] ^ 1])),
    ):
        with pytest.raises(SignatureError, match="does not verify"):
            verify(*args)
    with pytest.raises(SignatureError, match="32 raw bytes"):
        verify(me.public_bytes[:31], "ssa", b"body", sig)
    with pytest.raises(SignatureError, match="64 bytes"):
        verify(me.public_bytes, "ssa", b"body", sig[:63])
    for purpose in ("", "x" * 256, "é"):
        with pytest.raises(SignatureError, match="purpose"):
            me.sign(purpose, b"")
    with pytest.raises(SignatureError, match="must be bytes"):
        me.sign("ssa", "text")  # type: ignore[arg-type]
    assert issubclass(SignatureError, ClientInputError)
    with pytest.raises(ConfigurationError):
        SigningIdentity.from_private_bytes(bytes(31))
    with pytest.raises(ConfigurationError, match="Ed25519PrivateKey"):
        SigningIdentity(SealingKeyPair.generate().private_key)  # type: ignore[arg-type]


# ---- key files ------------------------------------------------------------


def test_key_file_is_private_atomic_and_checked(tmp_path: Path) -> None:
    me = SigningIdentity.generate()
    path = me.save(tmp_path / "k.pem")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert SigningIdentity.load(path).public_bytes == me.public_bytes
    with pytest.raises(ConfigurationError, match="exists"):
        SigningIdentity.generate().save(path)
    new = SigningIdentity.generate()
    new.save(path, overwrite=True)
    assert SigningIdentity.load(path).public_bytes == new.public_bytes
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["k.pem"]  # no temporary file left
    path.chmod(0o640)
    with pytest.raises(ConfigurationError, match="chmod 600"):
        SigningIdentity.load(path)
    x25519 = SealingKeyPair.generate().save(tmp_path / "x.pem")
    with pytest.raises(ConfigurationError, match="not an Ed25519 key"):
        SigningIdentity.load(x25519)
    junk = tmp_path / "junk.pem"
    junk.write_bytes(b"not a key")
    junk.chmod(0o600)
    with pytest.raises(ConfigurationError, match="not an unencrypted PKCS#8"):
        SigningIdentity.load(junk)
    with pytest.raises(ConfigurationError, match="cannot read"):
        SigningIdentity.load(tmp_path / "missing.pem")
    with pytest.raises(ConfigurationError, match="cannot write"):
        me.save(tmp_path / "no-such-dir" / "k.pem")


def test_load_or_create_makes_a_private_key_once(tmp_path: Path) -> None:
    path = tmp_path / "fsl" / "identity" / "node-7.pem"
    first, created = load_or_create_identity(path)
    assert created and stat.S_IMODE(path.stat().st_mode) == 0o600
    again, created = load_or_create_identity(path)
    assert not created and again.public_bytes == first.public_bytes


def test_node_identity_from_node_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identity, "_CACHE", {})
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    made = node_identity({}, 42)  # default path, created on first use
    default = tmp_path / "home" / "fsl" / "identity" / "node-42.pem"
    assert SigningIdentity.load(default).public_bytes == made.public_bytes
    assert node_identity({}, 42) is made  # cached
    # A simulation's node: new random ids every run, one key per partition all the same.
    first = node_identity({"partition-id": 3}, 1234)
    assert node_identity({"partition-id": 3}, 98765).public_bytes == first.public_bytes
    assert (tmp_path / "home" / "fsl" / "identity" / "partition-3.pem").exists()
    assert not (tmp_path / "home" / "fsl" / "identity" / "node-1234.pem").exists()
    for unusable in (True, -1, "3", 2.0):  # not a partition number: the node id names it
        assert node_identity({"partition-id": unusable}, 42) is made
    explicit = SigningIdentity.generate().save(tmp_path / "mine.pem")
    assert (
        node_identity({NODE_SIGNING_KEY: str(explicit)}, 42).public_bytes
        == SigningIdentity.load(explicit).public_bytes
    )
    for bad, match in (
        (3, "absolute path"),
        ("", "absolute path"),
        ("relative.pem", "absolute path"),
        (str(tmp_path / "absent.pem"), "does not exist"),
    ):
        with pytest.raises(ConfigurationError, match=match) as info:
            node_identity({NODE_SIGNING_KEY: bad}, 42)
        assert NODE_SIGNING_KEY in str(info.value)
    assert not (tmp_path / "absent.pem").exists()  # an explicit path is never created
    loose = SigningIdentity.generate().save(tmp_path / "loose.pem")
    loose.chmod(0o644)
    with pytest.raises(ConfigurationError, match=f"{NODE_SIGNING_KEY}.*chmod 600"):
        node_identity({NODE_SIGNING_KEY: str(loose)}, 42)


# ---- enrollment list ------------------------------------------------------------

K1, K2 = SigningIdentity.generate().public_bytes, SigningIdentity.generate().public_bytes


def test_enrollment_parses_keys_labels_and_comments(tmp_path: Path) -> None:
    text = (
        "# S1's clients\n"
        "\n"
        f"{K1.hex()}   node-1   # the first\n"
        f"  {K2.hex().upper()}\t\n"
        "   # indented comment\r\n"
    )
    entries = parse_enrollment(text, "list.txt")
    assert entries == [EnrollmentEntry(K1, "node-1", 3), EnrollmentEntry(K2, "", 4)]
    assert entries[1].name == K2.hex()[:16]
    path = tmp_path / "list.txt"
    path.write_text(text)
    enrolled = load_enrollment(path)
    assert len(enrolled) == 2 and not enrolled.is_open
    assert enrolled.check(K1) is None and enrolled.check(K2) is None
    assert "not enrolled" in str(enrolled.check(bytes(32)))
    assert "2 enrolled client keys" in enrolled.describe()
    opened = Enrollment.open()
    assert opened.is_open and opened.check(bytes(32)) is None and "insecure" in opened.describe()
    me = SigningIdentity.generate()
    assert parse_enrollment(me.enrollment_line("n@x"))[0] == EnrollmentEntry(
        me.public_bytes, "n@x", 1
    )


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (f"# ok\n{K1.hex()} a b\n", "line 2: expected '<hex public key> \\[label\\]', got 3"),
        (f"{K1.hex()[:-2]}\n", "line 1: the public key must be 64 hex digits.*62 characters"),
        (f"{K1.hex()}00\n", "line 1: the public key must be 64 hex"),
        ("zz" * 32 + "\n", "line 1: the public key must be 64 hex"),
        (f"{K1.hex()} bad|label\n", "line 1: the label must be"),
        (f"{K1.hex()} {'l' * 65}\n", "line 1: the label must be"),
        (f"\n{K1.hex()} caf\u00e9\n", "line 2: only printable ASCII"),
        (f"{K1.hex()} a\x00\n", "line 1: only printable ASCII"),
        ("#" + "x" * 1024 + "\n", "line 1: longer than 1024"),
    ],
    # Named, not shown: the random keys in the texts would differ between pytest-xdist workers.
    ids=[
        "three-fields",
        "short-key",
        "long-key",
        "non-hex-key",
        "label-character",
        "long-label",
        "non-ascii",
        "nul",
        "long-line",
    ],
)
def test_enrollment_syntax_errors_name_the_line(text: str, match: str) -> None:
    with pytest.raises(
        ConfigurationError, match=f"^list.txt, {match}" if "line" in match else match
    ):
        parse_enrollment(text, "list.txt")


def test_enrollment_bounds_and_content_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match="must be text"):
        parse_enrollment(b"x", "l")  # type: ignore[arg-type]
    monkeypatch.setattr(identity, "MAX_ENROLLMENT_BYTES", 100)
    with pytest.raises(ConfigurationError, match="longer than 100 characters"):
        parse_enrollment("#" * 101, "l")
    big = tmp_path / "big.txt"
    big.write_text("#" * 101)
    with pytest.raises(ConfigurationError, match="larger than 100 bytes"):
        load_enrollment(big)
    monkeypatch.setattr(identity, "MAX_ENROLLMENT_BYTES", 4 << 20)
    monkeypatch.setattr(identity, "MAX_ENROLLED", 1)
    with pytest.raises(ConfigurationError, match="line 3: more than 1 keys"):
        parse_enrollment(f"{K1.hex()}\n\n{K2.hex()}\n", "l")
    monkeypatch.setattr(identity, "MAX_ENROLLED", 100_000)
    with pytest.raises(ConfigurationError, match="l, line 4: the key of line 1 again"):
        Enrollment.of(parse_enrollment(f"{K1.hex()} a\n{K2.hex()}\n\n{K1.hex()} b\n"), "l")
    with pytest.raises(ConfigurationError, match="no enrolled key"):
        Enrollment.of(parse_enrollment("# nobody\n"), "l")
    with pytest.raises(ConfigurationError, match="cannot read enrollment list"):
        load_enrollment(tmp_path / "missing.txt")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"# caf\xe9\n")
    with pytest.raises(ConfigurationError, match="not UTF-8"):
        load_enrollment(latin)
    with pytest.raises(ConfigurationError, match="label"):
        SigningIdentity.generate().enrollment_line("two words")


def test_identity_cli_makes_a_key_and_prints_its_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "node.pem"
    assert identity.main([str(path)]) == 2  # no key and no --generate
    assert "cannot read" in capsys.readouterr().err
    assert identity.main([str(path), "--generate", "--label", "node-1"]) == 0
    out = capsys.readouterr()
    me = SigningIdentity.load(path)
    assert out.out == f"{me.public_bytes.hex()} node-1\n" and "created" in out.err
    assert identity.main([str(path)]) == 0
    assert capsys.readouterr().out == f"{me.public_bytes.hex()}\n"
    assert identity.main([str(path), "--label", "bad label"]) == 2
    assert parse_enrollment(f"{me.public_bytes.hex()} node-1")[0].public_key == me.public_bytes
    assert os.path.exists(path)


# ---- the signed sealed plaintext ------------------------------------------------------------

AD = associated_data(
    purpose="ssa", sender="client:1", recipient="S1", session=bytes(16), round=1,
    params_digest=bytes(32),
)  # fmt: skip
SIGNER = SigningIdentity.from_private_bytes(bytes(range(32)))


def test_signed_plaintext_layout_and_refusals() -> None:
    body = bytes(range(48))
    plain = ssa_sealing.encode_signed(SIGNER, "ssa", AD, body)
    assert plain[:5] == b"FSSG\x01" and len(plain) == 5 + 32 + 64 + 48
    decoded = ssa_sealing.decode_signed(plain, 48)
    assert (decoded.signer, decoded.body) == (SIGNER.public_bytes, body)
    for bad, match in (
        (body, "unsigned"),
        (b"FSSX" + plain[4:], "bad magic"),
        (b"FSSG\x02" + plain[5:], "unknown version"),
        (plain + b"\x00", "expected 149"),
        (plain[:-1], "expected 149"),
        (bytes(3), "bad magic"),
    ):
        with pytest.raises(SealedBoxError, match=match):
            ssa_sealing.decode_signed(bad, 48)
    with pytest.raises(SealedBoxError, match="SigningIdentity"):
        ssa_sealing.encode_signed(b"key", "ssa", AD, body)  # type: ignore[arg-type]


@given(st.binary(max_size=400), st.sampled_from([48, 64]))
def test_decode_signed_never_fails_otherwise(data: bytes, size: int) -> None:
    try:
        out = ssa_sealing.decode_signed(data, size)
    except SealedBoxError:
        return
    assert data[:5] == b"FSSG\x01" and len(data) == 101 + size
    assert out.signer + out.signature + out.body == data[5:]


@given(st.binary(min_size=48, max_size=48), st.integers(0, 148), st.integers(1, 255))
def test_any_flipped_byte_of_a_signed_plaintext_is_caught(body: bytes, at: int, flip: int) -> None:
    plain = bytearray(ssa_sealing.encode_signed(SIGNER, "ssa", AD, body))
    plain[at] ^= flip
    try:
        got = ssa_sealing.decode_signed(bytes(plain), 48)
        verify(got.signer, "ssa", len(AD).to_bytes(4, "big") + AD + got.body, got.signature)
    except (SealedBoxError, SignatureError):
        return
    pytest.fail(f"a flipped byte at {at} went unnoticed")
