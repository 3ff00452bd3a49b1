"""The projected value check (flwr_fsl.families.ssa.projected_check): the default of checked rounds.

Honest clients reconstruct exactly with it on; a word beyond ``2T`` passes a projection with
probability at most 1/2 (measured over many salts at a small ``r``); every malformed trailer is
a clean :class:`SSAInputError` that drops only that client; parameter versions 5 to 7 decode.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError
from flwr_fsl.families.ssa import projected_check as pc
from flwr_fsl.families.ssa.dp import DistributedDP
from flwr_fsl.families.ssa.messages import DEFAULT_PROJECTIONS, VALUE_CHECKS
from flwr_fsl.families.ssa.protocol import (
    SSAInputError,
    SSAParams,
    SSAServer,
    SSAUpload,
    encode_update,
    reconstruct,
)


def _params(**kw: object) -> SSAParams:
    base: dict[str, object] = dict(
        round_id=1, domain_size=256, num_items=12, value_width=2, hash_key=bytes(range(16))
    )
    base.update(kw)
    base.setdefault("weighted", False)
    return SSAParams(**base)  # type: ignore[arg-type]


def _aggregate(params: SSAParams, uploads: dict[int, SSAUpload]) -> tuple[object, set[int]]:
    """Both servers: S0 adds (or refuses), S1 checks against S0's digest; a failure drops."""
    s0, s1 = SSAServer(params, 0), SSAServer(params, 1)
    dropped: set[int] = set()
    for cid, up in uploads.items():
        try:
            digest = s0.add_client(cid, up.public_part, up.master_seeds[0])
        except SSAInputError:
            dropped.add(cid)
            continue
        try:
            s1.add_client(cid, up.public_part, up.master_seeds[1], digest)
        except SSAInputError:
            s0.discard(cid)
            dropped.add(cid)
    return reconstruct(params, s0.share(), s1.share()), dropped


def _honest(params: SSAParams, n: int, seed: int = 0) -> tuple[dict[int, SSAUpload], np.ndarray]:
    rng = np.random.default_rng(seed)
    sums = np.zeros((params.domain_size, params.value_width))
    uploads = {}
    for cid in range(n):
        idx = rng.choice(params.domain_size, params.num_items, replace=False)
        vals = rng.uniform(-1, 1, size=(params.num_items, params.value_width))
        sums[idx] += vals
        uploads[cid] = encode_update(params, idx, vals, 1.0, rng=rng)[0]
    return uploads, sums


def test_projected_is_the_default_of_checked_rounds() -> None:
    params = _params()
    assert params.value_check_mode == "projected" and params.projections == DEFAULT_PROJECTIONS
    assert replace(params, verify=False).value_check_mode == "off"  # unchecked rounds: no check
    with pytest.raises(ConfigurationError, match="value_check"):
        _params(value_check="sometimes")
    with pytest.raises(ConfigurationError, match="verify"):
        _params(value_check="exact", verify=False)
    with pytest.raises(ConfigurationError, match="projections"):
        _params(projections=0)


def test_turning_verify_on_turns_the_default_value_check_on() -> None:
    """The default check resolves where it is read: replace(verify=True) checks the words.

    Before, SSAParams(verify=False) stored value_check="off" and dataclasses.replace carried it
    into the checked round, which then ran with value words unchecked, silently.
    """
    unchecked = _params(verify=False)
    assert unchecked.value_check is None and unchecked.value_check_mode == "off"
    checked = replace(unchecked, verify=True)
    assert checked.value_check_mode == "projected" and checked == _params()
    assert json.loads(checked.to_bytes())["version"] == 8  # digest version 2, the default
    # r asked of an unchecked round is kept for its checked variant ...
    r8 = replace(_params(verify=False, projections=8), verify=True)
    assert r8.value_check_mode == "projected" and r8.projections == 8
    # ... and an explicit choice survives replace; a check an unchecked round cannot run is refused
    assert replace(_params(value_check="off"), max_abs=2.0).value_check_mode == "off"
    assert _params(value_check="projected") == _params()  # one representation per round
    assert _params(verify=False, value_check="off") == _params(verify=False)
    assert replace(_params(value_check="projected"), verify=False).value_check_mode == "off"
    with pytest.raises(ConfigurationError, match="value_check='exact' needs verify"):
        replace(_params(value_check="exact"), verify=False)
    # "projected" is the default: no check in an unchecked round, the check once it is checked
    asked = _params(verify=False, value_check="projected")
    assert asked == _params(verify=False) and asked.value_check_mode == "off"
    assert replace(asked, verify=True).value_check_mode == "projected"


