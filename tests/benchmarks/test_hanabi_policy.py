"""benchmarks/hanabi_policy.py on the tiny model: the greedy team's games add up, and the
move kinds are named as the game's moves say."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import hanabi_policy  # noqa: E402


def test_move_kinds():
    assert hanabi_policy.move_kind("(Play 1)") == "Play 1"
    assert hanabi_policy.move_kind("(Discard 0)") == "Discard 0"
    assert hanabi_policy.move_kind("(Reveal player +1 color R)") == "Reveal color"
    assert hanabi_policy.move_kind("(Reveal player +1 rank 3)") == "Reveal rank"


def test_the_greedy_teams_games_add_up(tmp_path):
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    cfg = load_config(str(ROOT / "examples" / "hanabi"), "multi_agent_hanabi", [
        "rollout.constrained_decoding=true", "tracking.backends=[jsonl]",
        f"output_dir={tmp_path}"])
    pipeline = AgenticPipeline(cfg)
    result = hanabi_policy.report(pipeline, games=3, seed=1)
    assert result["games"] == 3 and sum(result["ended"].values()) == 3
    # every move of every game is counted once, by its kind
    assert sum(result["greedy_moves"].values()) == pytest.approx(3 * result["moves_per_game"])
    assert set(result["greedy_moves"]) <= {"Play 0", "Play 1", "Discard 0", "Discard 1",
                                           "Reveal color", "Reveal rank"}
    # the first move's probabilities cover the legal kinds of a full-token opening: no discard
    assert sum(result["first_move_probability"].values()) == pytest.approx(1.0, abs=1e-4)
    assert not any(kind.startswith("Discard") for kind in result["first_move_probability"])
    assert result == hanabi_policy.report(pipeline, games=3, seed=1)  # greedy and seeded


def test_a_team_plays_the_same_from_its_checkpoint_or_its_adapters_alone(tmp_path):
    """``--checkpoint`` takes a whole checkpoint or only its agents/ folders (what
    ``device_runs.sh bring RUN adapters`` brings back): the same team plays either way, and
    not the untrained one; a folder that is neither is refused by name."""
    import shutil

    import torch

    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    def pipeline(out):
        return AgenticPipeline(load_config(
            str(ROOT / "examples" / "hanabi"), "multi_agent_hanabi",
            ["rollout.constrained_decoding=true", "tracking.backends=[jsonl]",
             f"output_dir={out}"]))

    trained = pipeline(tmp_path / "a")
    torch.manual_seed(3)
    with torch.no_grad():  # a "trained" team: every LoRA B of both agents set away from 0
        for name, param in trained.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    checkpoint = trained.save()
    adapters = tmp_path / "brought"
    shutil.copytree(checkpoint / "agents", adapters / "agents")
    played = hanabi_policy.report(trained, games=2, seed=4)

    fresh = pipeline(tmp_path / "b")
    untrained = hanabi_policy.report(fresh, games=2, seed=4)
    assert untrained["first_move_probability"] != played["first_move_probability"]
    assert hanabi_policy.load_team(fresh, adapters) == "adapters"
    assert hanabi_policy.report(fresh, games=2, seed=4) == played
    other = pipeline(tmp_path / "c")
    assert hanabi_policy.load_team(other, adapters / "agents") == "adapters"
    assert hanabi_policy.report(other, games=2, seed=4) == played
    assert hanabi_policy.load_team(other, checkpoint) == "checkpoint"
    with pytest.raises(SystemExit, match="neither a checkpoint nor an agents folder"):
        hanabi_policy.load_team(other, tmp_path / "a")


def test_the_saved_adapters_rank_is_the_one_the_team_is_built_with(tmp_path):
    """A run trained at r 16 (``learning.py``) against the example YAML's r 8: ``--checkpoint``
    builds the team at the rank and alpha the saved adapters have, from the checkpoint, its
    agents/ folder or the folder above it (session 76: the r 16 adapters were refused)."""
    import json

    saved = tmp_path / "step_00000045" / "agents" / "agent_0"
    saved.mkdir(parents=True)
    (saved / "adapter_config.json").write_text(json.dumps({"r": 16, "lora_alpha": 32.0}))
    expected = ["team.lora.rank=16", "team.lora.alpha=32.0"]
    assert hanabi_policy.lora_overrides(tmp_path / "step_00000045") == expected
    assert hanabi_policy.lora_overrides(tmp_path / "step_00000045" / "agents") == expected
    assert hanabi_policy.lora_overrides(tmp_path / "elsewhere") == []
