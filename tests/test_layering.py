"""The import layering of ``flwr_fsl``: imports point down, Flower and numba stay where they belong.

Layers, top to bottom (a module may import its own layer and any lower one):

====  =========================================================================================
5     ``strategies``, ``mods``, ``records``, ``testing``, ``experiment`` (the Flower layer)
4     ``helper`` (the second server S1: gRPC service, S0's connection)
3     ``protocols``, ``pinning`` (parties of each protocol, Flower-free)
2     ``submodel``, ``crypto`` (what a client sends; primitives)
1     ``kernels`` (numba and batched AES hot loops)
0     ``errors``, ``wireformat`` (the strict binary reader/writer)
====  =========================================================================================

``data``, ``models``, ``traffic``, ``reporting``, ``run_config`` are utilities outside the stack:
they import only ``errors`` and each other, and any layer may use them.

The checks read every module's imports with :mod:`ast` (function-level imports included), so
a lazy import cannot hide a layering violation.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "flwr_fsl"

LAYERS: dict[str, int] = {
    "errors": 0,
    "wireformat": 0,
    "kernels": 1,
    "submodel": 2,
    "crypto": 2,
    "protocols": 3,
    "pinning": 3,
    "helper": 4,
    "strategies": 5,
    "mods": 5,
    "records": 5,
    "testing": 5,
    "experiment": 5,
}
UTILITIES = frozenset({"data", "models", "traffic", "reporting", "run_config"})
FLOWER_FREE = ("protocols", "crypto", "kernels", "submodel", "errors", "pinning", "wireformat")


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _part(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            names.append("flwr_fsl." + _part(path))  # relative: same part
    return names


def _internal_part(name: str) -> str | None:
    if name == "flwr_fsl" or not name.startswith("flwr_fsl."):
        return None
    return name.split(".")[1]


def test_every_part_has_a_layer() -> None:
    parts = {_part(p) for p in _modules()} - {"__init__"}
    unplaced = sorted(parts - set(LAYERS) - UTILITIES)
    assert not unplaced, f"place these in LAYERS or UTILITIES: {unplaced}"


def test_imports_point_down() -> None:
    offending = []
    for path in _modules():
        part = _part(path)
        if part == "__init__":
            continue
        for name in _imports(path):
            target = _internal_part(name)
            if target is None or target == part:
                continue
            if part in UTILITIES:
                ok = target in UTILITIES or target == "errors"
            elif target in UTILITIES:
                ok = True
            else:
                ok = LAYERS[target] <= LAYERS[part]
            if not ok:
                offending.append((str(path.relative_to(PACKAGE.parent)), name))
    assert not offending, f"imports that point up: {offending}"


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


@pytest.mark.parametrize("module", ["flwr_fsl.protocols.ssa", "flwr_fsl.protocols.psr"])
def test_protocols_load_neither_flower_nor_grpc(module: str) -> None:
    loaded = _loaded_after_import(module, ("grpc", "flwr.", "flwr_fsl.helper"))
    assert not loaded, f"importing {module} loads {loaded}"
