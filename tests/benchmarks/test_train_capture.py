"""benchmarks/train_capture.py (and train_host.py) on the CPU (no CUDA graph here: the captured
loop runs the same function on the static inputs): each micro-batch's rows reach the static
inputs, so the "captured" step's summed gradients are the eager step's, for a team of two
agents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ~15 s: a compiled (aot_eager) tiny team
ROOT = Path(__file__).resolve().parents[2]


def test_the_captured_loop_gives_the_eager_steps_gradients(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "train_capture.py"), "--tiny", "--agents",
         "2", "--backend", "aot_eager", "--repeats", "1"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": str(ROOT), "OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "train_capture.json").read_text())
    assert result["captured_graph"] is False and result["agents"] == 2
    assert result["grad_scale"] > 1e-4  # gradients reached the team's buffer
    assert result["grad_gap"] == 0.0  # fp32 on the CPU: the same function on the same rows
    for mode in ("eager", "captured"):
        assert result[mode]["seconds"] > 0 and result[mode]["train_tokens_per_s"] > 0
    # the tiny batch's first response column: prompt 32, minus at most 20 tokens
    assert 12 <= result["window_first"] <= 32


def test_rows_must_fill_whole_micro_batches(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "train_capture.py"), "--tiny",
         "--micro", "5"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and "--rows 16 must be a multiple of --micro 5" in done.stderr


def test_train_host_times_the_captured_steps_edges(tmp_path):
    """benchmarks/train_host.py: each team's step ran its micro-batches through the captured
    path (the edges are measured around ``CapturedSteps.run``; a step that bypassed it has
    none and the script fails)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "train_host.py"), "--layers", "1",
         "--agents", "2", "--repeats", "1"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": str(ROOT), "OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "train_host.json").read_text())
    assert [team["agents"] for team in result["results"]] == [2]
    assert all(team["before_ms"] > 0 and team["after_ms"] > 0 for team in result["results"])
