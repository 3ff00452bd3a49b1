"""Each family's federation-size minimum is refused before round 1, naming the setting.

Issue 23: width-mnist at 6 nodes failed SESA only after four other arms had trained. Every
threshold protocol now says, before any client is asked anything, which setting needs how many
clients per round and how many nodes the grid has: SecAgg's and SFSL's
``reconstruction_threshold``, SESA's ``K_max + T`` (``tests/families/sesa/test_settings.py``),
PrivHFL's answerer (a querier needs another client) and SSA's ``min_clients`` (S0's; S1
enforces its own at round time, ``tests/families/ssa/test_strategy.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.testing import InProcessGrid
from tests.core.test_settings import counting_app
from tests.flower_apps import model_record


def _secagg() -> Any:
    from flwr_fsl.strategies import SecAggFedAvg

    return SecAggFedAvg(reconstruction_threshold=4)


def _sfsl() -> Any:
    from flwr_fsl.strategies import SFSLFedSubAvg

    return SFSLFedSubAvg(table="emb.weight", reconstruction_threshold=4)


def _privhfl() -> Any:
    from flwr_fsl.families.privhfl.strategy import PrivHFL

    # one node: a querier would have nobody to answer it.
    return PrivHFL(min_train_nodes=1, min_evaluate_nodes=1, min_available_nodes=1)


def _ssa() -> Any:
    from flwr_fsl.helper import InProcessHelper
    from flwr_fsl.strategies import SecureFedSubAvg

    helper = InProcessHelper()
    return SecureFedSubAvg(helper, 0.1, min_clients=4)


CASES: list[tuple[str, Callable[[], Any], int, str]] = [
    ("secagg", _secagg, 3, r"reconstruction_threshold needs at least 4 clients.* of 3 nodes"),
    ("sfsl", _sfsl, 3, r"reconstruction_threshold needs at least 4 clients.* of 3 nodes"),
    ("privhfl", _privhfl, 1, r"expansion .*needs at least 2 clients.* of 1 nodes"),
    ("ssa", _ssa, 3, r"min_clients needs at least 4 clients.* of 3 nodes"),
]


@pytest.mark.parametrize(("family", "build", "nodes", "match"), CASES, ids=[c[0] for c in CASES])
def test_federation_below_the_protocol_minimum_fails_before_any_client(
    family: str, build: Callable[[], Any], nodes: int, match: str
) -> None:
    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), nodes)
    strategy = build()
    with pytest.raises(ConfigurationError, match=match):
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert calls == [], f"{family}: a client was asked before the size check"


def test_an_experiment_names_the_arm_the_setting_and_the_node_count() -> None:
    from flwr_fsl.experiment import Arm, Experiment
    from flwr_fsl.strategies import FedSubAvg

    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), 3)
    arms = [
        Arm("plain", "FedSubAvg", lambda setup: FedSubAvg(fraction_evaluate=0.0)),
        Arm("secagg", "SecAggFedAvg", lambda setup: _secagg()),
    ]
    experiment = Experiment(
        name="size", arms=arms, initial_arrays=model_record(), num_rounds=1, sampling_seed=0
    )
    with pytest.raises(ConfigurationError, match=r"arm 'secagg'.*at least 4 clients.*of 3 nodes"):
        experiment.run(grid)
    assert calls == []


# -- a client-side misconfiguration reaches the server as one line naming the key --------------
RAY_REASON = (
    "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run() "
    '(pid=4242, ip=10.0.0.1)\n  File "ray_actor.py", line 65, in run\n'
    "    raise ClientAppException(str(ex)) from ex\n"
    "flwr.clientapp.client_app.ClientAppException: \n"
    "Exception ClientAppException occurred. Message: topk-ratio must be in (0, 1], got -0.1'>"
)


@pytest.mark.parametrize(
    ("reason", "line"),
    [
        (RAY_REASON, "topk-ratio must be in (0, 1], got -0.1"),
        (
            "<class 'flwr_fsl.core.errors.ConfigurationError'>:<'topk-ratio must be in (0, 1]'>",
            "ConfigurationError: topk-ratio must be in (0, 1]",
        ),
        ("ConfigurationError: topk-ratio bad", "ConfigurationError: topk-ratio bad"),
        ("Traceback (most recent call last):\n  File x\nKeyError: 'x-y'", "KeyError: 'x-y'"),
        ("", "(no reason given)"),
    ],
)
def test_client_error_reason_is_one_line(reason: str, line: str) -> None:
    from flwr_fsl.core.replies import client_error_line

    assert client_error_line(reason) == line


def test_topk_client_misconfiguration_reaches_the_server_as_one_line_with_the_key() -> None:
    from flwr_fsl.mods import topk_mod
    from flwr_fsl.strategies import FedSubAvg
    from tests.flower_apps import make_app

    # The server's config is fine; the clients' own run config has a negative ratio.
    grid = InProcessGrid(make_app([topk_mod]), 2, run_config={"topk-ratio": -0.1})
    strategy = FedSubAvg(fraction_evaluate=0.0)
    from flwr_fsl.core.errors import RunFailedError

    with pytest.raises(RunFailedError):
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    reasons = set(strategy.dropped[1].values())
    assert len(reasons) == 1
    (reason,) = reasons
    assert "\n" not in reason and "topk-ratio" in reason, reason
