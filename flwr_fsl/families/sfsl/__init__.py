"""Niu et al.'s secure federated submodel learning (SFSL) over Flower's Message API.

``perturb`` (randomized-response index perturbation with RAPPOR memoization, Alg. 2), ``psu``
(Bloom-filter private set union, Alg. 3), ``protocol`` (count-weighted row vectors and their
quantizer, Alg. 1 / App. B-C), ``dp`` (the distributed differential privacy the strategy runs
by default: each client's noise inside its masked vectors, the accounting), ``messages`` (the
versioned ``SFSLSettings`` record and the round's asks), ``server``
(:class:`~flwr_fsl.families.sfsl.server.SFSLServer`, the round without Flower, and the
in-process driver ``run_round``), ``records`` (the typed phases), ``strategy``
(:class:`~flwr_fsl.families.sfsl.strategy.SFSLFedSubAvg`) and ``mod``
(:class:`~flwr_fsl.families.sfsl.mod.PerturbedRows`). Built on :mod:`flwr_fsl.families.secagg`.
"""
