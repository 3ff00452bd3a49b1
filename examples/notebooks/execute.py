"""Execute the notebooks at their tiny setting and write them back WITH their outputs.

The committed notebooks carry their outputs (tables, plots as PNG) so they read on the
repository page and in the docs without running anything. This is how they were made::

    python examples/notebooks/execute.py                 # every notebook
    python examples/notebooks/execute.py 01_topk.ipynb   # one

It runs each notebook as the test suite does (nbclient, a kernel on this interpreter,
``FLWR_FSL_NOTEBOOK_TINY=1``, ``MPLBACKEND=Agg``), keeps the standard-output streams and
displayed data, drops standard-error streams (Flower's and Ray's log lines) and the run's
timestamps, and refuses to write a notebook over :data:`MAX_BYTES`. The test suite executes
the notebooks in memory and never writes them back.

To open them: ``pip install jupyterlab`` (or ``pip install -e ".[notebooks]"``), then
``jupyter lab examples/notebooks``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
MAX_BYTES = 1_000_000
KERNEL = "flwr-fsl-notebooks"


def _kernel(root: Path) -> None:
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "Python", "language": "python"})
    )


def _clean(nb: nbformat.NotebookNode) -> None:
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        cell.outputs = [
            out
            for out in cell.outputs
            if not (out.get("output_type") == "stream" and out.get("name") == "stderr")
        ]
    nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}


def execute(path: Path) -> int:
    """Execute ``path`` in place; return its size in bytes."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, kernel_name=KERNEL, timeout=600, resources={"metadata": {"path": str(HERE)}}
    )
    client.execute()
    _clean(nb)
    text = nbformat.writes(nb) + "\n"
    if len(text.encode()) > MAX_BYTES:
        raise SystemExit(f"{path.name}: {len(text.encode()):,} bytes > {MAX_BYTES:,}; not written")
    path.write_text(text)
    return len(text.encode())


def main(argv: list[str]) -> int:
    """Execute the notebooks named in ``argv`` (default: all) and write them back."""
    names = argv or sorted(p.name for p in HERE.glob("*.ipynb"))
    with tempfile.TemporaryDirectory() as tmp:
        _kernel(Path(tmp))
        os.environ["JUPYTER_PATH"] = os.pathsep.join(
            p for p in (tmp, os.environ.get("JUPYTER_PATH", "")) if p
        )
        os.environ["FLWR_FSL_NOTEBOOK_TINY"] = "1"
        os.environ["MPLBACKEND"] = "Agg"
        os.environ.setdefault("FLWR_FSL_PROGRESS", "1")
        for name in names:
            started = time.perf_counter()
            size = execute(HERE / name)
            print(f"{name}: {size:,} bytes, {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
