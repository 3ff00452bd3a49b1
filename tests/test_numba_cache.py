"""numba's on-disk cache never runs a stale callee from another file (``kernels._cache``).

Each case writes a small package into ``tmp_path`` (a cached caller in ``caller.py`` calls a
cached callee in ``callee.py``), runs it in fresh subprocesses, edits only the callee and checks
what a new process computes.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import flwr_fsl.kernels
from flwr_fsl.kernels import _cache

_ROOT = Path(__file__).resolve().parents[1]
_CALLEE = "from numba import njit\n\n\n@njit(cache=True)\ndef callee(x):\n    return x + {delta}\n"
_CALLER = (
    "from numba import njit\n\nfrom .callee import callee\n\n\n"
    "@njit(cache=True)\ndef caller(x):\n    return callee(x) * 2\n"
)
_INIT_FIXED = (
    "from pathlib import Path\n\nfrom flwr_fsl.kernels._cache import install\n\n"
    "install(Path(__file__).parent)\n"
)


def _write_package(root: Path, *, fixed: bool) -> Path:
    """Write the two-file package ``pkg`` under ``root``; return its directory."""
    package = root / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(_INIT_FIXED if fixed else "")
    (package / "callee.py").write_text(_CALLEE.format(delta=1))
    (package / "caller.py").write_text(_CALLER)
    return package


def _edit_callee(package: Path, delta: int) -> None:
    """Change only the callee's body, bumping its mtime as an editor would."""
    path = package / "callee.py"
    before = path.stat().st_mtime_ns
    path.write_text(_CALLEE.format(delta=delta))
    os.utime(path, ns=(before + 2_000_000_000, before + 2_000_000_000))


# Makes the in-tree ``__pycache__`` unwritable even for root, as a read-only install sees it.
_READ_ONLY_PRELUDE = (
    "from numba.core import caching\n"
    "def _refuse(self):\n"
    "    raise PermissionError('read-only install')\n"
    "caching.InTreeCacheLocator.ensure_cache_path = _refuse\n"
)


def _start(
    root: Path, env_extra: dict[str, str] | None = None, prelude: str = ""
) -> subprocess.Popen[str]:
    """Start a fresh process that prints ``caller(10)`` from the package under ``root``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(_ROOT)])}
    env.pop("NUMBA_CACHE_DIR", None)
    env.update(env_extra or {})
    code = prelude + "from pkg.caller import caller; print(caller(10))"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run(root: Path, env_extra: dict[str, str] | None = None, prelude: str = "") -> int:
    """Run :func:`_start` to completion and return the printed value."""
    proc = _start(root, env_extra, prelude)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return int(out)


def _cache_files(package: Path) -> list[Path]:
    """Return numba's index files written in the package's ``__pycache__``."""
    return sorted((package / "__pycache__").glob("*.nbi"))


def test_numba_alone_runs_the_stale_callee(tmp_path: Path) -> None:
    """The defect, without the fix: the cached caller keeps the old callee's code."""
    package = _write_package(tmp_path, fixed=False)
    assert _run(tmp_path) == 22
    assert _cache_files(package)
    _edit_callee(package, 5)
    assert _run(tmp_path) == 22  # stale: the callee now says 30


@pytest.mark.parametrize("cache_dir", [False, True], ids=["in-tree", "NUMBA_CACHE_DIR"])
def test_digest_recompiles_the_caller(tmp_path: Path, cache_dir: bool) -> None:
    """With :func:`flwr_fsl.kernels._cache.install`, the edit reaches the cached caller."""
    package = _write_package(tmp_path, fixed=True)
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")} if cache_dir else {}
    assert _run(tmp_path, env) == 22
    if cache_dir:
        assert list((tmp_path / "numba-cache").rglob("*.nbi"))
        assert not (package / "__pycache__").exists()
    else:
        assert _cache_files(package)
    _edit_callee(package, 5)
    assert _run(tmp_path, env) == 30
    assert _run(tmp_path, env) == 30  # the rewritten cache is loaded again


def test_two_processes_start_at_once(tmp_path: Path) -> None:
    """Two fresh processes racing on one stale cache both compute the new value."""
    package = _write_package(tmp_path, fixed=True)
    assert _run(tmp_path) == 22
    _edit_callee(package, 7)
    procs = [_start(tmp_path) for _ in range(2)]
    results = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err for _, err in results]
    assert [int(out) for out, _ in results] == [34, 34]
    assert _run(tmp_path) == 34


def test_read_only_package_uses_the_user_cache(tmp_path: Path) -> None:
    """A read-only install falls back to numba's user-wide cache dir, still keyed by the digest."""
    package = _write_package(tmp_path, fixed=True)
    user_cache = tmp_path / "user-cache"
    env = {"XDG_CACHE_HOME": str(user_cache), "HOME": str(tmp_path)}
    mode = package.stat().st_mode
    read_only = mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    package.chmod(read_only)
    try:
        assert _run(tmp_path, env, _READ_ONLY_PRELUDE) == 22
        assert not (package / "__pycache__").exists()
        assert list(user_cache.rglob("*.nbi"))
        package.chmod(mode)
        _edit_callee(package, 3)
        package.chmod(read_only)
        assert _run(tmp_path, env, _READ_ONLY_PRELUDE) == 26
    finally:
        package.chmod(mode)


def test_disable_jit_still_imports(tmp_path: Path) -> None:
    """With ``NUMBA_DISABLE_JIT=1`` the package imports and runs as plain Python."""
    _write_package(tmp_path, fixed=True)
    assert _run(tmp_path, {"NUMBA_DISABLE_JIT": "1"}) == 22


def test_digest_covers_every_cached_kernel() -> None:
    """Every flwr_fsl module with a ``cache=True`` kernel lies in the digested directory."""
    kernels_dir = Path(flwr_fsl.kernels.__file__).parent
    cached = {
        path.resolve().parent
        for path in (_ROOT / "flwr_fsl").rglob("*.py")
        if re.search(r"cache\s*=\s*True", path.read_text())
    }
    assert cached == {kernels_dir.resolve()}
    assert os.path.realpath(kernels_dir) in _cache._DIGESTS


def test_digest_changes_with_any_source(tmp_path: Path) -> None:
    """The digest depends on every file's name and contents, not on the other files' stamps."""
    package = _write_package(tmp_path, fixed=False)
    first = _cache.source_digest(package)
    assert _cache.source_digest(package) == first
    _edit_callee(package, 9)
    second = _cache.source_digest(package)
    assert second != first
    (package / "callee.py").rename(package / "callee2.py")
    assert _cache.source_digest(package) not in {first, second}


def test_install_is_idempotent_and_skips_non_directories(tmp_path: Path) -> None:
    """A second install adds no locators; a path that is no directory is left to numba."""
    classes = _cache._CACHE_IMPL._locator_classes
    count = len(classes)
    kernels_dir = Path(flwr_fsl.kernels.__file__).parent
    assert _cache.install(kernels_dir) == _cache.source_digest(kernels_dir)
    assert len(classes) == count
    assert _cache.install(tmp_path / "missing.zip" / "pkg") == ""
    assert len(classes) == count
