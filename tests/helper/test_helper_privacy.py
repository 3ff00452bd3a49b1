"""S1's own privacy account of each run (:mod:`flwr_fsl.helper.accounts`): kept per run id on
disk, so neither a restart of S1, nor a new session, nor a session S0 closes and re-opens under
the same id to replay a round resets it; S1 refuses rounds past the run's budget or its own
ceiling (``--dp-budget-epsilon``).

Issue 21 found the replay: with the account in the session, S0 re-opened the session, replayed
the same sealed uploads into the same round and averaged S1's fresh noise away (noise std 7.14
down to 0.073). Here every replay spends the run's account, and S1 refuses once it is spent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flwr_fsl.core.privacy import PrivacyAccount, PrivacyBudget
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.dp import DistributedDP, RunScope
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.helper import HelperLimits, InProcessHelper
from flwr_fsl.helper.accounts import ACCOUNTS_DIR
from flwr_fsl.helper.errors import HelperBudgetExhaustedError
from flwr_fsl.testing import InProcessGrid
from flwr_fsl.testing.helper_process import HelperProcess
from tests.families.ssa.test_index_strategy import K, initial, make_index_app
from tests.helper.test_helper import SID, fixed_ids, make_clients, make_params, sealed_uploads

DP = DistributedDP(1.0, clip_norm=1.0, max_weight=1.0)
# z = 1: three rounds spend epsilon 9.01, a fourth would spend 10.73.
BUDGET = PrivacyBudget(10.0, 1e-5)
RUN = RunScope("7", BUDGET)
NODES = 4


def dp_round(round_id: int, run: RunScope | None = RUN):  # type: ignore[no-untyped-def]
    return make_params(round_id, dp=DP, run=run, epoch=0)


def twin(state_dir: Path | None, **kwargs: object) -> InProcessHelper:
    limits = kwargs.pop("limits", HelperLimits(min_clients=1))
    return InProcessHelper(
        session_ids=fixed_ids(SID),
        limits=limits,  # type: ignore[arg-type]
        state_dir=state_dir,
        **kwargs,  # type: ignore[arg-type]
    )


def test_replays_into_a_reopened_session_are_refused_and_the_run_keeps_its_account(
    tmp_path: Path,
) -> None:
    # Issue 21: S0 used to close its session and re-open it under the same id, so S1 forgot
    # the closed rounds and the same sealed uploads opened again (fresh noise each time). S1
    # now draws every session id: the reopened session has another one, and uploads sealed
    # to the first never open in it.
    helper = twin(tmp_path)
    params = dp_round(1)
    clients = make_clients(3)
    uploads = sealed_uploads(params, clients, helper.public_key())  # bound to SID
    helper.open_round(1, params.to_bytes())
    assert helper.session_id == SID
    assert helper.add_clients(1, uploads) == {}
    helper.finish_round(1)
    helper.close_session()
    helper.open_session()
    assert helper.session_id != SID
    helper.open_round(1, params.to_bytes())
    rejected = helper.add_clients(1, uploads)
    assert sorted(rejected) == [c.cid for c in clients]
    assert all("authentication" in why for why in rejected.values())
    helper.abort_round(1)
    assert helper.service.accounts.rounds("run:7") == [1.0]
    # Honest rounds of the same run in new sessions spend the run's account, whatever the
    # session: two more rounds at z = 1, then S1 refuses.
    for rid in (2, 3):
        helper.open_session()
        p = dp_round(rid)
        helper.open_round(rid, p.to_bytes())
        fresh = sealed_uploads(p, clients, helper.public_key(), session=helper.session_id)
        assert helper.add_clients(rid, fresh) == {}
        helper.finish_round(rid)
    assert helper.service.accounts.rounds("run:7") == [1.0] * 3
    helper.open_session()
    with pytest.raises(HelperBudgetExhaustedError, match=r"the run's budget.*budget 10"):
        helper.open_round(4, dp_round(4).to_bytes())
    # Another run has its own account.
    helper.open_round(5, dp_round(5, RunScope("8", BUDGET)).to_bytes())


def test_s1_refuses_at_finish_when_concurrent_rounds_overrun_the_budget(tmp_path: Path) -> None:
    # Rounds 1..4 all open while the account is empty; S1 spends at FinishRound and refuses
    # the fourth there (and keeps nothing of it).
    helper = twin(tmp_path, limits=HelperLimits(min_clients=1))
    helper.open_session()
    clients = make_clients(2)
    for rid in (1, 2, 3, 4):
        helper.open_round(rid, dp_round(rid).to_bytes())
    for rid in (1, 2, 3, 4):
        params = dp_round(rid)
        helper.add_clients(rid, sealed_uploads(params, clients, helper.public_key()))
        if rid < 4:
            helper.finish_round(rid)
    with pytest.raises(HelperBudgetExhaustedError, match="budget 10"):
        helper.finish_round(4)
    assert helper.service.accounts.rounds("run:7") == [1.0] * 3
    assert 4 not in helper.service._sessions[SID].rounds


def test_the_operator_ceiling_caps_any_announced_budget(tmp_path: Path) -> None:
    # S0 announces a huge budget; S1's --dp-budget-epsilon 5 allows one round at z = 1.
    limits = HelperLimits(min_clients=1, dp_budget=PrivacyBudget(5.0))
    helper = twin(tmp_path, limits=limits)
    helper.open_session()
    generous = RunScope("9", PrivacyBudget(1e6))
    clients = make_clients(2)
    params = dp_round(1, generous)
    helper.open_round(1, params.to_bytes())
    helper.add_clients(1, sealed_uploads(params, clients, helper.public_key()))
    helper.finish_round(1)
    with pytest.raises(HelperBudgetExhaustedError, match="S1's ceiling"):
        helper.open_round(2, dp_round(2, generous).to_bytes())
    # A DP round naming no run is accounted under its session (and capped the same way).
    bare = dp_round(3, None)
    helper.open_round(3, bare.to_bytes())
    helper.add_clients(3, sealed_uploads(bare, clients, helper.public_key()))
    helper.finish_round(3)
    assert helper.service.accounts.rounds(f"session:{SID.hex()}") == [1.0]


def test_the_in_process_twin_restarted_on_the_same_state_dir_resumes(tmp_path: Path) -> None:
    key = SealingKeyPair.generate()
    first = twin(tmp_path, keypair=key)
    first.open_session()
    clients = make_clients(2)
    for rid in (1, 2):
        params = dp_round(rid)
        first.open_round(rid, params.to_bytes())
        first.add_clients(rid, sealed_uploads(params, clients, first.public_key()))
        first.finish_round(rid)
    files = list((tmp_path / ACCOUNTS_DIR).iterdir())
    assert len(files) == 1 and PrivacyAccount.decode(files[0].read_bytes()) == [1.0, 1.0]
    # "Restart": a new service on the same directory. One round is left of the run's budget.
    again = twin(tmp_path, keypair=key)
    again.open_session()
    params = dp_round(3)
    again.open_round(3, params.to_bytes())
    again.add_clients(3, sealed_uploads(params, clients, again.public_key()))
    again.finish_round(3)
    with pytest.raises(HelperBudgetExhaustedError):
        again.open_round(4, dp_round(4).to_bytes())
    # The same service without the directory (S1's state lost) would have started over.
    fresh = twin(tmp_path / "elsewhere", keypair=key)
    fresh.open_session()
    fresh.open_round(4, dp_round(4).to_bytes())


def test_the_real_helper_process_keeps_the_runs_account_across_a_restart(tmp_path: Path) -> None:
    # The S1 operator caps every run at epsilon 10 (three rounds at z = 1). A run spends two
    # rounds; S1 is killed and restarted with the same --state-dir; S0 comes back in the same
    # Flower run with a new session and no budget of its own: S1 allows one more round only.
    key_file = tmp_path / "s1.pem"
    SealingKeyPair.generate().save(key_file)
    state = tmp_path / "state"
    flags = ("--dp-budget-epsilon", "10")

    def run(proc: HelperProcess, rounds: int) -> SecureRowFedSubAvg:
        grid = InProcessGrid(
            make_index_app(True), NODES, {"ssa-helper-fingerprint": proc.fingerprint}
        )
        strategy = SecureRowFedSubAvg(
            proc.client(timeout=60),
            "emb",
            K,
            helper_fingerprint=proc.fingerprint,
            max_abs=1e3,
            min_available_nodes=NODES,
            fraction_evaluate=0.0,
            privacy_budget=None,
        )
        strategy.start(grid=grid, initial_arrays=initial(), num_rounds=rounds)
        return strategy

    first = HelperProcess(key_file, tmp_path / "s1-first.log", flags, state_dir=state)
    try:
        done = run(first, 2)
        assert sorted(done.rounds) == [1, 2] and done.failed_rounds == {}
    finally:
        first.proc.kill()
        first.stop()
    second = HelperProcess(key_file, tmp_path / "s1-second.log", flags, state_dir=state)
    try:
        again = run(second, 5)
    finally:
        second.stop()
    assert again.failed_rounds.keys() == {2}
    assert "HelperBudgetExhaustedError" in again.failed_rounds[2]
    assert sorted(again.rounds) == [1, 2]  # the run stopped before round 3
    files = list((state / ACCOUNTS_DIR).iterdir())
    assert len(files) == 1 and PrivacyAccount.decode(files[0].read_bytes()) == [1.0] * 3
