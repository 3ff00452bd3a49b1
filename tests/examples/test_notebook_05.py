"""Execute ``examples/notebooks/05_sfsl.ipynb`` in its tiny setting.

Same runner as ``tests/examples/test_notebooks.py`` (its ``kernel_name`` fixture: this
interpreter as the kernel, ``FLWR_FSL_NOTEBOOK_TINY=1``); that file's output check covers this
notebook too.
"""

from __future__ import annotations

import re

import pytest

from tests.examples.test_notebooks import NOTEBOOKS, run_notebook
from tests.examples.test_notebooks import kernel_name as kernel_name  # the fixture
from tests.prepared_data import require_prepared

NOTEBOOK = NOTEBOOKS / "05_sfsl.ipynb"
PHASES = (
    "union-advertise",
    "union-share",
    "union-train",
    "union-unmask",
    "perturb",
    "rows-advertise",
    "rows-share",
    "rows-train",
    "rows-unmask",
)


def _float(pattern: str, text: str) -> list[float]:
    return [float(v) for v in re.findall(pattern, text)]


def test_sfsl_notebook_runs(kernel_name: str) -> None:
    require_prepared("movielens")
    nb, text = run_notebook(NOTEBOOK.name, kernel_name)
    assert "tiny=True" in text
    # 1. PSU: the exact union; Bloom mode a superset.
    assert "equals the union of the users' row sets: True" in text
    assert "superset of the union: True" in text
    # 2. Table V's epsilons, and the memo defeating the majority vote.
    assert re.search(r"^cpp2 +0\.9375 +0\.0625 +0\.8828 +0\.1172 +2\.02 +2\.71$", text, re.M)
    assert "without the memo: the vote is S: True" in text
    assert "the vote is the permanent yes answers: True" in text
    # 3. Every phase of a round, in order, with the train config on the perturb message.
    found = re.findall(r"^(\S+) +down +[\d,]+ B/client +up +[\d,]+ B/client", text, re.M)
    assert found == list(PHASES)
    assert "failed rounds: none, dropped: 0" in text
    assert re.search(r"carries the round's train config: \{.*'sfsl-cpp': 'cpp2'", text)
    # 4. SFSL == plaintext count-weighted averaging each round, and CPP1/CPP5 == FedSubAvg.
    diffs = _float(r"max \|SFSL - plaintext count-weighted average\| = (\S+)", text)
    assert len(diffs) == 2 and all(d < 1e-5 for d in diffs)
    for arm in ("sfsl-cpp1", "sfsl-cpp5"):
        (diff,) = _float(rf"max \|{arm} - fedsubavg \(rows\)\| over the final models: (\S+)", text)
        assert diff < 1e-5
    # 5. What the server sees: a single-participant real row is that client's update.
    match = re.search(r"single-participant rows: (\d+) \(real: (\d+), fake: (\d+)\)", text)
    assert match is not None and int(match.group(1)) > 0
    (gap,) = _float(r"max \|aggregate update - that client's own update\| = (\S+)", text)
    assert gap < 1e-5
    assert re.search(r"fake ones: rows that moved: 0 ", text)
    # 6. The defaults: distributed DP, one Gaussian round at z = 1 per round, accounted.
    match = re.search(r"after (\d+) rounds \(epsilon, delta\) = \((\S+), 1e-05\)", text)
    assert match is not None and int(match.group(1)) == 2
    assert float(match.group(2)) == pytest.approx(7.08, abs=0.01)
    assert "noise multiplier per round 1.000" in text
    images = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if "image/png" in out.get("data", {})
    ]
    assert len(images) == 1, "the plot cell must display an image"
    assert re.search(r"final AUC: fedavg \S+, fedsubavg \S+, sfsl-cpp1.*, sfsl-dp \S+", text)
