"""Tests of flwr_fsl.submodel."""
