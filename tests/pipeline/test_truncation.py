"""Truncated episodes are not trained as finished games: without a critic their rows leave the
step (their partial returns are not a game's result)."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_rows_of_truncated_episodes_leave_a_critic_free_update(tmp_path):
    # Kuhn with at most 2 LLM turns: "Pass, Pass" and "Bet, Call/Fold" end, "Pass, Bet" is cut
    # before seat 0's answer: each cut episode holds one row of each agent.
    cfg = load_config(str(ROOT / "examples" / "kuhn_poker"), "quickstart_cpu", [
        "env.seat_to_agent=[[agent_0,agent_1]]", "rollout.max_turns=2", "rollout.num_groups=8",
        "eval.eval_steps=0", "tracking.backends=[jsonl]", "max_steps=1",
        f"output_dir={tmp_path / 'run'}"])
    metrics = AgenticPipeline(cfg).run()
    cut = metrics["rollout/truncated_episodes"]
    assert 0 < cut < 32
    assert metrics["agent_0/truncated_rows"] == pytest.approx(cut)  # its opening turn each
    assert metrics["agent_1/truncated_rows"] == pytest.approx(cut)
    for agent in ("agent_0", "agent_1"):
        trained = metrics[f"{agent}/num_rows"] + metrics.get(f"{agent}/truncated_rows", 0.0)
        assert trained == metrics[f"{agent}/turns"]
