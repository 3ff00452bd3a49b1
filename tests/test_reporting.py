"""Tests of run histories: from a Flower Result, JSON round trip, table and plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from flwr.app import MetricRecord
from flwr.serverapp.strategy import Result

from flwr_fsl.reporting import (
    RunHistory,
    comparison_table,
    load_histories,
    plot_histories,
    save_histories,
)
from flwr_fsl.strategies import RoundTraffic


def _result(accs: list[float], up: float | None = None) -> Result:
    result = Result()
    for r, acc in enumerate(accs):
        result.evaluate_metrics_serverapp[r] = MetricRecord({"accuracy": acc, "loss": 1 - acc})
    if up is not None:
        for r in range(1, len(accs)):
            result.train_metrics_clientapp[r] = MetricRecord(
                {"up-bytes-per-client": up, "down-bytes-per-client": 1000.0}
            )
    return result


def _traffic(rounds: int, up: int, down: int = 1000) -> list[RoundTraffic]:
    log = []
    for r in range(1, rounds + 1):
        log.append(RoundTraffic(r, "train", {1: down, 2: down}, {1: up, 2: up + 2}))
        log.append(RoundTraffic(r, "evaluate", {1: down}, {1: 10}))
    return log


def test_from_result_uses_train_traffic_only() -> None:
    h = RunHistory.from_result("x", _result([0.1, 0.5, 0.9]), _traffic(2, up=500))
    assert h.rounds == [0, 1, 2] and h.accuracy == [0.1, 0.5, 0.9]
    assert h.loss == pytest.approx([0.9, 0.5, 0.1])
    assert h.traffic_rounds == [1, 2]
    assert h.up_bytes_per_client == [501.0, 501.0]  # mean of 500 and 502, evaluate ignored
    assert h.down_bytes_per_client == [1000.0, 1000.0]
    assert h.final_accuracy == 0.9
    assert h.mean_up_mb == pytest.approx(501e-6)


def test_from_result_falls_back_to_train_metrics() -> None:
    h = RunHistory.from_result("x", _result([0.1, 0.2], up=300.0))
    assert h.traffic_rounds == [1] and h.up_bytes_per_client == [300.0]


def test_missing_metrics_become_none() -> None:
    result = Result()
    result.evaluate_metrics_serverapp[1] = MetricRecord({"other": 1.0})
    h = RunHistory.from_result("x", result)
    assert h.accuracy == [None] and h.final_accuracy is None and h.mean_up_mb == 0.0


def test_json_roundtrip(tmp_path: Path) -> None:
    hs = [
        RunHistory.from_result("dense", _result([0.1, 0.9]), _traffic(1, up=1000)),
        RunHistory.from_result("top-k", _result([0.1, 0.85]), _traffic(1, up=200), config={"k": 1}),
    ]
    path = save_histories(hs, tmp_path / "sub" / "h.json", meta={"seed": 1})
    doc = json.loads(path.read_text())
    assert doc["meta"] == {"seed": 1}
    assert doc["runs"][1]["final_accuracy"] == 0.85
    assert load_histories(path) == hs


def test_load_rejects_other_files(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"format": "something-else", "runs": []}))
    with pytest.raises(ValueError, match="not a"):
        load_histories(path)
    with pytest.raises(ValueError, match="malformed"):
        RunHistory.from_dict({"label": "x"})


def test_lengths_are_validated() -> None:
    with pytest.raises(ValueError, match="same length"):
        RunHistory("x", rounds=[1], accuracy=[], loss=[])


def test_comparison_table() -> None:
    hs = [
        RunHistory.from_result("dense", _result([0.1, 0.98]), _traffic(1, up=1_000_000)),
        RunHistory.from_result("top-k 10% EF", _result([0.1, 0.975]), _traffic(1, up=200_000)),
    ]
    table = comparison_table(hs)
    lines = table.splitlines()
    assert "final acc %" in lines[0] and "up vs dense" in lines[0]
    assert lines[2].split()[:2] == ["dense", "98.00"]
    assert "97.50" in lines[3] and "-0.50" in lines[3] and "20.0%" in lines[3]
    assert "up vs" not in comparison_table(hs, baseline=None)


def test_plot_writes_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    hs = [RunHistory.from_result("dense", _result([0.1, 0.5, 0.9]), _traffic(2, up=1000))]
    fig = plot_histories(hs, tmp_path / "p.png", title="t")
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert len(fig.axes) == 2


def test_plot_without_matplotlib_raises_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    hs = [RunHistory.from_result("dense", _result([0.1]))]
    with pytest.raises(ImportError, match="matplotlib"):
        plot_histories(hs)


def test_plot_rejects_empty() -> None:
    with pytest.raises(ValueError, match="empty"):
        plot_histories([])
