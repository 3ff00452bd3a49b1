"""Test and notebook helpers: run a ServerApp strategy against a ClientApp in one process."""

from flwr_fsl.testing.grid import InProcessGrid

__all__ = ["InProcessGrid"]
