"""S1 restarts mid-run (issue 8: "services ... survive restarts of their peers").

S1 keeps a run's session — open rounds and stored U-DPF keys — in memory only. These tests
restart it between rounds and check what the issue asks for:

* rounds while S1 is down fail cleanly: the model is unchanged and no client is asked anything
  (neither a retrieval query nor a train message) in a round known to fail;
* the restarted S1 (same port, same key file) refuses the old session with
  :class:`~flwr_fsl.helper.HelperSessionLostError` instead of silently starting an empty one;
  S0 then forgets its stored U-DPF keys, announces none (``fsl.udpf.held`` absent), and every
  client sends fresh keys — nobody is excluded — and hints resume the round after;
* the final model equals the plaintext count-weighted result over the rounds that succeeded;
* a restarted S1 with another key file fails each round at its opening (S0 re-checks the pinned
  fingerprint after every lost session; nobody is asked anything, the model is unchanged, the
  run goes on) until S1 is back with the pinned key.

The first test runs a real ``flwr-fsl-helper`` process (killed with SIGKILL, restarted);
the others use the in-process S1 with its service replaced by a fresh one (what a restart
leaves) to pin the mechanism down: the LeadServer's recovery, a session lost mid-round, the
error on each transport, and top-k mode.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message

from flwr_fsl.core.errors import ConfigurationError, RoundFailedError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.families.ssa.protocol import can_send_hint
from flwr_fsl.families.ssa.records import UDPF_HELD_FIELD
from flwr_fsl.families.ssa.two_server import ClientUpload, LeadServer, SessionLostError
from flwr_fsl.helper import (
    HelperLimits,
    HelperRequestError,
    HelperService,
    HelperSessionLostError,
    HelperUnavailableError,
    InProcessHelper,
    wire,
)
from flwr_fsl.mods import ssa_mod, topk_mod
from flwr_fsl.strategies import SecureFedSubAvg
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.helper_process import HelperProcess
from tests.families.ssa.test_index_strategy import (
    ROWS,
    TABLE,
    K,
    client_rows,
    initial,
    make_index_app,
    no_floor,
    row_delta,
)
from tests.flower_apps import make_app, model_record
from tests.helper.test_helper import (
    Client,
    bind,
    expected_sums,
    hint_for,
    make_clients,
    make_params,
    open_rounds,
    twin,
    upload_for,
)

NODES = 4


# Unchecked rounds (round mechanics): S1 must allow them (its default floor refuses them).
UNCHECKED = ("--min-value-check", "off")


class Messages:
    """A client mod recording, per server round, each message's type and U-DPF announcement."""

    def __init__(self) -> None:
        self.seen: dict[int, list[tuple[str, bool]]] = defaultdict(list)

    def __call__(self, msg: Message, context: Context, call_next: Any) -> Message:
        config = msg.content.config_records.get("config")
        held = config is not None and UDPF_HELD_FIELD in config
        self.seen[int(msg.metadata.group_id)].append((msg.metadata.message_type, held))
        return call_next(msg, context)

    def types(self, server_round: int) -> list[str]:
        return sorted(t for t, _ in self.seen.get(server_round, []))

    def held_announced(self, server_round: int) -> list[bool]:
        return [h for t, h in self.seen.get(server_round, []) if t == "train"]


def plaintext_table(rounds: list[int]) -> np.ndarray:
    """The count-weighted table after exactly ``rounds`` (fixed row sets, one step each)."""
    table = TABLE.astype(np.float64)
    for rnd in rounds:
        num, den = np.zeros_like(table), np.zeros(ROWS)
        for pid in range(NODES):
            idx, counts = client_rows(pid, rnd, True)
            num[idx] += counts[:, None] * row_delta(pid, rnd, idx).astype(np.float32)
            den[idx] += counts
        touched = den > 0
        table[touched] += num[touched] / den[touched, None]
        table = table.astype(np.float32).astype(np.float64)
    return table


# ---- a real S1 process, killed and restarted mid-run -----------------------------------------


