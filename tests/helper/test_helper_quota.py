"""S1's resource limits for every caller (issue 24 item 6, :mod:`flwr_fsl.helper.quota`).

The issue's reproductions, each turned into a test: a flood of ``OpenRound`` calls grew S1 by
~166 MB per open round (now: refused before allocating, with ``RESOURCE_EXHAUSTED``, once the
memory budget is taken, and an open session keeps its reserve); long ``AddClients`` held every
worker so ``Health`` waited 46.8 s (``test_helper_flood.py``, real process); 64 idle sessions
locked every new run out for the six-hour idle timeout (now: idle sessions are evicted after
``evict_idle_s`` when the table is full, expire after minutes, and one address holds at most
``max_sessions_per_peer``).
"""

from __future__ import annotations

import re
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.crypto.dpf import DPFKeyBatch
from flwr_fsl.families.ssa.protocol import SSAServer, encode_update, parse_public_part
from flwr_fsl.helper import (
    HelperLimits,
    HelperRequestError,
    HelperResourceError,
    HelperService,
    HelperSessionLostError,
    InProcessHelper,
    wire,
)
from flwr_fsl.helper import cli as helper_cli
from flwr_fsl.helper.quota import MemoryLedger, ServiceLimits, key_bytes
from flwr_fsl.helper.services.ssa import STORED_KEYS
from tests.helper.test_helper import make_clients, make_params, upload_for
from tests.helper.test_helper_sessions import _aggregate

MIB = 1 << 20


def service(**quota: Any) -> HelperService:
    limits = quota.pop("limits", None)
    return HelperService(SealingKeyPair.generate(), quota=ServiceLimits(**quota), limits=limits)


def big(round_id: int, domain: int = 1 << 16) -> bytes:
    """A round whose memory estimate is a few tens of MiB (nothing evaluated)."""
    return make_params(round_id, domain_size=domain, num_items=8, value_width=1).to_bytes()


# ---- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_memory_bytes": 0}, "max_memory_bytes"),
        ({"max_sessions": 1.5}, "max_sessions"),
        ({"max_calls_per_session": True}, "max_calls_per_session"),
        ({"session_idle_s": float("nan")}, "session_idle_s"),
        ({"round_idle_s": -1.0}, "round_idle_s"),
        ({"session_reserve_bytes": 3 << 30}, "session_reserve_bytes .* max_session_bytes"),
        ({"max_session_bytes": 9 << 30}, "max_session_bytes .* max_memory_bytes"),
    ],
)
def test_service_limits_are_validated(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        ServiceLimits(**kw)


def test_lowering_one_setting_alone_works() -> None:
    quota = ServiceLimits(max_sessions=4, session_idle_s=10.0)
    assert quota.max_sessions_per_peer == 4 and quota.evict_idle_s == 10.0
    assert ServiceLimits(session_idle_s=7200.0).round_idle_s == 7200.0


def test_a_round_larger_than_a_session_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="--max-session-mib"):
        service(max_session_bytes=512 * MIB, session_reserve_bytes=64 * MIB)
    with pytest.raises(ConfigurationError, match="quota"):
        HelperService(SealingKeyPair.generate(), quota="lots")  # type: ignore[arg-type]


def test_defaults_expire_idle_sessions_in_minutes() -> None:
    quota = HelperService(SealingKeyPair.generate()).quota
    assert quota.session_idle_s == 300.0 and quota.evict_idle_s == 30.0
    assert quota.max_sessions_per_peer < quota.max_sessions


# ---- memory -------------------------------------------------------------------------------------


