"""``benchmarks/newsgroups_compare.py --quick`` runs every arm and keeps its promises.

Issue 22 item 6: on real 20 Newsgroups data (skipped unless prepared), every arm finishes
without a failed round, secure top-k with mega-elements reaches plaintext top-k's accuracy
(the same update up to fixed-point error), and the byte columns have the expected order
(top-k uploads less than dense; the secure upload is DPF keys, larger than the plaintext rows).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.prepared_data import require_prepared

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "newsgroups_compare.py"


def test_quick_run_prints_every_arm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_prepared("newsgroups")
    spec = importlib.util.spec_from_file_location("newsgroups_compare", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["newsgroups_compare"] = module
    spec.loader.exec_module(module)
    out = tmp_path / "rows.json"
    assert module.main(["--quick", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = {r["arm"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == set(module.ARMS)
    for arm in module.ARMS:
        assert arm in printed
        assert rows[arm]["failed_rounds"] == 0
        assert rows[arm]["up_bytes"] > 0 and rows[arm]["down_bytes"] > 0
    assert rows["secure-topk-mega"]["accuracy"] == pytest.approx(
        rows["topk-mega"]["accuracy"], abs=0.01
    )
    assert rows["topk-mega"]["up_bytes"] < rows["dense"]["up_bytes"]
    assert rows["topk-mega"]["up_bytes"] < rows["secure-topk-mega"]["up_bytes"]
    assert "one padded instance" in printed
