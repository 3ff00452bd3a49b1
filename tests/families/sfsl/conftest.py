"""SFSL tests keep their randomized-response memos in a fresh ``FLWR_HOME`` each.

``PerturbedRows`` persists its permanent answers under ``$FLWR_HOME/fsl/sfsl-memo`` by default
(one file per node id); the in-process grid reuses node ids, so without this one test's memo
(drawn with its own ``p1, p2``) would reach the next.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _own_flwr_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path_factory.mktemp("flwr-home")))
