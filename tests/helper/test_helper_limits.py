"""S1 bounds what one request may cost (issue 8 item 7): every limit of ``HelperLimits`` refuses
an over-limit OpenRound / SetModel / AddClients / AddClientHints / PsrAnswer with a clear
HelperRequestError *before* S1 allocates or evaluates anything (the allocating constructors are
replaced by tripwires, and tracemalloc's peak stays small), a request just under each limit
works, S1 stays healthy for the session and for others, the memory formula bounds the peak S1
really reaches (traced), the limits come through the real gRPC process and the CLI flags, random
parameter sets only ever succeed or fail cleanly, and a long AddClients of one session holds up
neither Health nor another session's round."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flwr_fsl.core.errors import ConfigurationError, RoundFailedError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.dpf import DPFKeyBatch, evaluate_batch
from flwr_fsl.families.ssa import sealing as ssa_sealing
from flwr_fsl.families.ssa.dp import DEFAULT_BUDGET
from flwr_fsl.families.ssa.protocol import (
    SSAParams,
    SSAServer,
    encode_update,
    parse_public_part,
    reconstruct,
)
from flwr_fsl.families.ssa.psr import PSRServer, encode_table, make_query
from flwr_fsl.families.ssa.two_server import LeadServer
from flwr_fsl.helper import (
    HelperClient,
    HelperError,
    HelperRequestError,
    HelperService,
    InProcessHelper,
    start_server,
)
from flwr_fsl.helper import cli as helper_cli
from flwr_fsl.helper.limits import (
    MAX_PARAMS_BYTES,
    HelperLimits,
    query_work,
    round_words,
    upload_work,
)
from flwr_fsl.helper.services import ssa as ssa_service
from flwr_fsl.testing.helper_process import HelperProcess
from tests.helper.test_helper import (
    SID,
    WIDTH,
    M,
    bind,
    expected_sums,
    fixed_ids,
    hint_for,
    make_clients,
    make_params,
    open_rounds,
    sealed_uploads,
    signer_of,
    upload_for,
)
from tests.helper.test_helper_sessions import _aggregate

P = make_params(1)  # M=96 rows, K=8 items, width 2 (tau 3), 3 hashes, no stash


def twin(limits: HelperLimits | None = None, **kw: Any) -> InProcessHelper:
    return InProcessHelper(session_ids=fixed_ids(SID), limits=limits, **kw)


def sealed_queries(params: SSAParams, ids: list[int], pub: bytes) -> list[tuple[int, bytes, bytes]]:
    out = []
    for cid in ids:
        q = make_query(params, [cid % M, (cid + 1) % M], rng=np.random.default_rng(cid))
        sealed, _ = ssa_sealing.seal_psr_query(
            pub,
            binding=bind(params),
            client_id=cid,
            public_part=q.upload.public_part,
            master_seed=q.upload.master_seeds[1],
        )
        out.append((cid, q.upload.public_part, sealed))
    return out


class Tripwires:
    """Replace everything that allocates a round's arrays or evaluates a client with a recorder.

    Anything recorded means S1 started the work a limit should have refused first.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.hit: list[str] = []
        for owner, name in (
            (SSAServer, "__init__"),
            (PSRServer, "__init__"),
            (PSRServer, "answer"),
            (SSAServer, "add_client"),
            (SSAServer, "add_client_hint"),
            (SSAServer, "prepare"),
            (SSAServer, "add_prepared"),
            (ssa_sealing, "open_ssa_upload"),
            (ssa_sealing, "open_psr_query"),
        ):
            monkeypatch.setattr(owner, name, self._wire(name))

    def _wire(self, name: str) -> Callable[..., Any]:
        def tripped(*args: Any, **kwargs: Any) -> Any:
            self.hit.append(name)
            raise AssertionError(f"{name} called although a limit should have refused the call")

        return tripped


