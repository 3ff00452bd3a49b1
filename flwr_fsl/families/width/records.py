"""The width family's record keys: what its strategy writes and its mod reads."""

from __future__ import annotations

__all__ = ["RATE_CONFIG_KEY", "RATE_NODE_CONFIG_KEY", "WIDTH_KEY"]

WIDTH_KEY = "fsl.width"
"""The ``ConfigRecord`` of the width protocol, in both directions."""
RATE_CONFIG_KEY = "width-rate"
"""Where the train function finds its rate, in the message's config record."""
RATE_NODE_CONFIG_KEY = "width-rate"
"""Node config key of the node's capacity (``--node-config "width-rate=0.25"``)."""
