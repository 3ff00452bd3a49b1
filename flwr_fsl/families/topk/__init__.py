"""Plaintext top-k submodel averaging, the base of the secure top-k strategies.

:class:`~flwr_fsl.families.topk.strategy.FedSubAvg` (count-weighted, a drop-in for Flower's
``FedAvg``) and :data:`~flwr_fsl.families.topk.mod.topk_mod` (sparsify the user's dense reply).
"""
