"""S1's ``PsuSum`` (Cui's basic protocol): sealed seeds in, S1's total out; strict and bounded."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.psu import PSUParams
from flwr_fsl.families.ssa import union as U
from flwr_fsl.helper import HelperRequestError, InProcessHelper, wire
from flwr_fsl.helper.errors import WireFormatError
from flwr_fsl.helper.limits import HelperLimits
from flwr_fsl.helper.services.psu import (
    PsuSumRequest,
    PsuTotalResponse,
    SeedItem,
    request_psu_total,
)
from flwr_fsl.testing.helper_process import HelperProcess

SETS = {11: [1, 2, 3], 12: [3, 40], 13: [7]}


def _round(helper, key: SealingKeyPair, rid: int, m: int = 50, sets=SETS):  # type: ignore[no-untyped-def]
    psu = PSUParams.exact(m)
    binding = U.psu_binding(helper.session_id, rid, psu)
    lead = np.zeros(psu.vector_length, np.uint64)
    seeds = []
    for cid, rows in sets.items():
        share = U.share_set(psu, rows)
        lead += share.lead_vector
        sealed = U.seal_psu_seed(
            key.public_bytes, binding=binding, client_id=cid, seed=share.helper_seed
        )
        seeds.append((cid, sealed))
    return psu, lead, seeds


def test_s1_total_opens_the_union_and_refuses_bad_seeds_per_client() -> None:
    key = SealingKeyPair.generate()
    helper = InProcessHelper(keypair=key)
    psu, lead, seeds = _round(helper, key, 3)
    other = _round(helper, key, 4, sets={14: [5]})[2]  # bound to round 4: refused in round 3
    seeds += [(99, b"x" * U.SEALED_SEED_BYTES), (14, other[0][1])]
    total, refused = request_psu_total(helper, 3, U.psu_params_to_bytes(psu), seeds)
    np.testing.assert_array_equal(U.open_union(psu, lead, total), [1, 2, 3, 7, 40])
    assert set(refused) == {99, 14}
    with pytest.raises(HelperRequestError, match="replay"):
        request_psu_total(helper, 3, U.psu_params_to_bytes(psu), seeds[:1])


def test_s1_refuses_bad_parameters_and_oversize_rounds_before_allocating() -> None:
    key = SealingKeyPair.generate()
    helper = InProcessHelper(keypair=key, limits=HelperLimits(max_domain_size=1 << 10))
    helper.open_session()
    with pytest.raises(HelperRequestError, match="bad PSU parameters"):
        request_psu_total(helper, 1, b"\0" * 50, [])
    big = U.psu_params_to_bytes(PSUParams.exact(1 << 20))
    with pytest.raises(HelperRequestError, match="max-domain"):
        request_psu_total(helper, 1, big, [])
    psu, _, seeds = _round(helper, key, 2)
    twice = [seeds[0], seeds[0]]
    _, refused = request_psu_total(helper, 2, U.psu_params_to_bytes(psu), twice)
    assert "two PSU seeds" in refused[seeds[0][0]]


def test_wire_roundtrip_and_versions() -> None:
    request = PsuSumRequest(bytes(16), 5, b"p" * 50, (SeedItem(1, b"s" * 72),))
    assert wire.decode(wire.encode(request), PsuSumRequest) == request
    data = bytearray(wire.encode(request))
    data[8] = 2  # the body's format version
    with pytest.raises(WireFormatError, match="version"):
        wire.decode(bytes(data), PsuSumRequest)
    response = PsuTotalResponse(
        (wire.ClientResult(1, True), wire.ClientResult(2, False, b"no")),
        np.arange(4, dtype=np.uint64),
    )
    back = wire.decode(wire.encode(response), PsuTotalResponse)
    assert back.results == response.results
    np.testing.assert_array_equal(back.total, response.total)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cut=st.integers(0, 200), flip=st.integers(0, 200), noise=st.binary(max_size=12))
def test_psu_decoders_raise_only_wire_format_errors(cut: int, flip: int, noise: bytes) -> None:
    samples = [
        (PsuSumRequest, PsuSumRequest(bytes(16), 5, b"p" * 50, (SeedItem(1, b"s" * 72),))),
        (
            PsuTotalResponse,
            PsuTotalResponse((wire.ClientResult(1, True),), np.arange(3, dtype=np.uint64)),
        ),
    ]
    for cls, message in samples:
        data = bytearray(wire.encode(message))
        data[flip % len(data)] ^= 0x5A
        data = data[: max(8, len(data) - cut % len(data))] + noise
        try:
            decoded = wire.decode(bytes(data), cls)
        except WireFormatError:
            continue
        assert isinstance(decoded, cls)


def test_a_real_s1_process_sums_like_the_in_process_twin(tmp_path) -> None:  # type: ignore[no-untyped-def]
    key = SealingKeyPair.generate()
    key_file = tmp_path / "s1.pem"
    key.save(key_file)
    proc = HelperProcess(key_file, tmp_path / "helper.log")
    try:
        client = proc.client(timeout=120)
        try:
            psu, lead, seeds = _round(client, key, 1)
            total, refused = request_psu_total(client, 1, U.psu_params_to_bytes(psu), seeds)
        finally:
            client.close()
    finally:
        proc.stop()
    assert refused == {}
    np.testing.assert_array_equal(U.open_union(psu, lead, total), [1, 2, 3, 7, 40])
