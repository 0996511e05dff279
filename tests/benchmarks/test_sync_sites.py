"""benchmarks/run_hooks.py --sync_step: a synchronising operation is counted at the line of
this project that asked for it, not inside torch; without CUDA nothing is counted."""

from __future__ import annotations

import sys
from pathlib import Path
from traceback import FrameSummary

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import run_hooks  # noqa: E402

TORCH = "/venv/lib/python3.11/site-packages/torch"


def test_the_site_is_the_innermost_line_of_this_project():
    frames = [FrameSummary("/work/main/benchmarks/learning.py", 150, "run_recipe"),
              FrameSummary("/work/main/roll/pipeline/agentic_pipeline.py", 390, "train_step"),
              FrameSummary("/work/main/roll/multi_agent/trainer.py", 176, "train_step"),
              FrameSummary(f"{TORCH}/_tensor.py", 1050, "tolist"),
              FrameSummary("/usr/lib/python3.11/warnings.py", 109, "_showwarnmsg")]
    assert run_hooks.site_of(frames) == "roll/multi_agent/trainer.py:176 (train_step)"
    # no frame of ours: the innermost outside torch and warnings.py
    theirs = [FrameSummary("/venv/site-packages/peft/tuners/lora/layer.py", 80, "forward"),
              FrameSummary(f"{TORCH}/nn/modules/module.py", 1775, "_call_impl"),
              FrameSummary("/usr/lib/python3.11/warnings.py", 109, "_showwarnmsg")]
    assert run_hooks.site_of(theirs) == "/venv/site-packages/peft/tuners/lora/layer.py:80 (forward)"
    assert run_hooks.site_of([FrameSummary(f"{TORCH}/x.py", 1, "f")]) == "?"


def test_without_cuda_the_step_runs_and_nothing_is_counted():
    ran = []
    report = run_hooks.count_sync_sites(lambda: ran.append(1))
    assert ran == [1]
    assert report == {"cuda": False, "syncs": 0, "sites": []}
