"""Tests of flwr_fsl.strategies."""