def test_index_mode_run_survives_a_restart_of_the_real_s1_process(tmp_path: Path) -> None:
    key_file = tmp_path / "s1.pem"
    SealingKeyPair.generate().save(key_file)
    procs = [HelperProcess(key_file, tmp_path / "s1-first.log", UNCHECKED)]
    port = procs[0].address.rsplit(":", 1)[1]
    fingerprint = procs[0].fingerprint
    helper = procs[0].client(timeout=60)
    messages = Messages()
    grid = InProcessGrid(
        make_index_app(True, mods=(messages,)),
        NODES,
        {"ssa-helper-fingerprint": fingerprint},
        node_config_fn=no_floor(NODES),
    )
    strategy = SecureRowFedSubAvg(
        helper,
        "emb",
        K,
        dp=None,  # exact tables: DP off on both ends
        udpf=True,
        helper_fingerprint=fingerprint,
        frac_bits=32,
        max_abs=1e3,
        min_available_nodes=NODES,
        weighted=True,  # per-row counts, as plaintext_table weights them
    )
    tables: dict[int, np.ndarray] = {}

    def between_rounds(rnd: int, arrays: Any) -> None:
        tables[rnd] = arrays["emb"].numpy().copy()
        if rnd == 2:  # S1 crashes after round 2 (SIGKILL: no clean shutdown)
            procs[-1].proc.kill()
            procs[-1].stop()
        if rnd == 3:  # ... and comes back on the same port with the same key file
            procs.append(  # the same state dir: the same access token
                HelperProcess(
                    key_file,
                    tmp_path / "s1-second.log",
                    ("--port", port, *UNCHECKED),
                    state_dir=procs[0].state_dir,
                )
            )
            assert procs[-1].address.endswith(f":{port}")
            assert procs[-1].fingerprint == fingerprint

    try:
        result = strategy.start(
            grid=grid, initial_arrays=initial(), num_rounds=5, evaluate_fn=between_rounds
        )
    finally:
        helper.close()
        for proc in procs:
            proc.stop()

    # Round 3 (S1 down) failed before any client was asked anything; the table is unchanged.
    assert list(strategy.failed_rounds) == [3]
    assert "HelperUnavailableError" in strategy.failed_rounds[3]
    assert messages.types(3) == [] and strategy.rounds[3].traffic == []
    np.testing.assert_array_equal(tables[3], tables[2])
    # Every other round: everyone retrieved, trained and was aggregated; nobody was dropped.
    for rnd in (1, 2, 4, 5):
        assert messages.types(rnd) == ["query.psr"] * NODES + ["train"] * NODES, rnd
        assert not strategy.dropped[rnd], strategy.dropped[rnd]
    # The restarted S1 held no keys: S0 noticed at round 4's opening, announced none, and the
    # clients sent fresh keys; round 5 hints again against the keys of round 4.
    assert strategy.aggregation.lead.session_losses == [4]
    assert [messages.held_announced(r) for r in (1, 2, 4, 5)] == [
        [False] * NODES,
        [True] * NODES,
        [False] * NODES,
        [True] * NODES,
    ]
    udpf = [result.train_metrics_clientapp[r]["udpf-clients"] for r in (1, 2, 4, 5)]
    assert udpf == [0, NODES, 0, NODES]
    # Secure == plaintext over the rounds that succeeded.
    np.testing.assert_allclose(
        result.arrays["emb"].numpy(), plaintext_table([1, 2, 4, 5]), atol=1e-6
    )
    assert procs[0].proc.returncode == -9  # the first S1 was killed, not shut down


def test_first_call_after_a_restart_reaches_s1_at_once(tmp_path: Path) -> None:
    # gRPC keeps a channel that failed to connect in reconnect backoff (growing to minutes):
    # without a fresh channel the first rounds after S1 is back would still fail.
    key_file = tmp_path / "s1.pem"
    SealingKeyPair.generate().save(key_file)
    first = HelperProcess(key_file, tmp_path / "a.log", UNCHECKED)
    port = first.address.rsplit(":", 1)[1]
    client = first.client(timeout=30)
    try:
        client.open_round(1, make_params(1).to_bytes())
        first.proc.kill()
        first.stop()
        for _ in range(4):  # a few failed calls: the old channel's backoff grows
            with pytest.raises(HelperUnavailableError):
                client.health()
        with HelperProcess(
            key_file, tmp_path / "b.log", ("--port", port, *UNCHECKED), state_dir=first.state_dir
        ):
            client.health()  # the first call succeeds
            # The old session is gone, and S1 says so (gRPC NOT_FOUND), not "round not open".
            with pytest.raises(HelperSessionLostError, match="S1 restarted"):
                client.open_round(2, make_params(2).to_bytes())
            client.open_session()
            client.open_round(2, make_params(2).to_bytes())
            client.abort_round(2)  # the round is open on the new session
    finally:
        client.close()


