"""``make test``'s ``--dist loadgroup`` keeps each ``xdist_group`` on one worker (conftest hook).

A throwaway suite in a temporary folder, run by a pytest subprocess on two pytest-xdist workers
with this project's collection hook: four tests of one group in two modules (marked as the Ray
tests are, by a module ``pytestmark``) and four ungrouped ones. Every grouped test must carry the
group in its id and run on the same worker as the others of its group.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

GROUPED = 'import pytest\n\npytestmark = pytest.mark.xdist_group("together")\n\n'
PYTEST = [sys.executable, "-m", "pytest", "-c", os.devnull, "-p", "no:cacheprovider", "-v"]
TESTS = "def test_{0}_a():\n    pass\n\n\ndef test_{0}_b():\n    pass\n"


def test_a_group_runs_on_one_worker_under_loadgroup(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n"
    )
    (tmp_path / "test_one.py").write_text(GROUPED + TESTS.format("one"))
    (tmp_path / "test_two.py").write_text(GROUPED + TESTS.format("two"))
    (tmp_path / "test_free.py").write_text(TESTS.format("free") + "\n\n" + TESTS.format("more"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [*PYTEST, "-n", "2", "--dist", "loadgroup", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)", proc.stdout, re.M)
    assert len(ran) == 8, proc.stdout
    grouped = {worker for worker, nodeid in ran if nodeid.endswith("@together")}
    names = [nodeid for _, nodeid in ran if nodeid.endswith("@together")]
    assert len(names) == 4 and all("test_one" in n or "test_two" in n for n in names), ran
    assert len(grouped) == 1, ran
