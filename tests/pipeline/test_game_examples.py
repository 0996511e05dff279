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


@pytest.mark.slow
def test_the_hanabi_team_recipe_trains_a_step_and_evaluates_both_seatings_greedy_too(tmp_path):
    """examples/hanabi/team.yaml on the tiny model: one step of constrained team play on
    independent deals, the team evaluated in both seatings sampled and greedy (its figures),
    and a checkpoint. The tiny model scores 0 in every game: no agent has a gradient, so none
    moves."""
    import json

    cfg = load_config(str(ROOT / "examples" / "hanabi"), "team", [
        "model.path=tiny", "max_steps=1", "rollout.num_groups=2", "eval.eval_steps=1",
        "eval.num_episodes=4", "tracking.backends=[jsonl]", f"output_dir={tmp_path}"])
    assert not cfg.rollout.shared_deals and cfg.trainer.policy_over == "moves"
    pipeline = AgenticPipeline(cfg)
    start = {name: pipeline.model.export_adapter(name) for name in pipeline.agent_names}
    metrics = pipeline.run()
    moved_iff_gradient(pipeline, start, metrics)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evaluated = [row for row in rows if "eval/team/score" in row]
    assert [row["step"] for row in evaluated] == [0, 1]
    assert all("eval_greedy/team/score" in row for row in evaluated)
    trained = [row for row in rows if "agent_0/turns" in row][-1]
    assert trained["agent_0/format_error_rate"] == 0.0  # constrained: every answer a legal move
    assert latest_checkpoint(tmp_path).name == "step_00000001"