def test_library_code_reads_the_resolved_value_check() -> None:
    """``params.value_check`` is None in a default round: readers use ``value_check_mode``."""
    import re
    from pathlib import Path

    import flwr_fsl

    raw_read = re.compile(r"\bparams\.value_check\b(?!_)")
    readers = [
        f"{path}:{number}"
        for path in Path(flwr_fsl.__file__).parent.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if raw_read.search(line)
    ]
    assert readers == []


def test_psr_queries_are_unchecked_whatever_the_round_checks() -> None:
    """A retrieval query of an exact-check round (before: ConfigurationError) is unchecked."""
    from flwr_fsl.families.ssa.psr import query_params

    for check in VALUE_CHECKS:
        query = query_params(_params(value_check=check))
        assert not query.verify and query.value_check_mode == "off"


def test_parameter_versions_decode_to_the_right_check() -> None:
    projected = _params(projected_digest=1)  # version 7 (the default round's is 8: digest 2)
    raw = json.loads(projected.to_bytes())
    assert raw["version"] == 7 and raw["value_check"] == "projected" and raw["projections"] == 64
    assert SSAParams.from_bytes(projected.to_bytes()) == projected
    assert json.loads(_params().to_bytes())["version"] == 8
    assert SSAParams.from_bytes(_params().to_bytes()) == _params()
    exact = _params(value_check="exact")
    assert json.loads(exact.to_bytes())["version"] == 6
    assert SSAParams.from_bytes(exact.to_bytes()).value_check_mode == "exact"
    off = _params(value_check="off")
    assert json.loads(off.to_bytes())["version"] == 5
    assert SSAParams.from_bytes(off.to_bytes()).value_check_mode == "off"
    assert SSAParams.from_bytes(_params(verify=False).to_bytes()).value_check_mode == "off"
    r8 = _params(projections=8)
    assert SSAParams.from_bytes(r8.to_bytes()).projections == 8
    for bad in (
        {**raw, "value_check": "exact"},
        {**raw, "value_check": 1},
        {**raw, "projections": "64"},
        {k: v for k, v in raw.items() if k != "projections"},
        {**raw, "version": 6},
        {**raw, "range_check": True},
    ):
        with pytest.raises(SSAInputError):
            SSAParams.from_bytes(json.dumps(bad, sort_keys=True).encode())


