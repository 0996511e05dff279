"""benchmarks/pipeline_step.py --groups: every setting at each rollout.num_groups in one
process, each result kept in $OUT as it ends, and the later steps' pooled whole-step tok/s
(decoded + trained tokens over their time) computed from the steps it reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # two tiny runs in a subprocess (~15 s)
def test_a_sweep_over_groups_runs_each_setting_at_each_and_pools_the_later_steps(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pipeline_step.py"), "--tiny", "--settings",
         "kuhn:2", "--modes", "continuous", "--steps", "3", "--groups", "1", "2", "--gpu_busy"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env=os.environ | {"OUT": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "pipeline_step.json").read_text())
    assert report["complete"] is True
    results = report["results"]
    assert [r["overrides"] for r in results] == [["rollout.num_groups=1"],
                                                 ["rollout.num_groups=2"]]
    # twice the groups, twice the episodes in every step
    assert [2 * s["rollout/episodes"] for s in results[0]["steps"]] == [
        s["rollout/episodes"] for s in results[1]["steps"]]
    for result in results:
        later = result["steps"][1:]
        tokens = sum(s["rollout/decoded_tokens"] + s["trained_tokens"] for s in later)
        seconds = sum(s["time/step"] for s in later)
        assert abs(result["step_tokens_per_s_after_first"] - tokens / seconds) <= 1, result
        # steady state: step 2 of 3 alone, by what it trained (its batch's tokens twice over:
        # generated, then trained)
        middle = result["steps"][1]
        assert middle["trained_tokens"] == middle["rollout/generated_tokens"] > 0
        assert abs(result["step_tokens_per_s_steady"]
                   - 2 * middle["trained_tokens"] / middle["time/step"]) <= 1, result
        # the train phase alone in steady state: what step 2 trained over its time/train
        assert abs(result["train_tokens_per_s_steady"]
                   - middle["trained_tokens"] / middle["time/train"]) <= 1, result
        assert "trainer_capture" not in result  # CPU: no graphs, the uncaptured loop
        # --gpu_busy on a machine without GPUs: said, and the phases still timed (steps 2-3)
        busy = result["gpu_busy"]
        assert busy["available"] is False and busy["samples"] == 0
        assert busy["by_phase_after_first"] == {} and busy["by_step"] == {}
        seconds = busy["phase_seconds_after_first"]
        assert seconds["rollout"] > 0 and seconds["passes"] > 0 and seconds["update"] > 0
        assert seconds["rollout_overlapped"] == 0  # no rollout.overlap here
        steps = sum(s["time/step"] for s in result["steps"][1:])
        assert seconds["rollout"] + seconds["passes"] + seconds["update"] <= seconds["step"]
        assert abs(seconds["step"] - steps) < 0.2 * steps + 0.05
