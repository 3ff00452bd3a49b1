"""Cui et al.'s two-server secure submodel aggregation (SSA) and private submodel retrieval (PSR).

Flower-free: ``protocol`` (DPF uploads, cuckoo bins, both servers' shares), ``psr`` (private
row retrieval), ``two_server`` (S0's lead-server round against S1), ``dp`` (both servers'
distributed noise, clipping, the DP defaults and the run scope; the accounting is
:class:`~flwr_fsl.core.privacy.PrivacyAccount`, with the zCDP bound kept as a cross-check).
Flower ends: ``records`` (record keys and upload records),
``aggregation_strategy`` (:class:`~flwr_fsl.families.ssa.aggregation_strategy.SSASettings`, the
two-server aggregation a strategy holds), ``strategy``
(:class:`~flwr_fsl.families.ssa.strategy.SecureFedSubAvg`), ``index_strategy``
(:class:`~flwr_fsl.families.ssa.index_strategy.SecureRowFedSubAvg`), ``mod_base`` (the SSA
client-mod base), ``mod`` (:data:`~flwr_fsl.families.ssa.mod.ssa_mod`) and ``index_mod``
(:class:`~flwr_fsl.families.ssa.index_mod.PrivateRows`). S1 itself is
:mod:`flwr_fsl.helper`, whose services run this family's Flower-free parties.
"""
