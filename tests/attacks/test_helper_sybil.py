"""Sybil clients against a REAL ``flwr-fsl-helper`` process: S0 cannot invent clients S1 counts.

The attacker is S0 (the curious, deviating lead server): it relays what it likes to S1 over
gRPC, holds every client's S0 master seed and public part (what S0 legitimately sees), and its
goal is the victim's update on its own. S1's minimum participation (``--min-clients``, default
2) is what should stop that: S1 returns no share of a round with fewer clients. The attack of
issue 21: S0 seals a zero update under an invented client id (999999), so S1 counts two clients,
and the aggregate S0 reconstructs *is* the victim's update.

- **Default (``--enrollment``)**: S1 refuses the sybil (its key is not enrolled), counts one
  signer, and refuses the round: S0 learns nothing (attacker success 0 rows, the chance
  baseline without any share). Reusing the victim's sealed material under a second id is
  refused (it is bound to the victim's id); one enrolled key (an accomplice client S0 holds)
  signing for two ids is refused the second time, so it counts once toward the minimum.
- **Leaking option (``--open-enrollment``, documented insecure)**: the same sybil is accepted
  and S0 reconstructs every one of the victim's rows exactly.

Each case uses one S1 process (module fixtures, started once) and a fresh session.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.identity import SigningIdentity
from flwr_fsl.families.ssa.protocol import SSAParams, SSAServer, encode_update, reconstruct
from flwr_fsl.families.ssa.sealing import seal_ssa_upload
from flwr_fsl.helper import HelperClient, HelperRequestError
from flwr_fsl.testing.helper_process import HelperProcess
from tests.helper.test_helper import (
    WIDTH,
    Client,
    bind,
    make_clients,
    make_params,
    signer_of,
)

SYBIL = 999_999
VICTIM, OTHER, ACCOMPLICE = 10, 11, 12  # make_clients' ids; all three are enrolled


def _enrollment(tmp: Path) -> Path:
    path = tmp / "enrollment.txt"
    lines = [signer_of(cid).enrollment_line(f"client-{cid}") for cid in (VICTIM, OTHER, ACCOMPLICE)]
    path.write_text("# the enrolled clients\n" + "\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def s1_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("s1") / "s1.pem"
    SealingKeyPair.generate().save(path)
    return path


@pytest.fixture(scope="module")
def enrolled(s1_key: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HelperProcess]:
    tmp = tmp_path_factory.mktemp("enrolled")
    # These rounds are unchecked (make_params): S1 must allow them (its default floor refuses).
    flags = ("--min-value-check", "off")
    with HelperProcess(s1_key, tmp / "s1.log", flags, enrollment=_enrollment(tmp)) as proc:
        yield proc


@pytest.fixture(scope="module")
def open_s1(s1_key: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HelperProcess]:
    tmp = tmp_path_factory.mktemp("open")
    # These rounds are unchecked (make_params): S1 must allow them (its default floor refuses).
    with HelperProcess(s1_key, tmp / "s1.log", ("--min-value-check", "off")) as proc:
        yield proc


def _connect(proc: HelperProcess) -> HelperClient:
    """S0's authenticated connection with its session open (S1 draws the session id)."""
    conn = proc.client()
    conn.open_session()
    return conn


def _zero_upload(
    params: SSAParams, client_id: int, pub: bytes, session: bytes, signer: SigningIdentity
) -> tuple[tuple[int, bytes, bytes], bytes]:
    """S0's own zero-update upload under ``client_id``: (relay item, S0's master seed)."""
    idx = np.arange(params.num_items)
    upload, _ = encode_update(params, idx, np.zeros((params.num_items, WIDTH)), 1.0)
    sealed = seal_ssa_upload(
        pub,
        binding=bind(params, session),
        client_id=client_id,
        public_part=upload.public_part,
        master_seed=upload.master_seeds[1],
        signer=signer,
    )
    return (client_id, upload.public_part, sealed), upload.master_seeds[0]


def _honest(
    params: SSAParams, client: Client, pub: bytes, session: bytes
) -> tuple[tuple[int, bytes, bytes], bytes]:
    """An honest client's signed upload in ``session``: (relay item, S0's master seed)."""
    upload, _ = encode_update(
        params, client.idx, client.values, 1.0, rng=np.random.default_rng(client.cid)
    )
    sealed = seal_ssa_upload(
        pub,
        binding=bind(params, session),
        client_id=client.cid,
        public_part=upload.public_part,
        master_seed=upload.master_seeds[1],
        signer=signer_of(client.cid),
    )
    return (client.cid, upload.public_part, sealed), upload.master_seeds[0]


