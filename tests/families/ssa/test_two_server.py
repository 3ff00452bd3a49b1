"""S0's two-server party (:class:`LeadServer`) against the in-process S1: SSA rounds reconstruct
the plaintext count-weighted sums, S1's per-client rejections drop only that client, every
S0/S1 disagreement fails the round without moving S0's U-DPF keys, U-DPF hints, PSR answers and
the pinned helper key."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.crypto.channel import SealingKeyPair, public_key_fingerprint
from flwr_fsl.families.ssa.protocol import (
    SSAInputError,
    SSAParams,
    SSAResult,
    SSAUpload,
    encode_update,
    held_digest,
)
from flwr_fsl.families.ssa.psr import PSRClientState, decode_table, encode_table, make_query
from flwr_fsl.families.ssa.sealing import open_psr_answer, seal_psr_query
from flwr_fsl.families.ssa.two_server import (
    ClientUpload,
    HelperKeyMismatchError,
    LeadServer,
    SSARound,
    TooFewClientsError,
    TwoServerError,
)
from flwr_fsl.helper import HelperService, HelperUnavailableError, InProcessHelper
from flwr_fsl.helper.connection import HelperShare
from tests.helper.test_helper import (
    WIDTH,
    Client,
    bind,
    expected_sums,
    hint_for,
    make_clients,
    open_rounds,
    twin,
    upload_for,
)
from tests.helper.test_helper import make_params as _unchecked_params


def make_params(round_id: int, **kw: Any) -> SSAParams:
    """The helper tests' round with the key check on (the default of ``SSAParams``)."""
    return _unchecked_params(round_id, **{"verify": True, **kw})


class RecordingHelper:
    """An S1 that forwards to a real :class:`InProcessHelper`, recording every call's arguments.

    ``finish`` (if set) rewrites S1's honest :class:`HelperShare` before S0 sees it: the way to
    make S1 disagree with S0 without touching S1's code.
    """

    def __init__(
        self,
        inner: InProcessHelper,
        finish: Callable[[HelperShare], HelperShare] | None = None,
    ) -> None:
        self.inner = inner
        self.finish = finish
        self.calls: dict[str, list[tuple[Any, ...]]] = defaultdict(list)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):  # session_id
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name].append(args)
            return attr(*args, **kwargs)

        return call

    def finish_round(self, round_id: int) -> HelperShare:
        self.calls["finish_round"].append((round_id,))
        share = self.inner.finish_round(round_id)
        return self.finish(share) if self.finish else share

    def open_rounds(self) -> tuple[int, ...]:
        return open_rounds(self.inner)


def client_upload(upload: SSAUpload, sealed: bytes) -> ClientUpload:
    """What S0 receives from a client: public part, S0's master seed, S1's sealed material."""
    return ClientUpload(upload.public_part, upload.master_seeds[0], sealed)


def hint_upload(
    params: SSAParams, client: Client, helper_pub: bytes, rng: np.random.Generator | None = None
) -> ClientUpload:
    """What S0 receives from a U-DPF client: the hint and its binding sealed to S1."""
    _, hint, sealed = hint_for(params, client, helper_pub, rng=rng)
    return ClientUpload(hint=hint, sealed=sealed)


def fresh_uploads(
    params: SSAParams, clients: list[Client], helper_pub: bytes, epoch_seed: int = 0
) -> dict[int, ClientUpload]:
    return {c.cid: client_upload(*upload_for(params, c, helper_pub, epoch_seed)) for c in clients}


def plaintext(params: SSAParams, clients: list[Client]) -> tuple[np.ndarray, np.ndarray]:
    """Per element ``sum_i c_i dw_i`` and ``sum_i c_i`` in float64, for any round shape."""
    sums = np.zeros((params.domain_size, params.value_width))
    counts = np.zeros(params.domain_size)
    for c in clients:
        sums[c.idx] += c.weight * c.values
        counts[c.idx] += c.weight
    return sums, counts


def assert_matches(params: SSAParams, result: SSAResult, clients: list[Client]) -> None:
    sums, counts = plaintext(params, clients)
    # Each client's payload word is within one fixed-point step of c * dw (stochastic rounding);
    # integer weights encode exactly, so the counts are exact.
    tol = max(len(clients), 1) * 2.0**-params.frac_bits
    np.testing.assert_allclose(result.sums, sums, rtol=0, atol=tol)
    np.testing.assert_array_equal(result.counts, counts)


