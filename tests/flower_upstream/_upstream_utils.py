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
# Modified for flwr_fsl: only ``create_mock_reply`` of Flower's
# framework/py/flwr/serverapp/strategy/strategy_utils_test.py (adap/flower at fdef7afb1d), the
# helper fedavgm_test.py imports; imports from ``flwr.app`` (1.42's layout). The rest of that
# file tests Flower's utility functions, not a strategy, and needs ``parameterized``.
"""Tests for message-based strategy utilities."""

from unittest.mock import Mock

from flwr.app import (
    ArrayRecord,
    Message,
    MetricRecord,
    RecordDict,
)


def create_mock_reply(arrays: ArrayRecord, num_examples: float) -> Message:
    """Create a mock reply Message with default keys."""
    message = Mock(spec=Message)
    message.content = RecordDict(
        {"arrays": arrays, "metrics": MetricRecord({"num-examples": num_examples})}
    )
    message.has_error.side_effect = lambda: False
    message.has_content.side_effect = lambda: True
    return message
