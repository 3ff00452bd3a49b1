"""The docs' generated tables match the code; every name, path and command a page uses exists.

Pages: ``README.md``, every example's README and every Markdown page of ``docs/``. A page may
name a ``flwr_fsl`` module or attribute, a repository path, a link, a ``make`` target, a script
(``python benchmarks/...``), a module run with ``python -m``, an example app, or a flag of
``flwr-fsl-helper`` / ``flwr-fsl-identity``: each must exist.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

from tests import readme_layout

READMES = sorted(
    [
        readme_layout.README,
        *readme_layout.ROOT.glob("examples/*/README.md"),
        *(
            p
            for p in readme_layout.ROOT.glob("docs/**/*.md")
            if "_build" not in p.relative_to(readme_layout.ROOT).parts
        ),
    ]
)
DOC_PAGES = [p for p in READMES if p == readme_layout.README or "docs" in p.parts]
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


_CODE = re.compile(r"```[a-z]*\n(.*?)```|`([^`\n]+)`", re.S)
_MAKE = re.compile(r"(?:^|&& |; )make ([a-z][\w-]*)", re.M)
_SCRIPT = re.compile(r"python3? ((?:benchmarks|examples|tests)/[\w/.-]+\.py)")
_MODULE = re.compile(r"python3? -m ([\w.]+)")
_APP = re.compile(r"(?:flwr run|flwr_fsl\.testing\.local) (examples/[\w-]+)")
_CLI = re.compile(r"(flwr-fsl-helper|flwr-fsl-identity)((?: +(?:\\\n)?[^\s`|]+)*)")
_FLAG = re.compile(r"(?<![\w-])(--[a-z][\w-]*)")


def _make_targets() -> set[str]:
    text = (readme_layout.ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][\w-]*):", text, flags=re.M))


def _cli_flags(program: str) -> set[str]:
    flags = {"--help"}
    if program == "flwr-fsl-identity":  # its parser is built inside main(): read the source
        source = (readme_layout.PACKAGE / "crypto" / "identity.py").read_text()
        return flags | set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", source))
    from flwr_fsl.helper.cli import _parser

    for action in _parser()._actions:
        if not isinstance(action, argparse._HelpAction):
            flags.update(action.option_strings)
    return flags


def _code(text: str) -> list[str]:
    return [block or span for block, span in _CODE.findall(text)]


def command_problems(text: str) -> list[str]:
    """Return what the commands in a page's code name and does not exist."""
    problems: list[str] = []
    targets = _make_targets()
    flags = {p: _cli_flags(p) for p in ("flwr-fsl-helper", "flwr-fsl-identity")}
    for code in _code(text):
        problems += [f"make {t}" for t in _MAKE.findall(code) if t not in targets]
        problems += [s for s in _SCRIPT.findall(code) if not (readme_layout.ROOT / s).exists()]
        problems += [f"python -m {m}" for m in _MODULE.findall(code) if not _module_exists(m)]
        problems += [a for a in _APP.findall(code) if not (readme_layout.ROOT / a).is_dir()]
        for program, args in _CLI.findall(code):
            problems += [f"{program} {f}" for f in _FLAG.findall(args) if f not in flags[program]]
    return problems


def _module_exists(name: str) -> bool:
    if name in {"pip", "build", "venv", "pytest", "zipfile", "jupyter"}:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize(
    "page", sorted(readme_layout.BLOCKS), ids=lambda p: str(p.relative_to(readme_layout.ROOT))
)
def test_generated_tables_match_the_code(page: Path) -> None:
    start, end, make = readme_layout.BLOCKS[page]
    current = readme_layout.current_block(page.read_text(), start, end)
    assert current == make(), (
        f"{page.name}'s generated table is stale: run `python -m tests.readme_layout`"
    )


@pytest.mark.parametrize("page", READMES, ids=lambda p: str(p.relative_to(readme_layout.ROOT)))
def test_every_named_command_exists(page: Path) -> None:
    problems = sorted(set(command_problems(page.read_text())))
    assert not problems, f"{page.name} names commands that do not exist: {problems}"


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
    missing = [
        f for f in families if not (readme_layout.ROOT / "docs" / "families" / f"{f}.md").exists()
    ]
    assert not missing, f"families without docs/families/<family>.md: {missing}"
    toc = (readme_layout.DOCS / "index.md").read_text()
    assert all(f"families/{f}\n" in toc for f in families), "a family page is not in the toctree"


def test_the_readme_fits_and_starts_with_what_install_and_commands() -> None:
    text = readme_layout.README.read_text()
    assert len(text.splitlines()) <= 200
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert headings[:2] == ["Install", "Two commands (and the docs)"], headings
    assert "make demo" in text and "make test" in text


def test_the_checks_can_fail() -> None:
    assert command_problems("`make nosuchtarget` `python benchmarks/nosuch.py`") == [
        "make nosuchtarget",
        "benchmarks/nosuch.py",
    ]
    assert command_problems("```bash\nflwr-fsl-helper --key-file k --no-such-flag\n```") == [
        "flwr-fsl-helper --no-such-flag"
    ]
    assert command_problems("`python -m flwr_fsl.nosuch` `flwr run examples/nosuch`") == [
        "python -m flwr_fsl.nosuch",
        "examples/nosuch",
    ]
    assert not command_problems("`make docs` `flwr-fsl-helper --key-file k --generate-key`")
    assert _resolves("flwr_fsl.core.engine.PhasedStrategy")
    assert not _resolves("flwr_fsl.protocols.ssa")
    assert not _resolves("flwr_fsl.core.engine.NoSuchThing")
