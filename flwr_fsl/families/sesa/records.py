"""SESA's record keys and phase names: what its strategy writes and its mod reads."""

from __future__ import annotations

__all__ = ["SESA_KEY", "SESA_PHASES"]

SESA_KEY = "fsl.sesa"
"""The ``ConfigRecord`` of the SESA protocol, in both directions."""
SESA_PHASES = ("advertise", "offline", "train", "decode")
