"""S1's client-identity checks through the in-process twin (the same bytes as the process):
unknown signer, bad signature, unsigned v1 material, a signer reused under another id, a hint
signed by another key than the U-DPF keys S1 holds, minimum participation counted in distinct
signers; the CLI's --enrollment / --open-enrollment rules; open enrollment in simulation."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from flwr_fsl.crypto.channel import SealingKeyPair, associated_data, client_party, seal
from flwr_fsl.crypto.identity import Enrollment, EnrollmentEntry, SigningIdentity
from flwr_fsl.families.ssa import sealing as ssa_sealing
from flwr_fsl.families.ssa.protocol import SSAParams, held_digest
from flwr_fsl.helper import HelperLimits, HelperRequestError, HelperService, InProcessHelper
from flwr_fsl.helper.cli import main
from flwr_fsl.helper.setup import SIMULATION_CAVEAT
from tests.helper.test_helper import (
    SID,
    bind,
    first_round,
    fixed_ids,
    hint_for,
    make_clients,
    make_params,
    signer_of,
    upload_for,
)

CLIENTS = make_clients(4)  # ids 10..13
ENROLLED = Enrollment.of(
    [EnrollmentEntry(signer_of(c.cid).public_bytes, f"c{c.cid}", i) for i, c in enumerate(CLIENTS)]
)


def enrolled_twin(min_clients: int = 1) -> InProcessHelper:
    service = HelperService(
        SealingKeyPair.generate(),
        limits=HelperLimits(min_clients=min_clients),
        enrollment=ENROLLED,
        session_ids=fixed_ids(SID),
    )
    return InProcessHelper(service)


def _signed_by(
    signer: SigningIdentity, claimed: bytes, params: SSAParams, cid: int, public: bytes, pub: bytes
) -> bytes:
    """A sealed upload whose header names ``claimed`` but whose signature is ``signer``'s."""
    ad = associated_data(
        purpose=ssa_sealing.SSA,
        sender=client_party(cid),
        recipient=ssa_sealing.HELPER,
        **bind(params).fields(),
    )
    body = bytes(16) + hashlib.sha256(public).digest()
    plain = ssa_sealing.encode_signed(signer, ssa_sealing.SSA, ad, body)
    plain = plain[:5] + claimed + plain[37:]
    return seal(pub, plain, associated_data=ad)


def test_unknown_bad_unsigned_and_reused_signers_are_refused_per_client() -> None:
    helper = enrolled_twin()
    pub = helper.public_key()
    params = make_params(1)
    helper.open_round(1, params.to_bytes())
    good, stranger, forged, unsigned, reused = CLIENTS[0], 20, 21, 22, CLIENTS[1]
    up, sealed = upload_for(params, good, pub)
    ad = lambda cid: associated_data(  # noqa: E731
        purpose="ssa", sender=client_party(cid), recipient="S1", **bind(params).fields()
    )
    items = [
        (good.cid, up.public_part, sealed),
        # An unenrolled key, correctly signed.
        (
            stranger,
            up.public_part,
            ssa_sealing.seal_ssa_upload(
                pub,
                binding=bind(params),
                client_id=stranger,
                public_part=up.public_part,
                master_seed=bytes(16),
                signer=SigningIdentity.generate(),
            ),
        ),
        # Claims an enrolled key, signed by another.
        (
            forged,
            up.public_part,
            _signed_by(
                SigningIdentity.generate(),
                signer_of(CLIENTS[2].cid).public_bytes,
                params,
                forged,
                up.public_part,
                pub,
            ),
        ),
        # v1: the bare body, no signature.
        (unsigned, up.public_part, seal(pub, bytes(48), associated_data=ad(unsigned))),
        # The first client's enrolled key again, under another id.
        (
            reused.cid,
            up.public_part,
            ssa_sealing.seal_ssa_upload(
                pub,
                binding=bind(params),
                client_id=reused.cid,
                public_part=up.public_part,
                master_seed=bytes(16),
                signer=signer_of(good.cid),
            ),
        ),
    ]
    rejected = helper.add_clients(1, items)
    assert set(rejected) == {stranger, forged, unsigned, reused.cid}
    assert "is not enrolled at S1" in rejected[stranger]
    assert rejected[forged].startswith("SignatureError: the signature does not verify")
    assert "unsigned (v1)" in rejected[unsigned]
    assert f"already signed for client {good.cid}" in rejected[reused.cid]
    ids, _ = helper.finish_round(1)
    assert ids == (good.cid,)


