"""Flower's own Message-API strategy tests, run against every FedAvg drop-in of ``flwr_fsl``.

Files named ``test_*_upstream.py`` and ``_upstream_utils.py`` keep the text of Flower's tests
(Copyright 2025 Flower Labs GmbH, Apache License 2.0; their headers are kept and say what was
changed). They come from ``adap/flower``, ``framework/py/flwr/serverapp/strategy/`` at commit
``fdef7afb1d`` (2026-03-29, version ``1.28.0.dev``): the stored copy of Flower's repository has
no ``v1.42.0`` tag, and the wheel of the installed ``flwr`` 1.42.0 ships no tests. The code
those tests exercise (``fedavg.py``, ``fedavgm.py``, ``strategy_utils.py``) differs between that
commit and the installed 1.42.0 only in its import lines (checked with ``diff``).

The class under test is swapped through the ``strategy_cls`` fixture (``conftest.py``); every
expected difference is one entry of :data:`tests.flower_upstream.conftest.EXPECTED_DIFFERENCES`
with its reason, marked ``xfail(strict=True)``, and documented in ``docs/dropin.md``.
"""
