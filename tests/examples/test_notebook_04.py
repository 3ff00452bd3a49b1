"""Execute ``examples/notebooks/04_secure_aggregation.ipynb`` in its tiny setting.

Same runner as ``tests/examples/test_notebooks.py`` (its ``kernel_name`` fixture: this
interpreter as the kernel, ``FLWR_FSL_NOTEBOOK_TINY=1``); that file's output check covers this
notebook too.
"""

from __future__ import annotations

import re

from tests.examples.test_notebooks import NOTEBOOKS, run_notebook
from tests.examples.test_notebooks import kernel_name as kernel_name  # the fixture
from tests.prepared_data import require_prepared

NOTEBOOK = NOTEBOOKS / "04_secure_aggregation.ipynb"


def test_secure_aggregation_notebook_runs(kernel_name: str) -> None:
    require_prepared("mnist")
    nb, text = run_notebook(NOTEBOOK.name, kernel_name)
    assert "tiny=True" in text
    # The four phases ran with every client; the reply holds only the masked uint64 words.
    for phase in ("advertise", "share", "train", "unmask"):
        assert re.search(rf"^{phase} +down +[\d,]+ B/client +up +[\d,]+ B/client", text, re.M)
    assert "failed rounds: none" in text
    assert re.search(r"reply = masked: uint64\[\d+\]; num-examples", text)
    assert "unmasked vector holds it, masked vector lacks it" in text
    # SecAgg == FedAvg up to the fixed point, in the experiment and with a train-phase dropout.
    match = re.search(r"max \|SecAggFedAvg - FedAvg\| over the final models: (\S+)", text)
    assert match is not None and float(match.group(1)) < 1e-5
    diffs = re.findall(r"(train|unmask)-phase dropout: SecAgg over (\d+) clients; .* = (\S+)", text)
    assert [(p, int(n)) for p, n, _ in diffs] == [("train", 3), ("unmask", 4)]
    assert all(float(d) < 1e-5 for _, _, d in diffs)
    assert "round failed" in text and "model unchanged: True" in text
    match = re.search(r"final accuracy: FedAvg (\S+)%, SecAggFedAvg (\S+)%", text)
    assert match is not None and abs(float(match.group(1)) - float(match.group(2))) < 0.5
    images = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if "image/png" in out.get("data", {})
    ]
    assert len(images) == 2, "the two plot cells must each display an image"
