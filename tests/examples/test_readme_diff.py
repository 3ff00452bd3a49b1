"""The drop-in diffs of the README and the docs, applied as printed to a ``flwr new``-like app, run.

``tests/examples/quickstart`` is a PyTorch Message-API app in the shape Flower's template has
(``ClientApp()``, ``FedAvg(fraction_train=...)``, ``strategy.start(...)``, run config in
``pyproject.toml``). Each test reads the ```diff blocks of one "Drop-in" section (README.md's
top-k one, and one per family page in ``docs/families/``), applies them with a small strict
patcher (every removed line must be found, context lines anchor the additions) and runs the
patched app on the in-process grid: top-k (FedSubAvg + topk_mod), the private version
(SecureFedSubAvg + ssa_mod, S1 in-process, pinned by the fingerprint the page's pyproject line
asks for), SecAgg, width extraction and SESA. ``tests/examples/rows_quickstart`` is an index-mode
app with one private table (``PrivateRows`` + ``SecureRowFedSubAvg``): the SSA page's mixed-tables
diff (a derived table and the dense MLP) is applied to it and run. A README or docs edit that
no longer applies or runs fails here.
"""

from __future__ import annotations

import importlib
import logging
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
import torch
from flwr.app import Context, RecordDict

from flwr_fsl.helper.setup import load_or_create_key
from flwr_fsl.pinning import default_key_file
from flwr_fsl.testing import InProcessGrid

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = Path(__file__).resolve().parent / "quickstart"
ROWS_TEMPLATE = Path(__file__).resolve().parent / "rows_quickstart"  # index mode, one table
APP_FILES = {
    "client_app.py": "quickstart_app/client_app.py",
    "server_app.py": "quickstart_app/server_app.py",
    "task.py": "quickstart_app/task.py",
    "pyproject.toml": "pyproject.toml",
}


# Every family page's drop-in section, by family: the tests below apply each one.
DROPIN_SECTIONS = {
    "topk": "Drop-in: top-k submodels on Flower's PyTorch app",
    "ssa": "Drop-in: make top-k private (two servers)",
    "secagg": "Drop-in: secure aggregation for plain FedAvg",
    "sfsl": "Drop-in: a private row table on one server",
    "width": "Drop-in: clients of different capacity",
    "sesa": "Drop-in: secure shards",
    "privhfl": "Drop-in: heterogeneous models that share knowledge, not weights",
}


def section_diffs(page: str, heading: str) -> list[str]:
    """Return the ```diff blocks of one ``## heading`` section of a page (README or docs)."""
    text = (REPO / page).read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```diff\n(.*?)```", text[start : end if end > 0 else None], flags=re.S)


def readme_diffs() -> tuple[list[str], list[str]]:
    """Return the diff blocks of the top-k drop-in (README) and of "make it private" (SSA page)."""
    heading = "Drop-in: turn Flower's PyTorch app into a top-k submodel app"
    topk = section_diffs("README.md", heading)
    private = section_diffs("docs/families/ssa.md", "Drop-in: make top-k private (two servers)")
    return topk, private


def apply_diff(root: Path, block: str) -> None:
    """Apply one README diff block to the file its first line names.

    Raises
    ------
    AssertionError
        If a removed or context line is not found (the README no longer matches the app).
    """
    header, *lines = block.rstrip("\n").split("\n")
    name = header.strip().lstrip("#").strip()
    section = None
    if "," in name:
        name, section = (part.strip() for part in name.split(",", 1))
    path = root / APP_FILES[name]
    text = path.read_text().split("\n")
    cursor = 0
    if section is not None:
        cursor = text.index(section) + 1
    for line in lines:
        kind, body = line[:1], line[1:]
        if line.strip() == "..." or not line.strip():
            continue
        if kind == " ":
            found = _find(text, body, cursor)
            cursor = found + 1
        elif kind == "-":
            found = _find(text, body, cursor)
            del text[found]
            cursor = found
        elif kind == "+":
            text.insert(cursor, body)
            cursor += 1
        else:
            raise AssertionError(f"unexpected diff line {line!r}")
    path.write_text("\n".join(text))


def _find(text: list[str], body: str, start: int) -> int:
    for i in range(start, len(text)):
        if text[i] == body:
            return i
    raise AssertionError(f"README diff line not found in the app: {body!r}")


@pytest.fixture
def app_dir(tmp_path: Path) -> Iterator[Path]:
    yield from _app(tmp_path, TEMPLATE)