def test_minimum_participation_counts_distinct_enrolled_signers() -> None:
    helper = enrolled_twin(min_clients=3)
    pub = helper.public_key()
    params = make_params(1)
    helper.open_round(1, params.to_bytes())
    a, b = CLIENTS[0], CLIENTS[1]
    up_a, sealed_a = upload_for(params, a, pub)
    up_b, sealed_b = upload_for(params, b, pub)
    # S0 relays three ids, but b's key also signed the third: two signers.
    extra = ssa_sealing.seal_ssa_upload(
        pub,
        binding=bind(params),
        client_id=99,
        public_part=up_b.public_part,
        master_seed=bytes(16),
        signer=signer_of(b.cid),
    )
    rejected = helper.add_clients(
        1, [(a.cid, up_a.public_part, sealed_a), (b.cid, up_b.public_part, sealed_b)]
    )
    assert rejected == {}
    assert "already signed" in helper.add_clients(1, [(99, up_b.public_part, extra)])[99]
    with pytest.raises(HelperRequestError, match="2 clients, fewer than S1's minimum"):
        helper.finish_round(1)


def test_a_hint_must_be_signed_by_the_key_that_signed_the_held_keys() -> None:
    helper = enrolled_twin()
    pub = helper.public_key()
    a, b = make_clients(2)
    first_round(helper, make_params(1), [a, b])  # S1 holds a's keys, signed by a's key
    p2 = make_params(2)
    helper.open_round(2, p2.to_bytes())
    held = held_digest(a.state.keys[0])
    hint = a.state.next_round(p2, a.values, a.weight)
    # The right hint for the right keys, but signed by b's (enrolled, unused) key.
    wrong = ssa_sealing.seal_udpf_hint(
        pub, binding=bind(p2), client_id=a.cid, hint=hint, held=held, signer=signer_of(b.cid)
    )
    rejected = helper.add_client_hints(2, [(a.cid, hint, wrong)])
    assert "is not the one that signed the U-DPF keys S1 holds" in rejected[a.cid]
    assert helper.add_client_hints(2, [hint_for(p2, b, pub)]) == {}
    ids, _ = helper.finish_round(2)
    assert ids == (b.cid,)


def test_cli_requires_an_enrollment_choice(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    key = SealingKeyPair.generate().save(tmp_path / "s1.pem")
    assert main(["--key-file", str(key), "--port", "0"]) == 2
    assert "--enrollment FILE is required" in capsys.readouterr().err
    listing = tmp_path / "enrolled.txt"
    listing.write_text(f"{signer_of(1).public_bytes.hex()} one\nnot-a-key\n")
    assert main(["--key-file", str(key), "--enrollment", str(listing)]) == 2
    assert "enrolled.txt, line 2: the public key must be 64 hex" in capsys.readouterr().err
    both = ["--enrollment", str(listing), "--open-enrollment"]
    assert main(["--key-file", str(key), *both]) == 2
    assert "exclude each other" in capsys.readouterr().err
    # --print-fingerprint needs no enrollment.
    assert main(["--key-file", str(key), "--print-fingerprint"]) == 0


def test_help_documents_enrollment_and_the_key_tool(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--enrollment FILE" in out and "--open-enrollment" in out
    assert "flwr-fsl-identity KEYFILE --generate" in out and "fsl-signing-key" in out


def test_simulation_twin_uses_open_enrollment_and_says_so() -> None:
    twin = InProcessHelper()
    assert twin.service.enrollment.is_open
    assert "open enrollment" in SIMULATION_CAVEAT
    pub = twin.public_key()
    params = make_params(1)
    twin.open_round(1, params.to_bytes())
    c = make_clients(2)
    up, _ = upload_for(params, c[0], pub)
    anyone = ssa_sealing.seal_ssa_upload(
        pub,
        binding=bind(params, twin.session_id),
        client_id=c[0].cid,
        public_part=up.public_part,
        master_seed=bytes(16),
        signer=SigningIdentity.generate(),
    )
    assert twin.add_clients(1, [(c[0].cid, up.public_part, anyone)]) == {}
    with pytest.raises(ValueError, match="Enrollment"):
        HelperService(SealingKeyPair.generate(), enrollment="open")  # type: ignore[arg-type]
