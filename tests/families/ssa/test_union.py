"""Cui's basic protocol (PSU, then SSA over the union): :mod:`flwr_fsl.families.ssa.union`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto import psu as crypto_psu
from flwr_fsl.crypto.psu import PSUParams
from flwr_fsl.families.sfsl import psu as sfsl_psu
from flwr_fsl.families.ssa.aggregation_strategy import SSASettings
from flwr_fsl.families.ssa.protocol import SSAParams
from flwr_fsl.families.ssa.union import (
    ClientSet,
    UnionInputError,
    UnionParty,
    UnionRound,
    check_union_option,
    open_union,
    run_basic_round,
    share_set,
)

FRAC_BITS = 24


def params(m: int, k: int, width: int = 2) -> SSAParams:
    return SSASettings(frac_bits=FRAC_BITS).params(
        round_id=1, domain_size=m, num_items=k, value_width=width, hash_key=bytes(16)
    )


def plaintext(m: int, clients: dict[int, ClientSet]) -> tuple[np.ndarray, np.ndarray]:
    width = next(iter(clients.values())).values.shape[1]
    sums, counts = np.zeros((m, width)), np.zeros(m)
    for c in clients.values():
        sums[c.indices] += c.values
        counts[c.indices] += 1
    return sums, counts


def make_clients(
    rng: np.random.Generator, m: int, k: int, n: int, pool: int, width: int = 2
) -> dict[int, ClientSet]:
    popular = rng.choice(m, pool, replace=False)
    out = {}
    for cid in range(1, n + 1):
        idx = np.sort(rng.choice(popular, min(k, pool), replace=False))
        out[cid] = ClientSet(idx, rng.uniform(-0.5, 0.5, (idx.size, width)))
    return out


def assert_exact(result, m: int, clients: dict[int, ClientSet]) -> None:  # type: ignore[no-untyped-def]
    sums, counts = plaintext(m, clients)
    np.testing.assert_array_equal(result.counts, counts)
    np.testing.assert_allclose(result.sums, sums, atol=len(clients) * 2.0**-FRAC_BITS)


def test_the_old_path_re_exports_the_moved_module() -> None:
    assert sfsl_psu.PSUParams is crypto_psu.PSUParams
    assert sfsl_psu.client_vector is crypto_psu.client_vector
    assert sfsl_psu.MAX_FILTER == crypto_psu.MAX_FILTER


def test_with_psu_equals_without_on_the_same_clients() -> None:
    rng = np.random.default_rng(1)
    m, k = 2048, 32
    clients = make_clients(rng, m, k, 6, pool=80)
    off = run_basic_round(params(m, k), clients, "off")
    on = run_basic_round(params(m, k), clients, "psu")
    assert off.union is None and on.union is not None and not on.union.fallback
    np.testing.assert_array_equal(on.result.counts, off.result.counts)
    np.testing.assert_allclose(on.result.sums, off.result.sums, atol=12 * 2.0**-FRAC_BITS)
    assert_exact(on.result, m, clients)
    # The servers evaluate |U| elements per client instead of m, with shorter keys.
    assert on.union.size <= 80
    ssa_only = {c: on.up_lead[c] - 8 * (m + 1) for c in clients}
    assert all(ssa_only[c] < off.up_lead[c] for c in clients)


@settings(max_examples=15, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 5),
    k=st.integers(1, 12),
    pool=st.integers(1, 60),
    bloom=st.booleans(),
)
def test_union_is_the_true_union_and_the_round_exact(
    seed: int, n: int, k: int, pool: int, bloom: bool
) -> None:
    rng = np.random.default_rng(seed)
    m = 128
    clients = make_clients(rng, m, k, n, pool)
    true_union = np.unique(np.concatenate([c.indices for c in clients.values()]))
    psu = PSUParams.for_target(m, n * k, 1e-3, 4) if bloom else None
    out = run_basic_round(params(m, k), clients, "psu", psu)
    assert out.union is not None
    if bloom:  # a Bloom filter may add false positives, never lose a member
        assert np.isin(true_union, out.union.union).all()
    else:
        np.testing.assert_array_equal(out.union.union, true_union)
    assert_exact(out.result, m, clients)


def test_a_client_claiming_elements_it_does_not_send_is_harmless() -> None:
    rng = np.random.default_rng(2)
    m, k = 256, 8
    clients = make_clients(rng, m, k, 4, pool=20)
    liar = clients[1]
    extra = np.setdiff1d(np.arange(200, 230), liar.indices)
    clients[1] = ClientSet(liar.indices, liar.values, np.union1d(liar.indices, extra))
    out = run_basic_round(params(m, k), clients, "psu")
    assert out.union is not None and np.isin(extra, out.union.union).all()
    assert_exact(out.result, m, clients)  # the claimed-only elements have count 0


def test_a_client_sending_outside_the_union_cannot_name_those_elements() -> None:
    rng = np.random.default_rng(3)
    m, k = 256, 8
    clients = make_clients(rng, m, k, 4, pool=20)
    liar = clients[2]
    hidden = np.setdiff1d(
        np.arange(240, 248), np.concatenate([c.indices for c in clients.values()])
    )
    sent = np.concatenate([liar.indices[:4], hidden[:4]])
    values = rng.uniform(-0.5, 0.5, (sent.size, 2))
    clients[2] = ClientSet(sent, values, liar.indices[:4])  # claims only the first four
    out = run_basic_round(params(m, k), clients, "psu")
    assert out.union is not None and not np.isin(hidden[:4], out.union.union).any()
    assert not out.result.counts[hidden[:4]].any()  # the elements outside U never arrive
    honest = dict(clients)
    honest[2] = ClientSet(sent[:4], values[:4])
    assert_exact(out.result, m, honest)


def test_a_union_larger_than_honest_clients_make_falls_back_to_the_full_domain() -> None:
    rng = np.random.default_rng(4)
    m, k = 256, 8
    clients = make_clients(rng, m, k, 3, pool=20)
    c = clients[3]
    clients[3] = ClientSet(c.indices, c.values, np.arange(m))  # claims everything
    out = run_basic_round(params(m, k), clients, "psu")
    assert out.union is not None and out.union.fallback and out.union.size == m
    assert_exact(out.result, m, clients)


def test_a_malformed_share_drops_its_client_and_keeps_the_others_exact() -> None:
    rng = np.random.default_rng(5)
    m, k = 256, 8
    clients = make_clients(rng, m, k, 4, pool=30)
    out = run_basic_round(params(m, k), clients, "psu", malformed_psu=[4])
    assert 4 in out.dropped
    kept = {c: v for c, v in clients.items() if c != 4}
    assert out.union is not None
    np.testing.assert_array_equal(
        out.union.union, np.unique(np.concatenate([v.indices for v in kept.values()]))
    )
    assert_exact(out.result, m, kept)


def test_the_in_process_pair_checks_keys_under_a_fresh_digest_key(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Digest version 3 as LeadServer runs it: one secret 16-byte key per round, both servers."""
    from flwr_fsl.families.ssa import union as union_module

    keys: list[tuple[int, bytes | None]] = []
    real = union_module.SSAServer

    def recording(params: SSAParams, party: int, **kw: object) -> object:
        keys.append((party, kw.get("digest_key")))  # type: ignore[arg-type]
        return real(params, party, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(union_module, "SSAServer", recording)
    rng = np.random.default_rng(6)
    m, k = 256, 8
    clients = make_clients(rng, m, k, 3, pool=30)
    for union in ("off", "psu", "off"):
        assert_exact(run_basic_round(params(m, k), clients, union).result, m, clients)
    unchecked = SSASettings(frac_bits=FRAC_BITS).params(
        round_id=1, domain_size=m, num_items=k, value_width=2, hash_key=bytes(16), verify=False
    )
    run_basic_round(unchecked, clients, "off")
    assert [party for party, _ in keys] == [0, 1] * 4
    rounds = [keys[i][1] for i in range(0, 6, 2)]
    assert all(keys[i][1] == keys[i + 1][1] for i in range(0, 8, 2))  # both servers, one key
    assert all(isinstance(key, bytes) and len(key) == 16 and any(key) for key in rounds)
    assert len(set(rounds)) == 3  # fresh per round
    assert keys[6][1] is None  # an unchecked round has no key check


def test_a_client_failing_the_key_check_is_dropped_from_both_shares(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """S1 checks S0's digest (as in deployment): a tampered upload is dropped, the rest exact."""
    from flwr_fsl.families.ssa import union as union_module

    real = union_module.encode_update

    def tampering(params: SSAParams, indices: object, *args: object, **kw: object) -> object:
        upload, state = real(params, indices, *args, **kw)  # type: ignore[arg-type]
        if len(indices) == 7:  # type: ignore[arg-type]
            public = bytearray(upload.public_part)
            public[len(public) // 2] ^= 1
            upload = type(upload)(bytes(public), upload.master_seeds)
        return upload, state

    monkeypatch.setattr(union_module, "encode_update", tampering)
    rng = np.random.default_rng(7)
    m, k = 256, 8
    clients = make_clients(rng, m, k, 4, pool=30)
    clients[3] = ClientSet(clients[3].indices[:7], clients[3].values[:7])
    out = run_basic_round(params(m, k), clients, "off")
    assert list(out.dropped) == [3] and out.dropped[3].startswith("SSA: ")
    assert_exact(out.result, m, {c: v for c, v in clients.items() if c != 3})


def test_the_opened_total_does_not_count_the_holders() -> None:
    psu = PSUParams.exact(64)
    parties = (UnionParty(psu, 0), UnionParty(psu, 1))
    for cid in range(5):
        share = share_set(psu, [3, 7] if cid else [3])
        parties[0].add(cid, share.lead_vector)
        parties[1].add(cid, share.helper_seed)
    total = parties[0].total + parties[1].total
    assert set(np.flatnonzero(total[:64]).tolist()) == {3, 7}
    assert total[3] not in (np.uint64(5), np.uint64(1)) and total[7] != np.uint64(4)
    np.testing.assert_array_equal(open_union(psu, parties[0].total, parties[1].total), [3, 7])


def test_bad_inputs_are_refused_by_name() -> None:
    psu = PSUParams.exact(16)
    lead, helper = UnionParty(psu, 0), UnionParty(psu, 1)
    share = share_set(psu, [1])
    lead.add(1, share.lead_vector)
    with pytest.raises(UnionInputError, match="already"):
        lead.add(1, share.lead_vector)
    with pytest.raises(UnionInputError, match="uint64"):
        lead.add(2, share.lead_vector[:-1])
    with pytest.raises(UnionInputError, match="16-byte"):
        helper.add(2, b"short")
    with pytest.raises(ConfigurationError, match="union"):
        check_union_option("yes")
    with pytest.raises(ConfigurationError, match="party"):
        UnionParty(psu, 2)
    with pytest.raises(ConfigurationError, match="empty"):
        UnionRound.of(16, [], 4).params(params(16, 2))
    with pytest.raises(ConfigurationError, match=r"psu\.domain_size"):
        run_basic_round(params(16, 2), {}, "psu", PSUParams.exact(8))
