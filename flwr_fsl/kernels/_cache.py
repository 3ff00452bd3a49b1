"""Keys numba's on-disk cache of the package's kernels by one digest of all their sources.

Why: numba's ``cache=True`` keys a function's compiled code by a stamp of *its own* source file.
A cached caller in one file that calls a kernel in another keeps the callee's old machine code
(numba links the callee into the caller) when only the callee's file changes, so stale code runs
silently after a developer edits one kernel file or an editable install is updated; the project
hit this twice (``dcf_native`` over ``dcf_kernels``, ``dpf_eval`` over ``vdpf_kernels``).

How: :func:`install` registers, in front of numba's own cache locators, a subclass of each of
them that serves only the functions defined in one package directory and adds the SHA-256
digest of every ``*.py`` file of that directory to the source stamp numba stores in each cache
index. When any of those files changes, every index of the package mismatches on load and numba
recompiles and overwrites it, exactly as for an edit of the function's own file: no files are
purged, no stamp file is written, and numba's own atomic index writes keep two processes that
start at once safe. The subclasses keep numba's fallback order (``NUMBA_CACHE_DIR``, then the
in-tree ``__pycache__``, then the user-wide cache dir for a read-only install), and functions
outside the package fall through to numba's unchanged locators, so users' other numba code and
global settings are untouched. With ``NUMBA_DISABLE_JIT=1`` nothing is cached and the locators
are never asked. :mod:`flwr_fsl.kernels` calls :func:`install` on itself before any kernels
module is imported.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from numba.core import caching

# Package directory (resolved) -> hex digest of its sources; read by the locators.
_DIGESTS: dict[str, str] = {}
# numba >= 0.61 spells the class ``CacheImpl``; 0.60 ``_CacheImpl``.
_CACHE_IMPL: Any = vars(caching).get("CacheImpl") or vars(caching)["_CacheImpl"]


def source_digest(package_dir: Path) -> str:
    """Return the SHA-256 digest of every ``*.py`` file directly in ``package_dir``.

    Every file is hashed, not only those with ``cache=True``: a superset costs nothing and
    cannot miss a module that gains a cached kernel later.

    Parameters
    ----------
    package_dir : Path
        Directory of the package whose cached kernels depend on each other.

    Returns
    -------
    str
        Hex digest over the sorted file names and their contents.
    """
    digest = hashlib.sha256()
    for path in sorted(package_dir.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


class _PackageDigestMixin:
    """Restricts a numba locator to registered packages and adds their digest to its stamp."""

    _py_file: str

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> Any:
        """Return a locator for ``py_func`` if its file lies in a registered package, else None."""
        if _package_of(py_file) is None:
            return None
        return super().from_function(py_func, py_file)  # type: ignore[misc]

    def get_source_stamp(self) -> Any:
        """Return numba's stamp of the function's own file paired with its package's digest."""
        return (super().get_source_stamp(), _DIGESTS[_package_of(self._py_file) or ""])  # type: ignore[misc]


def _package_of(py_file: str) -> str | None:
    """Return the registered package directory holding ``py_file``, or None."""
    directory = os.path.dirname(os.path.realpath(py_file))
    return directory if directory in _DIGESTS else None


def install(package_dir: Path) -> str:
    """Make numba's cache of the functions defined in ``package_dir`` depend on its digest.

    Idempotent; the locators are registered once per process, the digest once per directory.
    A directory that is not on the file system (a zipped install) is left to numba's stamps.

    Parameters
    ----------
    package_dir : Path
        Directory of the package; its ``*.py`` files are hashed by :func:`source_digest`.

    Returns
    -------
    str
        The digest now in force for ``package_dir`` ("" when it is not a directory).
    """
    if not package_dir.is_dir():
        return ""
    key = os.path.realpath(package_dir)
    if key not in _DIGESTS:
        _DIGESTS[key] = source_digest(package_dir)
    classes: list[type] = _CACHE_IMPL._locator_classes
    if not any(issubclass(cls, _PackageDigestMixin) for cls in classes):
        ours = [
            type(f"PackageDigest{cls.__name__}", (_PackageDigestMixin, cls), {}) for cls in classes
        ]
        classes[:0] = ours
    return _DIGESTS[key]
