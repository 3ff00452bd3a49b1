"""The docs' generated tables, made from the package itself, and the pages they live in.

``python -m tests.readme_layout`` rewrites two blocks from the code:

- the "Layout" table of ``docs/design.md``, between ``<!-- layout:start -->`` and
  ``<!-- layout:end -->``: one row per folder of ``flwr_fsl`` (each protocol family its own row),
  its modules and the first line of its ``__init__`` docstring;
- the "Every flag" table of ``docs/operations.md``, between ``<!-- helper-flags:start -->`` and
  ``<!-- helper-flags:end -->``: every option of ``flwr-fsl-helper``'s argument parser with its
  help text.

``tests/test_readme_layout.py`` fails when a page's block differs from what this renders, or when
the README or a docs page names a ``flwr_fsl`` module, attribute, path or command that does not
exist, so none of them can go stale.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flwr_fsl"
README = ROOT / "README.md"
DOCS = ROOT / "docs"
LAYOUT_PAGE = DOCS / "design.md"
FLAGS_PAGE = DOCS / "operations.md"
START, END = "<!-- layout:start -->", "<!-- layout:end -->"
FLAGS_START, FLAGS_END = "<!-- helper-flags:start -->", "<!-- helper-flags:end -->"


def _summary(init: Path) -> str:
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    line = doc.strip().split("\n\n")[0].replace("\n", " ")
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", line).replace("``", "`").replace("|", "\\|")


def _folders() -> list[Path]:
    tops = sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    out: list[Path] = [PACKAGE]
    for top in tops:
        out.append(top)
        out.extend(sorted(p for p in top.iterdir() if p.is_dir() and (p / "__init__.py").exists()))
    return out


def render() -> str:
    """Return the Markdown table of the package's folders (``docs/design.md``'s "Layout")."""
    rows = ["| folder | modules | what it holds |", "| --- | --- | --- |"]
    for folder in _folders():
        modules = sorted(
            p.stem for p in folder.glob("*.py") if p.stem not in {"__init__", "__main__"}
        )
        names = ", ".join(f"`{m}`" for m in modules) or "—"
        rel = folder.relative_to(ROOT).as_posix()
        rows.append(f"| `{rel}/` | {names} | {_summary(folder / '__init__.py')} |")
    return "\n".join(rows)


def render_helper_flags() -> str:
    """Return the Markdown table of ``flwr-fsl-helper``'s options (``docs/operations.md``)."""
    from flwr_fsl.helper.cli import _parser

    rows = ["| flag | group | what it sets |", "| --- | --- | --- |"]
    for group in _parser()._action_groups:
        for action in group._group_actions:
            if isinstance(action, argparse._HelpAction) or not action.option_strings:
                continue
            flag = " ".join(action.option_strings)
            if action.metavar:
                flag += f" {action.metavar}"
            title = "" if group.title in {"options", "optional arguments"} else group.title
            text = " ".join((action.help or "").split()).replace("|", "\\|")
            rows.append(f"| `{flag}` | {title} | {text} |")
    return "\n".join(rows)


BLOCKS = {
    LAYOUT_PAGE: (START, END, render),
    FLAGS_PAGE: (FLAGS_START, FLAGS_END, render_helper_flags),
}


def current_block(text: str, start_marker: str = START, end_marker: str = END) -> str:
    """Return what a page holds between two markers (by default the layout markers)."""
    start, end = text.index(start_marker) + len(start_marker), text.index(end_marker)
    return text[start:end].strip("\n")


def write() -> None:
    """Rewrite every generated block of the docs from the package."""
    for page, (start_marker, end_marker, make) in BLOCKS.items():
        text = page.read_text()
        start, end = text.index(start_marker) + len(start_marker), text.index(end_marker)
        page.write_text(text[:start] + "\n" + make() + "\n" + text[end:])


if __name__ == "__main__":
    write()
    sys.stdout.write(render() + "\n")
