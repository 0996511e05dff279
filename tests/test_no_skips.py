"""The suite's no-skip rule (tests/no_skips.py) on a throwaway test file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _pytest(folder: Path, allow: bool) -> subprocess.CompletedProcess:
    (folder / "test_throwaway.py").write_text(
        "import pytest\n"
        "def test_missing_extra():\n"
        "    pytest.importorskip('a_package_that_is_not_installed')\n"
        "@pytest.mark.xfail(reason='known')\n"
        "def test_known_failure():\n"
        "    assert False\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ROLL_ALLOW_SKIPS", None)
    if allow:
        env["ROLL_ALLOW_SKIPS"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.no_skips",
                           "-p", "no:cacheprovider", str(folder)],
                          capture_output=True, text=True, env=env, cwd=folder)


@pytest.mark.slow  # a pytest run in a subprocess (~4 s): the quick subset stays under 3 minutes
def test_a_skip_fails_the_run_and_an_xfail_does_not(tmp_path):
    result = _pytest(tmp_path, allow=False)
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 xfailed" in result.stdout
    assert "a skip fails in this suite" in result.stdout
    assert "a_package_that_is_not_installed" in result.stdout
    allowed = _pytest(tmp_path, allow=True)
    assert allowed.returncode == 0 and "1 skipped, 1 xfailed" in allowed.stdout
