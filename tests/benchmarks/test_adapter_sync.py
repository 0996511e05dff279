"""benchmarks/adapter_sync.py, hf alone (vLLM's half needs the vLLM CPU build and is run by
hand): the report holds one sync time per agent count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a subprocess building two teams (~5 s; the quick subset stays < 3 min)
def test_the_hf_sync_is_timed_per_agent_count(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "adapter_sync.py"), "--engines", "hf",
         "--agents", "1", "4", "--steps", "2"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "adapter_sync.json").read_text())
    rows = {row["agents"]: row for row in report["results"]}
    assert set(rows) == {1, 4} and "vllm" not in rows[1] and report["vllm"] is None
    assert all(row["hf"]["sync_total_ms"] > 0 for row in rows.values())
