"""Both servers check every client's SSA keys (issue 21, item 4): forgeries are dropped by both.

Each forged client goes through the real two-server path (:class:`LeadServer` with the
in-process S1): S0 evaluates and sends its key-check digest, S1 compares, rejects and returns
nothing for it, S0 takes it back out of its share. The forged client is rejected with a reason,
S1's share holds exactly the accepted clients (else :class:`TwoServerError`), and the honest
clients' aggregate is exact. What is *not* caught (value words) is pinned down too.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flwr_fsl.families.ssa.protocol import (
    SSAInputError,
    SSAParams,
    SSAServer,
    encode_update,
    reconstruct,
)
from flwr_fsl.families.ssa.two_server import LeadServer
from flwr_fsl.families.ssa.verify import same_digest
from tests.families.ssa import forge
from tests.families.ssa.test_two_server import assert_matches, fresh_uploads
from tests.helper.test_helper import WIDTH, K, M, bind, make_clients, make_params, twin


def unit_params(round_id: int = 1, **kw: object) -> SSAParams:
    return make_params(round_id, **{"weighted": False, "epoch": 0, "verify": True, **kw})


def _forgery(params: SSAParams, name: str) -> tuple[forge.Plan, forge.Tamper | None]:
    rng = np.random.default_rng(7)
    plan = forge.honest_plan(params, rng.choice(M, K, replace=False), np.full((K, WIDTH), 0.5))
    real, col, one = forge.real_key(plan), forge.count_column(params), forge.one(params)
    tamper = None
    if name == "two points in a bin":
        tamper = forge.flip_last_level(real)
    elif name.startswith("count "):
        plan.betas[real, col] = {
            "count 2": 2 * one,
            "count 0": np.uint64(0),
            "count 2**63": np.uint64(1 << 63),
            "count -3 (erase an honest client)": np.uint64((-3 * int(one)) % (1 << 64)),
        }[name]
    elif name == "value in a dummy bin at a real slot":
        dummy = forge.dummy_key(plan, params)
        plan.alphas[dummy] = 0  # the bin's first element, count 0: a value without a count
        plan.betas[dummy] = 0
        plan.betas[dummy, 0] = one * np.uint64(80)
    elif name == "stash key with two points":
        tamper = forge.flip_last_level(params.num_keys - 1)
    elif name == "tampered proof word":
        tamper = forge.flip_proof(real)
    else:  # pragma: no cover - test table typo
        raise AssertionError(name)
    return plan, tamper


FORGERIES = [
    "two points in a bin",
    "count 2",
    "count 0",
    "count 2**63",
    "count -3 (erase an honest client)",
    "value in a dummy bin at a real slot",
    "stash key with two points",
    "tampered proof word",
]


@pytest.mark.parametrize("name", FORGERIES)
def test_forged_keys_are_dropped_by_both_servers_and_the_rest_is_exact(name: str) -> None:
    params = unit_params(stash_size=1 if "stash" in name else 0)
    lead = LeadServer(twin(), min_clients=1)
    pub = lead.helper_key()
    honest = make_clients(3)
    for c in honest:
        c.weight = 1.0  # unit weights: every chosen element counts 1
    uploads = fresh_uploads(params, honest, pub)
    plan, tamper = _forgery(params, name)
    bad = 99
    uploads[bad], _ = forge.forged_upload(params, plan, bad, pub, bind(params), tamper)
    lead.check_upload(params, bad, uploads[bad], accept_hints=False)  # well-formed keys
    outcome = lead.aggregate(params, uploads)  # S1's share must list exactly the accepted
    assert list(outcome.rejected) == [bad]
    assert "key check failed" in outcome.rejected[bad]
    assert outcome.accepted == [c.cid for c in honest]
    assert_matches(params, outcome.result, honest)


@pytest.mark.parametrize("name", FORGERIES)
def test_each_server_alone_sees_its_digest_differ(name: str) -> None:
    params = unit_params(stash_size=1 if "stash" in name else 0)
    plan, tamper = _forgery(params, name)
    upload, public = forge.forged_upload(params, plan, 5, twin().public_key(), bind(params), tamper)
    s0, s1 = SSAServer(params, 0), SSAServer(params, 1)
    digest0 = s0.add_client(5, public, upload.master_seed)
    with pytest.raises(SSAInputError, match="key check failed"):
        s1.add_client(5, public, _s1_seed(plan, params, tamper), expect=digest0)
    assert s1.num_clients == 0 and not s1.share().any()  # nothing added


def _s1_seed(plan: forge.Plan, params: SSAParams, tamper: forge.Tamper | None) -> bytes:
    """S1's master seed of :func:`forge.forged_upload` with seed 0 (the same draw)."""
    rng = np.random.default_rng(0)
    rng.bytes(16)
    return rng.bytes(16)