def test_key_bytes_bounds_a_real_key_batch() -> None:
    for kw in ({}, {"domain_size": 1 << 14, "num_items": 64, "value_width": 3}, {"verify": True}):
        params = make_params(1, **kw)
        idx = np.arange(min(params.num_items, params.domain_size))
        values = np.ones((idx.size, params.value_width))
        upload, _ = encode_update(params, idx, values)
        tracemalloc.start()
        try:
            keys = DPFKeyBatch.from_master_seed(
                1, parse_public_part(params, upload.public_part), upload.master_seeds[1]
            )
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert keys.public.num_keys == params.num_keys
        assert held <= key_bytes(params), (kw, held, key_bytes(params))


def test_ledger_counts_a_reserve_per_session_and_refuses_before_charging() -> None:
    ledger = MemoryLedger(
        ServiceLimits(max_memory_bytes=100, max_session_bytes=60, session_reserve_bytes=30)
    )
    ledger.open(b"a")
    ledger.open(b"b")
    ledger.open(b"c")  # 3 reserves of 30 = 90 <= 100
    with pytest.raises(HelperResourceError, match="--max-memory-mib"):
        ledger.open(b"d")
    ledger.charge(b"a", "r", 30, "x")  # within a's reserve: always fits
    with pytest.raises(HelperResourceError, match="--max-memory-mib"):
        ledger.charge(b"a", "r2", 20, "x")  # 90 - 30 + 50 > 100
    with pytest.raises(HelperResourceError, match="--max-session-mib"):
        ledger.charge(b"b", "r", 61, "x")
    assert ledger.used() == 30 and ledger.reserved() == 90
    ledger.release(b"a", "r")
    ledger.close(b"c")
    ledger.charge(b"a", "r2", 40, "x")  # 40 + 30 <= 100 now
    assert ledger.reserved() == 70
    ledger.charge(b"gone", "r", 10**12, "x")  # a retired session holds nothing


def test_a_flood_of_open_rounds_is_refused_before_allocating_and_an_open_run_keeps_its_reserve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's 26 OpenRounds: S1 grew ~166 MB per open round, without bound."""
    svc = service(
        max_memory_bytes=256 * MIB,
        max_session_bytes=128 * MIB,
        session_reserve_bytes=16 * MIB,
        limits=HelperLimits(max_round_bytes=64 * MIB),
    )
    honest = InProcessHelper(svc)
    honest.open_session()  # the honest run is open before the flood
    allocated = [0]
    real_init = SSAServer.__init__

    def counting(self: SSAServer, *args: Any, **kw: Any) -> None:
        allocated[0] += 1
        real_init(self, *args, **kw)

    monkeypatch.setattr(SSAServer, "__init__", counting)
    opened, refusals, flooders = 0, [], []
    for _ in range(40):
        conn = InProcessHelper(svc)
        try:
            conn.open_session()
        except HelperResourceError as err:
            refusals.append(str(err))
            break
        flooders.append(conn)
        for rid in range(1, 5):
            try:
                conn.open_round(rid, big(rid))
                opened += 1
            except HelperResourceError as err:
                refusals.append(str(err))
    assert opened >= 4 and allocated[0] == opened  # nothing allocated for a refused round
    assert svc.memory.reserved() <= 256 * MIB
    assert any("--max-memory-mib" in r for r in refusals)
    # The honest run's rounds still open and aggregate: its reserve was never given away.
    for rid in (1, 2, 3):
        result, sums, _ = _aggregate(honest, rid, seed=rid)
        np.testing.assert_allclose(result.sums, sums, atol=1e-5)
    for conn in flooders:
        conn.close()
    assert svc.memory.used() == svc.memory.used(honest.session_id)


