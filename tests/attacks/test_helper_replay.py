"""Issue 21: S0 replays honest uploads into a reopened session of a real ``flwr-fsl-helper``.

The attack (issue 21, "Replays"): S0 closed its session and re-opened it under the same id, S1
forgot the session's closed rounds, and the same sealed uploads opened again; each replay gave
S0 one more share over the same clients (fresh S1 noise each time), and three pairs gave a
victim's rows exactly; against S1's DP floor, 10,000 replays averaged the noise away.

Here the curious S0 is the real strategy (:class:`~flwr_fsl.strategies.SecureFedSubAvg` with the
real mods on :class:`~flwr_fsl.testing.InProcessGrid`) talking to a real S1 process started with
its defaults (a generated access token). It records the honest uploads of a round (what it
legitimately relays), then deviates: closes its session, tries to reopen the same id, and
replays the uploads into fresh sessions, into the same round and into another round.

Baseline: the attack needs at least two shares of S1 over the same uploads; S0 obtains none.
S1 draws session ids (``OpenSession`` carries no id), so a reopened session always has a new
one; the uploads are sealed to the old one and never open in it (every client is rejected for
authentication, so S1's share of the replayed round is over no client), and the closed id
answers nothing, even with its secret.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import grpc
import pytest

from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.protocol import SSAServer
from flwr_fsl.families.ssa.two_server import LeadServer, SSARound
from flwr_fsl.helper import HelperClient, HelperRequestError, HelperSessionLostError, wire
from flwr_fsl.mods import ssa_mod, topk_mod
from flwr_fsl.strategies import SecureFedSubAvg
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.helper_process import HelperProcess
from tests.attacks.test_helper_outsider import raw_call
from tests.flower_apps import make_app, model_record

NODES = 3
REPLAYS = 5


def _honest_round(proc: HelperProcess, helper: HelperClient) -> tuple[Any, list, bytes]:
    """One honest round of the real strategy; return its parameters, relayed uploads, session."""
    grid = InProcessGrid(
        make_app([ssa_mod, topk_mod]),
        NODES,
        {"ssa-helper-fingerprint": proc.fingerprint, "topk-error-feedback": False},
    )
    strategy = SecureFedSubAvg(helper, topk_ratio=0.2, min_available_nodes=NODES)
    lead: LeadServer = strategy.aggregation.lead
    seen: list[tuple[Any, dict, bytes]] = []
    real = lead.aggregate

    def spy(params: Any, uploads: Any) -> SSARound:
        items = list(uploads.items() if hasattr(uploads, "items") else uploads)
        seen.append((params, dict(items), lead.session_id))  # what S0 legitimately holds
        return real(params, items)

    lead.aggregate = spy  # type: ignore[method-assign]
    strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert strategy.failed_rounds == {} and len(seen) == 1
    params, uploads, session = seen[0]
    assert len(uploads) == NODES and all(u.hint is None for u in uploads.values())
    # S0's own key-check digest of each upload: what a checked round's relay carries.
    s0 = SSAServer(params, 0)
    relay = [
        (cid, u.public_part, u.sealed, s0.add_client(cid, u.public_part, u.master_seed))
        for cid, u in sorted(uploads.items())
    ]
    return params, relay, session


def test_replays_after_close_and_reopen_give_s0_no_share(tmp_path: Path) -> None:
    key_file = tmp_path / "s1.pem"
    SealingKeyPair.generate().save(key_file)
    with HelperProcess(key_file, tmp_path / "s1.log", state_dir=tmp_path / "state") as proc:
        helper = proc.client(timeout=60)
        try:
            params, relay, first = _honest_round(proc, helper)
            rid = params.round_id
            # Within the session: the round cannot be reopened, nor its material moved.
            with pytest.raises(HelperRequestError, match="already opened"):
                helper.open_round(rid, params.to_bytes())
            secret = helper._secret
            helper.close_session()
            # "Reopen under the same id": OpenSession has no id to name (the v3 body is
            # malformed now), and the closed id answers nothing, even with its secret.
            v3_body = wire.encode(wire.OpenSessionRequest()) + first
            with grpc.insecure_channel(proc.address) as channel:
                call = channel.unary_unary(f"/{wire_service()}/OpenSession")
                with pytest.raises(grpc.RpcError) as info:
                    call(v3_body, timeout=30, metadata=[("x-flwr-fsl-token", proc.token or "")])
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
            reopen = wire.OpenRoundRequest(first, rid, params.to_bytes())
            code, details = raw_call(
                proc.address, "OpenRound", reopen, token=proc.token, secret=secret
            )
            assert code == grpc.StatusCode.NOT_FOUND and "single-use" in str(details)
            # Replays into fresh sessions: a new id each time; every upload is refused.
            shares, sessions = 0, {first}
            for _ in range(REPLAYS):
                helper.open_session()
                assert helper.session_id not in sessions
                sessions.add(helper.session_id)
                helper.open_round(rid, params.to_bytes())
                answers = helper.add_checked(rid, relay, hints=False)
                rejected = {c: why for c, why in answers.items() if isinstance(why, str)}
                assert sorted(rejected) == [cid for cid, _, _, _ in relay]
                assert all("authentication" in why for why in rejected.values()), rejected
                ids, _ = helper.finish_round(rid)  # a share over nobody: nothing of anyone
                shares += bool(ids)
                helper.close_session()
            assert shares == 0  # the attack needs >= 2 shares over the same uploads
        finally:
            helper.close()
        with pytest.raises(HelperSessionLostError, match="closed"):
            helper._channel = helper._new_channel()
            helper.open_round(rid + 1, params.to_bytes())


def wire_service() -> str:
    """The gRPC service name (kept here so the raw call above reads like the wire)."""
    from flwr_fsl.helper.service import SERVICE_NAME

    return SERVICE_NAME


def test_a_forged_v3_open_session_body_is_malformed() -> None:
    # The replay named its session in OpenSession; that body no longer parses.
    v3 = wire.MAGIC + struct.pack("<BBH", wire.VERSION, int(wire.Kind.OPEN_SESSION), 0)
    with pytest.raises(wire.WireFormatError, match="trailing"):
        wire.decode(v3 + bytes(16), wire.OpenSessionRequest)
