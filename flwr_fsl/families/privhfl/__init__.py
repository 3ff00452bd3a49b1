"""PrivHFL (Sun et al.): heterogeneous models sharing knowledge through private queries.

``queries`` (mixup/cutmix/cutout query expansion and selection), ``protocol`` (the 3-party
secret-shared secure prediction and aggregation: the querier and the in-process driver), with
``config`` (its settings and seeds), ``ops`` (each party's steps of every interactive op) and
``wire`` (the byte format of its messages), ``inference`` (models as secure layers, on the
public layer types of ``architecture``),
``flow`` (the schedule, deals and per-party state of one secure session), ``messages`` (the
strict byte formats of the secure arm), ``server`` (the server's secure round,
:class:`~flwr_fsl.families.privhfl.server.PrivHFLServer`, and the in-process driver
:func:`~flwr_fsl.families.privhfl.server.run_secure_query`), ``client`` (the querier's and the
answerer's secure handlers), ``records`` (the Flower record keys both ends use),
``strategy`` (:class:`~flwr_fsl.families.privhfl.strategy.PrivHFL`) and ``mod``
(:class:`~flwr_fsl.families.privhfl.mod.PrivHFLClient`). The torch models are in
:mod:`flwr_fsl.models.privhfl`.
"""
