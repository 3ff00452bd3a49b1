"""Sealed channel: RFC 9180 conformance (an independent reference checked against RFC 9180
A.1.1), a frozen blob known answer, round trips, every truncation / tamper / wrong-key /
wrong-associated-data case, what the relay S0 can do, length hiding, key files."""

import hashlib
import hmac
import os
import stat
import struct
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.hashes import SHA256
from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from flwr_fsl.crypto.channel import (
    INFO_LABEL,
    OVERHEAD,
    SealedBoxError,
    SealingKeyPair,
    agree_key,
    associated_data,
    client_party,
    open_sealed,
    public_key_fingerprint,
    seal,
    verify_fingerprint,
)

# ---- an independent RFC 9180 base-mode Open (DHKEM(X25519, HKDF-SHA256), HKDF-SHA256) ----------


def _labeled_extract(suite_id: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
    return hmac.new(salt, b"HPKE-v1" + suite_id + label + ikm, hashlib.sha256).digest()


def _labeled_expand(suite_id: bytes, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
    labeled = struct.pack(">H", length) + b"HPKE-v1" + suite_id + label + info
    return HKDFExpand(SHA256(), length, labeled).derive(prk)


def rfc9180_open(sk_r: bytes, enc: bytes, ct: bytes, info: bytes, aad: bytes, aead_id: int):
    kem_id = b"KEM" + struct.pack(">H", 0x0020)
    hpke_id = b"HPKE" + struct.pack(">HHH", 0x0020, 0x0001, aead_id)
    sk = X25519PrivateKey.from_private_bytes(sk_r)
    pk_r = SealingKeyPair(sk).public_bytes
    dh = sk.exchange(X25519PublicKey.from_public_bytes(enc))
    eae_prk = _labeled_extract(kem_id, b"", b"eae_prk", dh)
    shared = _labeled_expand(kem_id, eae_prk, b"shared_secret", enc + pk_r, 32)
    psk_id_hash = _labeled_extract(hpke_id, b"", b"psk_id_hash", b"")
    info_hash = _labeled_extract(hpke_id, b"", b"info_hash", info)
    context = b"\x00" + psk_id_hash + info_hash
    secret = _labeled_extract(hpke_id, shared, b"secret", b"")
    nk = {1: 16, 2: 32}[aead_id]
    key = _labeled_expand(hpke_id, secret, b"key", context, nk)
    nonce = _labeled_expand(hpke_id, secret, b"base_nonce", context, 12)
    return AESGCM(key).decrypt(nonce, ct, aad)


# RFC 9180 Appendix A.1.1 (base mode, AES-128-GCM), first encryption (sequence number 0).
A11 = {
    "skRm": "4612c550263fc8ad58375df3f557aac531d26850903e55a9f23f21d8534e8ac8",
    "pkRm": "3948cfe0ad1ddb695d780e59077195da6c56506b027329794ab02bca80815c4d",
    "enc": "37fda3567bdbd628e88668c3c8d7e97d1d1253b6d4ea6d44c150f741f1bf4431",
    "info": "4f6465206f6e2061204772656369616e2055726e",
    "aad": "436f756e742d30",
    "pt": "4265617574792069732074727574682c20747275746820626561757479",
    "ct": "f938558b5d72f1a23810b4be2ab4f84331acc02fc97babc53a52ae8218a355a9"
    "6d8770ac83d07bea87e13c512a",
}


def test_reference_open_matches_rfc9180_a11():
    v = {k: bytes.fromhex(x) for k, x in A11.items()}
    assert SealingKeyPair.from_private_bytes(v["skRm"]).public_bytes == v["pkRm"]
    assert rfc9180_open(v["skRm"], v["enc"], v["ct"], v["info"], v["aad"], 1) == v["pt"]


def test_seal_is_rfc9180_base_mode_aes256gcm_with_ad_in_info():
    kp = SealingKeyPair.from_private_bytes(bytes.fromhex(A11["skRm"]))
    ad = AD(purpose="ssa", round=3, client=7, sender="client", recipient="S1")
    blob = seal(kp.public_bytes, b"master seed here", associated_data=ad)
    header, enc, ct = blob[:8], blob[8:40], blob[40:]
    assert header == b"FSSB\x01\x01\x00\x00"
    info = INFO_LABEL + header + ad
    assert rfc9180_open(_sk_bytes(kp), enc, ct, info, b"", 2) == b"master seed here"


# A blob frozen at format version 1: any change to the format or the key schedule breaks it.
FROZEN_SK = bytes(range(1, 33))
FROZEN_AD = (  # the v1 associated data bytes the blob was sealed with (opaque to the box format)
    b"FSAD\x01\x03\x00ssa\x06\x00client\x02\x00S1"
    + (1).to_bytes(8, "little")
    + (42).to_bytes(8, "little")
)
FROZEN_PT = b"flwr_fsl sealed box v1"
FROZEN_BLOB = bytes.fromhex(
    "4653534201010000a49cd391d871ac7649e9db1ce4fb74b9e20d9782d3b4a49d"
    "b032250c3eb10b2f7bd86fc73e293452a0ea0f725fe8623a7c7597aa59b7477e"
    "ee8a05ac36a2c0ab44fb5b97c591"
)


SID = bytes(range(16))
DIG = bytes(range(100, 132))


def AD(
    *,
    purpose: str = "ssa",
    round: Any = 0,
    client: Any = 0,
    sender: Any = "client",
    recipient: Any = "S1",
    session: Any = SID,
    params_digest: Any = DIG,
) -> bytes:
    """Associated data with the client id folded into the client party's id, as sealing does."""
    if sender == "client":
        sender = client_party(client)
    if recipient == "client":
        recipient = client_party(client)
    return associated_data(
        purpose=purpose,
        sender=sender,
        recipient=recipient,
        session=session,
        round=round,
        params_digest=params_digest,
    )


def _sk_bytes(kp: SealingKeyPair) -> bytes:
    return kp.private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


@pytest.fixture(scope="module")
def s1():
    return SealingKeyPair.generate()


@pytest.fixture
def ad():
    return AD(purpose="ssa", round=5, client=11, sender="client", recipient="S1")


@pytest.mark.parametrize("size", [0, 1, 16, 48, 1000, 1 << 20])
def test_round_trip(s1, ad, size):
    pt = os.urandom(size)
    blob = seal(s1.public_bytes, pt, associated_data=ad)
    assert len(blob) == size + OVERHEAD
    assert open_sealed(s1, blob, associated_data=ad) == pt
    assert open_sealed(s1, bytearray(blob), associated_data=bytearray(ad)) == pt


def test_fresh_ephemeral_key_per_seal(s1, ad):
    a, b = (seal(s1.public_bytes, b"same", associated_data=ad) for _ in range(2))
    assert a[8:40] != b[8:40] and a != b


def test_length_depends_on_plaintext_length_only(s1, ad):
    lengths = {
        len(seal(s1.public_bytes, pt, associated_data=ad))
        for pt in (bytes(48), b"\xff" * 48, os.urandom(48), b"x" * 48)
    }
    assert lengths == {48 + OVERHEAD}


def test_wrong_key_cannot_open(s1, ad):
    blob = seal(s1.public_bytes, b"secret", associated_data=ad)
    with pytest.raises(SealedBoxError, match="authentication"):
        open_sealed(SealingKeyPair.generate(), blob, associated_data=ad)


@pytest.mark.parametrize(
    "field, value",
    [
        ("purpose", "psr-query"),
        ("round", 6),
        ("client", 12),
        ("sender", "S0"),
        ("recipient", "S0"),
        ("session", bytes(16)),
        ("params_digest", bytes(32)),
    ],
)
def test_wrong_associated_data(s1, field, value):
    kw = dict(purpose="ssa", round=5, client=11, sender="client", recipient="S1")
    blob = seal(s1.public_bytes, b"secret", associated_data=AD(**kw))
    kw[field] = value
    with pytest.raises(SealedBoxError, match="authentication"):
        open_sealed(s1, blob, associated_data=AD(**kw))
    with pytest.raises(SealedBoxError):
        open_sealed(s1, blob, associated_data=b"")


def test_every_truncation_and_extension_fails(s1, ad):
    blob = seal(s1.public_bytes, b"0123456789", associated_data=ad)
    for n in range(len(blob)):
        with pytest.raises(SealedBoxError):
            open_sealed(s1, blob[:n], associated_data=ad)
    with pytest.raises(SealedBoxError):
        open_sealed(s1, blob + b"\0", associated_data=ad)


def test_every_single_bit_flip_fails(s1, ad):
    blob = seal(s1.public_bytes, b"0123456789", associated_data=ad)
    for i in range(len(blob)):
        for bit in (0, 7):
            bad = bytearray(blob)
            bad[i] ^= 1 << bit
            with pytest.raises(SealedBoxError):
                open_sealed(s1, bytes(bad), associated_data=ad)


@pytest.mark.parametrize(
    "offset, value, message",
    [(0, ord("X"), "magic"), (4, 2, "version"), (5, 9, "suite"), (7, 1, "reserved")],
)
def test_header_errors_are_named(s1, ad, offset, value, message):
    bad = bytearray(seal(s1.public_bytes, b"x", associated_data=ad))
    bad[offset] = value
    with pytest.raises(SealedBoxError, match=message):
        open_sealed(s1, bytes(bad), associated_data=ad)


def test_truncated_message_is_named(s1, ad):
    with pytest.raises(SealedBoxError, match="truncated"):
        open_sealed(s1, b"FSSB\x01", associated_data=ad)


def test_relay_s0_cannot_read_substitute_or_redirect(s1):
    """S0 holds S1's public key, the associated data, every blob and its own key pair."""
    s0 = SealingKeyPair.generate()
    ad_a = AD(purpose="ssa", round=1, client=1, sender="client", recipient="S1")
    ad_b = AD(purpose="ssa", round=1, client=2, sender="client", recipient="S1")
    seed_a = os.urandom(16)
    blob_a = seal(s1.public_bytes, seed_a, associated_data=ad_a)
    with pytest.raises(SealedBoxError):
        open_sealed(s0, blob_a, associated_data=ad_a)
    assert seed_a not in blob_a
    # Relabel client 1's blob as client 2's: rejected.
    with pytest.raises(SealedBoxError):
        open_sealed(s1, blob_a, associated_data=ad_b)
    # Re-encrypt under S0's own ephemeral key (splicing enc): rejected.
    forged = seal(s1.public_bytes, bytes(16), associated_data=ad_a)
    spliced = blob_a[:8] + forged[8:40] + blob_a[40:]
    with pytest.raises(SealedBoxError):
        open_sealed(s1, spliced, associated_data=ad_a)


def test_bad_public_keys_rejected(ad):
    with pytest.raises(SealedBoxError, match="32 bytes"):
        seal(b"\x01" * 31, b"x", associated_data=ad)
    with pytest.raises(SealedBoxError, match="must be bytes"):
        seal("00" * 32, b"x", associated_data=ad)  # type: ignore[arg-type]
    with pytest.raises(SealedBoxError, match="cannot seal"):
        seal(bytes(32), b"x", associated_data=ad)  # low-order point: all-zero shared secret


def test_bad_argument_types(s1, ad):
    with pytest.raises(SealedBoxError):
        seal(s1.public_bytes, "text", associated_data=ad)  # type: ignore[arg-type]
    with pytest.raises(SealedBoxError):
        seal(s1.public_bytes, b"x", associated_data="ad")  # type: ignore[arg-type]
    with pytest.raises(SealedBoxError):
        open_sealed(s1.private_key, b"x" * 80, associated_data=ad)  # type: ignore[arg-type]
    with pytest.raises(SealedBoxError):
        open_sealed(s1, "x" * 80, associated_data=ad)  # type: ignore[arg-type]


def test_frozen_blob_known_answer():
    kp = SealingKeyPair.from_private_bytes(FROZEN_SK)
    assert open_sealed(kp, FROZEN_BLOB, associated_data=FROZEN_AD) == FROZEN_PT


# ---- associated data ---------------------------------------------------------------------------


def test_associated_data_known_answer():
    got = AD(
        purpose="ssa",
        sender=client_party(258),
        recipient="S1",
        session=SID,
        round=1,
        params_digest=DIG,
    )
    want = (
        b"FSAD\x02"
        + b"\x03\x00ssa"
        + b"\x0a\x00client:258"
        + b"\x02\x00S1"
        + SID
        + (1).to_bytes(8, "little")
        + DIG
    )
    assert got == want


def test_associated_data_is_unambiguous():
    a = AD(purpose="a", round=0, client=0, sender="bc", recipient="d")
    b = AD(purpose="ab", round=0, client=0, sender="c", recipient="d")
    c = AD(purpose="a", round=1 << 8, client=0, sender="bc", recipient="d")
    d = AD(purpose="a", round=0, client=1, sender="client", recipient="d")
    e = AD(purpose="a", round=0, client=2, sender="client", recipient="d")
    f = AD(purpose="a", round=0, sender="bc", recipient="d", session=bytes(16))
    g = AD(purpose="a", round=0, sender="bc", recipient="d", params_digest=bytes(32))
    assert len({a, b, c, d, e, f, g}) == 7
    assert AD(purpose="é", round=0, client=0, sender="x", recipient="y") != (
        AD(purpose="e", round=0, client=0, sender="x", recipient="y")
    )


@pytest.mark.parametrize(
    "kw",
    [
        dict(purpose=""),
        dict(purpose="x" * 1025),
        dict(sender=b"client"),
        dict(recipient=None),
        dict(round=-1),
        dict(round=1 << 64),
        dict(round=True),
        dict(client=1.0),
        dict(client="3"),
        dict(session=bytes(15)),
        dict(session="s" * 16),
        dict(params_digest=bytes(31)),
    ],
)
def test_associated_data_rejects_bad_fields(kw):
    base = dict(purpose="ssa", round=0, client=0, sender="client", recipient="S1")
    base.update(kw)
    with pytest.raises(SealedBoxError):
        AD(**base)


def test_largest_fields_accepted():
    ad = AD(
        purpose="p" * 1024, round=(1 << 64) - 1, client=(1 << 64) - 1, sender="s", recipient="r"
    )
    assert ad.endswith(b"\xff" * 8 + DIG)


# ---- keys and fingerprints ---------------------------------------------------------------------


def test_fingerprint_is_sha256_of_raw_public_key():
    pk = bytes.fromhex(A11["pkRm"])
    assert public_key_fingerprint(pk) == hashlib.sha256(pk).hexdigest()
    kp = SealingKeyPair.from_private_bytes(bytes.fromhex(A11["skRm"]))
    assert kp.fingerprint == public_key_fingerprint(pk)
    assert kp.fingerprint in repr(kp) and A11["skRm"] not in repr(kp)
    with pytest.raises(SealedBoxError):
        public_key_fingerprint(pk[:31])


def test_verify_fingerprint(s1):
    fp = s1.fingerprint
    assert verify_fingerprint(s1.public_bytes, fp) == s1.public_bytes
    assert verify_fingerprint(s1.public_bytes, f"  sha256:{fp.upper()} ") == s1.public_bytes
    with pytest.raises(SealedBoxError, match="does not match"):
        verify_fingerprint(SealingKeyPair.generate().public_bytes, fp)
    for bad in ("", fp[:-1], fp[:-1] + "g", 123):
        with pytest.raises(SealedBoxError, match="fingerprint must"):
            verify_fingerprint(s1.public_bytes, bad)  # type: ignore[arg-type]


def test_private_key_validation():
    with pytest.raises(SealedBoxError):
        SealingKeyPair.from_private_bytes(b"\x01" * 31)
    with pytest.raises(SealedBoxError):
        SealingKeyPair(Ed25519PrivateKey.generate())  # type: ignore[arg-type]


def test_key_file_round_trip_and_mode(tmp_path):
    kp = SealingKeyPair.generate()
    path = kp.save(tmp_path / "s1.pem")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")
    loaded = SealingKeyPair.load(path)
    assert loaded.public_bytes == kp.public_bytes
    ad = AD(purpose="ssa", round=0, client=0, sender="client", recipient="S1")
    assert open_sealed(loaded, seal(kp.public_bytes, b"hi", associated_data=ad), associated_data=ad)


def test_key_file_never_clobbered_unless_asked(tmp_path):
    first, second = SealingKeyPair.generate(), SealingKeyPair.generate()
    path = first.save(tmp_path / "k.pem")
    with pytest.raises(SealedBoxError, match="exists"):
        second.save(path)
    assert SealingKeyPair.load(path).public_bytes == first.public_bytes
    second.save(path, overwrite=True)
    assert SealingKeyPair.load(path).public_bytes == second.public_bytes
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.pem"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_key_file_with_loose_mode_refused(tmp_path):
    path = SealingKeyPair.generate().save(tmp_path / "k.pem")
    path.chmod(0o644)
    with pytest.raises(SealedBoxError, match="chmod 600"):
        SealingKeyPair.load(path)


def test_key_file_errors(tmp_path):
    with pytest.raises(SealedBoxError, match="cannot read"):
        SealingKeyPair.load(tmp_path / "missing.pem")
    with pytest.raises(SealedBoxError, match="cannot write"):
        SealingKeyPair.generate().save(tmp_path / "no-dir" / "k.pem")
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"not a key")
    garbage.chmod(0o600)
    with pytest.raises(SealedBoxError, match="PKCS#8"):
        SealingKeyPair.load(garbage)
    other = tmp_path / "ed.pem"
    other.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        )
    )
    other.chmod(0o600)
    with pytest.raises(SealedBoxError, match="not an X25519"):
        SealingKeyPair.load(other)


