"""Execute ``examples/notebooks/02_secure_submodel_aggregation.ipynb`` in its tiny setting.

Same runner as ``tests/examples/test_notebooks.py`` (its ``kernel_name`` fixture: this
interpreter as the kernel, ``FLWR_FSL_NOTEBOOK_TINY=1``); that file's output check covers this
notebook too.
"""

from __future__ import annotations

import re

from tests.examples.test_notebooks import NOTEBOOKS, run_notebook
from tests.examples.test_notebooks import kernel_name as kernel_name  # the fixture
from tests.prepared_data import require_prepared

NOTEBOOK = NOTEBOOKS / "02_secure_submodel_aggregation.ipynb"


def test_secure_submodel_notebook_runs(kernel_name: str) -> None:
    require_prepared("mnist", "movielens")
    nb, text = run_notebook(NOTEBOOK.name, kernel_name)
    assert "tiny=True" in text
    assert "plaintext top-k 10%" in text and "secure top-k 1%" in text
    assert "FAILED" not in text and "dropped" not in text
    # After one round the secure model is the plaintext one up to fixed-point rounding.
    match = re.search(
        r"after round 1: max \|secure - plaintext\| over the global models: (\S+)", text
    )
    assert match is not None and float(match.group(1)) < 1e-5
    # Index mode: round 1 with fresh keys, round 2 with U-DPF hints.
    assert "U-DPF hint" in text and "of fresh)" in text
    images = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if "image/png" in out.get("data", {})
    ]
    assert len(images) == 2, "the two plot cells must each display an image"
