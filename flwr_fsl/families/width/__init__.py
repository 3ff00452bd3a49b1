"""Heterogeneous widths: FedRolex, HeteroFL and random width extraction over Flower.

``rules`` (width specs, capacity mixes, the index rules and their wire format), ``records``
(the record keys both ends use), ``strategy``
(:class:`~flwr_fsl.families.width.strategy.WidthFedAvg`) and ``mod``
(:data:`~flwr_fsl.families.width.mod.width_mod`). The width-scalable torch models an app trains
are in :mod:`flwr_fsl.models`.
"""
