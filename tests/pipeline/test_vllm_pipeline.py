"""A full pipeline run with rollout.engine=vllm on the real vLLM CPU build."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in-process
import vllm  # noqa: F401  (installed by scripts/install_cpu.sh: a broken build fails, never skips)

from roll.pipeline.agentic_pipeline import AgenticPipeline  # noqa: E402
from roll.pipeline.cli import load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_pipeline_with_vllm_engine_serves_each_new_adapter(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(str(ROOT / "examples" / "kuhn_poker"), "quickstart_cpu", [
        "rollout.engine=vllm", "rollout.vllm.enforce_eager=true", "rollout.num_groups=4",
        "rollout.vllm.max_model_len=1280",
        "team.optim.lr=5e-2", "max_steps=4", "save_steps=2", "eval.eval_steps=2",
        "eval.num_episodes=8", "tracking.backends=[jsonl]", f"output_dir={out}",
        "env.seat_to_agent=[[agent_0,random],[random,snapshot:agent_0@latest]]",
        "team.num_agents=1",
    ])
    pipeline = AgenticPipeline(cfg)
    assert type(pipeline.engine).__name__ == "VLLMEngine"
    pipeline.run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/engine_logprob_gap" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    # The engine's log-probs of its own samples equal the trainer's recomputation with the
    # current adapters at every step: after each update vLLM served the new weights (a stale
    # or skipped sync leaves a gap of the size of the update).
    for row in steps:
        assert row["rollout/engine_logprob_gap"] < 1e-4, row
    assert any(r["agent_0/grad_norm"] > 0 for r in steps)
    # The snapshot seat moved from the step-0 to the step-2 snapshot (taken at the step-2
    # checkpoint, played in steps 3 and 4); the stale step-0 slot was unloaded.
    assert set(pipeline.engine.slots) == {"agent_0", "agent_0@step2"}
    assert "eval/agent_0/win_rate" in rows[-1]
    assert (out / "checkpoints" / "step_00000004" / "agents" / "agent_0").is_dir()
    pipeline.engine.close()