def stored_snapshot(lead: LeadServer) -> dict[int, bytes]:
    return {c: keys.to_bytes() for c, keys in lead.stored_keys.items()}


# ---- 1. reconstruction --------------------------------------------------------------------------


@st.composite
def ssa_rounds(draw: st.DrawFn) -> tuple[SSAParams, list[Client]]:
    m = draw(st.integers(1, 120))
    k = draw(st.integers(1, min(m, 12)))
    width = draw(st.integers(1, 3))
    params = make_params(
        1,
        domain_size=m,
        num_items=k,
        value_width=width,
        hash_key=draw(st.binary(min_size=16, max_size=16)),
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32)))
    clients = []
    for c in range(draw(st.integers(1, 6))):
        n = int(rng.integers(0, k + 1))  # a client may choose fewer than k elements
        clients.append(
            Client(
                cid=10 + c,
                idx=rng.choice(m, n, replace=False),
                values=rng.uniform(-1, 1, size=(n, width)),
                weight=float(rng.integers(1, 8)),
            )
        )
    return params, clients


@given(ssa_rounds())
def test_aggregate_equals_plaintext_count_weighted_sums(case) -> None:  # type: ignore[no-untyped-def]
    params, clients = case
    lead = LeadServer(twin(), min_clients=1)
    uploads = fresh_uploads(params, clients, lead.helper_key())
    for cid, upload in uploads.items():
        lead.check_upload(params, cid, upload, accept_hints=False)
    outcome = lead.aggregate(params, uploads)
    assert isinstance(outcome, SSARound)
    assert outcome.accepted == [c.cid for c in clients]
    assert outcome.rejected == {} and outcome.hinted == 0
    assert_matches(params, outcome.result, clients)
    # Every accepted client's keys are stored for U-DPF; the round is closed on S1.
    assert set(lead.stored_keys) == {c.cid for c in clients}
    assert open_rounds(lead.helper) == ()


# ---- 2. a client S1 rejects ---------------------------------------------------------------------