def test_round_and_key_charges_are_released() -> None:
    svc = service()
    conn = InProcessHelper(svc)
    params = make_params(1)  # epoch 1: S1 keeps the clients' keys
    clients = make_clients(3)
    conn.open_round(1, params.to_bytes())
    sid = conn.session_id
    round_charge = svc.memory.used(sid)
    assert round_charge > 0
    relay = [
        (c.cid, up.public_part, sealed)
        for c in clients
        for up, sealed in [upload_for(params, c, conn.public_key(), session=sid)]
    ]
    assert conn.add_clients(1, relay) == {}
    assert svc.memory.used(sid) == round_charge + 3 * key_bytes(params)
    conn.finish_round(1)
    assert svc.memory.used(sid) == 3 * key_bytes(params)  # the stored U-DPF keys only
    assert svc.memory._charges[sid] == {STORED_KEYS: 3 * key_bytes(params)}
    conn.open_round(2, params.to_bytes().replace(b'"round_id": 1', b'"round_id": 2'))
    conn.abort_round(2)
    assert svc.memory.used(sid) == 3 * key_bytes(params)
    conn.close()
    assert svc.memory.used() == 0 and svc.memory.reserved() == 0


def test_a_request_is_charged_while_it_runs() -> None:
    svc = service(
        max_memory_bytes=64 * MIB,
        max_session_bytes=8 * MIB,
        session_reserve_bytes=1 * MIB,
        limits=HelperLimits(max_round_bytes=4 * MIB),
    )
    conn = InProcessHelper(svc)
    conn.open_round(1, make_params(1).to_bytes())
    with pytest.raises(HelperResourceError, match=r"AddClients request .*--max-session-mib"):
        conn.add_clients(1, [(10, b"\0" * (3 * MIB), b"\0" * 64)])
    assert conn.add_clients(1, [(10, b"\0" * 64, b"\0" * 64)])  # small: rejected per client
    charges = svc.memory._charges[conn.session_id]
    assert not [key for key in charges if key[0] == "call"]  # released when the call ended


# ---- calls --------------------------------------------------------------------------------------


def test_a_session_runs_one_call_and_queues_at_most_one_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc = service(max_calls_per_session=2)
    conn = InProcessHelper(svc)
    params = make_params(1)
    conn.open_round(1, params.to_bytes())
    inside, release = threading.Event(), threading.Event()
    real_add = SSAServer.add_prepared  # S1's AddClients adds each client through it

    def blocking(self: SSAServer, *args: Any, **kw: Any) -> Any:
        inside.set()
        release.wait(60)
        return real_add(self, *args, **kw)

    monkeypatch.setattr(SSAServer, "add_prepared", blocking)
    client = make_clients(1)[0]
    up, sealed = upload_for(params, client, conn.public_key(), session=conn.session_id)
    results: list[Any] = []
    first = threading.Thread(
        target=lambda: results.append(conn.add_clients(1, [(client.cid, up.public_part, sealed)]))
    )
    first.start()
    assert inside.wait(60)
    second = threading.Thread(target=lambda: results.append(conn.abort_round(1)))
    second.start()  # waits for the session's lock
    for _ in range(1000):
        if svc._sessions[conn.session_id].calls == 2:
            break
        threading.Event().wait(0.01)
    with pytest.raises(HelperResourceError, match="--max-calls-per-session"):
        conn.finish_round(1)
    other = InProcessHelper(svc)
    other.open_round(1, params.to_bytes())  # another session is not held up
    other.abort_round(1)
    assert other.health().protocol_version == wire.VERSION
    release.set()
    first.join(60)
    second.join(60)
    assert results[0] == {} and len(results) == 2


# ---- the session table --------------------------------------------------------------------------


def _open(svc: HelperService, peer: str) -> bytes:
    response = svc.handle("OpenSession", wire.encode(wire.OpenSessionRequest()), peer=peer)
    return wire.decode(response, wire.SessionInfoResponse).session


