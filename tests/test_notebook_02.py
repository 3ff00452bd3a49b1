"""Execute ``examples/notebooks/02_secure_submodel_aggregation.ipynb`` in its tiny setting.

Same runner as ``tests/test_notebooks.py`` (its ``kernel_name`` fixture: this interpreter as
the kernel, ``FLWR_FSL_NOTEBOOK_TINY=1``); that file's output check covers this notebook too.
"""

from __future__ import annotations

import os
import re

import nbformat
import pytest
from nbclient import NotebookClient

from flwr_fsl.data import cache_dir
from tests.test_notebooks import NOTEBOOKS
from tests.test_notebooks import kernel_name as kernel_name  # the fixture

NOTEBOOK = NOTEBOOKS / "02_secure_submodel_aggregation.ipynb"


def test_secure_submodel_notebook_runs(kernel_name: str) -> None:
    missing = [n for n in ("mnist", "movielens") if not (cache_dir() / f"{n}.npz").is_file()]
    if missing:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{missing} cache missing under CI: `make data` must run before the tests")
        pytest.skip(f"{missing} not prepared (python -m flwr_fsl.data prepare mnist movielens)")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name=kernel_name,
        timeout=300,
        resources={"metadata": {"path": str(NOTEBOOKS)}},
    )
    client.execute()
    text = "\n".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.get("output_type") == "stream"
    )
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