def test_client_with_tampered_sealed_material_is_dropped_and_the_rest_is_exact() -> None:
    params = make_params(1)
    clients = make_clients(4)
    lead = LeadServer(twin(), min_clients=1)
    uploads = fresh_uploads(params, clients, lead.helper_key())
    bad = clients[1].cid
    sealed = bytearray(uploads[bad].sealed)
    sealed[len(sealed) // 2] ^= 0x01  # S0 (or the network) flips one ciphertext bit
    uploads[bad] = replace(uploads[bad], sealed=bytes(sealed))
    outcome = lead.aggregate(params, uploads)
    assert list(outcome.rejected) == [bad]
    assert "authentication" in outcome.rejected[bad]
    good = [c for c in clients if c.cid != bad]
    assert outcome.accepted == [c.cid for c in good]
    assert_matches(params, outcome.result, good)
    # S0 keeps no U-DPF keys for the rejected client.
    assert set(lead.stored_keys) == {c.cid for c in good}


# ---- 3. S0 and S1 disagree ----------------------------------------------------------------------


def _extra_client(s: HelperShare) -> HelperShare:
    return HelperShare((*s.client_ids, 999), s.share)


def _missing_client(s: HelperShare) -> HelperShare:
    return HelperShare(s.client_ids[1:], s.share)


def _short_share(s: HelperShare) -> HelperShare:
    return HelperShare(s.client_ids, s.share[:-1])


def _narrow_share(s: HelperShare) -> HelperShare:
    return HelperShare(s.client_ids, s.share[:, :-1])


def _two_rounds_setup(finish: Callable[[HelperShare], HelperShare] | None = None):  # type: ignore[no-untyped-def]
    """An honest round 1 (so S0 has stored keys to protect), then round 2's hints."""
    helper = RecordingHelper(twin())
    lead = LeadServer(helper, min_clients=1)
    clients = make_clients(3)
    p1, p2 = make_params(1), make_params(2)
    lead.aggregate(p1, fresh_uploads(p1, clients, lead.helper_key()))
    helper.finish = finish
    uploads = {}
    for c in clients:
        c.values = -c.values
        uploads[c.cid] = hint_upload(p2, c, lead.helper_key())
    return helper, lead, clients, p2, uploads


@pytest.mark.parametrize(
    ("lie", "message"),
    [
        (_extra_client, "S1 aggregated clients"),
        (_missing_client, "S1 aggregated clients"),
        (_short_share, "shape"),
        (_narrow_share, "shape"),
    ],
)
def test_inconsistent_share_from_s1_fails_the_round(lie, message) -> None:  # type: ignore[no-untyped-def]
    helper, lead, _, p2, uploads = _two_rounds_setup(lie)
    before = stored_snapshot(lead)
    with pytest.raises(TwoServerError, match=message) as info:
        lead.aggregate(p2, uploads)
    assert isinstance(info.value, RoundFailedError)
    # S0's U-DPF keys stay those of the last round both servers completed.
    assert stored_snapshot(lead) == before
    # S1 closed the round when it returned its share: there is nothing left to release.
    assert lead.abort(2) is None
    assert helper.calls["abort_round"] == []
    assert helper.open_rounds() == ()


def test_client_s0_cannot_evaluate_is_never_relayed_and_the_others_stay_exact() -> None:
    # S0 evaluates first: a client whose keys S0 cannot use is rejected by S0 and never reaches
    # S1, so both shares hold the same clients.
    helper = RecordingHelper(twin())
    lead = LeadServer(helper, min_clients=1)
    clients = make_clients(3)
    p1, p2 = make_params(1), make_params(2)
    lead.aggregate(p1, fresh_uploads(p1, clients, lead.helper_key()))
    uploads = fresh_uploads(p2, clients, lead.helper_key(), epoch_seed=1)
    bad = clients[2].cid
    # S1's sealed material is intact; S0's own master seed is one byte short.
    uploads[bad] = replace(uploads[bad], master_seed=uploads[bad].master_seed[:15])
    outcome = lead.aggregate(p2, uploads)
    assert list(outcome.rejected) == [bad] and "rejected by S0" in outcome.rejected[bad]
    assert outcome.accepted == [c.cid for c in clients[:2]]
    relayed = [i[0] for call in helper.calls["add_checked"] if call[0] == 2 for i in call[1]]
    assert bad not in relayed
    assert_matches(p2, outcome.result, clients[:2])
    lead.open(make_params(3))
    assert helper.open_rounds() == (3,)
    assert lead.abort(3) is None
    assert helper.calls["abort_round"] == [(3,)]
    assert helper.open_rounds() == ()
    # Released once: a second abort, and an abort of a round never opened, do not reach S1.
    assert lead.abort(3) is None
    assert lead.abort(42) is None
    assert helper.calls["abort_round"] == [(3,)]


def test_hint_s0_has_no_keys_for_is_rejected_by_s0_and_never_relayed() -> None:
    helper, lead, clients, p2, uploads = _two_rounds_setup()
    del lead.stored_keys[clients[0].cid]  # S0 lost a client's keys that S1 still holds
    outcome = lead.aggregate(p2, uploads)
    relayed = [i[0] for call in helper.calls["add_checked"] if call[0] == 2 for i in call[1]]
    assert clients[0].cid not in relayed
    assert clients[0].cid in outcome.rejected
    assert "rejected by S0" in outcome.rejected[clients[0].cid]
    assert clients[0].cid not in outcome.accepted


def test_s1_failure_leaves_the_round_for_abort() -> None:
    helper = RecordingHelper(twin())
    lead = LeadServer(helper, min_clients=1)
    params = make_params(1)
    uploads = fresh_uploads(params, make_clients(2), lead.helper_key())

    def lost(round_id: int) -> HelperShare:  # the connection drops before S1 closes the round
        raise HelperUnavailableError("S1 went away")

    helper.finish_round = lost  # type: ignore[method-assign]
    with pytest.raises(RoundFailedError, match="went away"):
        lead.aggregate(params, uploads)
    assert lead.stored_keys == {}
    assert helper.open_rounds() == (1,)
    assert lead.abort(1) is None
    assert helper.calls["abort_round"] == [(1,)]
    assert helper.open_rounds() == ()


def test_abort_of_a_never_opened_round_does_not_call_s1() -> None:
    helper = RecordingHelper(twin())
    lead = LeadServer(helper, min_clients=1)
    assert lead.abort(7) is None
    assert helper.calls["abort_round"] == []


# ---- 4. U-DPF -----------------------------------------------------------------------------------


def test_udpf_hints_aggregate_to_the_plaintext_of_the_new_values() -> None:
    lead = LeadServer(twin(), min_clients=1)
    pub = lead.helper_key()
    clients = make_clients(4)
    p1, p2 = make_params(1, epoch=1), make_params(2, epoch=2)
    r1 = lead.aggregate(p1, fresh_uploads(p1, clients, pub))
    assert r1.hinted == 0
    assert_matches(p1, r1.result, clients)
    round1_keys = stored_snapshot(lead)

    rng = np.random.default_rng(5)
    uploads: dict[int, ClientUpload] = {}
    for c in clients[:2]:  # same index sets, new values: a hint each
        c.values = rng.uniform(-1, 1, size=c.values.shape)
        uploads[c.cid] = hint_upload(p2, c, pub, rng=np.random.default_rng(c.cid))
    fresh = clients[2]  # a client may always send fresh keys instead
    fresh.values = rng.uniform(-1, 1, size=fresh.values.shape)
    uploads[fresh.cid] = client_upload(*upload_for(p2, fresh, pub, epoch_seed=2))
    broken = clients[3]  # a hint altered on the way: S1 checks it against the client's seal
    good = hint_upload(p2, broken, pub)
    assert good.hint is not None
    uploads[broken.cid] = replace(good, hint=good.hint[:-3])
    for cid, upload in uploads.items():
        lead.check_upload(p2, cid, upload, accept_hints=True)
    r2 = lead.aggregate(p2, uploads)
    kept = clients[:3]
    assert r2.hinted == 2  # accepted hints only
    assert r2.accepted == [c.cid for c in kept]
    # S0 evaluates first: it cannot parse the truncated hint, so S1 never sees it.
    assert list(r2.rejected) == [broken.cid] and "bad hint" in r2.rejected[broken.cid]
    assert_matches(p2, r2.result, kept)
    sums, counts = expected_sums(kept)  # the same check through the helper tests' oracle
    np.testing.assert_allclose(r2.result.sums, sums, atol=1e-6)
    np.testing.assert_array_equal(r2.result.counts, counts)
    # S0's stored keys moved to round 2's epoch. S1 could not use the rejected client's hint,
    # so S0 forgets its keys: next round it announces none and the client sends fresh keys
    # (issue 8 item 3: a client is never excluded for good).
    for c in kept:
        assert np.all(lead.stored_keys[c.cid].public.epochs == 2)
        assert lead.held(c.cid) == held_digest(c.state.keys[0])
    assert broken.cid not in lead.stored_keys and lead.held(broken.cid) is None
    assert round1_keys[broken.cid]


def test_check_upload_rejects_unusable_hints_and_malformed_keys() -> None:
    lead = LeadServer(twin(), min_clients=1)
    pub = lead.helper_key()
    p1, p2 = make_params(1), make_params(2)
    client = make_clients(1)[0]
    good = client_upload(*upload_for(p1, client, pub))
    lead.check_upload(p1, client.cid, good, accept_hints=False)  # well-formed: no error
    lead.aggregate(p1, {client.cid: good})
    hint = hint_upload(p2, client, pub)
    lead.check_upload(p2, client.cid, hint, accept_hints=True)
    with pytest.raises(SSAInputError, match="without its binding"):
        lead.check_upload(p2, client.cid, replace(hint, sealed=b""), accept_hints=True)
    with pytest.raises(SSAInputError, match="without stored keys"):
        lead.check_upload(p2, client.cid + 1, hint, accept_hints=True)
    with pytest.raises(SSAInputError, match="without stored keys"):
        lead.check_upload(p2, client.cid, hint, accept_hints=False)

    other_layout = encode_update(
        make_params(1, hash_key=bytes(16)), client.idx, client.values, client.weight
    )[0].public_part
    bad_publics = {
        "empty": b"",
        "garbage": b"FDPF" + bytes(40),
        "truncated": good.public_part[:-9],
        "other layout": other_layout,
        "other epoch": good.public_part,  # epoch-1 keys offered in the epoch-2 round
    }
    for name, public in bad_publics.items():
        upload = replace(good, public_part=public)
        with pytest.raises(SSAInputError) as info:
            lead.check_upload(p2 if name == "other epoch" else p1, 5, upload, accept_hints=False)
        assert isinstance(info.value, ClientInputError), name
    for seed in (good.master_seed[:15], good.master_seed + b"\x00", b""):
        with pytest.raises(SSAInputError, match="bad keys"):
            lead.check_upload(p1, 5, replace(good, master_seed=seed), accept_hints=False)


# ---- 5. PSR -------------------------------------------------------------------------------------


def test_answer_queries_retrieve_exact_rows_and_report_rejections() -> None:
    helper = RecordingHelper(twin())
    lead = LeadServer(helper, min_clients=1)
    pub = lead.helper_key()
    params = make_params(1)
    rng = np.random.default_rng(11)
    rows = rng.normal(size=(params.domain_size, WIDTH)).astype(np.float32)
    table = encode_table(rows)
    queries: dict[int, ClientUpload] = {}
    states: dict[int, PSRClientState] = {}
    for cid in (10, 11, 12, 13):
        n = int(rng.integers(1, params.num_items + 1))
        q = make_query(params, rng.choice(params.domain_size, n, replace=False))
        sealed, answer_key = seal_psr_query(
            pub,
            binding=bind(params),
            client_id=cid,
            public_part=q.upload.public_part,
            master_seed=q.upload.master_seeds[1],
        )
        queries[cid] = ClientUpload(q.upload.public_part, q.upload.master_seeds[0], sealed)
        states[cid] = PSRClientState(params.round_id, q.indices, q.placement.slots, answer_key)
    tampered = bytearray(queries[12].sealed)
    tampered[-1] ^= 0x01
    queries[12] = replace(queries[12], sealed=bytes(tampered))
    queries[13] = replace(queries[13], public_part=b"FDPF" + bytes(40))  # S0 cannot answer

    answers = lead.answer_queries(params, table, queries)
    assert set(answers) == set(queries)
    for cid in (10, 11):
        answer = answers[cid]
        assert isinstance(answer, tuple)
        answer0, sealed1 = answer
        answer1 = open_psr_answer(
            states[cid].answer_key, sealed1, binding=bind(params), client_id=cid
        )
        got = decode_table(states[cid].rows(params, answer0, answer1), np.float32)
        np.testing.assert_array_equal(got, rows[states[cid].indices])
    assert isinstance(answers[12], str) and answers[12].startswith("rejected by S1")
    assert "authentication" in answers[12]
    assert isinstance(answers[13], str) and "malformed public part" in answers[13]
    # S0 relays only the queries it could answer; the round stays open for the SSA phase.
    assert [c for c, _, _ in helper.calls["psr_answer"][0][1]] == [10, 11, 12]
    assert helper.open_rounds() == (1,)

    # Index mode: the round's SSA phase reuses the open round (opened once on S1).
    clients = make_clients(2)
    outcome = lead.aggregate(params, fresh_uploads(params, clients, pub))
    assert_matches(params, outcome.result, clients)
    assert len(helper.calls["open_round"]) == 1 and len(helper.calls["set_model"]) == 1


def test_answer_queries_that_s0_rejects_never_reach_s1() -> None:
    helper = RecordingHelper(twin())
    lead = LeadServer(helper, min_clients=1)
    params = make_params(1)
    table = encode_table(np.zeros((params.domain_size, WIDTH), np.float32))
    q = make_query(params, [1, 2])
    answers = lead.answer_queries(
        params, table, {5: ClientUpload(q.upload.public_part, b"short", b"sealed")}
    )
    assert isinstance(answers[5], str) and "master seed" in answers[5]
    assert dict(helper.calls) == {}  # no round opened, no table sent
    assert lead.abort(1) is None and helper.calls["abort_round"] == []


# ---- 6. S1's pinned key -------------------------------------------------------------------------


def test_helper_key_is_checked_against_the_pin_and_fetched_once() -> None:
    keypair = SealingKeyPair.generate()
    helper = RecordingHelper(twin(keypair=keypair))
    lead = LeadServer(helper, keypair.fingerprint)
    assert lead.helper_key() == keypair.public_bytes
    assert lead.helper_key() == keypair.public_bytes
    assert len(helper.calls["public_key"]) == 1
    assert lead.session_id == helper.inner.session_id

    impostor = RecordingHelper(twin(keypair=SealingKeyPair.generate()))
    pinned = LeadServer(impostor, keypair.fingerprint)
    for _ in range(2):  # a mismatch is never cached as the key
        with pytest.raises(ConfigurationError, match="does not match"):
            pinned.helper_key()
    assert len(impostor.calls["public_key"]) == 2
    with pytest.raises(ConfigurationError, match="64 hex digits"):
        LeadServer(impostor, "not-a-fingerprint").helper_key()
    # Without a pin S0 takes S1's key as announced (clients still check their own pin).
    assert LeadServer(impostor).helper_key() == impostor.inner.public_key()


def test_a_pin_that_is_not_a_fingerprint_is_refused_before_any_call() -> None:
    helper = RecordingHelper(twin())
    for bad in ("not-a-fingerprint", "ab" * 31, "g" * 64):
        with pytest.raises(ConfigurationError, match="64 hex digits"):
            LeadServer(helper, bad)
    assert dict(helper.calls) == {}
    key = helper.inner.public_key()
    pin = "SHA256:" + public_key_fingerprint(key).upper()  # prefix and case are accepted
    assert LeadServer(helper, f"  {pin} ").helper_key() == key


def test_s1_back_with_another_key_fails_each_opening_until_the_pinned_key_is_back() -> None:
    key, other = SealingKeyPair.generate(), SealingKeyPair.generate()
    inner = twin(keypair=key)
    helper = RecordingHelper(inner)
    lead = LeadServer(helper, key.fingerprint)
    lead.open(make_params(1))
    assert lead.helper_key() == key.public_bytes

    inner.service = HelperService(other)  # S1 restarted with another key file
    for rnd in (2, 3):
        with pytest.raises(HelperKeyMismatchError, match="fingerprint mismatch") as info:
            lead.open(make_params(rnd))
        assert isinstance(info.value, RoundFailedError)  # fail the round, not the run
        assert other.fingerprint in str(info.value) and key.fingerprint in str(info.value)
        with pytest.raises(HelperKeyMismatchError):  # a mismatching key is never cached
            lead.helper_key()
        assert lead.abort(rnd) is None  # the round was never opened on that S1
    assert lead.key_mismatches == [2, 3] and lead.session_losses == [2]
    # Round 2's OpenRound found the session gone; after that S0 opened no round on it.
    assert [args[0] for args in helper.calls["open_round"]] == [1, 2]

    inner.service = HelperService(key)  # back with the pinned key
    lead.open(make_params(4))
    assert lead.helper_key() == key.public_bytes
    assert lead.session_losses == [2, 4] and lead.key_mismatches == [2, 3]
    assert open_rounds(inner) == (4,)


# ---- minimum participation (issue 8, item 2) ----------------------------------------------------


def test_too_few_uploads_never_reach_s1() -> None:
    helper = RecordingHelper(twin())
    lead = LeadServer(helper, min_clients=3)
    params = make_params(1)
    uploads = fresh_uploads(params, make_clients(2), lead.helper_key())
    with pytest.raises(TooFewClientsError, match="minimum participation is 3"):
        lead.aggregate(params, uploads)
    assert not helper.calls["open_round"] and not helper.calls["add_clients"]


def test_s1_rejections_below_the_minimum_leave_the_round_unreconstructed() -> None:
    # Three uploads, S1 rejects one: two left < 3, so S0 never asks for S1's share (it could
    # otherwise reconstruct an aggregate of fewer clients than the policy allows).
    helper = RecordingHelper(twin())
    lead = LeadServer(helper, min_clients=3)
    params = make_params(1)
    clients = make_clients(3)
    uploads = fresh_uploads(params, clients, lead.helper_key())
    bad = clients[0].cid
    sealed = bytearray(uploads[bad].sealed)
    sealed[-1] ^= 0x01
    uploads[bad] = replace(uploads[bad], sealed=bytes(sealed))
    with pytest.raises(TooFewClientsError, match="2 clients accepted"):
        lead.aggregate(params, uploads)
    assert not helper.calls["finish_round"]
    assert lead.stored_keys == {}
    assert lead.abort(params.round_id) is None and helper.open_rounds() == ()


def test_min_clients_is_validated() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigurationError, match="min_clients"):
            LeadServer(twin(), min_clients=bad)  # type: ignore[arg-type]


