"""Execute ``examples/notebooks/07_privhfl.ipynb`` in its tiny setting.

Same runner as ``tests/examples/test_notebooks.py`` (its ``kernel_name`` fixture: this
interpreter as the kernel, ``FLWR_FSL_NOTEBOOK_TINY=1``); that file's output check covers this
notebook too.
"""

from __future__ import annotations

import re

from tests.examples.test_notebooks import NOTEBOOKS, run_notebook
from tests.examples.test_notebooks import kernel_name as kernel_name  # the fixture
from tests.prepared_data import require_prepared

NOTEBOOK = NOTEBOOKS / "07_privhfl.ipynb"


def test_privhfl_notebook_runs(kernel_name: str) -> None:
    require_prepared("fashion")
    nb, text = run_notebook(NOTEBOOK.name, kernel_name)
    assert "tiny=True" in text
    # 1. the three expansions, six images each
    for method in ("mixup", "cutmix", "cutout"):
        assert re.search(rf"^{method}: 6 images", text, re.M), method
    # 2. the secure query equals the plaintext logits
    assert "within 1e-3: True" in text and "argmax equal: True" in text
    # ... and so does the same query over the strategy's messages, without Flower
    flow = r"over the messages \(keys, generate, step-1, \.\.\., retrain\): .*within 1e-3: True"
    assert re.search(flow + r"; nodes dropped: 0$", text, re.M)
    # 3. the paper's DReLU gives the querier every clear hidden sign; DCF gives it nothing
    match = re.search(r"hidden values it recovers: (\d+)/(\d+)", text)
    assert match is not None and int(match.group(1)) == int(match.group(2)) > 0
    dcf = "DCF run (record_leak=True): values the querier learned: 0"
    assert f"{dcf} (logits equal within 1e-3 in both: True)" in text
    # 4. the app ran: per-client table, no drop
    assert "what each party learned (plaintext answering)" in text
    assert "dropped: none" in text and re.search(r"mean accuracy: before [\d.]+%", text)
    images = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if "image/png" in out.get("data", {})
    ]
    assert len(images) == 1, "the expansion cell must display an image"
