"""Execute ``examples/notebooks/03_private_word_rows.ipynb`` in its tiny setting.

Same runner as ``tests/examples/test_notebooks.py`` (its ``kernel_name`` fixture: this
interpreter as the kernel, ``FLWR_FSL_NOTEBOOK_TINY=1``); that file's output check covers this
notebook too.
"""

from __future__ import annotations

import re

from tests.examples.test_notebooks import NOTEBOOKS, run_notebook
from tests.examples.test_notebooks import kernel_name as kernel_name  # the fixture
from tests.prepared_data import require_prepared

NOTEBOOK = NOTEBOOKS / "03_private_word_rows.ipynb"


def test_private_word_rows_notebook_runs(kernel_name: str) -> None:
    require_prepared("newsgroups")
    nb, text = run_notebook(NOTEBOOK.name, kernel_name)
    assert "tiny=True" in text
    assert "bytes per client and round" in text and "what S0 saw" in text
    assert "WARNING" not in text
    match = re.search(r"final accuracy: secure (\S+)%, plaintext (\S+)%; .* = (\S+)", text)
    assert match is not None
    assert abs(float(match.group(1)) - float(match.group(2))) < 0.05
    assert float(match.group(3)) < 1e-5
    match = re.search(r"secure upload = (\S+)% of dense", text)
    assert match is not None and float(match.group(1)) < 100
    images = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if "image/png" in out.get("data", {})
    ]
    assert len(images) == 1, "the plot cell must display an image"
