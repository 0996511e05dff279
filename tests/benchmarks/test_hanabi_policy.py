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
