"""The ``cfr[:N]`` opponent: OpenSpiel's CFR+ average policy, sampled per information state."""

from __future__ import annotations

import numpy as np
import pytest

from roll.agentic.env.openspiel_env import OpenSpielEnv
from roll.agentic.env.opponents import CFROpponent, build_opponent, solved_policy
from roll.agentic.env.seating import DEFAULT_CFR_ITERATIONS, build_seating


def test_cfr_specs_parse_with_and_without_iterations():
    seating = build_seating(["agent_0", "cfr:40"], 2, ["agent_0"])
    assert seating.seats[1].kind == "cfr" and seating.seats[1].cfr_iterations == 40
    assert not seating.seats[1].uses_llm
    default = build_seating(["cfr", "agent_0"], 2, ["agent_0"]).seats[0]
    assert default.cfr_iterations == DEFAULT_CFR_ITERATIONS
    with pytest.raises(ValueError, match="at least 1 CFR iteration"):
        build_seating(["agent_0", "cfr:0"], 2, ["agent_0"])
    with pytest.raises(ValueError, match="clashes"):
        build_seating(["cfr:3", "agent_0"], 2, ["cfr:3"])


def test_the_opponent_samples_the_solved_policy():
    """Player 0's first move with the Queen, and player 1 with the Jack facing a bet: over
    4,000 draws each the frequencies match the solved policy's probabilities (binomial
    sd < 0.008)."""
    env = OpenSpielEnv("kuhn_poker")
    policy = solved_policy(str(env.game), 200)
    opponent = build_opponent(build_seating(["cfr:200", "random"], 2, []).seats[0], seed=3)
    assert isinstance(opponent, CFROpponent)
    for deal, history in (([1, 0], []), ([1, 0], [1])):  # P0 Queen; P1 Jack facing a bet
        env.reset(0)
        state = env.game.new_initial_state()
        for card in deal:
            state.apply_action(card)
        for move in history:
            state.apply_action(move)
        env.set_state(state)
        seat = state.current_player()
        probabilities = policy.action_probabilities(state, seat)
        opponent = CFROpponent(200, seed=seat)
        picks = [opponent.choose(env, seat) for _ in range(4000)]
        for action_id in env.legal_action_ids(seat):
            share = picks.count(env.action_string(action_id)) / len(picks)
            assert share == pytest.approx(probabilities[action_id], abs=0.03), (history, action_id)
    # Same seed, same picks.
    env.set_state(state)
    first, again = CFROpponent(200, seed=9), CFROpponent(200, seed=9)
    assert [first.choose(env, 1) for _ in range(30)] == [again.choose(env, 1) for _ in range(30)]


def test_cfr_in_a_game_it_cannot_solve_is_refused(capsys):
    from pathlib import Path

    from roll.pipeline.cli import run_cli

    root = Path(__file__).resolve().parents[2]
    code = run_cli(lambda cfg: pytest.fail("must not start"), [
        "--config_path", str(root / "examples" / "hanabi"), "--config_name",
        "multi_agent_hanabi", "eval.seat_to_agent=[]", "eval.opponent=cfr:10"], "test")
    assert code == 2
    assert "cfr:10" in capsys.readouterr().err


def test_evaluation_against_cfr_runs_in_the_pipeline(tmp_path):
    from pathlib import Path

    from roll.pipeline.cli import load_config
    from roll.pipeline.rollout_pipeline import run_evaluation

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(str(root / "examples" / "kuhn_poker"), "quickstart_cpu", [
        "eval.opponent=cfr:50", "eval.num_episodes=30", "tracking.backends=[jsonl]",
        f"output_dir={tmp_path / 'run'}"])
    metrics = run_evaluation(cfg)
    # The untrained agents against a near-equilibrium player: they cannot win on average.
    for agent in ("agent_0", "agent_1"):
        assert metrics[f"eval/{agent}/episodes"] == 30.0
        assert metrics[f"eval/{agent}/mean_return_low"] < 0.2
    assert np.isfinite(metrics["eval/agent_0/mean_return"])