def test_idle_sessions_cannot_lock_new_runs_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's 64 idle sessions that locked every new run out for six hours."""
    clock = [1000.0]
    monkeypatch.setattr("flwr_fsl.helper.service.time.monotonic", lambda: clock[0])
    svc = service()
    for i in range(64):  # from 4 addresses: one address holds at most 16
        _open(svc, f"ipv4:10.0.0.{i % 4}")
    assert svc.session_count() == 64
    with pytest.raises(HelperResourceError, match=r"64 sessions are open .*--max-sessions"):
        _open(svc, "ipv4:10.0.1.1")  # none idle long enough to evict yet
    clock[0] += 31  # every idle session may now be evicted for a new run
    fresh = InProcessHelper(svc)
    result, sums, _ = _aggregate(fresh, 1, seed=1)  # a new run gets a session and a round
    np.testing.assert_allclose(result.sums, sums, atol=1e-5)
    assert svc.session_count() == 64
    clock[0] += 200
    fresh.open_round(2, make_params(2).to_bytes())
    clock[0] += 101  # minutes, not hours: the idle ones expire (the others idle 332 s)
    fresh.abort_round(2)
    assert svc.session_count() == 1


def test_one_address_holds_at_most_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("flwr_fsl.helper.service.time.monotonic", lambda: clock[0])
    svc = service(max_sessions=8, max_sessions_per_peer=3)
    flood = [_open(svc, "ipv4:10.9.9.9") for _ in range(3)]
    with pytest.raises(HelperResourceError, match=r"from ipv4:10\.9\.9\.9 .*per-peer"):
        _open(svc, "ipv4:10.9.9.9")
    others = [_open(svc, f"ipv4:10.0.0.{i}") for i in range(5)]  # other addresses still fit
    assert svc.session_count() == 8
    clock[0] += 31
    _open(svc, "ipv4:10.9.9.9")  # evicts the address's own idlest session, nobody else's
    assert sum(s in svc._sessions for s in flood) == 2
    assert all(s in svc._sessions for s in others)


def test_idle_callers_are_evicted_before_a_run_between_rounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("flwr_fsl.helper.service.time.monotonic", lambda: clock[0])
    svc = service(
        max_sessions=8,
        max_memory_bytes=48 * MIB,
        max_session_bytes=32 * MIB,
        session_reserve_bytes=16 * MIB,
        limits=HelperLimits(max_round_bytes=16 * MIB),
    )
    run = InProcessHelper(svc)
    _aggregate(run, 1, seed=1)  # a run under way, now between two rounds
    clock[0] += 10
    idle_caller = _open(svc, "ipv4:10.0.0.9")  # opened, never used
    clock[0] += 40  # both idle past evict_idle_s; the run for longer
    _open(svc, "ipv4:10.0.0.8")
    _open(svc, "ipv4:10.0.0.7")  # a 4th reserve of 16 MiB does not fit: the idle caller goes
    assert idle_caller not in svc._sessions and run.session_id in svc._sessions
    clock[0] += 10
    with pytest.raises(HelperResourceError, match="new session"):
        _open(svc, "ipv4:10.0.0.6")  # only unused sessions give up their reserve for it ...
    assert run.session_id in svc._sessions  # ... never a run under way
    result, sums, _ = _aggregate(run, 2, seed=2)
    np.testing.assert_allclose(result.sums, sums, atol=1e-5)


def test_an_open_round_keeps_its_session_past_the_idle_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("flwr_fsl.helper.service.time.monotonic", lambda: clock[0])
    svc = service(max_sessions=2)
    training, done = InProcessHelper(svc), InProcessHelper(svc)
    training.open_round(1, make_params(1).to_bytes())  # clients train for a while
    done.open_session()
    clock[0] += 600  # 10 minutes without a call
    InProcessHelper(svc).open_session()  # sweeps: the idle session without a round expires
    with pytest.raises(HelperSessionLostError, match="expired"):
        done.open_round(1, make_params(1).to_bytes())
    training.abort_round(1)  # the training run's round is still open
    training.open_round(2, make_params(2).to_bytes())
    clock[0] += 3601  # an open round without any call for an hour: dropped too
    InProcessHelper(svc).health()
    with pytest.raises(HelperRequestError):
        InProcessHelper(svc).open_session()
        training.abort_round(2)


