"""Tests of flwr_fsl.crypto and flwr_fsl.kernels."""