def refused_quietly(call: Callable[[], Any], match: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``call`` raises HelperRequestError(match) without allocating or evaluating anything."""
    with monkeypatch.context() as patch:
        wires = Tripwires(patch)
        tracemalloc.start()
        try:
            with pytest.raises(HelperRequestError, match=match):
                call()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert wires.hit == []
    assert peak < 256 << 10, f"a refused call allocated {peak} bytes"


# ---- HelperLimits itself ------------------------------------------------------------------------


def test_limits_are_validated():
    for f in fields(HelperLimits):
        for bad in (0, -1, True, 1.5, "8", 1 << 63):
            with pytest.raises(ConfigurationError, match=f.name):
                HelperLimits(**{f.name: bad})
    with pytest.raises(ConfigurationError, match="max_value_width"):
        HelperLimits(max_value_width=1 << 20)  # tau = width + 1 must fit a DPF
    with pytest.raises(ConfigurationError, match="limits must be a HelperLimits"):
        HelperService(SealingKeyPair.generate(), limits={"max_domain_size": 1})  # type: ignore[arg-type]
    assert twin().service.limits == HelperLimits()
    assert twin(HelperLimits(max_domain_size=7)).service.limits.max_domain_size == 7


def test_defaults_allow_large_single_coordinate_rounds_and_embedding_tables():
    limits = HelperLimits()
    for m, k, w, clients in (
        (1 << 20, 1 << 17, 1, 1000),
        (74_000, 64, 64, 1000),  # MovieLens-sized embedding rows
        (1 << 23, 1 << 16, 1, 100),
    ):
        params = SSAParams(1, m, k, w, bytes(16), max_abs=1e3, max_summands=50)
        budget = limits.open_round(params)
        budget.add_table()
        budget.admit("PsrAnswer", set(), range(clients), query=True)
        budget.admit("AddClients", set(), range(clients), query=False)
    # And for real at m = 2**20, width 1 (the share and the hashing table, then aborted).
    helper = twin()
    big = make_params(1, domain_size=1 << 20, num_items=1 << 14, value_width=1)
    helper.open_round(1, big.to_bytes())
    helper.abort_round(1)


def test_memory_formula_counts_what_the_parameters_drive():
    base = round_words(P)
    for field_name, value in (
        ("domain_size", 2 * M),
        ("value_width", 2 * WIDTH),
        ("stash_size", 2),
        ("scale_factor", 50.0),
    ):
        assert round_words(replace(P, **{field_name: value})) > base, field_name
    assert round_words(P, table=True) > base
    assert upload_work(P) == 3 * M * (WIDTH + 1)
    assert query_work(P) == 3 * M * (WIDTH + 1)


# ---- OpenRound ----------------------------------------------------------------------------------

OVER_OPEN = [
    # (limits, parameters of round 1, text the refusal must name)
    (HelperLimits(max_domain_size=M - 1), {}, "domain_size 96 exceeds .*--max-domain"),
    (HelperLimits(max_value_width=WIDTH - 1), {}, "value_width 2 exceeds .*--max-width"),
    (HelperLimits(max_num_items=7), {}, "num_items 8 exceeds .*--max-items"),
    (HelperLimits(max_round_bytes=8 * round_words(P) - 1), {}, "--max-round-mib"),
    (HelperLimits(max_round_work=upload_work(P) - 1), {}, "one client's keys.*--max-round-gwords"),
    # Defaults against what a ~350-byte request could ask for before the limits existed:
    (None, {"domain_size": 1 << 40}, "--max-domain"),
    (None, {"value_width": 1 << 19}, "--max-width"),
    (None, {"domain_size": 1 << 22, "value_width": 4096}, "--max-round-mib"),
    (None, {"stash_size": 1 << 20}, "--max-round-mib"),
    (None, {"scale_factor": 4e8}, "--max-round-mib"),  # 3.2e9 bins on 96 indices
]


@pytest.mark.parametrize(("limits", "fields_", "match"), OVER_OPEN)
def test_over_limit_open_round_is_refused_before_allocating(limits, fields_, match, monkeypatch):
    helper = twin(limits)
    params = make_params(1, **fields_)
    refused_quietly(lambda: helper.open_round(1, params.to_bytes()), match, monkeypatch)
    assert open_rounds(helper) == ()
    # The session is intact: the same round id opens once the parameters fit.
    helper.open_round(1, make_params(1, domain_size=32, num_items=4, value_width=1).to_bytes())
    assert open_rounds(helper) == (1,)


def test_long_parameter_bytes_are_not_parsed(monkeypatch):
    helper = twin()
    monkeypatch.setattr(
        ssa_service.SSAParams, "from_bytes", lambda data: pytest.fail("parsed")
    )  # never reached
    body = b"{" + b" " * MAX_PARAMS_BYTES + b"}"
    with pytest.raises(HelperRequestError, match=f"at most {MAX_PARAMS_BYTES}"):
        helper.open_round(1, body)


def test_a_round_just_under_every_limit_works():
    exact = HelperLimits(
        max_domain_size=M,
        max_value_width=WIDTH,
        max_num_items=8,
        max_round_bytes=8 * round_words(P),
        max_clients_per_round=3,
        max_round_work=3 * upload_work(P),
    )
    helper = twin(exact)
    pub = helper.public_key()
    clients = make_clients(3)
    helper.open_round(1, P.to_bytes())
    assert helper.add_clients(1, sealed_uploads(P, clients, pub)) == {}
    ids, share1 = helper.finish_round(1)
    assert ids == tuple(c.cid for c in clients)
    s0 = SSAServer(P, 0)
    for c in clients:
        upload, _ = upload_for(P, c, pub)
        s0.add_client(c.cid, upload.public_part, upload.master_seeds[0])
    result = reconstruct(P, s0.share(), share1)
    sums, counts = expected_sums(clients)
    np.testing.assert_allclose(result.sums, sums, atol=1e-5)
    np.testing.assert_allclose(result.counts, counts, atol=1e-5)


# ---- AddClients / AddClientHints / SetModel / PsrAnswer ------------------------------------------


@pytest.mark.parametrize(
    ("limits", "match"),
    [
        (HelperLimits(max_clients_per_round=3), "to 4 clients.*--max-clients-per-round"),
        (HelperLimits(max_round_work=3 * upload_work(P)), "words of work.*--max-round-gwords"),
    ],
)
def test_over_limit_add_clients_is_refused_before_any_client_is_evaluated(
    limits, match, monkeypatch
):
    helper = twin(limits)
    pub = helper.public_key()
    clients = make_clients(5)
    relay = sealed_uploads(P, clients, pub)
    helper.open_round(1, P.to_bytes())
    assert helper.add_clients(1, relay[:2]) == {}
    # Two more would make four: the whole call is refused, nothing of it is kept.
    refused_quietly(lambda: helper.add_clients(1, relay[2:4]), match, monkeypatch)
    # Ids already in the round are no new clients (rejected per client, nothing charged).
    again = helper.add_clients(1, [*relay[:2], relay[2]])
    assert set(again) == {clients[0].cid, clients[1].cid}
    assert "already submitted" in again[clients[0].cid]
    refused_quietly(lambda: helper.add_clients(1, relay[3:4]), match, monkeypatch)
    ids, _ = helper.finish_round(1)
    assert ids == tuple(c.cid for c in clients[:3])


def test_over_limit_hints_are_refused_before_any_key_is_updated(monkeypatch):
    helper = twin(HelperLimits(max_clients_per_round=2))
    pub = helper.public_key()
    clients = make_clients(3)
    helper.open_round(1, P.to_bytes())
    helper.add_clients(1, sealed_uploads(P, clients[:2], pub))
    helper.finish_round(1)
    p2 = make_params(2)
    helper.open_round(2, p2.to_bytes())
    hints = [hint_for(p2, c, pub) for c in clients[:2]]
    # A fresh upload and a hint count alike: the third client of either kind is refused.
    assert helper.add_clients(2, sealed_uploads(p2, clients[2:], pub)) == {}
    assert helper.add_client_hints(2, hints[:1]) == {}
    refused_quietly(lambda: helper.add_client_hints(2, hints[1:]), "to 3 clients", monkeypatch)
    ids, _ = helper.finish_round(2)
    assert ids == (clients[0].cid, clients[2].cid)


def test_set_model_over_the_memory_limit_is_refused_before_the_table_is_kept(monkeypatch):
    with_table = 8 * round_words(P, table=True)
    helper = twin(HelperLimits(max_round_bytes=with_table - 1))
    helper.open_round(1, P.to_bytes())  # fits without a table
    table = np.zeros((M, WIDTH), np.uint64)
    refused_quietly(
        lambda: helper.set_model(1, table), "with its PSR table.*--max-round-mib", monkeypatch
    )
    with pytest.raises(HelperRequestError, match="no PSR table"):
        helper.psr_answer(1, [])
    # Just under: the table is accepted.
    helper = twin(HelperLimits(max_round_bytes=with_table))
    helper.open_round(1, P.to_bytes())
    helper.set_model(1, table)
    # A wrongly shaped table is refused as such, not as an over-limit one.
    helper.open_round(2, make_params(2).to_bytes())
    with pytest.raises(HelperRequestError, match="bad PSR table: shape"):
        helper.set_model(2, np.zeros((M, WIDTH + 1), np.uint64))


def test_psr_queries_count_on_their_own_and_over_limit_is_refused_unanswered(monkeypatch):
    helper = twin(HelperLimits(max_clients_per_round=2))
    pub = helper.public_key()
    clients = make_clients(2)
    helper.open_round(1, P.to_bytes())
    helper.set_model(1, encode_table(np.ones((M, WIDTH), np.float32)))
    queries = sealed_queries(P, [c.cid for c in clients] + [99], pub)
    refused_quietly(lambda: helper.psr_answer(1, queries), "to 3 PSR queries", monkeypatch)
    answers = helper.psr_answer(1, queries[:2])
    assert all(isinstance(a, bytes) for a in answers.values())
    # Two queries and two uploads: the clients of either kind are counted separately.
    assert helper.add_clients(1, sealed_uploads(P, clients, pub)) == {}
    # Work is shared: queries and uploads draw on the same per-round total.
    work = 2 * query_work(P) + 2 * upload_work(P)
    helper = twin(HelperLimits(max_round_work=work))
    helper.open_round(1, P.to_bytes())
    helper.set_model(1, encode_table(np.ones((M, WIDTH), np.float32)))
    helper.psr_answer(1, sealed_queries(P, [c.cid for c in clients], helper.public_key()))
    relay = sealed_uploads(P, [*clients, *make_clients(3, seed=1)[2:]], helper.public_key())
    refused_quietly(lambda: helper.add_clients(1, relay), "words of work", monkeypatch)
    assert helper.add_clients(1, relay[:2]) == {}


def test_s0_sees_a_clear_error_and_the_round_fails_cleanly():
    helper = twin(HelperLimits(max_domain_size=64))
    lead = LeadServer(helper)
    with pytest.raises(RoundFailedError, match="domain_size 96 exceeds S1's limit 64"):
        lead.open(P)
    assert open_rounds(helper) == ()
    lead.open(make_params(1, domain_size=64, num_items=4))
    assert open_rounds(helper) == (1,)


def test_s1_refuses_projected_rounds_with_fewer_projections_than_its_floor():
    """``HelperLimits.min_projections`` (``--min-projections``, default 64), in-process S1."""
    from flwr_fsl.families.ssa.messages import DEFAULT_PROJECTIONS

    assert HelperLimits().min_projections == DEFAULT_PROJECTIONS == 64
    helper = twin(HelperLimits(min_projections=16))
    lead = LeadServer(helper)
    with pytest.raises(RoundFailedError, match=r"8 projections, fewer than S1's 16 .*--min-proj"):
        lead.open(make_params(1, verify=True, projections=8))
    assert open_rounds(helper) == ()
    lead.open(make_params(2, verify=True, projections=16))  # at the floor: accepted
    for r in (63, 1):  # the default floor
        with pytest.raises(RoundFailedError, match="--min-projections"):
            LeadServer(twin()).open(make_params(3, verify=True, projections=r))
    # Rounds without the projected check have no projections to count (their own floor decides).
    strict = LeadServer(twin(HelperLimits(min_projections=1024)))
    strict.open(make_params(4, verify=True, value_check="exact"))
    strict.open(make_params(5, verify=True, value_check="off"))
    strict.open(make_params(6))  # unchecked
    for bad in (0, 1025):
        with pytest.raises(ConfigurationError, match="min_projections"):
            HelperLimits(min_projections=bad)


# ---- the memory formula against the peak S1 really reaches ---------------------------------------


@pytest.mark.parametrize(
    "fields_",
    [
        {"domain_size": 1 << 14, "num_items": 100, "value_width": 1},
        {"domain_size": 1 << 14, "num_items": 100, "value_width": 8, "stash_size": 2},
        {"domain_size": 1 << 14, "num_items": 100, "value_width": 3, "count_weighted": False},
        {
            "domain_size": 1 << 14,
            "num_items": 300,
            "value_width": 4,
            "num_hashes": 2,
            "scale_factor": 3.0,
        },
        {"domain_size": 4096, "num_items": 100, "value_width": 1, "scale_factor": 200.0},
        {"domain_size": 2000, "num_items": 64, "value_width": 64},
    ],
)
def test_memory_formula_bounds_the_traced_peak_of_a_round(fields_):
    kp = SealingKeyPair.generate()

    def requests(hash_key: bytes) -> tuple[SSAParams, list, list, np.ndarray]:
        params = make_params(1, hash_key=hash_key, **fields_)
        m, k, w = params.domain_size, params.num_items, params.value_width
        rng = np.random.default_rng(0)
        uploads = []
        for cid in (1, 2):
            up, _ = encode_update(
                params, rng.choice(m, k, replace=False), rng.uniform(-1, 1, (k, w)), 1.0, rng=rng
            )
            sealed = ssa_sealing.seal_ssa_upload(
                kp.public_bytes,
                binding=bind(params),
                client_id=cid,
                public_part=up.public_part,
                master_seed=up.master_seeds[1],
                signer=signer_of(cid),
            )
            uploads.append((cid, up.public_part, sealed))
        queries = sealed_queries(params, [1, 2], kp.public_bytes)
        return params, uploads, queries, encode_table(rng.normal(size=(m, w)).astype(np.float32))

    def round_trip(params, uploads, queries, table) -> None:
        helper = twin(keypair=kp)
        helper.open_round(1, params.to_bytes())
        helper.set_model(1, table)
        helper.psr_answer(1, queries)
        assert helper.add_clients(1, uploads) == {}
        helper.finish_round(1)

    round_trip(*requests(bytes(16)))  # warm-up: imports, kernels, first-call caches
    params, uploads, queries, table = requests(bytes(range(16)))  # new key: a new hashing table
    sent = table.nbytes + sum(len(p) + len(s) for _, p, s in uploads + queries)
    tracemalloc.start()
    try:
        round_trip(params, uploads, queries, table)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # What the parameters drive, plus the bytes S0 sent (the request, its parsed copy, the keys
    # S1 keeps and the sealed answers): see flwr_fsl.helper.limits.
    bound = 8 * round_words(params, table=True) + 4 * sent
    assert peak <= bound, (peak, bound)


# ---- random parameter sets: a clean refusal or a round, never MemoryError -----------------------

SMALL = HelperLimits(
    max_domain_size=1 << 14,
    max_value_width=64,
    max_num_items=1 << 12,
    max_round_bytes=8 << 20,
    max_clients_per_round=8,
    max_round_work=1 << 24,
)


def _params_json(**fields_: Any) -> bytes:
    base = json.loads(P.to_bytes())
    base.update(fields_)
    return json.dumps(base, sort_keys=True).encode()


@st.composite
def open_round_fields(draw: st.DrawFn) -> dict[str, Any]:
    """SSAParams-like sizes: mostly valid sets around the limits, some far over, some invalid."""
    m = draw(st.one_of(st.integers(1, 1 << 15), st.integers(1, 1 << 62)))
    fitting_k = st.integers(0, min(m, 1 << 13))
    return {
        "domain_size": m,
        "num_items": draw(st.one_of(fitting_k, fitting_k, st.integers(0, 1 << 40))),
        "value_width": draw(st.one_of(st.integers(1, 80), st.integers(1, 1 << 22))),
        "stash_size": draw(st.one_of(st.just(0), st.integers(0, 8), st.integers(0, 1 << 20))),
        "num_hashes": draw(st.one_of(st.just(3), st.just(3), st.integers(1, 9))),
        "scale_factor": draw(st.one_of(st.none(), st.floats(1.0, 8.0), st.floats(1.0, 1e12))),
        "count_weighted": draw(st.booleans()),
    }


@settings(max_examples=80, deadline=None)
@given(fields_=open_round_fields())
def test_random_open_round_sizes_succeed_or_fail_cleanly(fields_: dict[str, Any]) -> None:
    helper = twin(SMALL)
    body = _params_json(**fields_)
    real = ssa_service.SSAServer

    def guarded(params: SSAParams, *args: Any, **kwargs: Any) -> SSAServer:
        # Independent of the formula: S1 must never start a round whose share alone is too big.
        assert params.domain_size <= SMALL.max_domain_size
        assert 8 * params.domain_size * params.tau <= SMALL.max_round_bytes
        return real(params, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ssa_service, "SSAServer", guarded)
        try:
            helper.open_round(1, body)
        except HelperRequestError as err:
            assert str(err)
            assert open_rounds(helper) == ()
        else:
            params = SSAParams.from_bytes(body)
            assert 8 * round_words(params) <= SMALL.max_round_bytes
            helper.abort_round(1)


# ---- the real gRPC process and the CLI -----------------------------------------------------------


@pytest.fixture(scope="module")
def helper_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HelperProcess]:
    key_file = tmp_path_factory.mktemp("s1-limits") / "s1.pem"
    SealingKeyPair.generate().save(key_file)
    # Unchecked rounds (round mechanics): S1 must allow them (its default floor refuses them).
    log = tmp_path_factory.mktemp("log") / "helper.log"
    proc = HelperProcess(key_file, log, ("--min-value-check", "off"))
    try:
        yield proc
    finally:
        proc.stop()


def test_limits_through_the_real_process(helper_process: HelperProcess) -> None:
    client = helper_process.client(timeout=60)
    other = helper_process.client(timeout=60)
    try:
        for fields_, match in (
            ({"domain_size": 1 << 40}, "domain_size 1099511627776 exceeds .*--max-domain"),
            ({"domain_size": 1 << 22, "value_width": 4096}, "--max-round-mib"),
        ):
            with pytest.raises(HelperRequestError, match=match):
                client.open_round(1, make_params(1, **fields_).to_bytes())
        with pytest.raises(HelperRequestError, match="round 1 is not open"):
            client.finish_round(1)  # refused rounds were never opened
        # S1 is healthy: this session and another run full rounds right after.
        for conn in (client, other):
            result, sums, counts = _aggregate(conn, 1, seed=3)  # type: ignore[arg-type]
            np.testing.assert_allclose(result.sums, sums, atol=1e-5)
            np.testing.assert_allclose(result.counts, counts, atol=1e-5)
    finally:
        client.close()
        other.close()


def _limits_of(argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> HelperLimits:
    seen: dict[str, Any] = {}

    class Recording(HelperService):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.update(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(helper_cli, "HelperService", Recording)
    key = tmp_path / "k.pem"
    assert (
        helper_cli.main(["--key-file", str(key), "--generate-key", "--print-fingerprint", *argv])
        == 0
    )
    limits: HelperLimits = seen["limits"]
    return limits


def test_cli_limit_flags(monkeypatch, tmp_path, capsys):
    # The CLI's defaults are the library's, plus S1's DP ceilings (per run and per client:
    # the strategies' default budget, so a deviating S0 gets no more from a real S1); the
    # in-process S1 of simulation has none (it is no separate party).
    # The CLI also insists on the projected value check (issue 21), the in-process S1 not.
    assert _limits_of([], monkeypatch, tmp_path) == replace(
        HelperLimits(),
        dp_budget=DEFAULT_BUDGET,
        dp_client_budget=DEFAULT_BUDGET,
        min_value_check="projected",
    )
    flags = [
        "--max-domain", "5000", "--max-width", "17", "--max-items", "300",
        "--max-round-mib", "64", "--max-clients-per-round", "9", "--max-round-gwords", "2",
    ]  # fmt: skip
    assert _limits_of(flags, monkeypatch, tmp_path) == HelperLimits(
        max_domain_size=5000,
        max_value_width=17,
        max_num_items=300,
        max_round_bytes=64 << 20,
        max_clients_per_round=9,
        max_round_work=2 << 30,
        dp_budget=DEFAULT_BUDGET,
        dp_client_budget=DEFAULT_BUDGET,
        min_value_check="projected",
    )
    for floor in ("off", "exact"):
        assert _limits_of(["--min-value-check", floor], monkeypatch, tmp_path) == replace(
            HelperLimits(),
            dp_budget=DEFAULT_BUDGET,
            dp_client_budget=DEFAULT_BUDGET,
            min_value_check=floor,
        )
    assert _limits_of(["--min-projections", "16"], monkeypatch, tmp_path) == replace(
        HelperLimits(),
        dp_budget=DEFAULT_BUDGET,
        dp_client_budget=DEFAULT_BUDGET,
        min_value_check="projected",
        min_projections=16,
    )
    capsys.readouterr()
    key = str(tmp_path / "k.pem")
    for flag, bad in (
        ("--max-domain", "0"),
        ("--max-domain", str(1 << 63)),
        ("--max-width", "-3"),
        ("--max-width", str(1 << 20)),
        ("--max-items", "many"),
        ("--max-round-mib", "0"),
        ("--max-round-mib", str(1 << 43)),
        ("--max-clients-per-round", "1.5"),
        ("--max-round-gwords", "0"),
        ("--min-projections", "0"),
        ("--min-projections", "1025"),
        ("--min-projections", "64.5"),
    ):
        with pytest.raises(SystemExit) as info:
            helper_cli.main(["--key-file", key, flag, bad])
        assert info.value.code == 2
        assert f"argument {flag}:" in capsys.readouterr().err


# ---- lock discipline: a long AddClients holds up no other session, nor Health --------------------


@pytest.mark.parametrize("transport", ["in-process", "grpc"])
def test_a_long_add_clients_does_not_hold_up_health_or_other_sessions(transport, monkeypatch):
    """Session A's AddClients keeps evaluating keys (real CPU work, holding A's lock) until
    session B has run a whole round and Health has answered; ordering by events, no timing."""
    service = HelperService(SealingKeyPair.generate())
    started, release, a_done = threading.Event(), threading.Event(), threading.Event()
    real_add = SSAServer.add_prepared  # what S1's AddClients calls per client (pipelined)
    spins = [0]

    def slow_add(self: SSAServer, item: Any, prepared: Any) -> bytes | None:
        # S1's side of session A's round only (_aggregate runs S0's SSAServer too).
        if self.party == 1 and self.params.round_id == 7 and not started.is_set():
            keys = DPFKeyBatch.from_master_seed(
                1, parse_public_part(self.params, item.body), item.master_seed
            )
            started.set()
            deadline = time.monotonic() + 60  # a safety net, never an assertion
            while not release.is_set() and time.monotonic() < deadline:
                evaluate_batch(keys)
                spins[0] += 1
        return real_add(self, item, prepared)

    monkeypatch.setattr(SSAServer, "add_prepared", slow_add)
    server = None
    if transport == "grpc":
        server, port = start_server(service, "127.0.0.1", 0, max_workers=3, token="t0ken")

        def connect() -> Any:
            return HelperClient(f"127.0.0.1:{port}", timeout=120, token="t0ken")
    else:

        def connect() -> Any:
            return InProcessHelper(service)

    a, b = connect(), connect()
    outcome: dict[str, Any] = {}

    def run_a() -> None:
        try:
            outcome["a"] = _aggregate(a, 7, seed=1)
        except BaseException as err:  # reported below
            outcome["a"] = err
        finally:
            a_done.set()

    thread = threading.Thread(target=run_a)
    thread.start()
    try:
        assert started.wait(120), "session A never reached its key evaluation"
        b.health()  # answers while A's call holds A's session lock
        assert 7 in open_rounds(service)  # A's round is open, its AddClients still running
        assert b.public_key() == service.public_key
        result, sums, _ = _aggregate(b, 1, seed=2)  # B: open, add 3 clients, finish
        np.testing.assert_allclose(result.sums, sums, atol=1e-5)
        assert not a_done.is_set(), "B's round waited for A's AddClients to end"
    finally:
        release.set()
        thread.join(120)
        a.close()
        b.close()
        if server is not None:
            server.stop(0)
    assert not isinstance(outcome["a"], BaseException), outcome["a"]
    result_a, sums_a, _ = outcome["a"]
    np.testing.assert_allclose(result_a.sums, sums_a, atol=1e-5)
    assert spins[0] >= 1


def test_refused_calls_over_grpc_are_request_errors_not_internal():
    service = HelperService(SealingKeyPair.generate(), limits=HelperLimits(max_domain_size=64))
    server, port = start_server(service, "127.0.0.1", 0, insecure=True)
    client = HelperClient(f"127.0.0.1:{port}", timeout=60)
    try:
        with pytest.raises(HelperRequestError, match="--max-domain") as info:
            client.open_round(1, P.to_bytes())
        assert isinstance(info.value, HelperError)
        assert "INTERNAL" not in str(info.value)
    finally:
        client.close()
        server.stop(0)
