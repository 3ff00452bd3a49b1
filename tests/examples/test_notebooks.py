"""Execute the example notebooks end to end in their tiny setting (nbclient).

The kernel is this interpreter: a kernelspec written to a temporary folder (put first on
``JUPYTER_PATH``) starts ``sys.executable -m ipykernel_launcher``, so the notebook sees the
same environment as the tests whatever kernelspecs the machine has.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from flwr_fsl.data import cache_dir
from tests.prepared_data import require_prepared

NOTEBOOKS = Path(__file__).resolve().parents[2] / "examples" / "notebooks"
KERNEL_NAME = "flwr-fsl-tests"


@pytest.fixture
def kernel_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python ({sys.executable})",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    jupyter_path = os.environ.get("JUPYTER_PATH", "")
    monkeypatch.setenv(
        "JUPYTER_PATH", os.pathsep.join(p for p in (str(tmp_path / "jupyter"), jupyter_path) if p)
    )
    monkeypatch.setenv("FLWR_FSL_NOTEBOOK_TINY", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("FLWR_FSL_CACHE", str(cache_dir()))
    return KERNEL_NAME


def run_notebook(name: str, kernel_name: str) -> tuple[nbformat.NotebookNode, str]:
    """Execute a notebook of ``examples/notebooks``; return it and its printed text."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
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
    return nb, text


def test_notebooks_are_committed_with_their_outputs() -> None:
    # Written by examples/notebooks/execute.py (tiny setting): every code cell ran, the plots
    # are PNG images, no log noise (stderr), and each file stays under 1 MB. The tests below
    # execute the notebooks in memory and never write them back.
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        assert path.stat().st_size < 1_000_000, path.name
        nb = nbformat.read(path, as_version=4)
        code = [cell for cell in nb.cells if cell.cell_type == "code"]
        assert all(cell.execution_count is not None for cell in code), path.name
        outputs = [out for cell in code for out in cell.outputs]
        assert any("image/png" in out.get("data", {}) for out in outputs), path.name
        assert not any(out.get("name") == "stderr" for out in outputs), path.name
        assert not any(out.get("output_type") == "error" for out in outputs), path.name


def test_topk_notebook_runs(kernel_name: str) -> None:
    require_prepared("mnist")
    nb, text = run_notebook("01_topk.ipynb", kernel_name)
    assert "tiny=True" in text
    assert "final acc %" in text and "top-k 10% EF" in text and "top-k 1%" in text
    images = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if "image/png" in out.get("data", {})
    ]
    assert images, "the plot cell displayed no image"
