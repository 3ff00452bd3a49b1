"""The DCF public part's deferred canonical check (issue 26, session 35).

``DCFPublicBatch.from_bytes(data, defer_check=True)`` leaves the canonical-bit check to the
evaluation of every key (:func:`~flwr_fsl.crypto.dcf.evaluate_paired` at ``tau = 2`` ORs the
corrections it reads): shares equal the checked decode's, a non-canonical part is refused with
the checked decode's reason by both drivers (native and Python) before any share is returned,
and every other use of a deferred batch runs the full check first. Also the one-pass check
kernel (:func:`~flwr_fsl.kernels.dcf_kernels.public_flags`) against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.crypto import dcf
from flwr_fsl.crypto.dcf import DCFKeyBatch, DCFKeyError, DCFPublicBatch
from flwr_fsl.kernels import dcf_kernels as _k

U64 = np.uint64
MSK = (bytes(range(16)), bytes(range(16, 32)))
HEADER = 24
SEED_REASON = "seed corrections must have bit 0 clear"
BITS_REASON = "cw_bits entries must be in 0..3"


def _keys(m: int, n: int, tau: int = 2, seed: int = 0) -> tuple[DCFKeyBatch, DCFKeyBatch]:
    rng = np.random.default_rng(seed)
    alphas = rng.integers(0, 1 << n, m, dtype=U64)
    betas = rng.integers(0, 1 << 62, (m, tau), dtype=U64)
    return dcf.generate_keys_batch(alphas, betas, n, master_seeds=MSK)


def _party(public: DCFPublicBatch, party: int) -> DCFKeyBatch:
    return DCFKeyBatch.from_master_seed(party, MSK[party], public)


def _bad(blob: bytes, n: int, m: int, tau: int, what: str, level: int, key: int) -> bytes:
    """The public part with one seed correction's bit 0 set or one bit correction of 4+."""
    raw = bytearray(blob)
    if what == "seed":
        raw[HEADER + 16 * (level * m + key)] |= 1
    else:
        raw[HEADER + 16 * n * m + 8 * n * m * tau + level * m + key] = 4 + level % 250
    return bytes(raw)


@pytest.mark.parametrize("native", [True, False])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), m=st.integers(1, 40), n=st.sampled_from([1, 3, 17, 40]))
def test_deferred_decode_evaluates_like_the_checked_one(
    native: bool, seed: int, m: int, n: int
) -> None:
    k0, k1 = _keys(m, n, seed=seed)
    blob = k0.public.to_bytes()
    points = np.random.default_rng(seed).integers(0, 1 << n, m, dtype=U64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dcf, "_NATIVE_AES", native)
        for party, keys in ((0, k0), (1, k1)):
            deferred = DCFPublicBatch.from_bytes(blob, defer_check=True)
            assert deferred.deferred and not DCFPublicBatch.from_bytes(blob).deferred
            got = dcf.evaluate_paired(_party(deferred, party), points)
            assert np.array_equal(got, dcf.evaluate_paired(keys, points))
            assert not deferred.deferred  # settled by the evaluation's flags
            assert deferred.to_bytes() == blob


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("what", ["seed", "bits", "both"])
@pytest.mark.parametrize("where", [(0, 0), (2, 5), (4, 6)])  # first, middle, last correction
def test_deferred_evaluation_refuses_with_the_checked_reason(
    native: bool, what: str, where: tuple[int, int]
) -> None:
    n, m = 5, 7
    k0, _ = _keys(m, n)
    blob = k0.public.to_bytes()
    bad = _bad(blob, n, m, 2, "seed" if what == "seed" else "bits", *where)
    if what == "both":
        bad = _bad(bad, n, m, 2, "seed", 0, 0)
    reason = SEED_REASON if what == "seed" else BITS_REASON  # bits first, as in the constructor
    with pytest.raises(DCFKeyError, match=reason):
        DCFPublicBatch.from_bytes(bad)
    deferred = DCFPublicBatch.from_bytes(bad, defer_check=True)
    keys = _party(deferred, 0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dcf, "_NATIVE_AES", native)
        for _ in range(2):  # a refusal leaves the batch deferred: refused again
            with pytest.raises(DCFKeyError, match=reason):
                dcf.evaluate_paired(keys, np.zeros(m, dtype=U64))
            assert deferred.deferred
    for use in (deferred.verify, deferred.to_bytes, lambda: deferred == k0.public):
        with pytest.raises(DCFKeyError, match=reason):
            use()
    with pytest.raises(DCFKeyError, match=reason):  # not every key: the full check runs first
        dcf.evaluate_at_batch(keys, [1], [0])