@pytest.fixture
def rows_app_dir(tmp_path: Path) -> Iterator[Path]:
    yield from _app(tmp_path, ROWS_TEMPLATE)


def _app(tmp_path: Path, template: Path) -> Iterator[Path]:
    root = tmp_path / "app"
    shutil.copytree(template, root)
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for module in [m for m in sys.modules if m.split(".")[0] == "quickstart_app"]:
            del sys.modules[module]


def run_app(root: Path, num_nodes: int = 3) -> Path:
    """Import the (patched) app and run its ServerApp main on the in-process grid."""
    for module in [m for m in sys.modules if m.split(".")[0] == "quickstart_app"]:
        del sys.modules[module]
    client = importlib.import_module("quickstart_app.client_app")
    server = importlib.import_module("quickstart_app.server_app")
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    model_path = root / "final_model.pt"
    run_config = {**config, "model-path": str(model_path)}
    grid = InProcessGrid(client.app, num_nodes, run_config)
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    server.main(grid, context)
    return model_path


def test_topk_then_private_diffs_apply_and_run(
    app_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    topk, private = readme_diffs()
    assert len(topk) == 3 and len(private) == 3, "a top-k drop-in section changed shape"
    # The top-k page shows the README's diff (with more settings in comments): both apply.
    docs_topk = section_diffs(
        "docs/families/topk.md", "Drop-in: top-k submodels on Flower's PyTorch app"
    )
    assert len(docs_topk) == 3, "docs/families/topk.md's drop-in section changed shape"
    for block in docs_topk:
        apply_diff(app_dir, block)
    run_app(app_dir)
    shutil.rmtree(app_dir)
    shutil.copytree(TEMPLATE, app_dir)
    unpatched = run_app(app_dir)
    assert unpatched.exists()

    for block in topk:
        apply_diff(app_dir, block)
    with caplog.at_level(logging.INFO):
        model_path = run_app(app_dir)
    assert "Starting FedSubAvg strategy" in caplog.text
    assert "dropping node" not in caplog.text
    assert torch.load(model_path).keys() == torch.load(unpatched).keys()

    # The private diff pins S1's key: in simulation S1 is in-process with the key kept under
    # $FLWR_HOME/fsl; the placeholder becomes that key's fingerprint, as the README says.
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    default_key_file().parent.mkdir(mode=0o700, parents=True)
    keypair, _ = load_or_create_key(default_key_file(), generate=True)
    for block in private:
        apply_diff(app_dir, block.replace("<printed by flwr-fsl-helper>", keypair.fingerprint))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        run_app(app_dir)
    assert "Starting SecureFedSubAvg strategy" in caplog.text
    assert caplog.text.count("securely aggregated 3 clients") == 3  # every round
    assert "dropping node" not in caplog.text and "failed" not in caplog.text.lower()


def test_the_patcher_refuses_a_diff_that_does_not_match(app_dir: Path) -> None:
    with pytest.raises(AssertionError, match="not found"):
        apply_diff(app_dir, "# server_app.py\n-    strategy = FedProx(mu=0.1)\n+    x = 1\n")


def test_secagg_diff_applies_to_the_unchanged_app_and_runs(
    app_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocks = section_diffs(
        "docs/families/secagg.md", "Drop-in: secure aggregation for plain FedAvg"
    )
    assert len(blocks) == 2, "docs/families/secagg.md's drop-in section changed shape"
    plain = run_app(app_dir)
    for block in blocks:
        apply_diff(app_dir, block)
    with caplog.at_level(logging.INFO):
        secure = run_app(app_dir)
    assert "Starting SecAggFedAvg strategy" in caplog.text
    assert caplog.text.count("SecAgg over 3 of 3 sampled clients") == 3  # every round
    assert "dropping node" not in caplog.text and "failed" not in caplog.text.lower()
    # The same training, averaged in secret: the same model up to the fixed point.
    for name, value in torch.load(plain).items():
        torch.testing.assert_close(torch.load(secure)[name], value, atol=1e-5, rtol=0)


def test_width_diff_applies_and_runs(app_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocks = section_diffs("docs/families/width.md", "Drop-in: clients of different capacity")
    assert len(blocks) == 3, "docs/families/width.md's drop-in section changed shape"
    for block in blocks:
        apply_diff(app_dir, block)
    with caplog.at_level(logging.INFO):
        model_path = run_app(app_dir)
    assert "Starting WidthFedAvg strategy" in caplog.text
    assert "dropping node" not in caplog.text and "failed" not in caplog.text.lower()
    state = torch.load(model_path)
    assert state["blocks.0.layer.weight"].shape == (16, 20)  # the full model comes back


def test_sesa_diff_applies_and_runs(app_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocks = section_diffs("docs/families/sesa.md", "Drop-in: secure shards")
    assert len(blocks) == 3, "docs/families/sesa.md's drop-in section changed shape"
    for block in blocks:
        apply_diff(app_dir, block)
    with caplog.at_level(logging.INFO):
        model_path = run_app(app_dir, num_nodes=8)
    assert "Starting SesaFedAvg strategy" in caplog.text
    assert "dropping node" not in caplog.text and "failed" not in caplog.text.lower()
    assert torch.load(model_path)["blocks.0.layer.weight"].shape == (16, 20)


def test_sfsl_diff_applies_and_runs(
    app_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))  # the clients' memo files
    blocks = section_diffs("docs/families/sfsl.md", "Drop-in: a private row table on one server")
    assert len(blocks) == 2, "docs/families/sfsl.md's drop-in section changed shape"
    plain = run_app(app_dir, num_nodes=5)
    for block in blocks:
        apply_diff(app_dir, block)
    with caplog.at_level(logging.INFO):
        secure = run_app(app_dir, num_nodes=5)
    assert "Starting SFSLFedSubAvg strategy" in caplog.text
    assert "dropping node" not in caplog.text and "failed" not in caplog.text.lower()
    before, after = torch.load(plain), torch.load(secure)
    assert before.keys() == after.keys()


def test_privhfl_diff_applies_and_runs(
    app_dir: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    heading = "Drop-in: heterogeneous models that share knowledge, not weights"
    blocks = section_diffs("docs/families/privhfl.md", heading)
    assert len(blocks) == 2, "docs/families/privhfl.md's drop-in section changed shape"
    for block in blocks:
        apply_diff(app_dir, block)
    with caplog.at_level(logging.INFO):
        run_app(app_dir)
    assert "Starting PrivHFL strategy" in caplog.text
    assert "dropping node" not in caplog.text and "failed" not in caplog.text.lower()
    assert "accuracy" in capsys.readouterr().out  # node_metrics printed


def test_mixed_tables_diff_applies_and_runs(
    rows_app_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocks = section_diffs(
        "docs/families/ssa.md", "Mixed models: several tables and dense layers (index mode)"
    )
    assert len(blocks) == 3, "docs/families/ssa.md's mixed-tables diff changed shape"
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))  # S1's key, in-process
    default_key_file().parent.mkdir(mode=0o700, parents=True)
    keypair, _ = load_or_create_key(default_key_file(), generate=True)
    pyproject = rows_app_dir / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace("<printed by flwr-fsl-helper>", keypair.fingerprint)
    )
    rounds = tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"][
        "num-server-rounds"
    ]

    def run_rows_app() -> dict[str, torch.Tensor]:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            path = run_app(rows_app_dir)
        assert "Starting SecureRowFedSubAvg strategy" in caplog.text
        assert "dropping node" not in caplog.text and "failed" not in caplog.text.lower()
        return torch.load(path)

    # The app as it was: one part per round (the item table). With 3 clients no row passes
    # the default DP's noisy-count threshold, so the check is on the rounds' parts, not values.
    one_table = run_rows_app()
    assert caplog.text.count("securely aggregated 3 clients") == rounds
    for block in blocks:
        apply_diff(rows_app_dir, block)
    mixed = run_rows_app()
    # Three parts per round: the item table, the derived genre table and the dense MLP.
    assert caplog.text.count("securely aggregated 3 clients") == 3 * rounds
    assert mixed.keys() == one_table.keys()
    for name, value in one_table.items():
        assert mixed[name].shape == value.shape, name


def test_every_family_page_has_a_tested_dropin_section() -> None:
    families = sorted(p.name for p in (REPO / "flwr_fsl" / "families").iterdir() if p.is_dir())
    families = [
        f for f in families if (REPO / "flwr_fsl" / "families" / f / "__init__.py").exists()
    ]
    assert sorted(DROPIN_SECTIONS) == families
    for family, heading in DROPIN_SECTIONS.items():
        assert section_diffs(f"docs/families/{family}.md", heading), family
