"""Simultaneous-move games (goofspiel) played in OpenSpiel's turn-based form.

Checks: the converted game equals the simultaneous game played with joint moves (turn order,
legal moves, chance, rewards, returns); a seat never sees the other seats' picks of the round
it is playing; bad game / nested-game configs are one-line errors naming the field; a short real
pipeline run on goofspiel with two agents finishes and writes metrics.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyspiel
import pytest

from roll.agentic.env.openspiel_env import OpenSpielEnv, load_game
from roll.agentic.env.renderers import render_prompt
from roll.errors import ConfigError
from roll.multi_agent.config import LoRAConfig, MultiAgentConfig, OptimConfig
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import CLIError, load_config
from roll.pipeline.config import (
    EnvSchema,
    EvalSchema,
    ModelSchema,
    PipelineConfig,
    RolloutSchema,
    SamplingSchema,
)
from roll.pipeline.validation import validate_config
from roll.utils.tracking import TrackingConfig

ROOT = Path(__file__).resolve().parents[2]
GOOFSPIEL_PARAMS = [
    {"num_cards": 4},  # random point order: a chance node every round
    {"num_cards": 5, "players": 3, "points_order": "descending", "returns_type": "total_points"},
    {"num_cards": 4, "imp_info": True, "returns_type": "point_difference"},
]


def resolve_chance(state: pyspiel.State, rng: np.random.Generator) -> None:
    """Sample chance nodes as the env does: one ``rng.choice`` with the outcome probabilities."""
    while state.is_chance_node():
        outcomes = state.chance_outcomes()
        probs = np.array([prob for _, prob in outcomes])
        state.apply_action(outcomes[rng.choice(len(outcomes), p=probs / probs.sum())][0])


def test_goofspiel_and_the_named_wrapper_load_the_same_turn_based_game() -> None:
    plain = OpenSpielEnv("goofspiel", {"num_cards": 4})
    as_string = OpenSpielEnv("turn_based_simultaneous_game", {"game": "goofspiel(num_cards=4)"})
    as_mapping = OpenSpielEnv("turn_based_simultaneous_game",
                              {"game": {"name": "goofspiel", "num_cards": 4}})
    expected = str(pyspiel.load_game_as_turn_based("goofspiel", {"num_cards": 4}))
    for env in (plain, as_string, as_mapping):
        assert str(env.game) == expected
        assert env.game.get_type().dynamics == pyspiel.GameType.Dynamics.SEQUENTIAL
        assert env.name == "goofspiel" and env.simultaneous_moves and env.num_seats == 2
    assert not OpenSpielEnv("tic_tac_toe").simultaneous_moves
    assert load_game("goofspiel", {"players": 3}).num_players() == 3


@pytest.mark.parametrize("params", GOOFSPIEL_PARAMS)
def test_random_goofspiel_through_the_env_matches_joint_moves_in_openspiel(params: dict) -> None:
    """Each round the seats pick in order 0, 1, ...; the env must offer each seat exactly the
    simultaneous game's legal moves, draw the same chance outcomes, and pay, round by round, the
    returns of the simultaneous game given the joint move."""
    env = OpenSpielEnv("goofspiel", params)
    game = pyspiel.load_game("goofspiel", params)
    histories = set()
    for seed in range(4):
        env.reset(seed)
        state, chance_rng = game.new_initial_state(), np.random.default_rng(seed)
        resolve_chance(state, chance_rng)
        move_rng, reward_sums = np.random.default_rng(100 + seed), np.zeros(env.num_seats)
        while not state.is_terminal():
            assert state.is_simultaneous_node()
            joint = []
            for seat in range(game.num_players()):
                assert env.current_seat() == seat
                legal_ids = list(state.legal_actions(seat))
                assert env.legal_action_ids(seat) == legal_ids
                assert env.legal_actions(seat) == [state.action_to_string(seat, a).strip()
                                                   for a in legal_ids]
                joint.append(legal_ids[move_rng.integers(len(legal_ids))])
                result = env.step(env.action_string(joint[-1]))
                reward_sums += result.rewards
                if seat < game.num_players() - 1:  # the round is applied with its last pick
                    assert result.rewards == [0.0] * env.num_seats and not result.done
            state.apply_actions(joint)
            resolve_chance(state, chance_rng)
            assert env.returns() == list(state.returns())
            assert result.done == state.is_terminal() == env.done
        assert env.current_seat() is None
        np.testing.assert_allclose(reward_sums, state.returns(), atol=1e-9)
        histories.add(tuple(env.history_ids()))
    assert len(histories) > 1, "seeds should give different episodes"


def views_of(env: OpenSpielEnv, seat: int) -> tuple:
    """Everything a seat's prompt could be built from, and the prompt itself."""
    return env.observation(seat), env.information_state(seat), render_prompt(env, seat).text


