"""Issue 21's malicious client against a real ``flwr-fsl-helper`` process: forged SSA keys.

The issue's two tries: a client that builds its own DPF keys made an element's average 80.00
and -1.1e9 against an honest 0.01, and neither server noticed. Here S0 is the real
:class:`~flwr_fsl.families.ssa.two_server.LeadServer` and S1 a real helper process over gRPC,
at default settings (``SSAParams.verify`` True, unit weights, ``value_check="projected"``, and
S1's default ``--min-value-check projected``) and with the exact value check
(``value_check="exact"``). Per try, the element's average with the forger in the round, and
whether the forger was dropped:

* average 80.00 by a value with count word 0 (the forger adds 79.99 to the sum and nothing
  to the count, so the element still looks like one client's): **caught** by both servers, the
  average stays the honest 0.01;
* a count word of 2**63, and two points in one key: **caught**;
* average -1.1e9 with the count word exactly 1: **caught at the defaults**
  (:mod:`flwr_fsl.families.ssa.projected_check`: the word is far beyond ``2T``, so each
  projection passes with probability at most 1/2, all 64 with at most 2^-64) and with
  ``value_check="exact"``; the average stays 0.01;
* a value word exactly at the bound (``max_abs``): **accepted** with either check — any client
  may choose any ``w`` within it; with the projected check a lone word at the projected
  bound ``T`` (8x ``max_abs`` here: ``T = 4 sqrt(k w) max_abs``, ``k = 4``) is **accepted**
  too: that is the projected check's documented slack (every word within ``2T``, and a word
  in ``(T, 2T]`` passes only when the other words' projections offset it);
* S1 insists: the default helper **refuses** rounds with ``value_check="off"`` and unchecked
  rounds (``verify=False``), naming ``--min-value-check``; a helper started with
  ``--min-value-check exact`` refuses projected rounds;
* the default helper **refuses** a projected round with fewer than 64 projections, naming
  ``--min-projections``; one started with ``--min-projections 32`` runs such a round and still
  catches the -1.1e9 try (each projection halves the forger's chance: 2^-32 here);
* with a helper started with ``--min-value-check off`` (a documented, non-default option),
  ``value_check="off"`` lets the -1.1e9 try through and ``verify=False`` the 80.00 try.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.sealing import RoundBinding
from flwr_fsl.families.ssa.protocol import SSAParams, encode_update
from flwr_fsl.families.ssa.sealing import seal_ssa_upload
from flwr_fsl.families.ssa.two_server import ClientUpload, LeadServer
from flwr_fsl.helper import HelperRequestError
from flwr_fsl.testing.helper_process import HelperProcess
from tests.families.ssa import forge
from tests.helper.test_helper import signer_of

TARGET, HONEST = 5, 0.01


def _start(tmp_path_factory, *flags: str):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("forged")
    key_file = folder / "s1.pem"
    SealingKeyPair.generate().save(key_file)
    args = ["--min-clients", "1", *flags]
    return HelperProcess(key_file, folder / "helper.log", extra_args=args)


@pytest.fixture(scope="module")
def helper(tmp_path_factory):  # type: ignore[no-untyped-def]
    proc = _start(tmp_path_factory)  # S1's defaults: --min-value-check projected
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def lax_helper(tmp_path_factory):  # type: ignore[no-untyped-def]
    proc = _start(tmp_path_factory, "--min-value-check", "off")
    try:
        yield proc
    finally:
        proc.stop()


def _params(
    round_id: int, verify: bool = True, value_check: str = "projected", projections: int = 64
) -> SSAParams:
    return SSAParams(
        round_id=round_id,
        domain_size=64,
        num_items=4,
        value_width=1,
        hash_key=bytes(range(16)),
        weighted=False,  # the strategies' default: unit weights
        verify=verify,
        value_check=value_check,
        projections=projections,
    )


def _honest(params: SSAParams, lead: LeadServer, cid: int) -> ClientUpload:
    upload, _ = encode_update(params, [TARGET, 20 + cid], [[HONEST], [0.5]])
    binding = RoundBinding.of(lead.session_id, params.round_id, params.to_bytes())
    sealed = seal_ssa_upload(
        lead.helper_key(),
        binding=binding,
        client_id=cid,
        public_part=upload.public_part,
        master_seed=upload.master_seeds[1],
        signer=signer_of(cid),
    )
    return ClientUpload(upload.public_part, upload.master_seeds[0], sealed)


def _forged(params: SSAParams, lead: LeadServer, attempt: str) -> ClientUpload:
    plan = forge.honest_plan(params, np.array([TARGET]), np.zeros((1, 1)))
    real, col, one = forge.real_key(plan), forge.count_column(params), forge.one(params)
    frac = 2**params.frac_bits
    tamper = None
    if attempt == "average 80.00 (value, count 0)":
        plan.betas[real, 0] = np.uint64(round((80.0 - HONEST) * frac))
        plan.betas[real, col] = 0
    elif attempt == "count 2**63":
        plan.betas[real, col] = np.uint64(1 << 63)
    elif attempt == "two points in a key":
        tamper = forge.flip_last_level(real)
    elif attempt == "value at the bound (count 1)":
        plan.betas[real, 0] = np.uint64(round(params.max_abs * frac))
        plan.betas[real, col] = one
    elif attempt == "value at the projected bound T (count 1)":
        plan.betas[real, 0] = np.uint64(params.projection_bound)
        plan.betas[real, col] = one
    elif attempt == "average -1.1e9 (value, count 1)":
        # sums: 0.01 + v over counts 2 -> v = 2 * (-1.1e9) - 0.01 (far outside max_abs)
        plan.betas[real, 0] = np.uint64(round((-2.2e9 - HONEST) * frac) % (1 << 64))
        plan.betas[real, col] = one
    binding = RoundBinding.of(lead.session_id, params.round_id, params.to_bytes())
    upload, _ = forge.forged_upload(params, plan, 666, lead.helper_key(), binding, tamper)
    return upload


def _round(helper: HelperProcess, params: SSAParams, attempt: str) -> tuple[float, dict]:
    client = helper.client(timeout=120)
    try:
        lead = LeadServer(client, helper_fingerprint=helper.fingerprint, min_clients=1)
        lead.open(params)
        uploads = {1: _honest(params, lead, 1), 666: _forged(params, lead, attempt)}
        outcome = lead.aggregate(params, uploads)
        return float(outcome.result.average()[TARGET, 0]), outcome.rejected
    finally:
        client.close()


CAUGHT = [
    "average 80.00 (value, count 0)",
    "count 2**63",
    "two points in a key",
]


@pytest.mark.parametrize("check", ["projected", "exact"], ids=["defaults", "exact"])
@pytest.mark.parametrize("attempt", CAUGHT)
def test_forged_keys_are_caught_by_both_servers(helper, attempt: str, check: str) -> None:  # type: ignore[no-untyped-def]
    params = _params(10 + CAUGHT.index(attempt) + 10 * (check == "exact"), value_check=check)
    average, rejected = _round(helper, params, attempt)
    assert list(rejected) == [666] and "key check failed" in rejected[666]
    assert average == pytest.approx(HONEST, abs=1e-6)  # the honest client's update, exactly


@pytest.mark.parametrize("check", ["projected", "exact"], ids=["defaults", "exact"])
def test_a_huge_value_with_count_one_is_caught(helper, check: str) -> None:  # type: ignore[no-untyped-def]
    params = _params(40 + (check == "exact"), value_check=check)
    average, rejected = _round(helper, params, "average -1.1e9 (value, count 1)")
    assert list(rejected) == [666] and "key check failed" in rejected[666]
    assert average == pytest.approx(HONEST, abs=1e-6)


@pytest.mark.parametrize("check", ["projected", "exact"], ids=["defaults", "exact"])
def test_a_value_word_at_the_bound_is_accepted(helper, check: str) -> None:  # type: ignore[no-untyped-def]
    params = _params(20 + (check == "exact"), value_check=check)
    average, rejected = _round(helper, params, "value at the bound (count 1)")
    assert rejected == {}
    assert average == pytest.approx((HONEST + params.max_abs) / 2, rel=1e-9)


def test_the_projected_checks_slack_a_lone_word_at_t_is_accepted(helper) -> None:  # type: ignore[no-untyped-def]
    params = _params(25)
    t = params.projection_bound / 2**params.frac_bits
    assert t > 7 * params.max_abs  # T = 4 sqrt(k w) max_abs (+ a unit): 8x max_abs at k = 4
    average, rejected = _round(helper, params, "value at the projected bound T (count 1)")
    assert rejected == {}
    assert average == pytest.approx((HONEST + t) / 2, rel=1e-9)


@pytest.mark.parametrize("weaker", ["off", "unchecked"])
def test_s1_refuses_rounds_that_check_less_than_its_floor(helper, weaker: str) -> None:  # type: ignore[no-untyped-def]
    params = _params(50) if weaker == "unchecked" else _params(51, value_check="off")
    if weaker == "unchecked":
        params = replace(params, verify=False)
    client = helper.client(timeout=120)
    try:
        lead = LeadServer(client, helper_fingerprint=helper.fingerprint, min_clients=1)
        with pytest.raises(HelperRequestError, match="--min-value-check"):
            lead.open(params)
    finally:
        client.close()


def test_s1_with_an_exact_floor_refuses_projected_rounds(tmp_path_factory) -> None:  # type: ignore[no-untyped-def]
    strict = _start(tmp_path_factory, "--min-value-check", "exact")
    try:
        client = strict.client(timeout=120)
        try:
            lead = LeadServer(client, helper_fingerprint=strict.fingerprint, min_clients=1)
            with pytest.raises(HelperRequestError, match="'projected' checks less"):
                lead.open(_params(60))
            _average, rejected = _round(strict, _params(61, value_check="exact"), CAUGHT[0])
            assert list(rejected) == [666]
        finally:
            client.close()
    finally:
        strict.stop()


def test_s1_refuses_projected_rounds_with_fewer_projections_than_its_floor(  # type: ignore[no-untyped-def]
    helper, tmp_path_factory
) -> None:
    client = helper.client(timeout=120)
    try:
        lead = LeadServer(client, helper_fingerprint=helper.fingerprint, min_clients=1)
        with pytest.raises(HelperRequestError, match=r"fewer than S1's 64 .*--min-projections"):
            lead.open(_params(70, projections=32))
    finally:
        client.close()
    fewer = _start(tmp_path_factory, "--min-projections", "32")
    try:
        params = _params(71, projections=32)
        average, rejected = _round(fewer, params, "average -1.1e9 (value, count 1)")
        assert list(rejected) == [666] and "key check failed" in rejected[666]
        assert average == pytest.approx(HONEST, abs=1e-6)
        client = fewer.client(timeout=120)
        try:
            lead = LeadServer(client, helper_fingerprint=fewer.fingerprint, min_clients=1)
            with pytest.raises(HelperRequestError, match=r"fewer than S1's 32 .*--min-projections"):
                lead.open(_params(72, projections=31))
        finally:
            client.close()
    finally:
        fewer.stop()


def test_value_check_off_lets_a_huge_value_with_count_one_through(lax_helper) -> None:  # type: ignore[no-untyped-def]
    # The documented gap of value_check="off" (S1 started with --min-value-check off).
    params = _params(41, value_check="off")
    average, rejected = _round(lax_helper, params, "average -1.1e9 (value, count 1)")
    assert rejected == {}
    assert average == pytest.approx(-1.1e9, rel=1e-3)


def test_unchecked_round_lets_the_forger_through(lax_helper) -> None:  # type: ignore[no-untyped-def]
    params = replace(_params(30), verify=False)
    average, rejected = _round(lax_helper, params, "average 80.00 (value, count 0)")
    assert rejected == {}
    assert average == pytest.approx(80.0, abs=1e-6)
