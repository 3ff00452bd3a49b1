"""Flower's four DP strategy wrappers and its DP accountant around each FedAvg drop-in.

A Flower user stacks ``DifferentialPrivacy{Client,Server}Side{Fixed,Adaptive}Clipping`` on a
``FedAvg``; the same stack on ``FedSubAvg`` (dense replies) gives ``FedAvg``'s model, run by
Flower's own ``Strategy.start``. ``SecAggFedAvg`` cannot be wrapped: the wrappers drive
``configure_train``/``aggregate_train`` and clip or noise plaintext replies, while a SecAgg round
is four phases whose replies are masked; the first round stops with a
:class:`~flwr_fsl.core.errors.ConfigurationError` that says so, before anything is sent
(use ``SecAggFedAvg(dp=SecAggDP(...), privacy_budget=...)``, distributed DP accounted by
:mod:`flwr_fsl.core.privacy`). Flower 1.42's accountant refuses any strategy whose
``aggregate_train`` is not ``FedAvg.aggregate_train``, both drop-ins included, at construction:
its noise is calibrated to an average over every sampled client, which FedSubAvg's
per-coordinate count weighting of sparse replies and SecAgg's four phases do not guarantee
(``docs/dropin.md``, differences F3 and S5).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord
from flwr.clientapp.mod import adaptiveclipping_mod, fixedclipping_mod
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from flwr.supercore.privacy_accounting import NeighboringRelation, PrivacyConfig, SamplingMethod
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.mods import topk_mod
from flwr_fsl.strategies import FedSubAvg, SecAggFedAvg
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import MODEL, make_app, model_record

N = 3
FIXED = {"noise_multiplier": 0.0, "clipping_norm": 1e6, "num_sampled_clients": N}
ADAPTIVE = {"noise_multiplier": 0.0, "num_sampled_clients": N, "initial_clipping_norm": 1e6}
WRAPPERS: dict[str, tuple[Callable[..., Any], dict[str, Any], list[Any]]] = {
    "client-fixed": (DifferentialPrivacyClientSideFixedClipping, FIXED, [fixedclipping_mod]),
    "server-fixed": (DifferentialPrivacyServerSideFixedClipping, FIXED, []),
    "client-adaptive": (
        DifferentialPrivacyClientSideAdaptiveClipping, ADAPTIVE, [adaptiveclipping_mod],
    ),
    "server-adaptive": (DifferentialPrivacyServerSideAdaptiveClipping, ADAPTIVE, []),
}  # fmt: skip


def _run(wrapper: str, inner: Any) -> ArrayRecord:
    cls, kwargs, mods = WRAPPERS[wrapper]
    strategy = cls(inner, **kwargs)
    grid = InProcessGrid(make_app(mods), N)
    return strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=2).arrays


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_fedsubavg_under_each_dp_wrapper_is_fedavg(wrapper: str) -> None:
    want = _run(wrapper, FedAvg(min_available_nodes=N, fraction_evaluate=0.0))
    got = _run(wrapper, FedSubAvg(min_available_nodes=N, fraction_evaluate=0.0))
    assert list(got.keys()) == list(want.keys())
    for name, value in MODEL.items():
        if np.issubdtype(value.dtype, np.floating):  # int buffers: rounded, kept int (F2)
            np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), rtol=1e-5)
            assert not np.array_equal(got[name].numpy(), value)
        else:
            assert got[name].numpy().dtype == value.dtype


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
def test_secaggfedavg_under_a_dp_wrapper_is_refused_before_anything_is_sent(wrapper: str) -> None:
    cls, kwargs, mods = WRAPPERS[wrapper]
    grid = InProcessGrid(make_app(mods), N)
    strategy = cls(SecAggFedAvg(min_available_nodes=N), **kwargs)
    with pytest.raises(ConfigurationError, match="several message phases"):
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)


def _accountant() -> RdpAccountant:
    return RdpAccountant(
        PrivacyConfig(
            1e-5, N, NeighboringRelation.ADD_OR_REMOVE_ONE, SamplingMethod.NO_AMPLIFICATION
        )
    )


@pytest.mark.parametrize(
    "cls", [DifferentialPrivacyClientSideFixedClipping, DifferentialPrivacyServerSideFixedClipping]
)
def test_flowers_accountant_takes_fedavg_and_refuses_both_drop_ins(cls: Any) -> None:
    cls(FedAvg(), 1.0, 1.0, N, accountant=_accountant())  # the baseline is accepted
    for inner in (FedSubAvg(), SecAggFedAvg()):
        with pytest.raises(ValueError, match=r"FedAvg\.aggregate_train"):
            cls(inner, 1.0, 1.0, N, accountant=_accountant())


def test_sparse_replies_under_a_dp_wrapper_are_refused_not_silently_miscalibrated() -> None:
    # Client-side wrapper + topk_mod: each sparse reply is dropped with the reason (the noise
    # z*C/n would be n times too small for a coordinate one client moved).
    grid = InProcessGrid(make_app([topk_mod, fixedclipping_mod]), N, run_config={"topk-ratio": 0.1})
    inner = FedSubAvg(min_available_nodes=N, fraction_evaluate=0.0)
    strategy = DifferentialPrivacyClientSideFixedClipping(inner, 1.0, 10.0, N)
    result = strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert len(inner.dropped[1]) == N and 1 not in result.train_metrics_clientapp
    assert all("calibrated to FedAvg's average" in r for r in inner.dropped[1].values())
    # Server-side wrapper + topk_mod: Flower's own clipping raises on the sparse arrays.
    grid = InProcessGrid(make_app([topk_mod]), N, run_config={"topk-ratio": 0.1})
    inner = FedSubAvg(min_available_nodes=N, fraction_evaluate=0.0)
    server = DifferentialPrivacyServerSideFixedClipping(inner, 1.0, 10.0, N)
    with pytest.raises(ValueError, match="broadcast"):
        server.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
