"""The one-line-per-round progress view (flwr_fsl.core.progress): on by default, off by setting."""

from __future__ import annotations

import re

import pytest

from flwr_fsl.core.progress import PROGRESS_ENV, RoundProgress, headline_metric
from flwr_fsl.strategies import FedSubAvg
from flwr_fsl.testing import InProcessGrid
from tests.core.test_settings import counting_app
from tests.flower_apps import make_app, model_record

LINE = re.compile(r"^round (\d)/2  train  3/3 clients  down \S+ \w?B  up \S+ \w?B  .*\d s$", re.M)


def test_a_strategy_prints_one_line_per_round(capsys: pytest.CaptureFixture[str]) -> None:
    FedSubAvg(fraction_evaluate=0.0).start(
        grid=InProcessGrid(make_app(), 3), initial_arrays=model_record(), num_rounds=2
    )
    lines = list(LINE.finditer(capsys.readouterr().out))
    assert [m.group(1) for m in lines] == ["1", "2"]
    assert all(float(m.group(0).split()[-2]) < 60 for m in lines)  # the round's seconds


def test_progress_is_off_by_attribute_or_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    strategy = FedSubAvg(fraction_evaluate=0.0)
    strategy.progress = False
    strategy.start(grid=InProcessGrid(make_app(), 3), initial_arrays=model_record(), num_rounds=1)
    monkeypatch.setenv(PROGRESS_ENV, "0")
    FedSubAvg(fraction_evaluate=0.0).start(
        grid=InProcessGrid(make_app(), 3), initial_arrays=model_record(), num_rounds=1
    )
    assert "round 1/1" not in capsys.readouterr().out


def test_a_failed_round_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    from flwr_fsl.core.errors import RunFailedError

    calls: list[int] = []
    with pytest.raises(RunFailedError):
        FedSubAvg(fraction_evaluate=0.0).start(
            grid=InProcessGrid(counting_app(calls, fail=True), 2),
            initial_arrays=model_record(),
            num_rounds=1,
        )
    assert re.search(r"^round 1/1  .*0/2 clients", capsys.readouterr().out, re.M)


def test_line_and_headline() -> None:
    assert headline_metric(None, {"loss": 0.5, "accuracy": 0.9}) == ("accuracy", 0.9)
    assert headline_metric({"x": "text", "f1": 1}) == ("f1", 1.0)
    line = RoundProgress(3, 10, ["advertise", "train"], 10, 9, 1.21e6, 3.1e5, ("acc", 0.91234),
                         4.2, None).line()  # fmt: skip
    assert (
        line
        == "round 3/10  advertise>train  9/10 clients  down 1.21 MB  up 310 kB  acc 0.9123  4.2 s"
    )
    failed = RoundProgress(1, 1, [], failure="TooFewClientsError: 1 left\nmore").line()
    assert failed == "round 1/1  FAILED: TooFewClientsError: 1 left"


def test_a_long_phase_chain_is_summarized() -> None:
    phases = [f"union-{p}" for p in ("advertise", "share", "train", "unmask")] + ["perturb"]
    line = RoundProgress(1, 2, phases, 6, 6).line()
    assert line == "round 1/2  5 phases union-advertise..perturb  6/6 clients"
