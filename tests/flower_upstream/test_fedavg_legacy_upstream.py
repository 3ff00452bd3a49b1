# Copyright 2025 Flower Labs GmbH. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
# Modified for flwr_fsl: Flower's legacy framework/py/flwr/server/strategy/fedavg_test.py
# (adap/flower at fdef7afb1d) ported to the Message API. The legacy
# ``strategy.num_fit_clients(num_available_clients=n)`` becomes the number of messages
# ``configure_train`` builds on a grid of ``n`` nodes (``num_evaluation_clients``:
# ``configure_evaluate``), with the legacy defaults (``min_fit_clients = 2``,
# ``min_available_clients = 2``) that the Message API keeps; ``aggregate_fit`` becomes
# ``aggregate_train`` on mock replies, compared with ``aggregate_arrayrecords``. The class under
# test comes from the ``strategy_cls`` fixture. Expected values unchanged.
"""FedAvg tests."""

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from numpy.testing import assert_allclose

from flwr_fsl.testing import InProcessGrid

from ._upstream_utils import create_mock_reply


def _grid(num_nodes: int) -> Grid:
    return InProcessGrid(ClientApp(), num_nodes)  # nothing is sent: only its node ids are read


def _num_fit_clients(strategy, num_available_clients: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    messages = strategy.configure_train(
        1, ArrayRecord([np.zeros(2)]), ConfigRecord(), _grid(num_available_clients)
    )
    return len(list(messages)), 2


def _num_evaluation_clients(strategy, num_available_clients: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    messages = strategy.configure_evaluate(
        1, ArrayRecord([np.zeros(2)]), ConfigRecord(), _grid(num_available_clients)
    )
    return len(list(messages)), 2


def test_fedavg_num_fit_clients_20_available(strategy_cls: type) -> None:
    """Test num_fit_clients function."""
    # Prepare
    strategy = strategy_cls()
    expected = 20

    # Execute
    actual, _ = _num_fit_clients(strategy, num_available_clients=20)

    # Assert
    assert expected == actual


def test_fedavg_num_fit_clients_19_available(strategy_cls: type) -> None:
    """Test num_fit_clients function."""
    # Prepare
    strategy = strategy_cls()
    expected = 19

    # Execute
    actual, _ = _num_fit_clients(strategy, num_available_clients=19)

    # Assert
    assert expected == actual


def test_fedavg_num_fit_clients_10_available(strategy_cls: type) -> None:
    """Test num_fit_clients function."""
    # Prepare
    strategy = strategy_cls()
    expected = 10

    # Execute
    actual, _ = _num_fit_clients(strategy, num_available_clients=10)

    # Assert
    assert expected == actual


def test_fedavg_num_fit_clients_minimum(strategy_cls: type) -> None:
    """Test num_fit_clients function."""
    # Prepare
    strategy = strategy_cls()
    expected = 9

    # Execute
    actual, _ = _num_fit_clients(strategy, num_available_clients=9)

    # Assert
    assert expected == actual


def test_fedavg_num_evaluation_clients_40_available(strategy_cls: type) -> None:
    """Test num_evaluation_clients function."""
    # Prepare
    strategy = strategy_cls(fraction_evaluate=0.05)
    expected = 2

    # Execute
    actual, _ = _num_evaluation_clients(strategy, num_available_clients=40)

    # Assert
    assert expected == actual


def test_fedavg_num_evaluation_clients_39_available(strategy_cls: type) -> None:
    """Test num_evaluation_clients function."""
    # Prepare
    strategy = strategy_cls(fraction_evaluate=0.05)
    expected = 2

    # Execute
    actual, _ = _num_evaluation_clients(strategy, num_available_clients=39)

    # Assert
    assert expected == actual


def test_fedavg_num_evaluation_clients_20_available(strategy_cls: type) -> None:
    """Test num_evaluation_clients function."""
    # Prepare
    strategy = strategy_cls(fraction_evaluate=0.05)
    expected = 2

    # Execute
    actual, _ = _num_evaluation_clients(strategy, num_available_clients=20)

    # Assert
    assert expected == actual


def test_fedavg_num_evaluation_clients_minimum(strategy_cls: type) -> None:
    """Test num_evaluation_clients function."""
    # Prepare
    strategy = strategy_cls(fraction_evaluate=0.05)
    expected = 2

    # Execute
    actual, _ = _num_evaluation_clients(strategy, num_available_clients=19)

    # Assert
    assert expected == actual


def test_inplace_aggregate_fit_equivalence(strategy_cls: type) -> None:
    """Test aggregate_fit equivalence between FedAvg and its inplace version."""
    # Prepare
    weights0_0 = np.random.randn(100, 64)
    weights0_1 = np.random.randn(314, 628, 3)
    weights1_0 = np.random.randn(100, 64)
    weights1_1 = np.random.randn(314, 628, 3)

    results = [
        create_mock_reply(ArrayRecord([weights0_0, weights0_1]), num_examples=1),
        create_mock_reply(ArrayRecord([weights1_0, weights1_1]), num_examples=5),
    ]

    fedavg_reference = aggregate_arrayrecords(
        [RecordDict(r.content) for r in results], "num-examples"
    )
    fedavg_inplace = strategy_cls()

    # Execute
    actual_aggregated, _ = fedavg_inplace.aggregate_train(1, results)

    # Assert
    assert actual_aggregated is not None
    for w_ref, w_act in zip(
        fedavg_reference.to_numpy_ndarrays(), actual_aggregated.to_numpy_ndarrays(), strict=True
    ):
        assert_allclose(w_ref, w_act)