def test_stored_keys_are_forgotten_when_the_hashing_layout_changes() -> None:
    # Keys of another hash key can never be updated again (S1 drops its own as well): S0
    # forgets them, so it announces nothing and the clients send fresh keys.
    lead = LeadServer(twin(), min_clients=1)
    pub = lead.helper_key()
    clients = make_clients(2)
    p1 = make_params(1)
    lead.aggregate(p1, fresh_uploads(p1, clients, pub))
    assert all(lead.held(c.cid) is not None for c in clients)
    p2 = make_params(2, hash_key=bytes(16))
    outcome = lead.aggregate(p2, fresh_uploads(p2, clients[:1], pub))
    assert outcome.accepted == [clients[0].cid]
    assert lead.held(clients[1].cid) is None  # dropped with the old layout
    assert lead.held(clients[0].cid) == held_digest(clients[0].state.keys[0])


def test_known_leak_differencing_two_rounds_reveals_a_dropped_clients_rows() -> None:
    # What the README states under "Several rounds", as the curious S0 would run it: fixed row
    # sets, one round with everybody and one where client i dropped out (S0 knows who took
    # part). The difference of the reconstructed counts is exactly client i's row set and
    # weight: minimum participation does not help. With distributed DP on, the same attack is
    # bounded: test_differencing_two_rounds_with_dp_is_bounded_as_the_accounting_predicts.
    lead = LeadServer(twin(), min_clients=2)
    pub = lead.helper_key()
    clients = make_clients(4)
    p1, p2 = make_params(1), make_params(2)
    everyone = lead.aggregate(p1, fresh_uploads(p1, clients, pub)).result.counts
    dropped = clients[2]
    rest = [c for c in clients if c is not dropped]
    without = lead.aggregate(p2, fresh_uploads(p2, rest, pub, epoch_seed=1)).result.counts
    assert everyone is not None and without is not None
    difference = everyone - without
    assert set(np.flatnonzero(difference).tolist()) == set(dropped.idx.tolist())
    assert np.all(difference[dropped.idx] == dropped.weight)