# ---- the CLI ------------------------------------------------------------------------------------


def _quota_of(argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ServiceLimits:
    seen: dict[str, Any] = {}

    class Recording(HelperService):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.update(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(helper_cli, "HelperService", Recording)
    key = str(tmp_path / "k.pem")
    assert helper_cli.main(["--key-file", key, "--generate-key", "--print-fingerprint", *argv]) == 0
    quota: ServiceLimits = seen["quota"]
    return quota


def test_cli_resource_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _quota_of([], monkeypatch, tmp_path) == ServiceLimits()
    flags = [
        "--max-memory-mib", "4096", "--max-session-mib", "1024", "--session-reserve-mib", "32",
        "--max-sessions", "10", "--max-sessions-per-peer", "3", "--max-open-rounds", "2",
        "--max-calls-per-session", "3", "--session-idle-s", "120", "--round-idle-s", "900",
        "--evict-idle-s", "15.5",
    ]  # fmt: skip
    assert _quota_of(flags, monkeypatch, tmp_path) == ServiceLimits(
        max_memory_bytes=4096 * MIB,
        max_session_bytes=1024 * MIB,
        session_reserve_bytes=32 * MIB,
        max_sessions=10,
        max_sessions_per_peer=3,
        max_open_rounds=2,
        max_calls_per_session=3,
        session_idle_s=120.0,
        round_idle_s=900.0,
        evict_idle_s=15.5,
    )
    capsys.readouterr()
    key = str(tmp_path / "k.pem")
    for flag, bad in (
        ("--max-memory-mib", "0"),
        ("--max-session-mib", "lots"),
        ("--max-sessions-per-peer", "-1"),
        ("--max-calls-per-session", "1.5"),
        ("--session-idle-s", "nan"),
        ("--round-idle-s", "0"),
        ("--evict-idle-s", "inf"),
        ("--workers", "0"),
    ):
        with pytest.raises(SystemExit) as info:
            helper_cli.main(["--key-file", key, "--open-enrollment", flag, bad])
        assert info.value.code == 2
        assert f"argument {flag}:" in capsys.readouterr().err
    for argv, named in (
        (["--session-reserve-mib", "4096"], "--session-reserve-mib .* --max-session-mib"),
        (["--max-memory-mib", "1024"], "--max-session-mib .* --max-memory-mib"),
        (["--max-session-mib", "512"], "--max-round-mib"),  # a 1 GiB round could never open
    ):
        assert helper_cli.main(["--key-file", key, "--open-enrollment", *argv]) == 2
        assert re.search(named, capsys.readouterr().err), argv


def test_a_busy_s1_refuses_session_calls_beyond_its_workers_but_not_health(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc = service()
    svc.max_calls = 1  # what start_server(max_workers=1) / --workers 1 sets
    conn = InProcessHelper(svc)
    params = make_params(1)
    conn.open_round(1, params.to_bytes())
    inside, release = threading.Event(), threading.Event()
    real_add = SSAServer.add_prepared  # S1's AddClients adds each client through it

    def blocking(self: SSAServer, *args: Any, **kw: Any) -> Any:
        inside.set()
        release.wait(60)
        return real_add(self, *args, **kw)

    monkeypatch.setattr(SSAServer, "add_prepared", blocking)
    client = make_clients(1)[0]
    up, sealed = upload_for(params, client, conn.public_key(), session=conn.session_id)
    thread = threading.Thread(
        target=conn.add_clients, args=(1, [(client.cid, up.public_part, sealed)])
    )
    thread.start()
    try:
        assert inside.wait(60)
        sessions = svc.session_count()
        with pytest.raises(HelperResourceError, match=r"S1 is busy: .*--workers"):
            InProcessHelper(svc).open_session()
        assert svc.session_count() == sessions  # the refused new session is not kept
        assert conn.health().protocol_version == wire.VERSION
    finally:
        release.set()
        thread.join(60)
