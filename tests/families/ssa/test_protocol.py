"""SSA (Cui et al.): reconstruction equals the plaintext aggregate; U-DPF, privacy, errors."""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.dpf import DPFPublicBatch
from flwr_fsl.crypto.fixedpoint import FixedPointOverflowError
from flwr_fsl.families.ssa import protocol as ssa_protocol
from flwr_fsl.families.ssa.projected_check import split_value_trailer
from flwr_fsl.families.ssa.protocol import (
    SSAInputError,
    SSAParams,
    SSAServer,
    encode_update,
    payload_words,
    place_indices,
    reconstruct,
)
from flwr_fsl.submodel import Encoding, SubmodelUpdate, TensorUpdate, count_weighted_average


def _key(n: int) -> bytes:
    return hashlib.sha256(n.to_bytes(8, "little")).digest()[:16]


def _run_round(params, clients, rng):  # type: ignore[no-untyped-def]
    servers = [SSAServer(params, 0), SSAServer(params, 1)]
    for cid, (idx, vals, weight) in enumerate(clients):
        upload, _ = encode_update(params, idx, vals, weight, rng=rng)
        for b in (0, 1):
            servers[b].add_client(cid, upload.public_part, upload.master_seeds[b])
    return reconstruct(params, servers[0].share(), servers[1].share())


def _plaintext(params, clients):  # type: ignore[no-untyped-def]
    """The same round through FedSubAvg's plaintext count-weighted averaging."""
    model = {"w": np.zeros((params.domain_size, params.value_width))}
    updates = [
        SubmodelUpdate(
            {
                "w": TensorUpdate(
                    Encoding.ROWS,
                    np.asarray(v, np.float64).reshape(len(i), params.value_width),
                    np.asarray(i, np.int64),
                    None if np.ndim(c) == 0 else np.asarray(c, np.float64),
                )
            },
            weight=float(c) if np.ndim(c) == 0 else 1.0,
        )
        for i, v, c in clients
    ]
    return count_weighted_average(model, updates)[0]["w"]


