"""Multi-phase strategies refuse Flower's configure_train/aggregate_train pair, before round 1.

A Flower wrapper (its DP strategy wrappers) or a loop written against ``Strategy.start``
drives a strategy through that pair; a multi-phase round cannot be carried by it. Every
multi-phase strategy refuses it with a ``ConfigurationError`` naming the strategy, its phases
and ``start``, raised before any message reaches a client — never a partial protocol (noise
added to an aggregate whose clipping never ran) or a ``NotImplementedError`` mid-run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)

from flwr_fsl.core.engine import MultiPhaseStrategy
from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.families.privhfl.strategy import PrivHFL
from flwr_fsl.families.sfsl.strategy import SFSLFedSubAvg
from flwr_fsl.families.ssa.index_strategy import SecureRowFedSubAvg
from flwr_fsl.strategies import SecAggFedAvg, SesaFedAvg, WidthFedAvg
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import make_app, model_record

MULTI_PHASE: dict[str, Callable[[], MultiPhaseStrategy]] = {
    "SecAggFedAvg": SecAggFedAvg,
    "SesaFedAvg": SesaFedAvg,
    "WidthFedAvg": WidthFedAvg,
    "PrivHFL": PrivHFL,
    "SFSLFedSubAvg": lambda: SFSLFedSubAvg(table="w"),
}
ARRAYS = ArrayRecord({"w": Array(np.zeros((4, 2), np.float32))})


class _CountingGrid(InProcessGrid):
    """The in-process grid, counting every message pushed to a client."""

    pushed = 0

    def push_messages(self, messages: object) -> list[str]:
        batch = list(messages)  # type: ignore[call-overload]
        self.pushed += len(batch)
        return super().push_messages(batch)


@pytest.mark.parametrize("name", sorted(MULTI_PHASE))
def test_the_flower_pair_is_refused_naming_start(name: str) -> None:
    strategy = MULTI_PHASE[name]()
    assert isinstance(strategy, MultiPhaseStrategy)
    with pytest.raises(ConfigurationError, match=rf"{name}\.configure_train .*\.start\("):
        strategy.configure_train(1, ARRAYS, ConfigRecord(), None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=rf"{name}\.aggregate_train"):
        strategy.aggregate_train(1, [])


def test_every_phase_is_named() -> None:
    with pytest.raises(ConfigurationError, match="advertise, share, train, unmask"):
        SecAggFedAvg().configure_train(1, ARRAYS, ConfigRecord(), None)  # type: ignore[arg-type]
    assert SecureRowFedSubAvg.PHASES == ("query.psr", "train")
    assert issubclass(SecureRowFedSubAvg, MultiPhaseStrategy)


WRAPPERS: dict[str, Callable[[Strategy], Strategy]] = {
    "server-side clipping": lambda s: DifferentialPrivacyServerSideFixedClipping(
        s, noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=2
    ),
    "client-side clipping": lambda s: DifferentialPrivacyClientSideFixedClipping(
        s, noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=2
    ),
}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize("name", sorted(MULTI_PHASE))
def test_flower_dp_wrappers_stop_before_any_message(name: str, wrapper: str) -> None:
    grid = _CountingGrid(make_app(), 3)
    wrapped = WRAPPERS[wrapper](MULTI_PHASE[name]())
    with pytest.raises(ConfigurationError, match=rf"{name}\.configure_train"):
        wrapped.start(grid, ARRAYS, num_rounds=1)
    assert grid.pushed == 0


def test_the_check_can_fail() -> None:
    # A single-phase strategy is driven through the pair by the same wrapper: messages go out.
    from flwr_fsl.strategies import FedSubAvg

    grid = _CountingGrid(make_app(), 3)
    wrapped = WRAPPERS["client-side clipping"](FedSubAvg(fraction_evaluate=0.0))
    wrapped.start(grid, model_record(), num_rounds=1)
    assert grid.pushed > 0