@pytest.mark.parametrize(("params", "rounds_before"), [
    ({"num_cards": 4}, 0), ({"num_cards": 4}, 1),
    ({"num_cards": 4, "imp_info": True}, 1),
    ({"num_cards": 4, "players": 3, "points_order": "descending"}, 1),
])
def test_a_seat_does_not_see_the_other_picks_of_its_round(params: dict,
                                                          rounds_before: int) -> None:
    """Seat k's views at its turn are the same whatever seat 0 picked in that round."""
    env, seed = OpenSpielEnv("goofspiel", params), 5
    env.reset(seed)
    move_rng, moves = np.random.default_rng(0), []
    for _ in range(rounds_before * env.num_seats):
        ids = env.legal_action_ids(env.current_seat())
        moves.append(ids[move_rng.integers(len(ids))])
        env.apply_action_id(moves[-1])
    prefix, first_picks = env.history_ids(), env.legal_action_ids(0)

    def replay_until(seat: int, first_pick: int) -> None:
        """Replay the earlier rounds, seat 0 picks ``first_pick``, seats 1..seat-1 their first
        legal move; stop at ``seat``'s turn."""
        env.reset(seed)
        for move in moves:
            env.apply_action_id(move)
        assert env.history_ids() == prefix  # same chance outcomes
        env.apply_action_id(first_pick)
        while env.current_seat() != seat:
            env.apply_action_id(env.legal_action_ids(env.current_seat())[0])

    for seat in range(1, env.num_seats):
        views, raw_states = set(), set()
        for pick in first_picks:
            replay_until(seat, pick)
            views.add(views_of(env, seat))
            raw_states.add(str(env.state))
        assert len(views) == 1, f"seat {seat} sees seat 0's pick of its round"
        # The raw state does hold the pick: a view built from it would leak.
        assert len(raw_states) == len(first_picks)
    if rounds_before == 0:
        # Once the round is applied, seat 1 does learn something about seat 0's bid.
        after = set()
        for pick in first_picks:
            replay_until(env.num_seats - 1, pick)
            env.apply_action_id(1)
            after.add((env.observation(1), env.information_state(1)))
        assert len(after) > 1


def test_the_goofspiel_prompt_explains_simultaneous_bids_and_lists_them() -> None:
    env = OpenSpielEnv("goofspiel", {"num_cards": 4})
    env.reset(0)
    prompt = render_prompt(env, 0)
    assert "simultaneous" in prompt.text and "You are player 0." in prompt.text
    assert all(move in prompt.text for move in env.legal_actions(0))
    assert not prompt.numbered_moves  # "2." would be confused with bidding card 2
    oshi = OpenSpielEnv("oshi_zumo", {"coins": 3})  # no renderer of its own: the generic one
    oshi.reset(0)
    text = render_prompt(oshi, 0).text
    assert "Turn-based Oshi Zumo" in text and "simultaneous" in text


def game_config(game: str, params: dict) -> PipelineConfig:
    return PipelineConfig(team=MultiAgentConfig(num_agents=2),
                          env=EnvSchema(game=game, params=params))


