"""roll/pipeline/stalls.py: the console says once when an agent has nothing to learn, and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import load_config
from roll.pipeline.stalls import StallWatch, stall_reason

ROOT = Path(__file__).resolve().parents[2]


def _step(**per_agent: dict[str, float]) -> dict[str, float]:
    return {f"{agent}/{key}": value for agent, figures in per_agent.items()
            for key, value in figures.items()}


def test_three_steps_in_a_row_at_zero_advantage_say_it_once_per_agent():
    watch = StallWatch(["a", "b"], steps=3)
    dead, alive = {"zero_adv_fraction": 1.0}, {"zero_adv_fraction": 0.5}
    assert watch.observe(_step(a=dead, b=dead), 1) == []
    assert watch.observe(_step(a=dead, b=alive), 2) == []  # b's count starts again
    lines = watch.observe(_step(a=dead, b=dead), 3)
    assert len(lines) == 1 and lines[0].startswith("a has nothing to learn")
    assert "the 3 steps to step 3" in lines[0]
    assert watch.observe(_step(a=dead, b=dead), 4) == []  # b: 2 in a row
    lines = watch.observe(_step(a=dead, b=dead), 5)
    assert [line.split()[0] for line in lines] == ["b"]  # a is not said again
    assert watch.observe(_step(a=dead, b=dead), 6) == []


def test_a_step_without_rows_neither_counts_nor_resets():
    watch = StallWatch(["a"], steps=2)
    assert watch.observe(_step(a={"zero_adv_fraction": 1.0}), 1) == []
    assert watch.observe({"a/episode_return": 0.0}, 2) == []  # no rows for a this step
    assert len(watch.observe(_step(a={"zero_adv_fraction": 1.0}), 3)) == 1
    # a share just under 1 (one row of 40 with a gradient) is not a stall
    watch = StallWatch(["a"], steps=1)
    assert watch.observe(_step(a={"zero_adv_fraction": 39 / 40}), 1) == []
    with pytest.raises(ValueError, match="steps must be >= 1"):
        StallWatch(["a"], steps=0)


def test_the_reason_follows_the_metrics_in_order():
    # every answer failed to parse: that comes first, whatever the entropy
    reason = stall_reason("a", _step(a={"format_error_rate": 1.0, "entropy": 0.0}))
    assert "no answer parsed (format_error_rate 1.00)" in reason
    assert "rollout.constrained_decoding=true" in reason
    # legal-move entropy is read before the token entropy; 0.01 nats < 0.05: deterministic
    reason = stall_reason("a", _step(a={"format_error_rate": 0.2, "action_entropy": 0.01,
                                        "entropy": 2.0}))
    assert "deterministic (action_entropy 0.010 nats)" in reason
    assert "trainer.action_entropy_coef" in reason
    reason = stall_reason("a", _step(a={"entropy": 0.049}))
    assert "deterministic (entropy 0.049 nats)" in reason
    # mixed play and parsed answers: the groups' returns were equal
    for figures in ({"action_entropy": 0.6}, {"entropy": 0.05}, {}):
        reason = stall_reason("a", _step(a=figures))
        assert reason.startswith("the episodes of every group ended with equal returns")
        assert "rollout.shared_deals=false" in reason


@pytest.mark.slow
def test_the_hanabi_launch_line_on_the_tiny_model_says_no_answer_parsed(tmp_path, capsys):
    """The README's first launch line as a new user runs it (the tiny default, free text):
    no answer parses, every row has advantage 0, and the console says so after 3 steps."""
    cfg = load_config(str(ROOT / "examples" / "hanabi"), "multi_agent_hanabi", [
        "max_steps=4", "rollout.num_groups=1", "rollout.group_size=2",
        "rollout.sampling.max_new_tokens=8", "eval.eval_steps=0",
        "tracking.backends=[jsonl]", f"output_dir={tmp_path}"])
    metrics = AgenticPipeline(cfg).run()
    assert metrics["agent_0/format_error_rate"] == 1.0
    said = [line for line in capsys.readouterr().out.splitlines() if "nothing to learn" in line]
    assert len(said) == 2  # once per agent over 4 steps
    for agent, line in zip(["agent_0", "agent_1"], sorted(said, key=lambda x: x.split()[1]),
                           strict=True):
        assert f"] {agent} has nothing to learn" in line
        assert "the 3 steps to step 3" in line
        assert "no answer parsed (format_error_rate 1.00)" in line