def test_a_huge_value_with_count_one_is_caught_by_the_range_check() -> None:
    """Issue 21's -1.1e9 forgery: value words are range-checked (range_check module)."""
    params = unit_params(value_check="exact")
    lead = LeadServer(twin(), min_clients=1)
    pub = lead.helper_key()
    honest = make_clients(2)
    for c in honest:
        c.weight = 1.0
    uploads = fresh_uploads(params, honest, pub)
    target = int(honest[0].idx[0])
    plan = forge.honest_plan(params, np.array([target]), np.zeros((1, WIDTH)))
    real = forge.real_key(plan)
    # -1.1e9 in the ring: far outside max_abs=1e3; the forger's trailer claims it clipped.
    plan.betas[real, 0] = np.uint64((-int(1.1e9 * 2**params.frac_bits)) % (1 << 64))
    uploads[77], _ = forge.forged_upload(params, plan, 77, pub, bind(params))
    outcome = lead.aggregate(params, uploads)
    assert 77 in outcome.rejected and 77 not in outcome.accepted
    assert outcome.result.counts is not None
    exact = sum(c.values[list(c.idx).index(target)] for c in honest if target in c.idx)
    np.testing.assert_allclose(outcome.result.sums[target], exact, atol=1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    m=st.integers(2, 300),
    k=st.integers(1, 12),
    width=st.integers(1, 4),
    stash=st.integers(0, 2),
    weighted=st.booleans(),
    count=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_honest_keys_always_pass_and_aggregate_exactly(
    m: int, k: int, width: int, stash: int, weighted: bool, count: bool, seed: int
) -> None:
    k = min(k, m)
    params = SSAParams(
        round_id=1,
        domain_size=m,
        num_items=k,
        value_width=width,
        hash_key=seed.to_bytes(16, "little"),
        stash_size=stash,
        count_weighted=count,
        weighted=weighted or not count,
        epoch=1,
    )
    rng = np.random.default_rng(seed)
    servers = [SSAServer(params, b) for b in (0, 1)]
    sums = np.zeros((m, width))
    states = []
    for cid in range(2):
        idx = rng.choice(m, rng.integers(0, k + 1), replace=False)
        vals = rng.uniform(-1, 1, (idx.size, width))
        upload, state = encode_update(params, idx, vals, 2.0, rng=rng)
        d0 = servers[0].add_client(cid, upload.public_part, upload.master_seeds[0])
        d1 = servers[1].add_client(cid, upload.public_part, upload.master_seeds[1], d0)
        assert same_digest(d0, d1)
        sums[idx] += vals * (2.0 if params.weighted and count else 1.0)
        states.append((idx, state))
    result = reconstruct(params, servers[0].share(), servers[1].share())
    np.testing.assert_allclose(result.sums, sums, atol=1e-5)
    # U-DPF: the updated keys (same leaf seeds, new leaf words) pass again.
    nxt = replace(params, round_id=2, epoch=2)
    servers2 = [
        SSAServer(nxt, b, previous_keys={i: s.keys[b] for i, (_, s) in enumerate(states)})
        for b in (0, 1)
    ]
    for cid, (idx, state) in enumerate(states):
        hint = state.next_round(nxt, rng.uniform(-1, 1, (idx.size, width)), 1.0)
        d0 = servers2[0].add_client_hint(cid, hint)
        assert same_digest(d0, servers2[1].add_client_hint(cid, hint, d0))


def test_verify_false_is_the_unchecked_round_and_old_params_mean_it() -> None:
    import json

    checked = unit_params(value_check="off")  # version 5: keys checked, value words not
    raw = json.loads(checked.to_bytes())
    assert raw["version"] == 5 and raw["verify"] is True
    assert SSAParams.from_bytes(checked.to_bytes()) == checked
    plain = replace(checked, verify=False)
    assert (
        json.loads(plain.to_bytes())["version"] == 4
        and not SSAParams.from_bytes(plain.to_bytes()).verify
    )
    for bad in ({**raw, "verify": False}, {**raw, "version": 4}):
        with pytest.raises(SSAInputError):
            SSAParams.from_bytes(json.dumps(bad).encode())
    # Keys of the other kind do not fit a round.
    upload, _ = encode_update(plain, np.arange(3), np.ones((3, WIDTH)))
    with pytest.raises(SSAInputError, match="the round needs"):
        SSAServer(checked, 0).add_client(1, upload.public_part, upload.master_seeds[0])


def test_s1_refuses_unchecked_uploads_in_a_checked_round_and_vice_versa() -> None:
    from flwr_fsl.helper import HelperRequestError

    helper = twin()
    checked, unchecked = unit_params(1), unit_params(2, verify=False)
    honest = make_clients(1)
    for params in (checked, unchecked):
        helper.open_round(params.round_id, params.to_bytes())
    upload = fresh_uploads(checked, honest, helper.public_key())[honest[0].cid]
    with pytest.raises(HelperRequestError, match="checks every client's keys"):
        helper.add_clients(1, [(honest[0].cid, upload.public_part, upload.sealed)])
    with pytest.raises(HelperRequestError, match="does not check keys"):
        helper.add_checked(2, [(honest[0].cid, b"", b"", bytes(32))], hints=False)
