"""Every strategy's FedAvg knobs are checked at construction, naming the argument.

One table of bad values for the arguments every strategy shares with Flower's ``FedAvg``
(plus ``sampling_seed`` and ``max_weight``), run against every strategy of the package; and
the run-level checks of ``PhasedStrategy.start``: a federation too small for the sampling or
the protocol is refused before any client is called, and a run in which no round produced a
result raises :class:`RunFailedError` instead of ending "completed".
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import pytest
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from flwr_fsl.core.checks import check_federation, check_real, check_threshold
from flwr_fsl.core.engine import PhasedStrategy
from flwr_fsl.core.errors import ConfigurationError, RunFailedError
from flwr_fsl.crypto.channel import SealingKeyPair
from flwr_fsl.families.privhfl.strategy import PrivHFL
from flwr_fsl.helper import InProcessHelper
from flwr_fsl.strategies import (
    FedSubAvg,
    SecAggFedAvg,
    SecureFedSubAvg,
    SecureRowFedSubAvg,
    SesaFedAvg,
    SFSLFedSubAvg,
    WidthFedAvg,
)
from flwr_fsl.testing import InProcessGrid
from tests.flower_apps import model_record

_KEY = SealingKeyPair.generate()


def _helper() -> InProcessHelper:
    return InProcessHelper(keypair=_KEY)


FACTORIES: dict[str, Callable[..., PhasedStrategy]] = {
    "PhasedStrategy": PhasedStrategy,
    "FedSubAvg": FedSubAvg,
    "SecAggFedAvg": SecAggFedAvg,
    "SFSLFedSubAvg": lambda **kw: SFSLFedSubAvg("emb", **kw),
    "SesaFedAvg": SesaFedAvg,
    "WidthFedAvg": WidthFedAvg,
    "PrivHFL": PrivHFL,
    "SecureFedSubAvg": lambda **kw: SecureFedSubAvg(_helper(), 0.2, **kw),
    "SecureRowFedSubAvg": lambda **kw: SecureRowFedSubAvg(_helper(), "emb", 4, **kw),
}
CLASSES = {
    "PhasedStrategy": PhasedStrategy,
    "FedSubAvg": FedSubAvg,
    "SecAggFedAvg": SecAggFedAvg,
    "SFSLFedSubAvg": SFSLFedSubAvg,
    "SesaFedAvg": SesaFedAvg,
    "WidthFedAvg": WidthFedAvg,
    "PrivHFL": PrivHFL,
    "SecureFedSubAvg": FedSubAvg,  # **kwargs go to FedSubAvg
    "SecureRowFedSubAvg": FedSubAvg,
}
_FUNCTION_ARGS = ("train_metrics_aggr_fn", "evaluate_metrics_aggr_fn")
BAD: dict[str, list[Any]] = {
    "fraction_train": ["0.5", math.nan, math.inf, 1.5, -0.1, True, None],
    "fraction_evaluate": ["0.5", math.nan, 1.5, -0.1, True],
    "min_train_nodes": [1.5, 2.0, -1, "2", True, None],
    "min_evaluate_nodes": [1.5, -1, "2", False],
    "min_available_nodes": [1.5, -1, "2", True],
    "weighted_by_key": [5, "", None, b"num-examples"],
    "arrayrecord_key": [5, "", None],
    "configrecord_key": [5, "", None],
    "train_metrics_aggr_fn": [5, "mean"],
    "evaluate_metrics_aggr_fn": [5, "mean"],
    "sampling_seed": ["x", 1.5, True, "42"],
    "max_weight": [math.nan, math.inf, 0, -1.0, "1", 1e301, True],
}


def _accepts(name: str, arg: str) -> bool:
    own = CLASSES[name] if name in ("SecureFedSubAvg", "SecureRowFedSubAvg") else None
    if own is not None and arg == "plaintext_evaluation":
        return True
    return arg in inspect.signature(CLASSES[name].__init__).parameters


CASES = [
    pytest.param(name, arg, value, id=f"{name}-{arg}-{value!r}")
    for name in FACTORIES
    for arg, values in BAD.items()
    if _accepts(name, arg)
    for value in values
]


@pytest.mark.parametrize(("name", "arg", "value"), CASES)
def test_bad_fedavg_argument_is_refused_by_name(name: str, arg: str, value: Any) -> None:
    kwargs: dict[str, Any] = {arg: value}
    if arg == "weighted_by_key" and name.startswith("Secure"):
        kwargs["weighted"] = True  # SSA reads the key only with weights
    if arg == "fraction_evaluate" and _accepts(name, "plaintext_evaluation"):
        kwargs["plaintext_evaluation"] = True  # the secure ones refuse > 0 without it
    with pytest.raises(ConfigurationError, match=arg):
        FACTORIES[name](**kwargs)


@pytest.mark.parametrize("name", list(FACTORIES))
def test_defaults_construct(name: str) -> None:
    FACTORIES[name]()


def test_every_strategy_is_in_the_table() -> None:
    import flwr_fsl.strategies as strategies

    exported = {
        n for n in strategies.__all__
        if inspect.isclass(getattr(strategies, n))
        and issubclass(getattr(strategies, n), PhasedStrategy)
        and getattr(strategies, n) not in (PhasedStrategy,)
    }  # fmt: skip
    assert exported - set(FACTORIES) == set()


# -- the shared validators --------------------------------------------------------------------
@pytest.mark.parametrize("value", [math.nan, -math.inf, "1", True, None])
def test_check_real_refuses_non_finite_and_non_numbers(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="knob"):
        check_real("knob", value)


@pytest.mark.parametrize("value", [math.nan, 0.0, 1.5, 1, 0, "0.5", True])
def test_check_threshold(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="t_knob"):
        check_threshold("t_knob", value, min_count=2)


class _Sampling:
    fraction_train, fraction_evaluate = 1.0, 0.0
    min_train_nodes, min_evaluate_nodes, min_available_nodes = 2, 0, 2


def test_check_federation_names_the_setting_and_the_minimum() -> None:
    check_federation(_Sampling(), 3)
    with pytest.raises(ConfigurationError, match=r"min_available_nodes=2.*1 nodes"):
        check_federation(_Sampling(), 1)
    with pytest.raises(ConfigurationError, match=r"needs at least 5.*samples 3"):
        check_federation(_Sampling(), 3, lambda size: (5, "needs"))


# -- run-level checks on a real grid ------------------------------------------------------------
def counting_app(calls: list[int], fail: bool = False) -> ClientApp:
    """A ClientApp that records each call's node id in ``calls`` (and fails if ``fail``)."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        calls.append(context.node_id)
        if fail:
            raise RuntimeError("this client always fails")
        return Message(RecordDict(), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        calls.append(context.node_id)
        return Message(RecordDict(), reply_to=msg)

    return app


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_available_nodes": 4}, "min_available_nodes=4"),
        ({"min_train_nodes": 5}, "min_train_nodes=5"),
        ({"min_evaluate_nodes": 4, "fraction_evaluate": 0.5}, "min_evaluate_nodes=4"),
    ],
)
def test_impossible_sampling_is_refused_before_any_client_is_called(
    kwargs: dict[str, Any], match: str
) -> None:
    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), 3)
    strategy = FedSubAvg(**kwargs)
    with pytest.raises(ConfigurationError, match=match):
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=1)
    assert calls == []