@pytest.mark.parametrize(("game", "params", "field", "needle"), [
    ("turn_based_simultaneous_game", {"game": "no_such_game(num_cards=4)"}, "env.params",
     "env.params.game: unknown OpenSpiel game 'no_such_game'"),
    ("turn_based_simultaneous_game", {"game": "goofspiel(num_cardz=4)"}, "env.params",
     "env.params.game.num_cardz"),
    ("turn_based_simultaneous_game", {"game": {"name": "goofspiel", "num_cards": "4"}},
     "env.params", "env.params.game.num_cards"),
    ("turn_based_simultaneous_game", {"game": "goofspiel(num_cards=4"}, "env.params",
     "env.params.game"),
    ("turn_based_simultaneous_game", {"game": "tic_tac_toe"}, "env.params",
     "not a simultaneous-move game"),
    ("turn_based_simultaneous_game", {}, "env.params", "env.params.game"),
    ("goofspiel", {"num_cards": 0}, "env.params", "env.params.num_cards"),
    ("goofspiel", {"num_cards": 4, "num_turns": 9}, "env.params", "num_turns"),
    ("repeated_game", {"stage_game": "matrix_pd"}, "env.params",
     "env.params.num_repetitions"),
    ("mfg_crowd_modelling", {}, "env.game", "MEAN_FIELD"),
])
def test_bad_simultaneous_game_config_is_one_line_naming_the_field(
    game: str, params: dict, field: str, needle: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_config(game_config(game, params))
    message = str(caught.value)
    assert caught.value.field_path == field
    assert needle in message and len(message.splitlines()) == 1, message


def test_nested_games_validate_and_count_seats() -> None:
    for game, params in [
        ("goofspiel", {"num_cards": 3}),
        ("turn_based_simultaneous_game", {"game": "goofspiel(num_cards=3)"}),
        ("repeated_game", {"stage_game": "matrix_pd", "num_repetitions": 3}),
    ]:
        validate_config(game_config(game, params))


@pytest.mark.parametrize("game_override", [
    "env.params.game='goofspiel(num_cards=4)'", "env.params.game={name:goofspiel,num_cards:4}"])
def test_the_wrapper_can_be_named_from_the_command_line(game_override: str) -> None:
    config = (str(ROOT / "examples" / "kuhn_poker"), "multi_agent_kuhn_poker")
    cfg = load_config(*config, ["env.game=turn_based_simultaneous_game", game_override])
    assert OpenSpielEnv(cfg.env.game, cfg.env.params).name == "goofspiel"
    bad_field = r"^config error: env\.params=.*env\.params\.game\.num_cardz"
    with pytest.raises(CLIError, match=bad_field):
        load_config(*config, ["env.game=turn_based_simultaneous_game",
                              game_override.replace("num_cards", "num_cardz")])


@pytest.mark.slow
def test_two_agents_train_on_goofspiel_end_to_end(tmp_path, tiny_model_path) -> None:
    out = tmp_path / "run"
    cfg = PipelineConfig(
        model=ModelSchema(path=str(tiny_model_path)),
        team=MultiAgentConfig(num_agents=2, lora=LoRAConfig(rank=4, alpha=8),
                              optim=OptimConfig(lr=1e-2)),
        env=EnvSchema(game="goofspiel", params={"num_cards": 3},
                      seat_to_agent=["agent_0", "agent_1"]),
        rollout=RolloutSchema(num_groups=2, group_size=2, constrained_decoding=True,
                              sampling=SamplingSchema(max_new_tokens=16)),
        eval=EvalSchema(eval_steps=0),
        tracking=TrackingConfig(backends=["jsonl"]),
        output_dir=str(out),
        max_steps=2,
        save_steps=0,
    )
    AgenticPipeline(validate_config(cfg)).run()
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for metrics in lines:
        assert metrics["rollout/episodes"] == 4
        # With 3 cards each seat bids twice per episode (the last bid is forced and automatic).
        assert metrics["agent_0/turns"] == metrics["agent_1/turns"] == 4 * 2
        assert metrics["agent_0/format_error_rate"] == metrics["agent_1/format_error_rate"] == 0
        # Win/loss goofspiel is zero-sum between the two agents.
        assert metrics["agent_0/episode_return"] == -metrics["agent_1/episode_return"]
        assert metrics["agent_0/optimizer_steps"] == metrics["agent_1/optimizer_steps"] == 1