# ---- agree_key: X25519 (RFC 7748 6.1) then HKDF-SHA256 (an independent RFC 5869 reference) ----

_ALICE = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"
_BOB = "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"
_SHARED = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"


def _hkdf_ref(secret: bytes, salt: bytes, info: bytes, length: int) -> bytes:
    prk = hmac.new(salt or bytes(32), secret, hashlib.sha256).digest()
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out, counter = out + block, counter + 1
    return out[:length]


def test_agree_key_known_answer():
    alice = X25519PrivateKey.from_private_bytes(bytes.fromhex(_ALICE))
    bob = X25519PrivateKey.from_private_bytes(bytes.fromhex(_BOB))
    alice_pub, bob_pub = (SealingKeyPair(k).public_bytes for k in (alice, bob))
    assert alice_pub.hex() == "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
    salt, info = bytes(range(32)), b"flwr_fsl/test\x00" + struct.pack("<QQ", 3, 8)
    for length in (16, 1, 32, 100):
        want = _hkdf_ref(bytes.fromhex(_SHARED), salt, info, length)
        assert agree_key(alice, bob_pub, salt=salt, info=info, length=length) == want
        assert agree_key(bob, alice_pub, salt=salt, info=info, length=length) == want
    assert agree_key(alice, bob_pub, salt=salt, info=info) == _hkdf_ref(
        bytes.fromhex(_SHARED), salt, info, 16
    )
    assert agree_key(alice, bob_pub, salt=b"", info=info) == _hkdf_ref(
        bytes.fromhex(_SHARED), b"", info, 16
    )
    # Salt and info both separate the keys.
    assert agree_key(alice, bob_pub, salt=salt, info=info + b"x") != want[:16]
    assert agree_key(alice, bob_pub, salt=bytes(32), info=info) != want[:16]