@st.composite
def rounds(draw: st.DrawFn):  # type: ignore[no-untyped-def]
    m = draw(st.integers(1, 600))
    k = draw(st.integers(0, min(m, 60)))
    width = draw(st.integers(1, 4))
    stash = draw(st.sampled_from([0, 0, 2]))
    params = SSAParams(
        round_id=1,
        domain_size=m,
        num_items=k,
        value_width=width,
        hash_key=_key(draw(st.integers(0, 2**32))),
        stash_size=stash,
        frac_bits=30,
        max_abs=1e3,
        max_summands=10,
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    clients = []
    for _ in range(draw(st.integers(1, 5))):
        n = draw(st.integers(0, k))
        idx = rng.choice(m, n, replace=False)
        vals = rng.uniform(-1, 1, size=(n, width))
        weight = (
            float(draw(st.integers(1, 50)))
            if draw(st.booleans())
            else rng.integers(1, 20, size=n).astype(np.float64)
        )
        clients.append((idx, vals, weight))
    return params, clients, rng


@settings(max_examples=40)
@given(rounds())
def test_secure_aggregate_equals_plaintext_count_weighted(case) -> None:  # type: ignore[no-untyped-def]
    params, clients, rng = case
    result = _run_round(params, clients, rng)
    expected = _plaintext(params, clients)
    # Each client's payload word is off by < 2^-frac_bits; weights scale it by <= 50.
    tol = len(clients) * 50 * 2.0**-params.frac_bits
    np.testing.assert_allclose(result.average(), expected, atol=tol)
    counts = np.zeros(params.domain_size)
    for idx, _, c in clients:
        counts[idx] += c
    np.testing.assert_array_equal(result.counts, counts)


def test_stash_keys_carry_what_the_bins_cannot() -> None:
    m, k = 300, 24
    for n in range(200):  # find a hash key whose cuckoo insertion uses the stash
        params = SSAParams(
            round_id=1,
            domain_size=m,
            num_items=k,
            value_width=2,
            hash_key=_key(n),
            stash_size=4,
            scale_factor=1.0,
        )
        idx = np.arange(0, 2 * k, 2)
        if place_indices(params, idx, rng=np.random.default_rng(0)).cuckoo_table.stashed.size:
            break
    else:  # pragma: no cover
        pytest.fail("no hash key produced a stash")
    rng = np.random.default_rng(1)
    clients = [(idx, rng.normal(size=(k, 2)), 3.0), (idx[:5] + 1, rng.normal(size=(5, 2)), 1.0)]
    result = _run_round(params, clients, rng)
    np.testing.assert_allclose(result.average(), _plaintext(params, clients), atol=1e-5)


def test_without_count_weighting_servers_get_plain_sums() -> None:
    params = SSAParams(
        round_id=1,
        domain_size=100,
        num_items=10,
        value_width=1,
        hash_key=_key(1),
        count_weighted=False,
    )
    rng = np.random.default_rng(0)
    a, b = np.arange(10), np.arange(5, 15)
    result = _run_round(params, [(a, np.ones(10), 1.0), (b, 2 * np.ones(10), 1.0)], rng)
    expected = np.zeros(100)
    expected[a] += 1
    expected[b] += 2
    np.testing.assert_allclose(result.sums[:, 0], expected, atol=1e-6)
    assert result.counts is None
    with pytest.raises(ConfigurationError, match="count-weighted"):
        result.average()


def test_udpf_rounds_equal_fresh_key_rounds() -> None:
    base = SSAParams(round_id=1, domain_size=500, num_items=30, value_width=3, hash_key=_key(7))
    rng = np.random.default_rng(3)
    idx = [rng.choice(500, 30, replace=False) for _ in range(3)]
    states, stored = {}, [{}, {}]
    for epoch in range(1, 5):  # U-DPF epochs start at 1 (epoch-0 keys are not kept)
        params = replace(base, round_id=epoch, epoch=epoch)
        values = [np.random.default_rng([epoch, c]).normal(size=(30, 3)) for c in range(3)]
        # U-DPF path: fresh keys in epoch 1, hints afterwards.
        servers = [SSAServer(params, b, stored[b]) for b in (0, 1)]
        for c in range(3):
            weight = float(c + 1)
            if epoch == 1:
                upload, states[c] = encode_update(
                    params, idx[c], values[c], weight, rng=np.random.default_rng([epoch, c, 9])
                )
                for b in (0, 1):
                    servers[b].add_client(c, upload.public_part, upload.master_seeds[b])
            else:
                hint = states[c].next_round(
                    params, values[c], weight, rng=np.random.default_rng([epoch, c, 9])
                )
                for b in (0, 1):
                    servers[b].add_client_hint(c, hint)
        stored = [servers[0].keys, servers[1].keys]
        got = reconstruct(params, servers[0].share(), servers[1].share())
        # Fresh-key path with the same rounding randomness.
        fresh = [SSAServer(params, b) for b in (0, 1)]
        for c in range(3):
            upload, _ = encode_update(
                params, idx[c], values[c], float(c + 1), rng=np.random.default_rng([epoch, c, 9])
            )
            for b in (0, 1):
                fresh[b].add_client(c, upload.public_part, upload.master_seeds[b])
        want = reconstruct(params, fresh[0].share(), fresh[1].share())
        np.testing.assert_array_equal(got.sums, want.sums)
        np.testing.assert_array_equal(got.counts, want.counts)


def test_stale_or_foreign_hints_are_rejected() -> None:
    p0 = SSAParams(
        round_id=1, domain_size=100, num_items=8, value_width=1, hash_key=_key(2), epoch=1
    )
    p1, p2 = replace(p0, round_id=2, epoch=2), replace(p0, round_id=3, epoch=3)
    upload, state = encode_update(p0, np.arange(8), np.ones(8), 1.0)
    s0 = SSAServer(p0, 0)
    s0.add_client(0, upload.public_part, upload.master_seeds[0])
    hint1 = state.next_round(p1, np.ones(8), 1.0)
    hint2 = state.next_round(p2, np.ones(8), 1.0)
    with pytest.raises(SSAInputError):  # epoch-2 hint applied in the epoch-1 round
        SSAServer(p1, 0, s0.keys).add_client_hint(0, hint2)
    with pytest.raises(SSAInputError, match="no stored keys"):
        SSAServer(p1, 0, {}).add_client_hint(0, hint1)
    with pytest.raises(SSAInputError, match="bad hint"):
        SSAServer(p1, 0, s0.keys).add_client_hint(0, hint1[:-3])
    with pytest.raises(ConfigurationError, match="larger epoch"):
        state.next_round(p1, np.ones(8), 1.0)


def _params(**kw):  # type: ignore[no-untyped-def]
    return SSAParams(
        **{
            "round_id": 1,
            "domain_size": 256,
            "num_items": 16,
            "value_width": 2,
            "hash_key": _key(5),
            **kw,
        }
    )


def _corruptions(params: SSAParams, public: bytes):  # type: ignore[no-untyped-def]
    other_tau = encode_update(
        replace(params, count_weighted=False), np.arange(4), np.ones((4, 2)), 1.0
    )[0].public_part
    other_k = encode_update(replace(params, num_items=20), np.arange(4), np.ones((4, 2)), 1.0)[
        0
    ].public_part
    other_key = encode_update(replace(params, hash_key=_key(99)), np.arange(4), np.ones((4, 2)))[
        0
    ].public_part
    public, tail = split_value_trailer(params, public)  # the value check's trailer
    trailer = tail or b""
    parsed = DPFPublicBatch.from_bytes(public)
    levels = int(parsed.cw_bits.shape[0])
    tail = 0 if parsed.cw_proof is None else 8 * parsed.cw_proof.size  # proof words come last
    flipped = bytearray(public)
    if levels % 4:  # control bits are packed 2 per level: the last byte's padding must be 0
        flipped[-1 - tail] |= 0xC0
    else:  # no padding bits: set the reserved control-bit slot of the last seed CW instead
        flipped[-(levels // 4) - 16 - tail] |= 1
    return {
        "truncated": public[:-9],
        "empty": b"",
        "garbage": b"FDPF" + bytes(40),
        "wrong tau": other_tau,
        "wrong number of keys": other_k,
        "wrong bin domains": other_key,
        "bad control bits": bytes(flipped) + trailer,
    }


def test_malformed_client_is_rejected_and_others_stay_exact() -> None:
    params = _params()
    rng = np.random.default_rng(0)
    good = [(rng.choice(256, 16, replace=False), rng.normal(size=(16, 2)), 2.0) for _ in range(3)]
    expected = _run_round(params, good, np.random.default_rng(1))
    bad_public = encode_update(params, np.arange(16), np.ones((16, 2)), 1.0)[0].public_part
    cases = _corruptions(params, bad_public)
    servers = [SSAServer(params, 0), SSAServer(params, 1)]
    rng = np.random.default_rng(1)
    for cid, (idx, vals, w) in enumerate(good):
        upload, _ = encode_update(params, idx, vals, w, rng=rng)
        for b in (0, 1):
            servers[b].add_client(cid, upload.public_part, upload.master_seeds[b])
        if cid == 0:
            before = servers[0].share()
            for name, blob in cases.items():
                with pytest.raises(SSAInputError):
                    servers[0].add_client(100 + len(name), blob, bytes(16))
            with pytest.raises(SSAInputError, match="master seed"):
                servers[0].add_client(99, upload.public_part, b"short")
            with pytest.raises(SSAInputError, match="already"):  # replay in the same round
                servers[0].add_client(0, upload.public_part, upload.master_seeds[0])
            np.testing.assert_array_equal(servers[0].share(), before)
    got = reconstruct(params, servers[0].share(), servers[1].share())
    np.testing.assert_allclose(got.average(), expected.average(), atol=1e-5)


def test_stale_epoch_keys_are_rejected() -> None:
    params = _params()
    upload, _ = encode_update(params, np.arange(4), np.ones((4, 2)))
    with pytest.raises(SSAInputError, match="epoch"):
        SSAServer(replace(params, epoch=1), 0).add_client(0, upload.public_part, bytes(16))


def test_server_view_has_fixed_length_and_is_independent_of_the_index_set() -> None:
    """What S0 receives (public part + master seed) for two index sets of equal size."""
    params = _params(num_items=12, value_width=1)
    set_a, set_b = np.arange(12), np.arange(200, 256, 5)[:12]
    views: dict[str, list[bytes]] = {"a": [], "b": []}
    for trial in range(300):
        for name, idx in (("a", set_a), ("b", set_b)):
            vals = np.full(12, 0.5) if name == "a" else np.full(12, -3.0)
            upload, _ = encode_update(params, idx, vals, 1.0, rng=np.random.default_rng(trial))
            views[name].append(upload.public_part + upload.master_seeds[0])
    lengths = {len(v) for vs in views.values() for v in vs}
    assert len(lengths) == 1
    # Per-byte-position bit frequencies of the two views agree (two-proportion z-test over
    # every bit position). The header, epoch and per-bin domain bytes are public and equal in
    # both views; constant bit positions are skipped below anyway.
    header = 16
    bits = {
        n: np.unpackbits(np.frombuffer(b"".join(v), np.uint8).reshape(len(v), -1), axis=1)
        for n, v in views.items()
    }
    fa, fb = bits["a"][:, header * 8 :].mean(0), bits["b"][:, header * 8 :].mean(0)
    pooled = (fa + fb) / 2
    informative = (pooled > 0.05) & (pooled < 0.95)  # skip structurally constant bits
    z = np.abs(fa - fb)[informative] / np.sqrt(pooled * (1 - pooled) * 2 / 300)[informative]
    # Under independence z is ~N(0,1) per position: no position should be wildly off.
    assert z.size > 1000
    assert np.mean(z > 3.3) < 0.005 and z.max() < 6.0


def test_params_round_trip_and_validation() -> None:
    params = _params(stash_size=2, epoch=3, verify=False)
    assert SSAParams.from_bytes(params.to_bytes()) == params
    for blob in (
        b"{",
        b'{"format": "x"}',
        params.to_bytes().replace(b'"version": 1', b'"version": 2'),
    ):
        with pytest.raises(SSAInputError):
            SSAParams.from_bytes(blob)
    good = params.to_bytes()
    for bad in (
        "text",
        None,
        2**40,  # bytes(2**40) would allocate a terabyte
        good + b" " * (64 * 1024),
        good.replace(b'"round_id": ', b'"round_id": ' + b"1" * 5000),
        good.replace(b'"scale_factor": null', b'"scale_factor": ' + b"[" * 30000),
        good.replace(b"{", b'{"round_id": 7, ', 1),
        good.replace(b'"max_abs": 10000.0', b'"max_abs": NaN'),
    ):
        with pytest.raises(SSAInputError):
            SSAParams.from_bytes(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="num_items"):
        _params(num_items=300)
    with pytest.raises(ConfigurationError):
        _params(domain_size=0)


def test_client_input_errors() -> None:
    params = _params()
    with pytest.raises(ConfigurationError, match="k=16"):
        encode_update(params, np.arange(17), np.ones((17, 2)))
    with pytest.raises(ConfigurationError, match="shape"):
        encode_update(params, np.arange(3), np.ones((3, 3)))
    with pytest.raises(ConfigurationError, match="weights"):
        encode_update(params, np.arange(3), np.ones((3, 2)), 0.0)
    with pytest.raises(ConfigurationError):
        encode_update(params, np.array([1, 1]), np.ones((2, 2)))
    with pytest.raises(FixedPointOverflowError, match="max_abs"):
        encode_update(params, np.arange(2), np.full((2, 2), 1e9))


def test_public_part_shape_matches_cuis_formula() -> None:
    """Bytes per client vs. eps*k*((lambda+2)*bits + l) + lambda with actual per-bin domains."""
    params = _params(num_items=64, value_width=1, domain_size=4096, verify=False)
    upload, _ = encode_update(params, np.arange(64), np.ones(64), 1.0)
    public = DPFPublicBatch.from_bytes(upload.public_part)
    levels = int(public.cw_bits.shape[0])
    words = int(public.cw_leaf.size)
    # Seed CW (16 B) + 2 control bits per level (packed 4 per byte), leaf CW words, a domain
    # byte per key, one shared epoch (8 B); then the 16-byte header and the epoch-mode byte with
    # the zero padding that aligns the domain bytes to 8.
    assert np.all(public.epochs == public.epochs[0])
    payload = levels * 16 + (levels + 3) // 4 + words * 8 + public.num_keys + 8
    assert payload + 16 + 1 <= len(upload.public_part) <= payload + 16 + 8


# ---- hostile weights on the client (issue 8 item 6): no numpy overflow, a clean refusal ------


@pytest.mark.parametrize(
    ("values", "weights"),
    [
        ([[2.0, -3.0]], 1e308),  # a huge num-examples times an ordinary delta
        ([[1e308, 1.0]], 2.0),  # a huge delta times an ordinary weight
        ([[0.5, 0.5], [1.0, 1.0]], [1.0, 1e308]),  # one huge per-element count
        ([[np.inf, 0.0]], 1.0),
        ([[np.nan, 0.0]], 1.0),
        ([[2.0, 0.0]], 600.0),  # finite, just above: 2 * 600 > max_abs
    ],
    ids=["weight-1e308", "value-1e308", "count-1e308", "inf", "nan", "just-above"],
)
def test_out_of_range_payload_is_refused_before_any_overflowing_arithmetic(
    values: list[list[float]], weights: object
) -> None:
    params = _params(max_abs=1e3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning would fail the test here
        with pytest.raises(FixedPointOverflowError) as info:
            payload_words(params, np.array(values), weights)  # type: ignore[arg-type]
        with pytest.raises(FixedPointOverflowError):
            encode_update(params, np.arange(len(values)), np.array(values), weights)  # type: ignore[arg-type]
    # The text names the public bound only, never the client's weight or value.
    assert str(info.value) == "a payload word is NaN, inf or exceeds max_abs=1000.0"


@settings(max_examples=60)
@given(
    st.floats(-1e308, 1e308, allow_nan=False),
    st.floats(min_value=1e-300, max_value=1e308, allow_nan=False),
)
def test_payload_bound_is_exactly_max_abs_and_never_warns(value: float, weight: float) -> None:
    params = _params(max_abs=1e3, frac_bits=16)
    fits = weight <= 1e3 and abs(value) * weight <= 1e3 * (1 - 1e-12)
    clearly_out = weight > 1e3 or abs(value) * weight > 1e3 * (1 + 1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            words = payload_words(params, np.array([[value, 0.0]]), weight)
        except FixedPointOverflowError:
            assert not fits
            return
    assert not clearly_out
    decoded = params.fixed_point.decode(words)
    np.testing.assert_allclose(decoded[0], [value * weight, 0.0, weight], atol=2.0**-15)


# ---- unit weights (issue 20): SSAParams version 4 --------------------------------------------


def test_unit_weight_params_are_version_4_and_weighted_keeps_the_old_bytes() -> None:
    import json

    weighted = _params(epoch=2, verify=False)
    assert json.loads(weighted.to_bytes())["version"] == 1  # byte for byte as before
    unit = replace(weighted, weighted=False)
    raw = json.loads(unit.to_bytes())
    assert raw["version"] == 4 and raw["weighted"] is False
    assert SSAParams.from_bytes(unit.to_bytes()) == unit
    for bad in (
        {**raw, "weighted": True},  # one encoding per parameter set: true is version 1/2
        {**raw, "weighted": 0},
        {k: v for k, v in raw.items() if k != "weighted"},  # version 4 without the flag
        {**raw, "version": 1},  # version 1 has no such field (an old decoder refuses it too)
        {**raw, "version": 3},
    ):
        with pytest.raises(SSAInputError):
            SSAParams.from_bytes(json.dumps(bad).encode())
    with pytest.raises(ConfigurationError, match="weighted"):
        _params(weighted=1)


def test_every_weighting_dp_and_run_combination_has_one_encoding() -> None:
    """Versions 1-3 are weighted rounds (none, dp, dp + run); 4 is unit weights with either."""
    import json

    from flwr_fsl.core.privacy import PrivacyBudget
    from flwr_fsl.families.ssa.dp import DistributedDP, RunScope

    dp = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, max_weight=1.0)
    run = RunScope("7", PrivacyBudget(20.0))
    expected = {
        (True, None, None): 1,
        (True, dp, None): 2,
        (True, dp, run): 3,
        (False, None, None): 4,
        (False, dp, None): 4,
        (False, dp, run): 4,
    }
    for (weighted, dp_, run_), version in expected.items():
        params = _params(weighted=weighted, dp=dp_, run=run_, verify=False)
        raw = json.loads(params.to_bytes())
        assert raw["version"] == version
        assert ("dp" in raw, "run" in raw) == (dp_ is not None, run_ is not None)
        assert SSAParams.from_bytes(params.to_bytes()) == params
    raw = json.loads(_params(weighted=False, dp=dp, run=run, verify=False).to_bytes())
    for bad in (
        {k: v for k, v in raw.items() if k != "dp"},  # a run only with dp, in every version
        {**raw, "version": 3},  # version 3 has no weighted field
        {k: v for k, v in raw.items() if k != "weighted"},
    ):
        with pytest.raises(SSAInputError):
            SSAParams.from_bytes(json.dumps(bad).encode())


def test_unit_weights_put_one_in_every_count_word_whatever_the_weights() -> None:
    params = _params(weighted=False)
    values = np.array([[0.5, -1.0], [2.0, 0.25]])
    for weights in (7.0, np.array([3.0, 40.0])):
        words = payload_words(params, values, weights)
        decoded = params.fixed_point.decode(words)
        np.testing.assert_allclose(decoded[:, 2], [1.0, 1.0])
        np.testing.assert_allclose(decoded[:, :2], values, atol=1e-6)
    # Two clients on one element: the count word says how many, the sum is theirs unweighted.
    servers = [SSAServer(params, b) for b in (0, 1)]
    for cid, (value, weight) in enumerate(((1.0, 5.0), (3.0, 500.0))):
        upload, _ = encode_update(params, [9], [[value, value]], weight)
        for b in (0, 1):
            servers[b].add_client(cid, upload.public_part, upload.master_seeds[b])
    result = reconstruct(params, servers[0].share(), servers[1].share())
    assert result.counts is not None and result.counts[9] == pytest.approx(2.0)
    np.testing.assert_allclose(result.average()[9], [2.0, 2.0], atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(rounds(), st.booleans(), st.booleans(), st.data())
def test_share_read_at_any_time_and_discards_equal_one_scatter_per_client(  # type: ignore[no-untyped-def]
    case, verify: bool, defer: bool, data: st.DataObject
) -> None:
    saved = ssa_protocol.DEFERRED_SCATTER_MAX_BYTES
    ssa_protocol.DEFERRED_SCATTER_MAX_BYTES = (
        saved if defer else 0
    )  # a large round: no deferred sum
    try:
        _share_read_at_any_time(case, verify, data)
    finally:
        ssa_protocol.DEFERRED_SCATTER_MAX_BYTES = saved


def _share_read_at_any_time(case, verify: bool, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    # The server sums clients' evaluated shares in bin order and scatters once per read (issue
    # 26): reading the share between clients, or discarding a client S1 refused, must give
    # exactly what adding each kept client on its own gives.
    params, clients, rng = case
    params = replace(params, verify=verify)
    uploads = [encode_update(params, i, v, w, rng=rng)[0] for i, v, w in clients]
    ref = SSAServer(params, 0)
    kept = data.draw(st.lists(st.booleans(), min_size=len(uploads), max_size=len(uploads)))
    for cid, (upload, keep) in enumerate(zip(uploads, kept, strict=True)):
        if keep:
            solo = SSAServer(params, 0)
            solo.add_client(cid, upload.public_part, upload.master_seeds[0])
            ref._share[: params.domain_size] += solo.share()
    server = SSAServer(params, 0)
    for cid, (upload, keep) in enumerate(zip(uploads, kept, strict=True)):
        server.add_client(cid, upload.public_part, upload.master_seeds[0])
        if data.draw(st.booleans()):
            server.share()  # a read in the middle flushes the pending sum
        if not keep:
            server.discard(cid)
        server.forget_recent()
    np.testing.assert_array_equal(server.share(), ref.share())
    assert server.clients == tuple(c for c, k in enumerate(kept) if k)
