"""A user's own SSA app with an in-process S1 is told, once, that S1 is no separate party."""

from __future__ import annotations

import logging

import pytest

from flwr_fsl.helper import InProcessHelper
from flwr_fsl.helper import setup as helper_setup
from flwr_fsl.strategies import SecureFedSubAvg, SecureRowFedSubAvg


def test_the_caveat_is_logged_once_per_process(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(helper_setup, "_CAVEAT_SHOWN", set())
    with caplog.at_level(logging.WARNING, logger="flwr_fsl.helper.setup"):
        SecureFedSubAvg(InProcessHelper(), 0.1)
        SecureFedSubAvg(InProcessHelper(), 0.1)
        SecureRowFedSubAvg(InProcessHelper(), "emb.weight", 4)
    said = [r for r in caplog.records if "S1 runs in-process" in r.getMessage()]
    assert len(said) == 1


def test_no_caveat_for_a_remote_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helper_setup, "_CAVEAT_SHOWN", set())
    assert not helper_setup.note_in_process(object())
    assert helper_setup.note_in_process(InProcessHelper())
    assert not helper_setup.note_in_process(InProcessHelper())