def test_honest_clients_are_exact_and_the_trailer_is_small() -> None:
    params = _params()
    uploads, sums = _honest(params, 3)
    result, dropped = _aggregate(params, uploads)
    assert not dropped
    np.testing.assert_allclose(result.sums, sums, atol=3 * 2.0**-params.frac_bits)  # type: ignore[attr-defined]
    off = encode_update(replace(params, value_check="off"), np.arange(12), np.ones((12, 2)))[0]
    extra = len(uploads[0].public_part) - len(off.public_part)
    assert extra == pc.trailer_bytes(params)
    exact = encode_update(replace(params, value_check="exact"), np.arange(12), np.ones((12, 2)))
    assert extra < len(exact[0].public_part) - len(off.public_part)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(8, 400),
    k=st.integers(1, 8),
    width=st.integers(1, 4),
    max_abs=st.sampled_from([1.0, 10.0, 1e4]),
    frac_bits=st.sampled_from([8, 16, 24]),
    r=st.integers(1, 80),
    seed=st.integers(0, 2**16),
)
def test_honest_rounds_reconstruct_over_shapes(
    m: int, k: int, width: int, max_abs: float, frac_bits: int, r: int, seed: int
) -> None:
    params = _params(
        domain_size=m,
        num_items=min(k, m),
        value_width=width,
        max_abs=max_abs,
        frac_bits=frac_bits,
        projections=r,
    )
    rng = np.random.default_rng(seed)
    sums = np.zeros((m, width))
    uploads = {}
    for cid in range(2):
        idx = rng.choice(m, params.num_items, replace=False)
        vals = rng.uniform(-max_abs, max_abs, size=(params.num_items, width))
        sums[idx] += vals
        uploads[cid] = encode_update(params, idx, vals, 1.0, rng=rng)[0]
    result, dropped = _aggregate(params, uploads)
    assert not dropped
    np.testing.assert_allclose(result.sums, sums, atol=2 * 2.0**-frac_bits)  # type: ignore[attr-defined]


def _pass_rate(params: SSAParams, words: np.ndarray, trials: int) -> float:
    """Fraction of salts (random seeds) whose ``r`` projections of ``words`` all lie in [-T, T]."""
    bound = params.projection_bound
    rng = np.random.default_rng(1)
    passed = 0
    for _ in range(trials):
        y = pc.project(rng.bytes(16), params.projections, words).view(np.int64)
        passed += int(np.abs(y).max() <= bound)
    return passed / trials


@pytest.mark.parametrize("where", ["2T+1", "-(2T+1)", "2^62", "2^63", "2^63+1", "-2^63+2T+1"])
def test_a_word_beyond_2t_passes_at_most_2_to_the_minus_r(where: str) -> None:
    """r = 8: over 4000 salts the pass rate stays within 2^-8 plus five standard deviations."""
    params = _params(projections=8)
    t = params.projection_bound
    bad = {
        "2T+1": 2 * t + 1,
        "-(2T+1)": -(2 * t + 1),
        "2^62": 1 << 62,
        "2^63": 1 << 63,
        "2^63+1": (1 << 63) + 1,
        "-2^63+2T+1": -(1 << 63) + 2 * t + 1,  # 2a is small mod 2^64: rest +- a both may pass
    }[where]
    rng = np.random.default_rng(0)
    bound = params.value_bound
    words = rng.integers(-bound, bound, size=params.num_keys * params.value_width)
    words[:] = words // 64  # honest-looking others
    words = words.astype(np.int64).view(np.uint64)
    words[3] = np.uint64(bad % (1 << 64))
    trials, p = 4000, 2.0**-8
    rate = _pass_rate(params, words, trials)
    assert rate <= p + 5 * np.sqrt(p * (1 - p) / trials)


def test_a_lone_word_at_t_always_passes_and_just_above_t_almost_never() -> None:
    """Inside: |y| <= T whatever z. A lone word T + 1 passes only when all its z are 0 (2^-r)."""
    params = _params(projections=8)
    t = params.projection_bound
    words = np.zeros(params.num_keys * params.value_width, np.uint64)
    words[5] = np.uint64(t)
    assert _pass_rate(params, words, 300) == 1.0
    words[5] = np.uint64(t + 1)
    assert _pass_rate(params, words, 2000) <= 2.0**-8 + 5 * np.sqrt(2.0**-8 / 2000)


def test_honest_projections_pass_far_more_often_than_the_bound_says() -> None:
    """Full-norm honest words (every word at the bound): no salt fails in 500 tries at r = 64."""
    params = _params()
    words = np.full(params.num_items * params.value_width, params.value_bound, np.int64)
    words[::2] *= -1
    padded = np.zeros(params.num_keys * params.value_width, np.int64)
    padded[: words.size] = words
    assert _pass_rate(params, padded.view(np.uint64), 500) == 1.0
    assert pc.honest_failure_bound(64) < 2e-5