def test_agree_key_errors():
    key = X25519PrivateKey.generate()
    peer = SealingKeyPair.generate().public_bytes
    with pytest.raises(SealedBoxError, match="low-order"):
        agree_key(key, bytes(32), salt=b"", info=b"")
    with pytest.raises(SealedBoxError, match="32 bytes"):
        agree_key(key, peer[:31], salt=b"", info=b"")
    with pytest.raises(SealedBoxError, match="must be bytes"):
        agree_key(key, "peer", salt=b"", info=b"")  # type: ignore[arg-type]
    with pytest.raises(SealedBoxError, match="X25519PrivateKey"):
        agree_key(SealingKeyPair.generate(), peer, salt=b"", info=b"")  # type: ignore[arg-type]
    with pytest.raises(SealedBoxError, match="salt and info"):
        agree_key(key, peer, salt="s", info=b"")  # type: ignore[arg-type]
    with pytest.raises(SealedBoxError, match="salt and info"):
        agree_key(key, peer, salt=b"", info=None)  # type: ignore[arg-type]
    for length in (0, 8161, True, 16.0):
        with pytest.raises(SealedBoxError, match="length"):
            agree_key(key, peer, salt=b"", info=b"", length=length)  # type: ignore[arg-type]
    assert len(agree_key(key, peer, salt=b"", info=b"", length=8160)) == 8160
