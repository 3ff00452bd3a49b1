"""SESA (Sami & Güler): shard-based random submodels, Lagrange-coded secure submodel aggregation.

``protocol`` (parties, messages, Lagrange coding over F_p), ``layout`` (shards of a width
layout), ``records``, ``strategy`` (:class:`~flwr_fsl.families.sesa.strategy.SesaFedAvg`) and
``mod`` (:data:`~flwr_fsl.families.sesa.mod.sesa_mod`). Built on :mod:`flwr_fsl.families.width`.
"""