def test_l2_bound_is_tighter_with_dp_clipping() -> None:
    plain = _params()
    dp = _params(dp=DistributedDP(1.0, 1.0, 1.0, 1e-5))
    assert plain.value_l2_bound >= np.sqrt(12 * 2) * plain.value_bound
    assert dp.value_l2_bound <= 2**24 + 10  # C * 2^f plus rounding
    assert dp.projection_bound == 4 * dp.value_l2_bound
    assert pc.l2_statement(plain)


def test_a_client_far_beyond_the_l2_bound_cannot_make_a_trailer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only a client that skips clipping gets here: encode refuses rather than loop."""
    import flwr_fsl.families.ssa.protocol as ssa

    params = _params(dp=DistributedDP(1.0, 1.0, 1.0, 1e-5), max_abs=1e4)
    words = params.fixed_point.encode(np.array([[5e3, 5e3, 1.0]] * 12))
    monkeypatch.setattr(ssa, "payload_words", lambda *_a, **_k: words)
    with pytest.raises(ConfigurationError, match="L2 bound"):
        encode_update(params, np.arange(12), np.ones((12, 2)))


def _cases(params: SSAParams, public: bytes) -> dict[str, bytes]:
    size = pc.trailer_bytes(params)
    head = len(public) - size

    def flip(offset: int) -> bytes:
        out = bytearray(public)
        out[head + offset] ^= 1
        return bytes(out)

    return {
        "truncated by one": public[:-1],
        "truncated below a trailer": public[: size - 1],
        "oversized by one": public + b"\x00",
        "without a trailer": public[:head],
        "salt": flip(0),
        "part_a": flip(16),
        "part_b": flip(48),
        "S0's encrypted share": flip(80),
        "S0's proof share": flip(size - 64 - 8),
        "part0": flip(size - 64),
        "part1": flip(size - 1),
    }


@pytest.mark.parametrize("epoch", [0, 1], ids=["fresh", "udpf-epoch"])
def test_every_malformed_trailer_drops_only_that_client(epoch: int) -> None:
    params = _params(epoch=epoch)
    uploads, sums = _honest(params, 2)
    victim = encode_update(params, np.arange(12), np.full((12, 2), 0.5))[0]
    for name, blob in _cases(params, victim.public_part).items():
        tampered = dict(uploads)
        tampered[9] = SSAUpload(blob, victim.master_seeds)
        result, dropped = _aggregate(params, tampered)
        assert dropped == {9}, name
        np.testing.assert_allclose(result.sums, sums, atol=3 * 2.0**-params.frac_bits)  # type: ignore[attr-defined]


def test_server_check_refuses_a_wrong_size_trailer_cleanly() -> None:
    params = _params()
    up = encode_update(params, np.arange(12), np.ones((12, 2)))[0]
    _, trailer = pc.split_trailer(params, up.public_part)
    with pytest.raises(ClientInputError):
        pc.server_projected(params, None, np.zeros((1, 2), np.uint64), trailer[:-1], None, 32)  # type: ignore[arg-type]


@pytest.mark.parametrize("digest", [1, 2])
def test_a_udpf_hint_carries_the_projected_check(digest: int) -> None:
    first = _params(epoch=1, projected_digest=digest)
    upload, state = encode_update(first, np.arange(12), np.full((12, 2), 0.25))
    servers = [SSAServer(first, b) for b in (0, 1)]
    digest = servers[0].add_client(1, upload.public_part, upload.master_seeds[0])
    servers[1].add_client(1, upload.public_part, upload.master_seeds[1], digest)
    nxt = replace(first, round_id=2, epoch=2)
    hint = state.next_round(nxt, np.full((12, 2), -0.5), 1.0)
    s0, s1 = (SSAServer(nxt, b, previous_keys={1: servers[b].keys[1]}) for b in (0, 1))
    s1.add_client_hint(1, hint, s0.add_client_hint(1, hint))
    got = reconstruct(nxt, s0.share(), s1.share())
    np.testing.assert_allclose(got.sums[:12], -0.5, atol=2.0**-20)


def test_s1s_floor_orders_the_checks_and_counts_projections() -> None:
    from flwr_fsl.helper.errors import HelperRequestError
    from flwr_fsl.helper.limits import HelperLimits

    floors = {f: HelperLimits(min_value_check=f) for f in ("off", "projected", "exact")}
    rounds = {
        "unchecked": _params(verify=False),
        "off": _params(value_check="off"),
        "projected": _params(),
        "exact": _params(value_check="exact"),
    }
    allowed = {
        "off": set(rounds),
        "projected": {"projected", "exact"},
        "exact": {"exact"},
    }
    for floor, limits in floors.items():
        for name, params in rounds.items():
            if name in allowed[floor]:
                limits.check_value_check(params)
            else:
                with pytest.raises(HelperRequestError, match="--min-value-check"):
                    limits.check_value_check(params)
    with pytest.raises(HelperRequestError, match="projections"):
        floors["projected"].check_value_check(_params(projections=63))
    with pytest.raises(ConfigurationError, match="min_value_check"):
        HelperLimits(min_value_check="most")


def test_the_strategies_settings_default_to_the_projected_check() -> None:
    """Every strategy (top-k, rows, index mode, mixed tables) builds its rounds from these."""
    from flwr_fsl.families.ssa.aggregation_strategy import SSASettings

    shape = dict(round_id=1, domain_size=64, num_items=4, value_width=2, hash_key=bytes(16))
    assert SSASettings().params(**shape).value_check_mode == "projected"
    assert SSASettings(value_check="exact").params(**shape).value_check_mode == "exact"
    with pytest.raises(ConfigurationError, match="value_check"):
        SSASettings(value_check=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("party", [0, 1])
def test_a_prepared_check_gives_the_same_blob_and_the_same_refusals(party: int) -> None:
    """The servers run :func:`prepare_projected` on their pool beside the evaluation: the
    check blob is the one :func:`server_projected` computes alone, and every malformed trailer
    is refused by the preparation with the error :func:`server_projected` raises."""
    from flwr_fsl.families.ssa.server_eval import ClientKeys

    params = _params()
    up = encode_update(params, np.arange(12), np.full((12, 2), 0.5))[0]
    item = ClientKeys(3, up.public_part, up.master_seeds[party])
    own = SSAServer(params, party).prepare(item)
    assert own.trailer is not None
    sums = np.random.default_rng(party).integers(0, 2**63, (params.num_keys, 2), dtype=np.uint64)
    expect = bytes(range(64)) + bytes(range(100, 116))  # the other's check: fixes the query seed
    args = (params, own.keys, own.trailer, expect, 32)
    prepared = pc.prepare_projected(*args)
    blob = pc.server_projected(params, own.keys, sums, own.trailer, expect, 32)
    assert pc.server_projected(*args[:2], sums, *args[2:], prepared=prepared) == blob
    size, refused = pc.trailer_bytes(params), 0
    for name, public in _cases(params, up.public_part).items():
        trailer = public[-size:] if len(public) >= size else public
        refusals = []
        for run in (
            lambda t=trailer: pc.prepare_projected(params, own.keys, t, expect, 32),
            lambda t=trailer: pc.server_projected(params, own.keys, sums, t, expect, 32),
        ):
            try:
                run()
                refusals.append("")
            except SSAInputError as err:
                refusals.append(str(err))
        assert refusals[0] == refusals[1], name
        refused += bool(refusals[0])
    assert refused >= 5  # the sizes, and this server's part
    with pytest.raises(SSAInputError, match="malformed"):
        pc.prepare_projected(params, own.keys, own.trailer, expect[:40], 32)
