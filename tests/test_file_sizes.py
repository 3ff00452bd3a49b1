"""No library module over ``MAX_LINES`` lines: a file that long holds more than one concern.

A module that grows past the limit is split into cohesive parts (the original keeps
re-exporting its public names), not added to the allow-list; the list only holds files whose
split is under way, each with a ceiling so it cannot keep growing meanwhile.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flwr_fsl"
MAX_LINES = 800

ALLOWED: dict[str, int] = {
    # A file being split may be listed here with its ceiling (its line count + 50) until then.
}
"""Path (relative to the repository root) -> the most lines it may have for now."""


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_over_the_limit() -> None:
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        limit = ALLOWED.get(rel, MAX_LINES)
        lines = _line_count(path)
        if lines > limit:
            too_long.append(f"{rel}: {lines} lines (limit {limit})")
    assert not too_long, "split these modules into cohesive parts:\n" + "\n".join(too_long)


SIZE_BUDGET_EXCEPTIONS = 56
"""Functions over ruff's size budget (C901 complexity 10, PLR0913 8 arguments, PLR0915 50
statements), each marked ``# noqa`` where it is defined: shrink this number, never raise it."""


def test_size_budget_exceptions_do_not_grow() -> None:
    marked = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "# noqa:" in line and any(c in line for c in ("C901", "PLR0913", "PLR0915"))
    ]
    assert len(marked) <= SIZE_BUDGET_EXCEPTIONS, (
        f"{len(marked)} functions are exempt from the size budget (at most "
        f"{SIZE_BUDGET_EXCEPTIONS}): split the new ones instead"
    )
