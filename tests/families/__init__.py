"""Tests of each protocol family, one folder per family (as flwr_fsl/families)."""
