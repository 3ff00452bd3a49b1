"""Tests of flwr_fsl.helper."""