# ---- scale: chunked relay to S1, one-shot keys not kept -----------------------------------------


def test_uploads_are_relayed_in_chunks_and_s0_consumes_them_one_chunk_at_a_time() -> None:
    # A 1-byte chunk limit puts every upload in its own AddClients request. S0 evaluates the
    # next chunk while S1 evaluates the relayed one, and settles that one before it relays
    # again, so a caller that streams uploads never has more than two chunks of them in
    # S0's memory.
    params = make_params(1, epoch=0)
    clients = make_clients(5)
    recorder = RecordingHelper(twin())
    lead = LeadServer(recorder, min_clients=1, relay_chunk_bytes=1)
    uploads = fresh_uploads(params, clients, lead.helper_key())
    pulled: list[int] = []
    pulled_at_call: list[int] = []
    inner_add = recorder.inner.add_checked

    def add_checked(round_id: int, items: Any, *, hints: bool) -> dict[int, str | bytes]:
        items = list(items)
        pulled_at_call.append(len(pulled))
        return inner_add(round_id, items, hints=hints)

    recorder.inner.add_checked = add_checked  # type: ignore[method-assign]

    def stream() -> Any:
        for cid, upload in uploads.items():
            pulled.append(cid)
            yield cid, upload

    outcome = lead.aggregate(params, stream())
    assert len(pulled_at_call) == len(clients)  # one request per upload
    # When chunk i goes to S1, S0 has read at most two uploads beyond it (the next chunk,
    # which it evaluates meanwhile, and the one that did not fit), however many are to come.
    assert all(n <= i + 3 for i, n in enumerate(pulled_at_call))
    assert pulled_at_call[0] in (2, 3)
    assert outcome.accepted == [c.cid for c in clients]
    assert_matches(params, outcome.result, clients)


