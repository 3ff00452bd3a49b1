"""Tests of flwr_fsl.protocols."""
