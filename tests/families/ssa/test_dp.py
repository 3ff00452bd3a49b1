"""Distributed DP for two-server SSA (:mod:`flwr_fsl.families.ssa.dp`): the zCDP cross-check
formulas against the RDP account in use, sensitivity, validation, the run scope in the
parameters, the CSPRNG Gaussian, client clipping, each server's noise (S0's in
:class:`LeadServer`, S1's in ``FinishRound`` through the in-process twin, S1 refusing a round
below its floor, S1's CLI flags) and the differencing attack with DP on."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from flwr_fsl.core.errors import ClientInputError, ConfigurationError, RoundFailedError
from flwr_fsl.core.privacy import PrivacyAccount, PrivacyBudget
from flwr_fsl.crypto.discrete_gaussian import exponential
from flwr_fsl.crypto.fixedpoint import FixedPoint, FixedPointOverflowError
from flwr_fsl.crypto.prg import PRGStream
from flwr_fsl.families.ssa import dp as dpmod
from flwr_fsl.families.ssa.dp import (
    DistributedDP,
    RunScope,
    check_headroom,
    clip_update,
    epsilon,
    gaussian,
    noise_std,
    noise_words,
    sensitivity,
    suppress_small_counts,
    zcdp_rho,
    zcdp_to_epsilon,
)
from flwr_fsl.families.ssa.protocol import SSAParams, SSAServer, payload_words
from flwr_fsl.families.ssa.two_server import LeadServer
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.helper.cli import _dp_budget, _dp_policy, _parser, default_state_dir, main
from flwr_fsl.helper.errors import HelperRequestError
from flwr_fsl.helper.limits import HelperLimits
from tests.families.ssa.test_two_server import fresh_uploads
from tests.helper.test_helper import SID, Client, _key, fixed_ids, make_params

DP = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, max_weight=1.0, delta=1e-5)


def stream(seed: int) -> PRGStream:
    return PRGStream(seed.to_bytes(16, "little"))


def twin(policy: DistributedDP | None = None) -> InProcessHelper:
    return InProcessHelper(
        session_ids=fixed_ids(SID), limits=HelperLimits(min_clients=1, dp=policy)
    )


def clients_of(m: int, k: int, width: int, n: int, seed: int = 0) -> list[Client]:
    rng = np.random.default_rng(seed)
    return [
        Client(
            cid=10 + c,
            idx=rng.choice(m, k, replace=False),
            values=rng.uniform(-1, 1, size=(k, width)),
            weight=float(c + 1),
        )
        for c in range(n)
    ]


def clipped_plaintext(params: SSAParams, clients: list[Client]) -> tuple[np.ndarray, np.ndarray]:
    """Per element sum of clipped ``c * dw`` and clipped ``c``: what the noise is added to."""
    assert params.dp is not None
    sums = np.zeros((params.domain_size, params.value_width))
    counts = np.zeros(params.domain_size)
    for c in clients:
        v, w = clip_update(c.values, np.full(len(c.idx), c.weight), params.dp)
        sums[c.idx] += w[:, None] * v
        counts[c.idx] += w
    return sums, counts


# ---- accounting ---------------------------------------------------------------------------------


def test_accounting_known_values() -> None:
    # Direct formulas, written out independently of the module.
    for z, rounds, delta in [(1.0, 1, 1e-5), (0.8, 50, 1e-6), (4.0, 1000, 1e-5)]:
        rho = rounds / (2 * z * z)
        expected = rho + 2 * math.sqrt(rho * math.log(1 / delta))
        assert epsilon(z, rounds, delta) == pytest.approx(expected, rel=1e-12)
    assert epsilon(1.0, 1, 1e-5) == pytest.approx(0.5 + 2 * math.sqrt(0.5 * math.log(1e5)))
    assert epsilon(1.0, 1, 1e-5) == pytest.approx(5.2986, abs=1e-4)
    assert epsilon(2.0, 0, 1e-5) == 0.0
    assert zcdp_rho(2.0) == 0.125 and math.isinf(zcdp_rho(0.0))
    assert math.isinf(zcdp_to_epsilon(math.inf, 1e-5))
    # The account in use (RDP, dp-accounting) never exceeds the zCDP conversion of the same
    # rounds, and is within its slack: the formula above is the cross-check.
    account = PrivacyAccount()
    assert account.epsilon() == 0.0
    for z in (1.0, 2.0, 0.5):
        account.spend(z)
    assert account.rounds == 3 and "3 round(s)" in account.describe()
    zcdp = zcdp_to_epsilon(0.5 + 0.125 + 2.0, 1e-5)
    assert 0.6 * zcdp < account.epsilon() <= zcdp
    with pytest.raises(ConfigurationError, match="rounds"):
        epsilon(1.0, -1, 1e-5)
    with pytest.raises(ConfigurationError, match="delta"):
        zcdp_to_epsilon(1.0, 1.0)


def test_sensitivity_known_values_scalar_and_rows() -> None:
    dp = DistributedDP(1.0, clip_norm=3.0, max_weight=2.0)
    # Scalar mode: k coordinates, one value and one count word each.
    assert sensitivity(dp, 4, 1, 24) == pytest.approx(2 * math.sqrt(9 + 4) + 2**-24 * math.sqrt(8))
    # Row mode: width only enters through the rounding term; one count word per row.
    assert sensitivity(dp, 4, 16, 10) == pytest.approx(
        2 * math.sqrt(9 + 4) + 2**-10 * math.sqrt(4 * 17)
    )
    assert noise_std(dp, 4, 1, 24) == sensitivity(dp, 4, 1, 24)
    assert noise_std(dp, 4, 1, 24, noise_multiplier=3.0) == 3 * sensitivity(dp, 4, 1, 24)


def test_the_sensitivity_bounds_a_clipped_clients_contribution() -> None:
    # Worst cases against the bound: a client at the weight bound, its norm at the clip.
    dp = DistributedDP(1.0, clip_norm=2.0, max_weight=5.0)
    rng = np.random.default_rng(3)
    for k, w in [(1, 1), (7, 1), (5, 8)]:
        params = make_params(1, domain_size=64, num_items=k, value_width=w, dp=dp, max_abs=1e3)
        for scale in (1e-3, 1.0, 1e3):
            values = rng.normal(size=(k, w)) * scale
            words = payload_words(params, values, 100.0, rng)
            contribution = params.fixed_point.decode(words)
            norm = float(np.sqrt(np.sum(contribution**2)))
            assert norm <= sensitivity(dp, k, w, params.frac_bits) + 1e-12


# ---- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": math.nan}, "noise_multiplier"),
        ({"noise_multiplier": True}, "noise_multiplier"),
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"clip_norm": math.inf}, "clip_norm"),
        ({"max_weight": -2.0}, "max_weight"),
        ({"max_weight": "1"}, "max_weight"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, Any], name: str) -> None:
    base: dict[str, Any] = {"noise_multiplier": 1.0, "clip_norm": 1.0, "max_weight": 1.0}
    with pytest.raises(ConfigurationError, match=name):
        DistributedDP(**{**base, **kwargs})


def test_params_with_dp_round_trip_and_strict_format() -> None:
    plain = make_params(1, verify=False)
    raw_plain = json.loads(plain.to_bytes())
    assert raw_plain["version"] == 1 and "dp" not in raw_plain  # unchanged without DP
    params = make_params(1, dp=DP, verify=False)
    raw = json.loads(params.to_bytes())
    assert raw["version"] == 2 and raw["dp"] == DP.to_dict()
    assert SSAParams.from_bytes(params.to_bytes()) == params
    bad = [
        {**raw, "version": 1},  # a dp object in version 1
        {k: v for k, v in raw.items() if k != "dp"},  # version 2 without dp
        {**raw, "dp": {**raw["dp"], "extra": 1.0}},
        {**raw, "dp": {**raw["dp"], "clip_norm": -1.0}},
        {**raw, "dp": {**raw["dp"], "delta": True}},
        {**raw, "dp": [1.0]},
        {**raw, "version": True},
    ]
    for blob in bad:
        with pytest.raises(ValueError):
            SSAParams.from_bytes(json.dumps(blob).encode())
    with pytest.raises(ConfigurationError, match="count_weighted"):
        make_params(1, dp=DP, count_weighted=False)
    with pytest.raises(ConfigurationError, match="max_abs"):
        make_params(1, dp=DistributedDP(1.0, clip_norm=10.0, max_weight=200.0), max_abs=1e3)


def test_params_naming_their_run_are_version_3_and_strict() -> None:
    scope = RunScope("4242", PrivacyBudget(20.0, 1e-5))
    params = make_params(1, dp=DP, run=scope, verify=False)
    raw = json.loads(params.to_bytes())
    assert raw["version"] == 3 and raw["run"] == {"id": "4242", "epsilon": 20.0, "delta": 1e-5}
    assert SSAParams.from_bytes(params.to_bytes()) == params
    bare = make_params(1, dp=DP, run=RunScope("r"))
    assert json.loads(bare.to_bytes())["run"] == {"id": "r"}
    assert SSAParams.from_bytes(bare.to_bytes()) == bare
    bad = [
        {**raw, "version": 2},  # a run object in version 2
        {k: v for k, v in raw.items() if k != "run"},  # version 3 without run
        {**raw, "run": {"id": "1", "epsilon": 20.0}},  # budget without delta
        {**raw, "run": {**raw["run"], "extra": 1}},
        {**raw, "run": {**raw["run"], "id": 7}},
        {**raw, "run": {**raw["run"], "id": ""}},
        {**raw, "run": {**raw["run"], "id": "x" * 129}},
        {**raw, "run": {**raw["run"], "epsilon": -1.0}},
        {**raw, "run": {**raw["run"], "delta": True}},
        {**raw, "run": "4242"},
    ]
    for blob in bad:
        with pytest.raises((ClientInputError, ConfigurationError)):
            SSAParams.from_bytes(json.dumps(blob).encode())
    with pytest.raises(ConfigurationError, match="needs dp"):
        make_params(1, run=RunScope("1"))
    with pytest.raises(ConfigurationError, match="printable"):
        RunScope("a\nb")


# ---- sampling and noise words -------------------------------------------------------------------


def test_gaussian_from_the_csprng_has_the_right_moments_and_tails() -> None:
    n = 400_000
    g = gaussian(n, stream(1))
    assert g.shape == (n,)
    assert abs(g.mean()) < 5 / math.sqrt(n)
    assert g.std() == pytest.approx(1.0, rel=0.01)
    assert np.mean(np.abs(g) > 3) == pytest.approx(0.0027, rel=0.15)
    assert np.array_equal(gaussian(10, stream(2)), gaussian(10, stream(2)))  # keyed: repeatable
    assert not np.array_equal(gaussian(10), gaussian(10))  # fresh OS-keyed streams


def test_exponential_tail_is_not_cut_at_the_uniforms_resolution() -> None:
    class Zeros:
        """A stream whose first words are 0: u < 2^-64, the sampler must go deeper."""

        def __init__(self) -> None:
            self.calls = 0

        def words(self, n: int) -> np.ndarray:
            self.calls += 1
            return np.zeros(n, np.uint64) if self.calls <= 2 else np.full(n, 7, np.uint64)

    out = exponential(Zeros(), 3)  # type: ignore[arg-type]
    assert out[0] > 128 * math.log(2)  # two zero words in a row: u below 2^-128
    assert np.all(out > 64 * math.log(2))  # every zero word: u below 2^-64


def test_noise_words_have_std_sigma_on_the_fixed_point_grid() -> None:
    fp = FixedPoint(frac_bits=16, max_abs=1e3, max_summands=10)
    words = noise_words((300, 100), 2.5, fp, stream(3))
    assert words.dtype == np.uint64 and words.shape == (300, 100)
    noise = fp.decode(words)
    assert np.all(noise * fp.scale == np.rint(noise * fp.scale))  # on the grid
    assert noise.std() == pytest.approx(2.5, rel=0.03)
    assert abs(noise.mean()) < 5 * 2.5 / math.sqrt(noise.size)
    assert not np.any(noise_words((4, 3), 0.0, fp))
    with pytest.raises(ConfigurationError, match="sigma"):
        noise_words((2,), -1.0, fp)
    with pytest.raises(FixedPointOverflowError, match="DP noise"):
        check_headroom(FixedPoint(frac_bits=40, max_abs=1e3, max_summands=10), 1e6)


def test_clip_update_bounds_the_norm_and_weights() -> None:
    dp = DistributedDP(1.0, clip_norm=2.0, max_weight=3.0)
    values = np.full((4, 5), 10.0)
    v, w = clip_update(values, np.array([1.0, 5.0, 3.0, 0.5]), dp)
    assert np.sqrt(np.sum(v**2)) <= 2.0
    assert np.allclose(v / np.linalg.norm(v), values / np.linalg.norm(values))  # direction kept
    assert w.tolist() == [1.0, 3.0, 3.0, 0.5]
    small = np.full((2, 1), 0.1)
    assert np.array_equal(clip_update(small, np.ones(2), dp)[0], small)  # inside: unchanged


def test_clip_update_of_a_huge_update_clips_to_the_norm_without_overflow() -> None:
    """|v| near 1e308 squares to inf: the update must still clip to norm C, not to zero."""
    import warnings

    dp = DistributedDP(1.0, clip_norm=2.0, max_weight=3.0)
    values = np.array([[1e300, -1e300], [3e299, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        v, _ = clip_update(values, np.ones(2), dp)
    assert 1.99 < np.linalg.norm(v) <= 2.0
    assert np.allclose(v / np.linalg.norm(v), values / np.linalg.norm(values / 1e300) / 1e300)


def test_small_noisy_counts_are_treated_as_untouched() -> None:
    sums = np.array([[1.0], [5.0], [-2.0]])
    counts = np.array([0.5, 10.0, -1.0])
    s, c, threshold = suppress_small_counts(sums, counts, sigma_total=1.0, stds=3.0)
    assert threshold == 3.0
    assert c.tolist() == [0.0, 10.0, 0.0] and s[:, 0].tolist() == [0.0, 5.0, 0.0]
    # Default threshold: pure noise passes it 1e-4 times per round over m elements.
    for m in (40, 1 << 20):
        t = dpmod.count_threshold_stds(m)
        tail = 0.5 * math.erfc(t / math.sqrt(2))
        assert m * tail == pytest.approx(1e-4, rel=1e-6)
    assert dpmod.count_threshold_stds(1, 0.5) == 3.0  # never below 3 stds
    assert suppress_small_counts(sums, counts, 1.0)[2] == dpmod.count_threshold_stds(3)


# ---- the two servers' noise ---------------------------------------------------------------------


def dp_params(round_id: int, dp: DistributedDP, **kw: Any) -> SSAParams:
    base: dict[str, Any] = dict(domain_size=2000, num_items=8, value_width=2, epoch=0, dp=dp)
    base.update(kw)
    return make_params(round_id, **base)


def test_reconstruction_is_plaintext_plus_both_servers_noise() -> None:
    params = dp_params(1, DP)
    clients = clients_of(params.domain_size, params.num_items, params.value_width, 4)
    lead = LeadServer(twin(), min_clients=1, noise_stream=stream(4))
    s1_shares: list[np.ndarray] = []
    finish = lead.helper.finish_round

    def capture(round_id: int) -> Any:
        share = finish(round_id)
        s1_shares.append(share.share.copy())
        return share

    lead.helper.finish_round = capture  # type: ignore[method-assign]
    uploads = fresh_uploads(params, clients, lead.helper_key())
    result = lead.aggregate(params, uploads).result
    sums, counts = clipped_plaintext(params, clients)
    assert result.counts is not None
    total = np.concatenate([result.sums - sums, (result.counts - counts)[:, None]], axis=1)
    sigma = noise_std(DP, params.num_items, params.value_width, params.frac_bits)
    # Both servers' noise: variance 2 sigma^2 per word (6000 words: generous bounds).
    assert total.std() == pytest.approx(math.sqrt(2) * sigma, rel=0.1)
    assert abs(total.mean()) < 5 * math.sqrt(2) * sigma / math.sqrt(total.size)
    # S1's noise alone: its returned share minus the share S1 would have computed honestly
    # (the tests' clients use fixed master seeds, so S1's clean share can be recomputed).
    clean1 = SSAServer(params, 1)
    for c in clients:
        clean1.add_client(c.cid, uploads[c.cid].public_part, _key(2000 + c.cid))
    noise1 = params.fixed_point.decode(s1_shares[0] - clean1.share())
    noise0 = total - noise1
    assert noise1.std() == pytest.approx(sigma, rel=0.1)
    assert noise0.std() == pytest.approx(sigma, rel=0.1)
    assert abs(np.corrcoef(noise0.ravel(), noise1.ravel())[0, 1]) < 0.1  # independent


def test_s1_refuses_a_round_asking_for_less_noise_than_its_floor() -> None:
    # The round asks for noise multiplier 0 (or 1): S1, started with a policy
    # (flwr-fsl-helper --dp-noise-multiplier 2 ...), never accepts less than its floor, and
    # never silently adds more than the round says either: it refuses the round.
    policy = DistributedDP(2.0, clip_norm=1.0, max_weight=1.0)
    for asked in (0.0, 1.0):
        params = dp_params(1, DistributedDP(asked, clip_norm=1.0, max_weight=1.0))
        clients = clients_of(params.domain_size, params.num_items, params.value_width, 3)
        lead = LeadServer(twin(policy), min_clients=1)
        with pytest.raises(HelperRequestError, match="below S1's floor 2"):
            lead.aggregate(params, fresh_uploads(params, clients, lead.helper_key()))
    # At its floor or above, S1 adds what the round asks.
    params = dp_params(2, DistributedDP(3.0, clip_norm=1.0, max_weight=1.0))
    assert HelperLimits(dp=policy).noise_multiplier(params) == 3.0


def test_without_a_policy_s1_adds_what_the_round_asks_and_nothing_without_dp() -> None:
    params = make_params(1, epoch=0)
    clients = clients_of(params.domain_size, params.num_items, params.value_width, 2)
    lead = LeadServer(twin(), min_clients=1)
    result = lead.aggregate(params, fresh_uploads(params, clients, lead.helper_key())).result
    plain_counts = np.zeros(params.domain_size)
    for c in clients:
        plain_counts[c.idx] += c.weight
    assert np.array_equal(result.counts, plain_counts)  # no DP: exact as before


def test_s1_policy_refuses_rounds_it_cannot_cover() -> None:
    policy = DistributedDP(1.0, clip_norm=1.0, max_weight=2.0)
    helper = twin(policy)
    with pytest.raises(HelperRequestError, match="no DP parameters"):
        helper.open_round(1, make_params(1).to_bytes())
    with pytest.raises(HelperRequestError, match="--dp-clip-norm"):
        helper.open_round(2, make_params(2, dp=DistributedDP(1.0, 1.5, 1.0)).to_bytes())
    with pytest.raises(HelperRequestError, match="--dp-max-weight"):
        helper.open_round(3, make_params(3, dp=DistributedDP(1.0, 1.0, 3.0)).to_bytes())
    with pytest.raises(HelperRequestError, match="--dp-noise-multiplier"):
        helper.open_round(4, make_params(4, dp=DistributedDP(0.0, 0.5, 2.0)).to_bytes())
    helper.open_round(7, make_params(7, dp=DistributedDP(1.0, 0.5, 2.0)).to_bytes())
    assert HelperLimits(dp=policy).noise_multiplier(make_params(5, dp=DP)) == 1.0
    assert HelperLimits(dp=policy).noise_multiplier(make_params(5, dp=DP.__class__(3, 1, 1))) == 3
    with pytest.raises(ConfigurationError, match="DistributedDP"):
        HelperLimits(dp=1.0)  # type: ignore[arg-type]
    # A LeadServer sees S1's refusal as a failed round.
    lead = LeadServer(twin(policy), min_clients=1)
    params = make_params(6, epoch=0)
    clients = clients_of(params.domain_size, params.num_items, params.value_width, 2)
    with pytest.raises(RoundFailedError):
        lead.aggregate(params, fresh_uploads(params, clients, lead.helper_key()))


def test_helper_cli_dp_flags(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    key = str(tmp_path / "s1.pem")
    flags = ["--dp-noise-multiplier", "1.5", "--dp-clip-norm", "0.5", "--dp-max-weight", "4"]
    args = _parser().parse_args(["--key-file", key, *flags])
    assert _dp_policy(args) == DistributedDP(1.5, 0.5, 4.0, 1e-5)
    assert _dp_policy(_parser().parse_args(["--key-file", key])) is None
    with pytest.raises(ConfigurationError, match="go together"):
        _dp_policy(_parser().parse_args(["--key-file", key, "--dp-clip-norm", "1"]))
    with pytest.raises(SystemExit):
        _parser().parse_args(["--key-file", key, "--dp-noise-multiplier", "-1"])
    argv = ["--key-file", key, "--generate-key", "--print-fingerprint"]
    dp_flags = ["--dp-noise-multiplier", "2", "--dp-clip-norm", "1", "--dp-max-weight", "1"]
    assert main(argv + dp_flags) == 0
    assert "DP noise on every round: noise multiplier >= 2" in capsys.readouterr().out
    assert main(argv + dp_flags[:2]) == 2
    assert main(argv + dp_flags + ["--dp-delta", "1.5"]) == 2
    # S1's budget ceiling per run, and where it keeps the accounts.
    ceiling = _parser().parse_args(["--key-file", key, "--dp-budget-epsilon", "8"])
    assert _dp_budget(ceiling) == PrivacyBudget(8.0, 1e-5)
    both = ["--dp-budget-epsilon", "8", "--dp-budget-delta", "1e-6"]
    assert _dp_budget(_parser().parse_args(["--key-file", key, *both])) == PrivacyBudget(8, 1e-6)
    # Unset: the strategies' default budget, so an announced larger one gets no more from S1.
    assert _dp_budget(_parser().parse_args(["--key-file", key])) == PrivacyBudget(20.0, 1e-5)
    only_delta = ["--key-file", key, "--dp-budget-delta", "1e-6"]
    assert _dp_budget(_parser().parse_args(only_delta)) == PrivacyBudget(20.0, 1e-6)
    assert main([*argv, "--dp-budget-epsilon", "8"]) == 0
    assert "DP budget ceiling per run: epsilon <= 8" in capsys.readouterr().out
    assert main([*argv, "--dp-budget-epsilon", "8", "--dp-budget-delta", "2"]) == 2
    assert default_state_dir().name == "helper-state"


# ---- the differencing attack with DP on ---------------------------------------------------------


def test_differencing_two_rounds_with_dp_is_bounded_as_the_accounting_predicts() -> None:
    # Counterpart of test_known_leak_differencing_two_rounds_reveals_a_dropped_clients_rows:
    # the same attack by S0, which knows its own noise (it recomputes it from its own noise
    # stream and subtracts it), so S0's view is exactly the aggregate plus S1's noise.
    z = 0.1
    dp = DistributedDP(z, clip_norm=1.0, max_weight=1.0)
    m, k = 1000, 100
    lead = LeadServer(twin(dp), min_clients=2, noise_stream=stream(9))
    own = stream(9)  # S0's own randomness, replayed
    clients = clients_of(m, k, 1, 4, seed=5)
    p1 = dp_params(1, dp, domain_size=m, num_items=k, value_width=1)
    p2 = dp_params(2, dp, domain_size=m, num_items=k, value_width=1)
    pub = lead.helper_key()
    sigma = noise_std(dp, k, 1, p1.frac_bits)

    def s0_view(params: SSAParams, uploads: Any) -> np.ndarray:
        counts = lead.aggregate(params, uploads).result.counts
        assert counts is not None
        mine = noise_words((m, params.tau), sigma, params.fixed_point, own)
        return counts - params.fixed_point.decode(mine)[:, -1]

    everyone = s0_view(p1, fresh_uploads(p1, clients, pub))
    dropped = clients[2]
    rest = [c for c in clients if c is not dropped]
    without = s0_view(p2, fresh_uploads(p2, rest, pub, epoch_seed=1))
    difference = everyone - without
    chosen = np.zeros(m, bool)
    chosen[dropped.idx] = True
    # Without DP the difference is exactly the client's rows and weight; now it is not.
    assert set(np.flatnonzero(difference).tolist()) != set(dropped.idx.tolist())
    # The attacker's best per-element test between N(0, 2 s^2) and N(W, 2 s^2) thresholds at
    # W/2; its balanced accuracy is Phi(W / (2 sqrt(2) s)) with s = S1's noise std.
    predicted = 0.5 * (1 + math.erf(1.0 / (2 * math.sqrt(2) * sigma) / math.sqrt(2)))
    guess = difference > 0.5
    balanced = 0.5 * (np.mean(guess[chosen]) + np.mean(~guess[~chosen]))
    assert 0.55 < predicted < 0.75
    assert abs(balanced - predicted) < 0.1  # ~4 standard errors
    assert balanced < 0.85  # vs 1.0 without DP