# ---- the mechanism, with the in-process S1 ------------------------------------------------------


class RestartableHelper(InProcessHelper):
    """The in-process S1 that can go down and restart (a fresh service: no sessions, no keys)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.down = False
        self.calls: list[tuple[str, HelperService]] = []  # (method, the S1 that got it)

    def restart(self) -> None:
        self.service = HelperService(self.service.keypair, limits=self.service.limits)

    def _transport(self, method: str, body: bytes) -> bytes:
        if self.down:
            raise HelperUnavailableError(f"S1 is down ({method})")
        self.calls.append((method, self.service))
        return super()._transport(method, body)


def _client_round(
    lead: LeadServer, round_id: int, clients: list[Client], pub: bytes
) -> tuple[dict[int, ClientUpload], int]:
    """What each client sends after S0 opened the round: a hint only against announced keys."""
    params = make_params(round_id)
    lead.open(params)
    binding = bind(params, lead.session_id)  # S1 drew the session id; clients bind to it
    uploads: dict[int, ClientUpload] = {}
    hints = 0
    for c in clients:
        c.values = np.random.default_rng([round_id, c.cid]).uniform(-1, 1, c.values.shape)
        if can_send_hint(c.state, params, c.idx, lead.held(c.cid)):
            rng = np.random.default_rng(c.cid)
            _, hint, sealed = hint_for(params, c, pub, rng=rng, binding=binding)
            uploads[c.cid] = ClientUpload(hint=hint, sealed=sealed)
            hints += 1
        else:
            upload, sealed = upload_for(
                params, c, pub, epoch_seed=round_id, session=lead.session_id
            )
            uploads[c.cid] = ClientUpload(upload.public_part, upload.master_seeds[0], sealed)
        lead.check_upload(params, c.cid, uploads[c.cid], accept_hints=True)
    return uploads, hints


def _assert_exact(lead: LeadServer, round_id: int, uploads: dict, clients: list[Client]) -> None:
    outcome = lead.aggregate(make_params(round_id), uploads)
    assert outcome.rejected == {} and sorted(outcome.accepted) == sorted(c.cid for c in clients)
    sums, counts = expected_sums(clients)
    np.testing.assert_allclose(outcome.result.sums, sums, atol=len(clients) * 2.0**-24)
    np.testing.assert_array_equal(outcome.result.counts, counts)


def test_lead_server_forgets_keys_when_s1_lost_the_session_and_nobody_is_excluded() -> None:
    helper = RestartableHelper(limits=HelperLimits(min_clients=1))
    lead = LeadServer(helper, min_clients=2)
    pub = lead.helper_key()
    clients = make_clients(3)
    for rnd, expect_hints in ((1, 0), (2, 3)):
        uploads, hints = _client_round(lead, rnd, clients, pub)
        assert hints == expect_hints
        _assert_exact(lead, rnd, uploads, clients)
    assert all(lead.held(c.cid) is not None for c in clients)

    helper.restart()
    uploads, hints = _client_round(lead, 3, clients, pub)
    # S0 learnt at the round's opening that S1 lost the session: it holds no keys for anyone,
    # announces none, and every client sends fresh keys (a hint could only be rejected).
    assert lead.session_losses == [3] and lead.stored_keys == {}
    assert hints == 0 and all(lead.held(c.cid) is None for c in clients)
    _assert_exact(lead, 3, uploads, clients)
    uploads, hints = _client_round(lead, 4, clients, pub)
    assert hints == 3  # hints resume against round 3's keys
    _assert_exact(lead, 4, uploads, clients)
    assert lead.session_losses == [3]


def test_a_session_lost_mid_round_fails_that_round_and_the_next_one_recovers() -> None:
    helper = RestartableHelper(limits=HelperLimits(min_clients=1))
    lead = LeadServer(helper)
    pub = lead.helper_key()
    clients = make_clients(3)
    uploads, _ = _client_round(lead, 1, clients, pub)
    _assert_exact(lead, 1, uploads, clients)
    uploads, hints = _client_round(lead, 2, clients, pub)
    assert hints == 3
    helper.restart()  # after S0 opened round 2, before it relays the uploads
    with pytest.raises(SessionLostError) as info:
        lead.aggregate(make_params(2), uploads)
    assert isinstance(info.value, RoundFailedError)  # the strategy fails the round
    assert lead.abort(2) is not None  # nothing to release on S1: reported, not raised
    # S0's keys are still round 1's (the failed round moved nothing); the next opening
    # finds the session gone and forgets them, so round 3 is all fresh keys and exact.
    uploads, hints = _client_round(lead, 3, clients, pub)
    assert lead.session_losses == [3] and hints == 0
    _assert_exact(lead, 3, uploads, clients)


def test_session_lost_is_the_same_error_on_both_transports(tmp_path: Path) -> None:
    key = SealingKeyPair.generate()
    key_file = tmp_path / "s1.pem"
    key.save(key_file)
    service = HelperService(key)
    local = InProcessHelper(service)
    with HelperProcess(key_file, tmp_path / "s1.log", UNCHECKED) as proc:
        remote = proc.client(timeout=30)
        for conn in (local, remote):
            conn.open_round(1, make_params(1).to_bytes())  # a connection opens its session
            conn.close_session()
            with pytest.raises(HelperSessionLostError, match="unknown session") as info:
                conn.abort_round(1)
            assert isinstance(info.value, HelperRequestError)  # callers that caught it still do
            assert isinstance(info.value, SessionLostError)
            # The connection does not paper over the loss: its next round fails the same way,
            # until S0 opens a new session (a new id).
            with pytest.raises(HelperSessionLostError):
                conn.open_round(2, make_params(2).to_bytes())
            lost = conn.session_id
            conn.open_session()
            assert conn.session_id != lost
            conn.open_round(2, make_params(2).to_bytes())
            conn.abort_round(2)
        remote.close()
    local.close()
    # OpenRound does not create a session behind S0's back: only OpenSession does.
    request = wire.encode(wire.OpenRoundRequest(bytes(16), 1, make_params(1).to_bytes()))
    with pytest.raises(HelperSessionLostError):
        service.handle("OpenRound", request)
    assert service.session_count() == 0


def test_topk_round_while_s1_is_down_asks_nobody_to_train_and_restart_recovers() -> None:
    key = SealingKeyPair.generate()
    helper = RestartableHelper(keypair=key)
    messages = Messages()
    run_config = {"ssa-helper-fingerprint": key.fingerprint, "topk-error-feedback": False}
    grid = InProcessGrid(make_app([messages, ssa_mod, topk_mod]), 3, run_config)
    strategy = SecureFedSubAvg(
        helper,
        topk_ratio=0.2,
        helper_fingerprint=key.fingerprint,
        min_available_nodes=3,
        fraction_evaluate=0.0,
    )
    models: dict[int, dict[str, np.ndarray]] = {}

    def between_rounds(rnd: int, arrays: Any) -> None:
        models[rnd] = {k: v.numpy().copy() for k, v in arrays.items()}
        helper.down = rnd == 1  # down during round 2
        if rnd == 2:
            helper.restart()

    strategy.start(
        grid=grid, initial_arrays=model_record(), num_rounds=3, evaluate_fn=between_rounds
    )
    assert list(strategy.failed_rounds) == [2]
    assert "HelperUnavailableError" in strategy.failed_rounds[2]
    assert messages.types(2) == []  # round 1's key was cached: S0 still checked S1 first
    for name, value in models[1].items():
        np.testing.assert_array_equal(models[2][name], value)
    assert messages.types(3) == ["train"] * 3 and not strategy.dropped[3]
    assert strategy.aggregation.lead.session_losses == [3]
    assert any(not np.array_equal(models[3][n], models[2][n]) for n in models[2])


def test_a_connection_opens_its_session_once_and_never_recreates_it_silently() -> None:
    # Direct users of a connection (tests, notebooks) keep working: the first open_round of a
    # connection opens its session, a later one after a restart does not.
    conn = twin()
    conn.open_round(1, make_params(1).to_bytes())
    assert conn.service.session_count() == 1
    conn.service = HelperService(conn.service.keypair)
    with pytest.raises(HelperSessionLostError):
        conn.open_round(2, make_params(2).to_bytes())
    assert conn.service.session_count() == 0


def test_s1_back_with_another_key_fails_each_round_until_the_pinned_key_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # S1 restarts with another key file after round 1 and with the pinned one after round 3.
    # S0 re-fetches S1's key after each lost session and checks it against the pin: rounds 2
    # and 3 fail before any client is asked anything (nobody seals material to the unpinned
    # key or trains), the model is unchanged, the failure is logged naming both
    # fingerprints, and the run goes on; round 4 (the pinned key again) trains everyone.
    key, other = SealingKeyPair.generate(), SealingKeyPair.generate()
    helper = RestartableHelper(keypair=key)
    messages = Messages()
    run_config = {"ssa-helper-fingerprint": key.fingerprint, "topk-error-feedback": False}
    grid = InProcessGrid(make_app([messages, ssa_mod, topk_mod]), 3, run_config)
    strategy = SecureFedSubAvg(
        helper,
        topk_ratio=0.2,
        helper_fingerprint=key.fingerprint,
        min_available_nodes=3,
        fraction_evaluate=0.0,
    )
    models: dict[int, dict[str, np.ndarray]] = {}
    impostor = HelperService(other)

    def between_rounds(rnd: int, arrays: Any) -> None:
        models[rnd] = {k: v.numpy().copy() for k, v in arrays.items()}
        if rnd == 1:
            helper.service = impostor  # restarted with another key file
        if rnd == 3:
            helper.service = HelperService(key)  # restarted with the pinned key file

    with caplog.at_level(logging.ERROR):
        result = strategy.start(
            grid=grid, initial_arrays=model_record(), num_rounds=4, evaluate_fn=between_rounds
        )
    lead = strategy.aggregation.lead
    assert list(strategy.failed_rounds) == [2, 3]
    for rnd in (2, 3):
        reason = strategy.failed_rounds[rnd]
        assert reason.startswith("HelperKeyMismatchError: S1's public key fingerprint mismatch")
        assert other.fingerprint in reason and key.fingerprint in reason
        assert messages.types(rnd) == [] and strategy.rounds[rnd].traffic == []
        for name, value in models[1].items():
            np.testing.assert_array_equal(models[rnd][name], value)
    assert caplog.text.count("fingerprint mismatch") >= 2, caplog.text
    # The impostor was asked for its key and a session, never for a round or a client's
    # material (its OpenCheckedRound of round 2 was refused: it did not know the session).
    asked = [m for m, service in helper.calls if service is impostor]
    assert set(asked) == {"OpenCheckedRound", "OpenSession", "PublicKey"}, asked
    assert asked.count("OpenCheckedRound") == 1
    assert open_rounds(InProcessHelper(impostor)) == ()
    # S0 noticed each restart at the next round's opening; rounds 2 and 3 failed on the key.
    assert lead.session_losses == [2, 4] and lead.key_mismatches == [2, 3]
    assert messages.types(4) == ["train"] * 3 and not strategy.dropped[4]
    assert any(not np.array_equal(models[4][n], models[3][n]) for n in models[3])
    assert sorted(result.train_metrics_clientapp) == [1, 4]


def test_a_wrong_pin_at_the_first_contact_is_a_configuration_error() -> None:
    # Before S1's key ever matched, a mismatch is a bad setting (wrong pin or address): the
    # run stops before round 1, naming the setting, and no client is asked anything.
    helper = RestartableHelper(keypair=SealingKeyPair.generate())
    pinned = SealingKeyPair.generate().fingerprint
    messages = Messages()
    grid = InProcessGrid(make_app([messages, ssa_mod, topk_mod]), 3, {})
    strategy = SecureFedSubAvg(
        helper, topk_ratio=0.2, helper_fingerprint=pinned, min_available_nodes=3
    )
    with pytest.raises(ConfigurationError, match=r"ssa-helper-fingerprint.*does not match"):
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=2)
    assert messages.seen == {}
    assert helper.service.session_count() == 0  # no round opened on the unverified S1
