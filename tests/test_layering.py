"""The import layering of ``flwr_fsl``: imports point down, Flower and numba stay where they belong.

Layers, top to bottom (a module may import its own layer and any lower one):

====  =========================================================================================
6     ``research`` (reproductions of papers' attacks; nothing in the package imports it)
5     ``strategies``, ``mods`` (the public import paths), ``testing``, ``experiment``,
      ``core.engine`` / ``core.replies`` / ``core.phases`` / ``core.records`` / ``core.state`` /
      ``core.rounds`` / ``core.traffic``, and
      each family's Flower modules (``strategy*.py``, ``mod*.py``, ``records*.py``)
4     ``helper`` (the second server S1: gRPC service, S0's connection)
3     ``pinning`` and each family's Flower-free modules (``families/<f>/messages.py``,
      ``protocol.py``, ...): the parties of each protocol, testable without Flower
2     ``submodel``, ``crypto`` (what a client sends; primitives)
1     ``kernels`` (numba and batched AES hot loops)
0     ``core.errors``, ``core.wireformat``, ``core.exchange``, ``core.privacy``,
      ``core.checks`` (error taxonomy, strict codec, the transport a Flower-free round server
      talks through, privacy accounting, argument checks)
====  =========================================================================================

``data``, ``models``, ``reporting``, ``run_config`` are utilities outside the stack: they import
only ``core.errors``, ``core.checks``, ``core.traffic`` and each other, and any layer may use
them.

Families (``flwr_fsl/families/<f>``) import the platform and their declared dependencies only
(:data:`FAMILY_DEPENDS`); a family's strategy never imports a client mod (both read the record
keys and messages from the family's Flower-free modules); ``helper`` may import the Flower-free
modules of the family whose S1 it serves (``ssa``).

The checks read every module's imports with :mod:`ast` (function-level imports included), so
a lazy import cannot hide a layering violation.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "flwr_fsl"

LAYERS: dict[str, int] = {
    "core.errors": 0,
    "core.wireformat": 0,
    "core.exchange": 0,
    "core.privacy": 0,
    "core.checks": 0,
    "core.progress": 0,
    "core.threads": 0,
    "kernels": 1,
    "submodel": 2,
    "crypto": 2,
    "pinning": 3,
    "families:free": 3,
    "helper": 4,
    "core.engine": 5,
    "core.replies": 5,
    "core.phases": 5,
    "core.state": 5,
    "core.rounds": 5,
    "core.traffic": 5,
    "families:flower": 5,
    "strategies": 5,
    "mods": 5,
    "core.records": 5,
    "testing": 5,
    "experiment": 5,
    "research": 6,
}
UTILITIES = frozenset({"data", "models", "reporting", "run_config"})
UTILITY_MAY_IMPORT = frozenset({"core.errors", "core.checks", "core.traffic"})
FLOWER_FREE = (
    "crypto",
    "kernels",
    "submodel",
    "core.errors",
    "core.wireformat",
    "core.exchange",
    "core.privacy",
    "core.checks",
    "core.progress",
    "core.threads",
    "pinning",
    "families:free",
)
FAMILY_DEPENDS: dict[str, frozenset[str]] = {
    "topk": frozenset(),
    "secagg": frozenset(),
    "sfsl": frozenset({"secagg"}),
    "width": frozenset(),
    "sesa": frozenset({"width"}),
    "ssa": frozenset({"topk"}),
    "privhfl": frozenset(),
}
"""Which other families a family may import (``ssa`` also uses the platform's ``helper``)."""
HELPER_SERVES = frozenset({"ssa"})
_FLOWER_MODULE = re.compile(r"^(strategy|mod|records)(_\w+)?$|^\w+_(strategy|mod|records)$")


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _dotted(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(["flwr_fsl", *parts])


def _part_of(module: str) -> str:
    """The layer key of a dotted module name inside ``flwr_fsl``."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    if parts[0] == "core":
        return "core." + parts[1] if len(parts) > 1 else "core"
    if parts[0] == "families":
        if len(parts) < 3:
            return "families:free"  # a family's package __init__
        return "families:flower" if _FLOWER_MODULE.match(parts[2]) else "families:free"
    return parts[0]


def _family_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "families" else None


def _part(path: Path) -> str:
    return _part_of(_dotted(path))


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            names.append(_dotted(path))  # relative: same package
    return names


def _internal_part(name: str) -> str | None:
    if name == "flwr_fsl" or not name.startswith("flwr_fsl."):
        return None
    return _part_of(name)


def _layer(part: str) -> int:
    if part == "core":
        return 0
    return LAYERS[part]


def test_every_part_has_a_layer() -> None:
    parts = {_part(p) for p in _modules()} - {"__init__", "core"}
    unplaced = sorted(parts - set(LAYERS) - UTILITIES)
    assert not unplaced, f"place these in LAYERS or UTILITIES: {unplaced}"


def test_imports_point_down() -> None:
    offending = []
    for path in _modules():
        part = _part(path)
        if part in {"__init__", "core"}:
            continue
        for name in _imports(path):
            target = _internal_part(name)
            if target is None or target == part or target == "__init__":
                continue
            if part in UTILITIES:
                ok = target in UTILITIES or target in UTILITY_MAY_IMPORT
            elif target in UTILITIES:
                ok = True
            else:
                ok = _layer(target) <= _layer(part)
                if part == "helper" and target == "families:free":
                    ok = _family_of(name) in HELPER_SERVES
            if not ok:
                offending.append((str(path.relative_to(PACKAGE.parent)), name))
    assert not offending, f"imports that point up: {offending}"


def test_families_import_only_declared_dependencies() -> None:
    offending = []
    for path in _modules():
        family = _family_of(_dotted(path))
        if family is None:
            continue
        assert family in FAMILY_DEPENDS, f"declare {family}'s dependencies in FAMILY_DEPENDS"
        for name in _imports(path):
            other = _family_of(name)
            if other is not None and other != family and other not in FAMILY_DEPENDS[family]:
                offending.append((str(path.relative_to(PACKAGE.parent)), name))
    assert not offending, f"undeclared family dependencies: {offending}"


def test_strategies_never_import_client_mods() -> None:
    offending = []
    for path in _modules():
        module = _dotted(path)
        leaf = module.rsplit(".", 1)[-1]
        if _family_of(module) is None or not re.match(r"^strategy|_strategy$", leaf):
            continue
        for name in _imports(path):
            target_leaf = name.rsplit(".", 1)[-1]
            if _family_of(name) is not None and re.match(r"^mod(_\w+)?$|_mod$", target_leaf):
                offending.append((str(path.relative_to(PACKAGE.parent)), name))
            if name == "flwr_fsl.mods" or name.startswith("flwr_fsl.mods."):
                offending.append((str(path.relative_to(PACKAGE.parent)), name))
    assert not offending, f"strategies importing client mods: {offending}"


def test_research_is_imported_by_nothing() -> None:
    offending = [
        (str(path.relative_to(PACKAGE.parent)), name)
        for path in _modules()
        if _part(path) != "research"
        for name in _imports(path)
        if _internal_part(name) == "research"
    ]
    assert not offending, f"the library imports research code: {offending}"


def test_lower_layers_never_import_flower_or_grpc() -> None:
    offending = []
    for path in _modules():
        if _part(path) not in FLOWER_FREE:
            continue
        for name in _imports(path):
            if name.split(".")[0] in {"flwr", "grpc", "flwr_datasets"}:
                offending.append((str(path.relative_to(PACKAGE.parent)), name))
    assert not offending, f"Flower/gRPC imported below the Flower layer: {offending}"


def test_numba_only_in_kernels() -> None:
    offending = [
        (str(path.relative_to(PACKAGE.parent)), name)
        for path in _modules()
        if _part(path) != "kernels"
        for name in _imports(path)
        if name.split(".")[0] == "numba"
    ]
    assert not offending, f"numba outside flwr_fsl/kernels: {offending}"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    # A planted violation must be seen by the same parser the checks use.
    planted = tmp_path / "bad.py"
    planted.write_text("def f():\n    import flwr.app\n    from flwr_fsl.strategies import x\n")
    assert _imports(planted) == ["flwr.app", "flwr_fsl.strategies"]
    assert _part_of("flwr_fsl.families.sesa.strategy") == "families:flower"
    assert _part_of("flwr_fsl.families.sesa.protocol") == "families:free"
    assert _part_of("flwr_fsl.core.engine") == "core.engine"


def _loaded_after_import(module: str, prefixes: tuple[str, ...]) -> list[str]:
    code = (
        f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith({prefixes!r})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return list(ast.literal_eval(done.stdout.strip()))


def test_clients_seal_without_loading_the_helper_server() -> None:
    # Flower itself loads grpc on a client; S1's server and S0's connection code must not load.
    loaded = _loaded_after_import("flwr_fsl.mods", ("flwr_fsl.helper",))
    assert not loaded, f"importing flwr_fsl.mods loads the helper package: {loaded}"


@pytest.mark.parametrize("module", ["flwr_fsl.families.ssa.protocol", "flwr_fsl.families.ssa.psr"])
def test_protocols_load_neither_flower_nor_grpc(module: str) -> None:
    loaded = _loaded_after_import(module, ("grpc", "flwr.", "flwr_fsl.helper"))
    assert not loaded, f"importing {module} loads {loaded}"


def test_the_library_imports_without_torch() -> None:
    # torch is an extra (flwr_fsl[torch]): only the example models and PrivHFL's clients need it.
    blocked = "import sys; sys.modules['torch'] = None\n"
    library = (
        "import flwr_fsl.strategies, flwr_fsl.mods, flwr_fsl.helper, flwr_fsl.models.mf\n"
        "import flwr_fsl.families.sesa.strategy, flwr_fsl.families.sfsl.mod\n"
    )
    done = subprocess.run([sys.executable, "-c", blocked + library], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # The check can fail: a torch model does need torch.
    model = "from flwr_fsl.models import MnistCNN\n"
    done = subprocess.run([sys.executable, "-c", blocked + model], capture_output=True, text=True)
    assert done.returncode != 0 and "torch" in done.stderr.splitlines()[-1]
