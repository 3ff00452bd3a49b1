"""Tests of flwr_fsl.mods."""
