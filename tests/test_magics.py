"""One registry of format tags: every 4-byte magic of the package goes through register_magic.

Importing the package registers every magic (:data:`flwr_fsl.core.wireformat.MAGICS`); the source
scan below finds every magic literal, so a format that bypasses the registry — a bare
``_MAGIC = b"XXXX"`` or a 4-byte tag literal used inline — fails here.

Excluded on purpose: ``flwr_fsl/data/fashion.py``'s ``_AR_MAGIC = b"!<arch>\\n"`` is the
``ar`` archive format of an external download (Fashion-MNIST's Debian package), not a format
of ours; ``flwr_fsl/families/ssa/messages.py``'s ``_MAGIC = "flwr_fsl/ssa-params"`` is a JSON
``"format"`` string (``SSAParams`` is JSON, not a binary format).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import flwr_fsl
from flwr_fsl.core.errors import ConfigurationError
from flwr_fsl.core.wireformat import MAGICS, register_magic

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    p
    for folder in ("flwr_fsl", "examples")
    for p in (ROOT / folder).rglob("*.py")
    if "__pycache__" not in p.parts
)
NOT_OURS = {("flwr_fsl/data/fashion.py", "_AR_MAGIC")}
"""(file, name) of magic-named constants that are not formats of this package."""
_TAG = re.compile(rb"[A-Z][A-Z0-9]{3}")


def _import_all() -> list[str]:
    """Import every module of the package (those that import at all); return the failures."""
    failed = []
    for info in pkgutil.walk_packages(flwr_fsl.__path__, "flwr_fsl."):
        try:
            importlib.import_module(info.name)
        except Exception as err:  # an optional dependency: it registers nothing we can see
            failed.append(f"{info.name}: {type(err).__name__}")
    return failed


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


def _is_register_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name | ast.Attribute)
        and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
        == "register_magic"
    )


def _registered_in_source() -> dict[bytes, str]:
    """magic -> file of every ``register_magic(b"....", ...)`` call in the source."""
    found: dict[bytes, str] = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if _is_register_call(node):
                assert isinstance(node, ast.Call)
                arg = node.args[0] if node.args else None
                assert isinstance(arg, ast.Constant) and isinstance(arg.value, bytes), (
                    f"{_rel(path)}:{node.lineno}: register_magic needs a bytes literal"
                )
                assert arg.value not in found, f"{arg.value!r} registered twice in the source"
                found[arg.value] = _rel(path)
    return found


def _tag_literals(paths: list[Path] = SOURCES) -> list[tuple[str, int, bytes]]:
    """Every bytes literal that looks like a format tag (4 capitals/digits, maybe + version)."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, bytes):
                if _TAG.fullmatch(node.value[:4]) and len(node.value) in (4, 5):
                    out.append((_rel(path), node.lineno, node.value))
    return out


def _bare_magic_assignments(paths: list[Path] = SOURCES) -> list[str]:
    """``*MAGIC* = <bytes literal or expression without register_magic>`` assignments."""
    bad = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name) and "MAGIC" in t.id]
            if not names or (_rel(path), names[0]) in NOT_OURS:
                continue
            has_bytes = any(
                isinstance(n, ast.Constant) and isinstance(n.value, bytes)
                for n in ast.walk(node.value)
            )
            registered = any(_is_register_call(n) for n in ast.walk(node.value))
            if has_bytes and not registered:
                bad.append(f"{_rel(path)}:{node.lineno}: {names[0]}")
    return bad


def test_importing_the_package_registers_every_magic_in_the_source() -> None:
    _import_all()
    in_source = _registered_in_source()
    assert len(in_source) >= 26  # the formats frozen in tests/vectors/frozen.json
    missing = {m: f for m, f in in_source.items() if m not in MAGICS}
    assert not missing, f"registered in the source but not after importing: {missing}"
    assert set(MAGICS) == set(in_source), "MAGICS holds a magic registered outside the source"


def test_every_description_names_its_module() -> None:
    _import_all()
    in_source = _registered_in_source()
    for magic, name in MAGICS.items():
        module = in_source[magic].removesuffix(".py").replace("/", ".")
        assert f"({module})" in name, f"{magic!r}: {name!r} should name {module}"


def test_every_tag_literal_is_a_registered_magic() -> None:
    _import_all()
    unregistered = [f"{f}:{line}: {v!r}" for f, line, v in _tag_literals() if v[:4] not in MAGICS]
    assert not unregistered, f"format tags that bypass register_magic: {unregistered}"


def test_no_magic_is_assigned_without_the_registry() -> None:
    assert not _bare_magic_assignments()


def test_the_source_scan_can_fail(tmp_path: Path) -> None:
    # A bare magic assignment and an inline tag literal are both seen.
    module = tmp_path / "fake.py"
    module.write_text(
        '_MAGIC = b"ZZZZ"\nOK = register_magic(b"ZZZY", "x")\nx = data[:5] == b"QQQQ\\x01"\n'
    )
    assert _bare_magic_assignments([module]) == ["fake.py:1: _MAGIC"]
    assert [v for _f, _l, v in _tag_literals([module])] == [b"ZZZZ", b"ZZZY", b"QQQQ\x01"]
    assert not {b"ZZZZ", b"ZZZY", b"QQQQ"} & set(MAGICS)


def test_register_magic_refuses_duplicates_and_bad_lengths() -> None:
    with pytest.raises(ConfigurationError, match="already registered"):
        register_magic(b"FDPF", "a second DPF format")
    for bad in (b"ABC", b"ABCDE", b"", "ABCD"):
        with pytest.raises(ConfigurationError):
            register_magic(bad, "bad")  # type: ignore[arg-type]
    assert b"ABC" not in MAGICS and b"ABCDE" not in MAGICS


def test_fsad_keeps_its_version_byte() -> None:
    from flwr_fsl.crypto.channel import AD_MAGIC
    from flwr_fsl.families.ssa.sealing import _ANSWER_MAGIC

    assert AD_MAGIC == b"FSAD\x02"
    assert _ANSWER_MAGIC == b"FSPA\x01"
    assert b"FSAD" in MAGICS and b"FSPA" in MAGICS
