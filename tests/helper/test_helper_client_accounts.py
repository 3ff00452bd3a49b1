"""S1's per-client privacy accounts (:mod:`flwr_fsl.helper.client_accounts`): every DP round S1
returns a share of is spent on each accepted signer's own account, across runs, sessions and
restarts (on disk); with ``--dp-client-budget-epsilon`` S1 refuses, per client, one a round would
take past it. This closes "a deviating S0 starts a fresh run and gets a fresh budget"."""

from __future__ import annotations

from pathlib import Path

import pytest

from flwr_fsl.core.privacy import PrivacyBudget
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.ssa.dp import DistributedDP, RunScope
from flwr_fsl.helper import HelperLimits, HelperRequestError, HelperService, InProcessHelper
from flwr_fsl.helper.cli import main
from flwr_fsl.helper.client_accounts import CLIENT_ACCOUNTS_DIR
from tests.helper.test_helper import make_clients, make_params, sealed_uploads, signer_of

DP = DistributedDP(1.0, clip_norm=1.0, max_weight=1.0)
# z = 1: three rounds spend epsilon 9.01 at delta 1e-5, a fourth would spend 10.73.
CEILING = PrivacyBudget(10.0, 1e-5)
GENEROUS = PrivacyBudget(1e6, 1e-5)  # what a deviating S0 announces for each fresh run


def service(state_dir: Path, key: SealingKeyPair, ceiling: PrivacyBudget | None = CEILING):  # type: ignore[no-untyped-def]
    limits = HelperLimits(min_clients=1, dp_client_budget=ceiling)
    return HelperService(key, limits=limits, state_dir=state_dir)


def run_round(helper: InProcessHelper, run: str, rid: int, clients: list) -> dict[int, str]:  # type: ignore[type-arg]
    params = make_params(rid, dp=DP, run=RunScope(run, GENEROUS), epoch=0)
    helper.open_round(rid, params.to_bytes())
    rejected = helper.add_clients(
        rid, sealed_uploads(params, clients, helper.public_key(), helper.session_id)
    )
    helper.finish_round(rid)
    return rejected


def test_a_fresh_run_is_no_fresh_budget_for_a_client(tmp_path: Path) -> None:
    key = SealingKeyPair.generate()
    a, b, c = make_clients(3)
    helper = InProcessHelper(service(tmp_path, key))
    for rid in (1, 2, 3):  # a and b spend three rounds (eps 9.01) in run A; c one
        assert run_round(helper, "A", rid, [a, b, c] if rid == 1 else [a, b]) == {}
    accounts = helper.service.client_accounts
    assert accounts.rounds(signer_of(a.cid).public_bytes) == [1.0] * 3
    assert accounts.rounds(signer_of(c.cid).public_bytes) == [1.0]
    assert 9.0 < accounts.epsilon(signer_of(a.cid).public_bytes, 1e-5) < 9.1
    # S0 starts a fresh run (new run id, a budget of its choosing); S1 restarted (sessions lost)
    # on the same state directory in between.
    again = InProcessHelper(service(tmp_path, key))
    rejected = run_round(again, "B", 1, [a, b, c])
    assert set(rejected) == {a.cid, b.cid}
    assert "per-client ceiling (flwr-fsl-helper --dp-client-budget-epsilon)" in rejected[a.cid]
    assert again.service.client_accounts.rounds(signer_of(c.cid).public_bytes) == [1.0] * 2
    assert len(list((tmp_path / CLIENT_ACCOUNTS_DIR).iterdir())) == 3


def test_without_a_ceiling_s1_keeps_the_accounts_and_refuses_nobody(tmp_path: Path) -> None:
    helper = InProcessHelper(service(tmp_path, SealingKeyPair.generate(), ceiling=None))
    clients = make_clients(2)
    for rid in range(1, 6):
        assert run_round(helper, "A", rid, clients) == {}
    assert (
        helper.service.client_accounts.rounds(signer_of(clients[0].cid).public_bytes) == [1.0] * 5
    )
    # Rounds without DP spend nothing.
    plain = make_params(6)
    helper.open_round(6, plain.to_bytes())
    helper.add_clients(6, sealed_uploads(plain, clients, helper.public_key(), helper.session_id))
    helper.finish_round(6)
    assert len(helper.service.client_accounts.rounds(signer_of(clients[0].cid).public_bytes)) == 5


def test_cli_client_budget_flags(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    key = SealingKeyPair.generate().save(tmp_path / "s1.pem")
    base = ["--key-file", str(key), "--print-fingerprint"]
    # Unset, both ceilings are the strategies' default budget (epsilon 20).
    assert main([*base, "--dp-client-budget-delta", "1e-6"]) == 0
    out = capsys.readouterr().out
    assert "ceiling per enrolled client, across runs: epsilon <= 20 at delta 1e-06" in out
    assert "DP budget ceiling per run: epsilon <= 20 at delta 1e-05" in out
    assert main([*base, "--dp-client-budget-epsilon", "8"]) == 0
    assert "ceiling per enrolled client, across runs: epsilon <= 8" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main([*base, "--dp-client-budget-epsilon", "-1"])


def test_a_client_overrun_between_admission_and_finish_drops_the_round(tmp_path: Path) -> None:
    # Two open rounds admit the same client while its account holds two rounds (as two
    # sessions could); the first to finish spends the third; the second is refused at
    # FinishRound and spends nothing, on the client's account or the run's.
    key = SealingKeyPair.generate()
    shared = service(tmp_path, key)
    a = make_clients(1)[0]
    first = InProcessHelper(shared)
    for rid in (1, 2):
        assert run_round(first, "A", rid, [a]) == {}
    x = InProcessHelper(shared)  # rounds 3 and 4 open at once
    p3 = make_params(3, dp=DP, run=RunScope("A", GENEROUS), epoch=0)
    p4 = make_params(4, dp=DP, run=RunScope("A", GENEROUS), epoch=0)
    for p in (p3, p4):
        x.open_round(p.round_id, p.to_bytes())
        assert x.add_clients(p.round_id, sealed_uploads(p, [a], x.public_key(), x.session_id)) == {}
    x.finish_round(3)
    with pytest.raises(HelperRequestError, match="per-client ceiling"):
        x.finish_round(4)
    assert shared.client_accounts.rounds(signer_of(a.cid).public_bytes) == [1.0] * 3
    assert shared.accounts.rounds("run:A") == [1.0] * 3  # the refused round spent nothing
