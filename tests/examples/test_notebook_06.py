"""Execute ``examples/notebooks/06_heterogeneous_widths.ipynb`` in its tiny setting.

Same runner as ``tests/examples/test_notebooks.py`` (its ``kernel_name`` fixture: this
interpreter as the kernel, ``FLWR_FSL_NOTEBOOK_TINY=1``); that file's output check covers this
notebook too.
"""

from __future__ import annotations

import re

from tests.examples.test_notebooks import NOTEBOOKS, run_notebook
from tests.examples.test_notebooks import kernel_name as kernel_name  # the fixture
from tests.prepared_data import require_prepared

NOTEBOOK = NOTEBOOKS / "06_heterogeneous_widths.ipynb"


def _seen(rule: str, text: str) -> float:
    match = re.search(
        rf"^{re.escape(rule)} +a 1/4 client saw +([\d.]+)% of the channels", text, re.M
    )
    assert match is not None, rule
    return float(match.group(1))


def test_heterogeneous_widths_notebook_runs(kernel_name: str) -> None:
    require_prepared("mnist")
    nb, text = run_notebook(NOTEBOOK.name, kernel_name)
    assert "tiny=True" in text
    # 1. The index sets: a 1/4 client under static sees its 50 channels only; rolling's window
    # moves one channel a round (50 + 59 of 200 in 60 rounds); random and shards see all.
    assert _seen("HeteroFL (static)", text) == 25.0
    assert _seen("FedRolex (rolling)", text) == 54.5
    assert _seen("random", text) == 100.0
    assert _seen("SESA shards (one draw)", text) == 100.0
    assert re.search(r"^HeteroFL \(static\) .* min 3, max 9$", text, re.M)
    # 2. Every arm trained; narrow clients download less (FedRolex, round 1).
    down = {
        float(rate): int(value.replace(",", ""))
        for rate, value in re.findall(r"FedRolex round 1, capacity ([\d.]+): ([\d,]+) B", text)
    }
    assert set(down) == {1.0, 0.5, 0.25} and down[1.0] > down[0.5] > down[0.25]
    final = re.search(r"^final accuracy: (.*)$", text, re.M)
    assert final is not None
    assert [p.split()[0] for p in final.group(1).split(", ")] == [
        "full", "fedrolex", "heterofl", "random", "sesa"
    ]  # fmt: skip
    # 3. SESA: a train reply is one masked field; the server's decoded per-shard counts are the
    # true counts of the clients' secret choices.
    assert "a train reply holds: arrays [], metrics [], configs ['fsl.sesa'] -> ['masked']" in text
    means = [float(m) for m in re.findall(r"byte mean ([\d.]+) \(uniform", text)]
    assert len(means) == 4 and all(120 < m < 135 for m in means)
    assert re.search(r"true count: \[.*\]; equal: True", text)
    images = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if "image/png" in out.get("data", {})
    ]
    assert len(images) == 2, "the two plot cells must display an image each"
