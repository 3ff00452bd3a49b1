"""The README's layout table matches the package; every ``flwr_fsl`` name a README uses exists."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tests import readme_layout

READMES = sorted(
    [
        readme_layout.README,
        *readme_layout.ROOT.glob("examples/*/README.md"),
        *readme_layout.ROOT.glob("docs/**/*.md"),
    ]
)
_LINK = re.compile(r"\]\((?!https?:)([^)#]+)")
_DOTTED = re.compile(r"`(flwr_fsl(?:\.\w+)+)")
_PATH = re.compile(r"(?<![\w/.])(flwr_fsl/[\w/]+(?:\.py)?)")


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_layout_table_matches_the_package() -> None:
    current = readme_layout.current_block(readme_layout.README.read_text())
    assert current == readme_layout.render(), (
        "README's layout table is stale: run `python -m tests.readme_layout`"
    )


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(readme_layout.ROOT)))
def test_every_named_module_exists(readme: Path) -> None:
    text = readme.read_text()
    missing = sorted({d for d in _DOTTED.findall(text) if not _resolves(d)})
    assert not missing, f"{readme.name} names modules or attributes that do not exist: {missing}"
    paths = sorted({p for p in _PATH.findall(text) if not (readme_layout.ROOT / p).exists()})
    assert not paths, f"{readme.name} names paths that do not exist: {paths}"
    links = sorted({link for link in _LINK.findall(text) if not (readme.parent / link).exists()})
    assert not links, f"{readme.name} links to files that do not exist: {links}"


def test_every_family_has_a_doc_page() -> None:
    families = sorted(
        p.name
        for p in (readme_layout.PACKAGE / "families").iterdir()
        if (p / "__init__.py").exists()
    )
    documented = {"secagg", "topk"}  # their drop-in sections stay in README.md (tested diffs)
    missing = [
        f
        for f in families
        if f not in documented
        and not (readme_layout.ROOT / "docs" / "families" / f"{f}.md").exists()
    ]
    assert not missing, f"families without docs/families/<family>.md: {missing}"


def test_the_checks_can_fail() -> None:
    assert _resolves("flwr_fsl.core.engine.PhasedStrategy")
    assert not _resolves("flwr_fsl.protocols.ssa")
    assert not _resolves("flwr_fsl.core.engine.NoSuchThing")