def test_chunked_relay_equals_one_request_with_rejections_and_hints_across_chunks() -> None:
    clients = make_clients(6)
    probe = fresh_uploads(make_params(1), clients[:1], twin().public_key())[clients[0].cid]
    two_uploads = 2 * (len(probe.public_part) + len(probe.sealed) + 64)
    results = []
    for chunk_bytes in (1, two_uploads, 64 << 20):
        recorder = RecordingHelper(twin())
        lead = LeadServer(recorder, min_clients=1, relay_chunk_bytes=chunk_bytes)
        pub = lead.helper_key()
        p1, p2 = make_params(1), make_params(2)
        lead.aggregate(p1, fresh_uploads(p1, clients[:4], pub))
        # Round 2: four hints, two fresh clients, one hint and one fresh upload tampered.
        uploads = {
            c.cid: hint_upload(p2, c, pub, rng=np.random.default_rng(c.cid)) for c in clients[:4]
        }
        uploads.update(fresh_uploads(p2, clients[4:], pub, epoch_seed=2))
        for bad in (clients[1].cid, clients[5].cid):
            sealed = bytearray(uploads[bad].sealed)
            sealed[-1] ^= 1
            uploads[bad] = replace(uploads[bad], sealed=bytes(sealed))
        outcome = lead.aggregate(p2, uploads)
        calls = len(recorder.calls["add_checked"])
        results.append((calls, outcome))
        good = [c for c in clients if c.cid not in (clients[1].cid, clients[5].cid)]
        assert sorted(outcome.rejected) == [clients[1].cid, clients[5].cid]
        assert sorted(outcome.accepted) == sorted(c.cid for c in good)
        assert outcome.hinted == 3
        assert_matches(p2, outcome.result, good)
        assert clients[1].cid not in lead.stored_keys  # the rejected hint's keys forgotten
    # Smaller chunks mean more requests, never another result.
    assert (
        results[0][0] > results[1][0] > results[2][0] == 3
    )  # round 1, then one hints and one fresh request
    for _, outcome in results[1:]:
        np.testing.assert_array_equal(outcome.result.counts, results[0][1].result.counts)


