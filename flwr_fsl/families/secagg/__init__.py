"""Bonawitz et al.'s secure aggregation (SecAgg) over Flower's Message API.

``protocol`` (parties, Shamir shares, masks), ``messages`` (the byte formats), ``rounds`` (the
in-process driver :func:`~flwr_fsl.families.secagg.rounds.run_round`), ``vector`` (the weighted
fixed-point vector a client masks), ``records`` (the Flower record keys both ends use),
``strategy`` (:class:`~flwr_fsl.families.secagg.strategy.SecAggFedAvg`) and ``mod``
(:data:`~flwr_fsl.families.secagg.mod.secagg_mod`).
"""
