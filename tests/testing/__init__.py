"""Tests of flwr_fsl.testing."""
