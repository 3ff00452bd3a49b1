"""Tests of flwr_fsl.data."""