def test_other_evaluations_of_a_deferred_part_check_it_first() -> None:
    n, m = 6, 3
    for tau in (1, 2, 3):
        k0, _ = _keys(m, n, tau)
        blob = k0.public.to_bytes()
        deferred = DCFPublicBatch.from_bytes(blob, defer_check=True)
        got = dcf.evaluate_at_batch(_party(deferred, 0), [2, 0], [5, 9])
        assert np.array_equal(got, dcf.evaluate_at_batch(k0, [2, 0], [5, 9]))
        assert not deferred.deferred
        bad = DCFPublicBatch.from_bytes(_bad(blob, n, m, tau, "seed", 1, 2), defer_check=True)
        keys = _party(bad, 0)
        with pytest.raises(DCFKeyError, match=SEED_REASON):
            dcf.evaluate_at_batch(keys, [0], [1])
        with pytest.raises(DCFKeyError, match=SEED_REASON):
            dcf.evaluate_paired(keys, np.zeros(m, dtype=U64))


def test_an_empty_batch_is_never_deferred() -> None:
    k0, _ = _keys(0, 4)
    assert not DCFPublicBatch.from_bytes(k0.public.to_bytes(), defer_check=True).deferred


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 6),
    m=st.integers(1, 9),
    seeds=st.lists(st.integers(0, 2**64 - 1), min_size=108, max_size=108),
    bits=st.lists(st.integers(0, 255), min_size=54, max_size=54),
    clean=st.booleans(),
)
def test_public_flags_match_numpy(n: int, m: int, seeds: list[int], bits: list[int], clean: bool):  # type: ignore[no-untyped-def]
    s = np.array(seeds[: n * m * 2], dtype=U64).reshape(n, m, 2)
    b = np.array(bits[: n * m], dtype=np.uint8).reshape(n, m)
    if clean:
        s[:, :, 0] &= ~U64(1)
        b &= 3
    want = int(np.any(s[:, :, 0] & U64(1))) | (int(np.bitwise_or.reduce(b.reshape(-1))) & ~3)
    assert int(_k.public_flags(s, b)) == want


@pytest.mark.parametrize("native", [True, False])
@settings(max_examples=40, deadline=None)
@given(
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_mutated_public_part_fares_alike_checked_or_deferred(
    native: bool, flips: list[tuple[int, int]], seed: int
) -> None:
    """Fuzz: for any corrupted public part (header included), the deferred decode and the
    evaluation of every key refuse with the checked decode's reason, or, where the checked
    decode accepts, return its shares."""
    n, m = 4, 5
    k0, _ = _keys(m, n, seed=seed)
    raw = bytearray(k0.public.to_bytes())
    for at, mask in flips:
        raw[at % len(raw)] ^= mask
    bad = bytes(raw)
    points = np.random.default_rng(seed).integers(0, 1 << n, m, dtype=U64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dcf, "_NATIVE_AES", native)
        try:
            checked = DCFPublicBatch.from_bytes(bad)
        except DCFKeyError as err:
            with pytest.raises(DCFKeyError) as caught:
                public = DCFPublicBatch.from_bytes(bad, defer_check=True)
                if public.num_keys == m and public.domain_bits == n:
                    dcf.evaluate_paired(_party(public, 0), points)
                else:
                    public.verify()
            assert str(caught.value) == str(err)
            return
        deferred = DCFPublicBatch.from_bytes(bad, defer_check=True)
        want = dcf.evaluate_paired(_party(checked, 0), points)
        assert np.array_equal(dcf.evaluate_paired(_party(deferred, 0), points), want)
