"""advantage.drop_zero_advantage: rows with nothing to learn leave the policy update, and the
dashboard still counts them."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import load_config

ROOT = Path(__file__).resolve().parents[2]


def _first_step(out: Path, drop: bool) -> dict[str, float]:
    cfg = load_config(str(ROOT / "examples" / "kuhn_poker"), "quickstart_cpu", [
        "rollout.num_groups=8", "eval.eval_steps=0", "tracking.backends=[jsonl]",
        "max_steps=1", f"advantage.drop_zero_advantage={str(drop).lower()}",
        f"output_dir={out}"])
    return AgenticPipeline(cfg).run()


def test_zero_advantage_rows_are_counted_and_optionally_dropped(tmp_path):
    kept = _first_step(tmp_path / "kept", drop=False)
    dropped = _first_step(tmp_path / "dropped", drop=True)  # the same rollout (same seed)
    for agent in ("agent_0", "agent_1"):
        fraction = kept[f"{agent}/zero_adv_fraction"]
        assert 0 < fraction < 1  # this seed has groups of equal returns, and others
        assert dropped[f"{agent}/zero_adv_fraction"] == fraction  # counted before dropping
        assert f"{agent}/dropped_rows" not in kept
        rows, left = kept[f"{agent}/num_rows"], dropped[f"{agent}/num_rows"]
        assert dropped[f"{agent}/dropped_rows"] == pytest.approx(fraction * rows)
        assert left + dropped[f"{agent}/dropped_rows"] == rows
