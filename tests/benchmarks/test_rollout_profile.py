"""pipeline_step.py --profile_rollout (benchmarks/run_hooks.py): one step's rollout under
torch.profiler, with the serve loop's own ranges counted once per admission, decode step and
finished request; without a profiler the ranges cost nothing and record nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import run_hooks  # noqa: E402

from roll.pipeline.agentic_pipeline import AgenticPipeline  # noqa: E402
from roll.pipeline.cli import load_config  # noqa: E402
from roll.utils.stages import profiled  # noqa: E402


def _step_2_measured(tmp_path: Path, hook, top: int, name: str) -> tuple[dict, dict]:
    """Kuhn with 4 short games a step for 2 steps, step 2's rollout measured by ``hook``
    (run_hooks): its report (``name``.json) and step 2's metrics."""
    out = tmp_path / "run"
    cfg = load_config(str(ROOT / "examples" / "kuhn_poker"), "multi_agent_kuhn_poker", [
        "rollout.num_groups=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens=12",
        "eval.eval_steps=0", "tracking.backends=[jsonl]", "save_steps=0", "max_steps=2",
        f"output_dir={out}"])
    pipeline = AgenticPipeline(cfg)
    hook(pipeline, 2, top, tmp_path)
    pipeline.run()
    report = json.loads((tmp_path / f"{name}.json").read_text())
    step = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][-1]
    return report, step


@pytest.mark.slow  # a profiled rollout (~4 s): the quick subset stays under 3 minutes
def test_ranges_count_the_serve_loops_admissions_decode_steps_and_finished_requests(tmp_path):
    report, step = _step_2_measured(tmp_path, run_hooks.profile_rollout_of_step, 5,
                                    "profile_rollout")
    assert report["step"] == 2 and step["step"] == 2
    ranges = report["ranges"]
    assert ranges["roll.admit"]["calls"] == step["rollout/prefills"]
    assert ranges["roll.decode_step"]["calls"] == step["rollout/decode_steps"]
    assert ranges["roll.follow"]["calls"] == step["rollout/llm_turns"]  # one per served turn
    assert all(entry["host_ms"] > 0 for entry in ranges.values())
    assert len(report["top"]) == 5


def test_a_range_is_nothing_without_a_profiler():
    with profiled("roll.test") as inside:
        assert inside is None  # nullcontext: no range object was made
    with torch.profiler.profile() as prof:
        with profiled("roll.test"):
            torch.ones(3).sum()
    assert any(event.key == "roll.test" for event in prof.key_averages())


@pytest.mark.slow  # a cProfiled rollout (~4 s)
def test_cprofile_counts_the_serve_loops_functions_once_per_admission_and_step(tmp_path):
    """learning.py --cprofile_rollout: the rollout of one step under cProfile, each function's
    calls and seconds; the serve loop's own methods are called once per admission and per
    decode step that step's metrics count."""
    report, step = _step_2_measured(tmp_path, run_hooks.cprofile_rollout_of_step, 400,
                                    "cprofile_rollout")
    assert report["step"] == 2 and step["step"] == 2
    by_name = {row["function"].split(" (")[1].rstrip(")"): row for row in report["by_cumulative"]
               if row["function"].startswith("roll/inference/hf/continuous.py:")}
    assert by_name["_admit"]["calls"] == step["rollout/prefills"]
    assert by_name["_decode_step"]["calls"] == step["rollout/decode_steps"]
    assert 0 < by_name["serve"]["cumulative_s"] <= report["profiled_s"]
    own = [row["own_s"] for row in report["by_own"]]
    assert len(own) == 400 and own == sorted(own, reverse=True)