def _victim(params: SSAParams, pub: bytes, session: bytes) -> tuple[Client, tuple, bytes]:
    victim = make_clients(1, seed=7)[0]
    assert victim.cid == VICTIM
    item, seed0 = _honest(params, victim, pub, session)
    return victim, item, seed0


def _attack(proc: HelperProcess) -> tuple[dict[int, str], int]:
    """Run the sybil round; return S1's rejections and how many victim rows S0 recovered."""
    conn = _connect(proc)
    session = conn.session_id
    try:
        pub = conn.public_key()
        params = make_params(1)
        conn.open_round(1, params.to_bytes())
        victim, item, seed0 = _victim(params, pub, session)
        sybil, sybil_seed0 = _zero_upload(params, SYBIL, pub, session, SigningIdentity.generate())
        rejected = conn.add_clients(1, [item, sybil])
        try:
            ids, share1 = conn.finish_round(1)
        except HelperRequestError as err:
            assert "minimum participation" in str(err)
            return rejected, 0  # no share: S0 learns nothing about the victim
        s0 = SSAServer(params, 0)
        for (cid, public, _), seed in ((item, seed0), (sybil, sybil_seed0)):
            if cid in ids:
                s0.add_client(cid, public, seed)
        result = reconstruct(params, s0.share(), share1)
        assert result.counts is not None
        rows = np.flatnonzero(result.counts)
        exact = np.allclose(result.sums[victim.idx], victim.values, atol=1e-5)
        recovered = len(set(rows.tolist()) & set(victim.idx.tolist())) if exact else 0
        return rejected, recovered
    finally:
        conn.close()


def test_invented_client_is_refused_and_the_round_with_one_real_client_fails(
    enrolled: HelperProcess,
) -> None:
    rejected, recovered = _attack(enrolled)
    assert set(rejected) == {SYBIL}
    assert "is not enrolled at S1" in rejected[SYBIL]
    assert recovered == 0  # chance baseline: no share, nothing about the victim's rows


def test_open_enrollment_keeps_the_leak(open_s1: HelperProcess) -> None:
    rejected, recovered = _attack(open_s1)
    assert rejected == {}
    assert recovered == make_params(1).num_items  # every victim row, exactly


def test_a_real_clients_material_under_a_second_id_is_refused(enrolled: HelperProcess) -> None:
    conn = _connect(enrolled)
    session = conn.session_id
    try:
        pub = conn.public_key()
        params = make_params(1)
        conn.open_round(1, params.to_bytes())
        _, item, _ = _victim(params, pub, session)
        other = make_clients(2, seed=3)[1]
        assert other.cid == OTHER
        other_item, _ = _honest(params, other, pub, session)
        assert conn.add_clients(1, [item, other_item]) == {}
        rejected = conn.add_clients(1, [(SYBIL, item[1], item[2])])  # victim's, under 999999
        assert "authentication" in rejected[SYBIL]
        again = conn.add_clients(1, [item])  # the same material again, under its own id
        assert "already submitted" in again[VICTIM]
        ids, _ = conn.finish_round(1)
        assert ids == (VICTIM, OTHER)
    finally:
        conn.close()


def test_one_enrolled_key_signs_for_one_client_per_round(enrolled: HelperProcess) -> None:
    """S0 holds an accomplice's enrolled key and signs zero updates for two ids with it.

    The second is refused, so the key counts once toward S1's minimum (a round of the victim
    and one accomplice still reaches a minimum of 2: a client colluding with S0 is outside the
    model minimum participation protects; ``tests/helper/test_helper_identity.py`` shows a
    minimum of 3 refusing the same relay).
    """
    conn = _connect(enrolled)
    session = conn.session_id
    try:
        pub = conn.public_key()
        params = make_params(1)
        conn.open_round(1, params.to_bytes())
        _, item, _ = _victim(params, pub, session)
        accomplice = signer_of(ACCOMPLICE)
        first, _ = _zero_upload(params, ACCOMPLICE, pub, session, accomplice)
        second, _ = _zero_upload(params, SYBIL, pub, session, accomplice)
        rejected = conn.add_clients(1, [item, first, second])
        assert set(rejected) == {SYBIL}
        assert f"already signed for client {ACCOMPLICE}" in rejected[SYBIL]
        ids, _ = conn.finish_round(1)
        assert ids == (VICTIM, ACCOMPLICE)
    finally:
        conn.close()
