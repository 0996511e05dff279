"""The game examples in the real pipeline, one process (tiny offline model, hf engine, CPU): one
step trains, an agent's adapter moves iff it had a gradient, and a checkpoint is written. The
Ray run of the same step (tests/distributed/test_ray_pipeline.py) takes two of these games:
its ranks see a game only through its rows, so the other games are checked here, at a
fraction of the cost of two Ray ranks each."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import load_config
from roll.utils.checkpoint import latest_checkpoint
from tests.pipeline.helpers import moved_iff_gradient

ROOT = Path(__file__).resolve().parents[2]
GAMES = {"tictactoe": "multi_agent_tictactoe", "connect_four": "multi_agent_connect_four",
         "leduc_poker": "multi_agent_leduc_poker"}


@pytest.mark.slow  # three example runs: the quick subset stays under 3 minutes
@pytest.mark.parametrize("example", sorted(GAMES))
def test_game_examples_train_one_step_and_checkpoint(tmp_path, example):
    cfg = load_config(str(ROOT / "examples" / example), GAMES[example], [
        "max_steps=1", "rollout.num_groups=2", "rollout.group_size=4",
        "rollout.constrained_decoding=true", "rollout.sampling.max_new_tokens=40",
        "eval.eval_steps=0", "tracking.backends=[jsonl]", f"output_dir={tmp_path}"])
    pipeline = AgenticPipeline(cfg)
    start = {name: pipeline.model.export_adapter(name) for name in pipeline.agent_names}
    metrics = pipeline.run()
    assert pipeline.trainer.global_step == 1
    moved = moved_iff_gradient(pipeline, start, metrics)
    assert any(moved.values())  # these games' graded returns differ within a group
    assert latest_checkpoint(tmp_path).name == "step_00000001"
