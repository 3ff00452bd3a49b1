"""Tests of flwr_fsl.models."""
