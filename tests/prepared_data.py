"""Tests needing the real prepared data: fail under CI (`make data` runs first), else skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flwr_fsl.data import cache_dir


def require_prepared(*names: str) -> list[Path]:
    """Return the cached ``.npz`` files of ``names``; fail (CI) or skip if any is missing."""
    paths = [cache_dir() / f"{name}.npz" for name in names]
    missing = [n for n, p in zip(names, paths, strict=True) if not p.is_file()]
    if missing:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{missing} cache missing under CI: `make data` must run before the tests")
        pytest.skip(f"{missing} not prepared (python -m flwr_fsl.data prepare {' '.join(missing)})")
    return paths
