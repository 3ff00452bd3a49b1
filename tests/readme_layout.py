"""The README's "Layout" table, made from the package itself, and a check of every module it names.

``python -m tests.readme_layout`` rewrites the table between the ``<!-- layout:start -->`` and
``<!-- layout:end -->`` markers of ``README.md`` from the package: one row per folder of
``flwr_fsl`` (each protocol family its own row), its modules and the first line of its
``__init__`` docstring. ``tests/test_readme_layout.py`` fails when the README's table differs
from what this renders, or when a README names a ``flwr_fsl`` module, attribute or path that
does not exist, so neither can go stale.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flwr_fsl"
README = ROOT / "README.md"
START, END = "<!-- layout:start -->", "<!-- layout:end -->"


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
    """Return the Markdown table of the package's folders (the README's "Layout" block)."""
    rows = ["| folder | modules | what it holds |", "| --- | --- | --- |"]
    for folder in _folders():
        modules = sorted(
            p.stem for p in folder.glob("*.py") if p.stem not in {"__init__", "__main__"}
        )
        names = ", ".join(f"`{m}`" for m in modules) or "—"
        rel = folder.relative_to(ROOT).as_posix()
        rows.append(f"| `{rel}/` | {names} | {_summary(folder / '__init__.py')} |")
    return "\n".join(rows)


def current_block(text: str) -> str:
    """Return what the README holds between the layout markers."""
    start, end = text.index(START) + len(START), text.index(END)
    return text[start:end].strip("\n")


def write() -> None:
    """Rewrite the README's layout block from the package."""
    text = README.read_text()
    start, end = text.index(START) + len(START), text.index(END)
    README.write_text(text[:start] + "\n" + render() + "\n" + text[end:])


if __name__ == "__main__":
    write()
    sys.stdout.write(render() + "\n")
