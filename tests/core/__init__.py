"""Tests of ``flwr_fsl.core``: the round engine's typed phase contract."""
