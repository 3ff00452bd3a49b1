"""SSA servers on several threads (issue 26): shares and key-check digests do not depend on it.

The evaluation is split into small key ranges here (a few dozen points each) so that every
thread count really runs ranges at once, and forgeries are still caught in any range.
"""

from __future__ import annotations

import numpy as np
import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.ssa import protocol, verify
from flwr_fsl.families.ssa.protocol import SSAInputError, SSAServer, encode_update
from flwr_fsl.families.ssa.verify import same_digest
from tests.families.ssa import forge
from tests.families.ssa.test_key_check import FORGERIES, _forgery, _s1_seed
from tests.helper.test_helper import WIDTH, K, M, bind, make_params, twin


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "_RANGE_POINTS", 40)
    monkeypatch.setattr(verify, "_SEGMENT_POINTS", 40)


def _uploads(params: protocol.SSAParams, n: int) -> list[protocol.SSAUpload]:
    rng = np.random.default_rng(3)
    out = []
    for c in range(n):
        idx = rng.choice(M, K, replace=False)
        vals = rng.normal(size=(K, WIDTH))
        seeds = (bytes([c + 1] * 16), bytes([c + 101] * 16))
        out.append(encode_update(params, idx, vals, 1.0, rng=rng, master_seeds=seeds)[0])
    return out


@pytest.mark.parametrize("checked", [False, True])
def test_shares_and_digests_do_not_depend_on_threads(checked: bool) -> None:
    params = make_params(1, weighted=False, epoch=0, verify=checked)
    uploads = _uploads(params, 3)
    seen: dict[int, tuple[bytes, bytes, list[bytes | None]]] = {}
    for threads in (1, 2, 3):
        servers = [SSAServer(params, p, threads=threads) for p in (0, 1)]
        assert len(servers[0]._ranges) > 2 or checked  # really split
        digests: list[bytes | None] = []
        for c, up in enumerate(uploads):
            d0 = servers[0].add_client(c, up.public_part, up.master_seeds[0])
            d1 = servers[1].add_client(c, up.public_part, up.master_seeds[1], expect=d0)
            assert (d0 is None and d1 is None) or same_digest(d0, d1)
            digests.append(None if d0 is None else d0[:32])  # the range part draws a seed
        servers[0].discard(1)  # S0 takes a client back out on its threads too
        servers[0].forget_recent()
        seen[threads] = (servers[0].share().tobytes(), servers[1].share().tobytes(), digests)
    assert seen[1] == seen[2] == seen[3]
    if checked:
        assert len(SSAServer(params, 0)._check.segments) > 2  # type: ignore[union-attr]


@pytest.mark.parametrize("name", FORGERIES)
def test_forgeries_are_caught_on_two_threads(name: str) -> None:
    params = make_params(1, weighted=False, epoch=0, verify=True, stash_size=int("stash" in name))
    plan, tamper = _forgery(params, name)
    upload, public = forge.forged_upload(params, plan, 5, twin().public_key(), bind(params), tamper)
    s0, s1 = SSAServer(params, 0, threads=2), SSAServer(params, 1, threads=2)
    digest0 = s0.add_client(5, public, upload.master_seed)
    with pytest.raises(SSAInputError, match="key check failed"):
        s1.add_client(5, public, _s1_seed(plan, params, tamper), expect=digest0)
    assert s1.num_clients == 0 and not s1.share().any()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_threads_argument_is_checked(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="threads"):
        SSAServer(make_params(1), 0, threads=bad)  # type: ignore[arg-type]


def test_threads_default_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(verify.THREADS_ENV, "3")
    assert SSAServer(make_params(1), 0).threads == 3
    monkeypatch.setenv(verify.THREADS_ENV, "zero")
    with pytest.raises(ConfigurationError, match=verify.THREADS_ENV):
        SSAServer(make_params(1), 0)
    monkeypatch.delenv(verify.THREADS_ENV)
    assert verify.default_threads() >= 1


def test_lead_server_threads_reach_s0() -> None:
    from flwr_fsl.families.ssa.two_server import LeadServer

    assert LeadServer(twin(), min_clients=1, threads=2).threads == 2
    assert LeadServer(twin(), min_clients=1).threads is None  # SSAServer's default
    with pytest.raises(ConfigurationError, match="threads"):
        LeadServer(twin(), min_clients=1, threads=0)