def test_one_shot_round_keeps_no_keys_on_either_server() -> None:
    # Epoch-0 keys (top-k SSA, index mode without U-DPF) are evaluated and dropped: memory
    # stays O(m τ) per round however many clients come, and no hint can ever use them.
    lead = LeadServer(twin(), min_clients=1)
    pub = lead.helper_key()
    clients = make_clients(3)
    p0 = make_params(1, epoch=0)
    outcome = lead.aggregate(p0, fresh_uploads(p0, clients, pub))
    assert_matches(p0, outcome.result, clients)
    assert lead.stored_keys == {} and all(lead.held(c.cid) is None for c in clients)
    p2 = make_params(2)
    hint = hint_upload(p2, clients[0], pub)
    with pytest.raises(SSAInputError, match="without stored keys"):
        lead.check_upload(p2, clients[0].cid, hint, accept_hints=True)
    # S1 kept none either: it refuses the hint for keys it does not hold.
    lead.open(p2)
    rejected = lead.helper.add_checked(
        2, [(clients[0].cid, hint.hint, hint.sealed, bytes(32))], hints=True
    )
    assert "S1 holds other keys" in rejected[clients[0].cid]


def test_relay_chunk_bytes_is_validated_and_an_unrelayable_upload_fails_the_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flwr_fsl.families.ssa import two_server

    for bad in (0, -1, True, 1.5, two_server.MAX_MESSAGE_BYTES):
        with pytest.raises(ConfigurationError, match="relay_chunk_bytes"):
            LeadServer(twin(), relay_chunk_bytes=bad)  # type: ignore[arg-type]
    lead = LeadServer(twin(), min_clients=1)
    params = make_params(1, epoch=0)
    uploads = fresh_uploads(params, make_clients(2), lead.helper_key())
    monkeypatch.setattr(two_server, "MAX_MESSAGE_BYTES", 1024)  # smaller than one upload
    with pytest.raises(TwoServerError, match="cannot be relayed"):
        lead.aggregate(params, uploads)
    assert lead.abort(1) is None  # the round opened on S1 is released