@pytest.mark.parametrize(("num_rounds", "timeout"), [(1.5, 10.0), (-1, 10.0), (1, 0.0), (1, "x")])
def test_bad_start_arguments(num_rounds: Any, timeout: Any) -> None:
    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), 2)
    with pytest.raises(ConfigurationError, match=r"num_rounds|timeout"):
        FedSubAvg().start(
            grid=grid, initial_arrays=model_record(), num_rounds=num_rounds, timeout=timeout
        )
    assert calls == []


def test_run_where_every_client_fails_raises_run_failed() -> None:
    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls, fail=True), 3)
    strategy = FedSubAvg(fraction_evaluate=0.0)
    with pytest.raises(RunFailedError, match="no round produced a result") as err:
        strategy.start(grid=grid, initial_arrays=model_record(), num_rounds=2)
    assert len(calls) == 6  # every client was asked in both rounds
    assert set(strategy.dropped[1]) == set(grid.get_node_ids())
    result = err.value.result
    assert set(result.arrays) == set(model_record())  # the initial model, untouched


def test_run_without_training_is_not_a_failure() -> None:
    # fraction_train=0: an evaluation-only run samples no client for training.
    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), 2)
    FedSubAvg(fraction_train=0.0, fraction_evaluate=0.0).start(
        grid=grid, initial_arrays=model_record(), num_rounds=1
    )


# -- experiments: every arm is built and checked before the first arm trains -----------------
def _experiment(arms: list[Any]) -> Any:
    from flwr_fsl.experiment import Experiment

    return Experiment(
        name="settings", arms=arms, initial_arrays=model_record(), num_rounds=1, sampling_seed=0
    )


def test_a_bad_last_arm_is_refused_before_the_first_arm_trains() -> None:
    from flwr_fsl.experiment import Arm
    from flwr_fsl.strategies import SecAggFedAvg

    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), 3)
    arms = [
        Arm("plain", "FedSubAvg", lambda setup: FedSubAvg(fraction_evaluate=0.0)),
        Arm("secure", "SecAggFedAvg", lambda setup: SecAggFedAvg(clipping_range=math.nan)),
    ]
    with pytest.raises(ConfigurationError, match=r"arm 'secure'.*clipping_range"):
        _experiment(arms).run(grid)
    assert calls == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"fraction_train": 1.5}, "fraction_train"),
        ({"fraction_train": "0.5"}, "fraction_train"),
        ({"min_available_nodes": 4}, "min_available_nodes=4"),
        ({"min_train_nodes": 4}, "min_train_nodes=4"),
    ],
)
def test_flowers_own_strategy_with_impossible_sampling_is_refused_not_a_hang(
    kwargs: dict[str, Any], match: str
) -> None:
    from flwr.serverapp.strategy import FedAvg

    from flwr_fsl.experiment import Arm

    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls), 3)
    arms = [Arm("fedavg", "FedAvg", lambda setup: FedAvg(**kwargs))]
    with pytest.raises(ConfigurationError, match=match):
        _experiment(arms).run(grid)
    assert calls == []


def test_an_arm_whose_every_client_fails_is_reported_then_the_experiment_fails() -> None:
    from flwr_fsl.experiment import Arm, ExperimentFailedError

    calls: list[int] = []
    grid = InProcessGrid(counting_app(calls, fail=True), 2)
    arms = [Arm("plain", "FedSubAvg", lambda setup: FedSubAvg(fraction_evaluate=0.0))]
    with pytest.raises(ExperimentFailedError, match="FedSubAvg"):
        _experiment(arms).run(grid)
    assert len(calls) == 2
