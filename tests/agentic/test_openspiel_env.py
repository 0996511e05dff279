"""OpenSpielEnv against OpenSpiel itself, prompts, opponents, forfeit and parameter errors."""

from __future__ import annotations

import numpy as np
import pyspiel
import pytest

from roll.agentic.env.actions import ActionConfig, parse_action
from roll.agentic.env.base import MultiAgentEnv
from roll.agentic.env.openspiel_env import OpenSpielEnv, unique_action_strings
from roll.agentic.env.opponents import MCTSOpponent, RandomOpponent
from roll.agentic.env.renderers import RENDERERS, render_generic, render_prompt, renderer_named

SMALL_HANABI = {"players": 2, "colors": 2, "ranks": 2, "hand_size": 2,
                "max_information_tokens": 3, "max_life_tokens": 1}
GAMES = [
    ("hanabi", SMALL_HANABI),
    ("hanabi", {}),
    ("hanabi", {"players": 5, "colors": 3, "ranks": 3, "hand_size": 2}),
    ("tic_tac_toe", {}),
    ("kuhn_poker", {}),
    ("kuhn_poker", {"players": 3}),
    ("connect_four", {}),
    ("leduc_poker", {}),
]
SEEDS = range(5)


def reference_playout(game_name: str, params: dict, seed: int,
                      action_seed: int) -> tuple[list[int], list[float]]:
    """Random play straight on pyspiel: chance outcomes drawn by ``rng.choice`` with their
    probabilities from a generator seeded ``seed``; moves by one ``integers(len(legal))`` draw from
    a second generator seeded ``action_seed``."""
    state = pyspiel.load_game(game_name, params).new_initial_state()
    chance_rng, action_rng = np.random.default_rng(seed), np.random.default_rng(action_seed)
    while not state.is_terminal():
        if state.is_chance_node():
            outcomes = state.chance_outcomes()
            probs = np.array([prob for _, prob in outcomes])
            state.apply_action(outcomes[chance_rng.choice(len(outcomes), p=probs / probs.sum())][0])
        else:
            legal = state.legal_actions()
            state.apply_action(legal[action_rng.integers(len(legal))])
    return list(state.history()), list(state.returns())


def env_playout(env: OpenSpielEnv, seed: int, action_seed: int) -> list[float]:
    """Random play through the env protocol; returns the summed per-step rewards."""
    env.reset(seed)
    opponent = RandomOpponent(action_seed)
    total = np.zeros(env.num_seats)
    while not env.done:
        result = env.step(opponent.choose(env, env.current_seat()))
        assert len(result.rewards) == env.num_seats and result.done == env.done
        total += result.rewards
    assert env.current_seat() is None
    return total.tolist()


@pytest.mark.parametrize(("game_name", "params"), GAMES)
def test_random_play_matches_openspiel(game_name: str, params: dict) -> None:
    env = OpenSpielEnv(game_name, params)
    histories = set()
    for seed in SEEDS:
        step_reward_sums = env_playout(env, seed, action_seed=1000 + seed)
        history, returns = reference_playout(game_name, params, seed, action_seed=1000 + seed)
        assert env.history_ids() == history
        assert env.returns() == returns
        np.testing.assert_allclose(step_reward_sums, returns, atol=1e-9)
        histories.add(tuple(history))
    assert len(histories) > 1, "seeds should give different episodes"


def test_env_satisfies_protocol_and_rejects_bad_use() -> None:
    env = OpenSpielEnv("tic_tac_toe")
    with pytest.raises(RuntimeError, match="reset"):
        env.current_seat()
    env.reset(0)
    assert isinstance(env, MultiAgentEnv)
    assert env.current_seat() == 0 and env.num_seats == 2 and env.name == "tic_tac_toe"
    with pytest.raises(ValueError, match="does not act now"):
        env.legal_actions(1)
    with pytest.raises(ValueError, match="illegal action"):
        env.step("x(9,9)")
    for move in ["x(0,0)", "o(1,0)", "x(0,1)", "o(1,1)", "x(0,2)"]:
        result = env.step(move)
    assert result.done and env.returns() == [1.0, -1.0] and result.rewards == [1.0, -1.0]
    with pytest.raises(RuntimeError, match="done"):
        env.apply_action_id(8)


def test_observation_is_from_the_seats_point_of_view() -> None:
    env = OpenSpielEnv("kuhn_poker")
    env.reset(1)
    assert env.observation(0) == env.state.observation_string(0)
    assert env.observation(0) != env.observation(1)  # different private cards
    dice = OpenSpielEnv("liars_dice")  # no observation string: information state instead
    dice.reset(2)
    assert dice.observation(1) == dice.state.information_state_string(1)
    hanabi = OpenSpielEnv("hanabi", SMALL_HANABI)
    hanabi.reset(3)
    own_hand = hanabi.observation(0).split("Hands:")[1].split("-----")[0]
    assert "XX ||" in own_hand and "R1 ||" not in own_hand  # own cards hidden


def test_action_ids_and_strings_round_trip() -> None:
    env = OpenSpielEnv("leduc_poker")
    env.reset(0)
    seat = env.current_seat()
    for text, action_id in zip(env.legal_actions(seat), env.legal_action_ids(seat), strict=True):
        assert env.action_string(action_id) == text
        assert env.state.action_to_string(seat, action_id) == text


def test_duplicate_action_strings_are_disambiguated() -> None:
    assert unique_action_strings(["Pass", " Pass ", "Bet", ""], [3, 7, 1, 9]) == [
        "Pass (#3)", "Pass (#7)", "Bet", "(#9)"]
    assert unique_action_strings(["a", "b"], [0, 1]) == ["a", "b"]


def test_forfeit_outcomes() -> None:
    env = OpenSpielEnv("tic_tac_toe")
    env.reset(0)
    env.step("x(1,1)")
    result = env.forfeit(1)
    assert result.done and env.done and env.current_seat() is None
    assert env.returns() == [1.0, -1.0] and result.info == {"forfeit_seat": 1}

    kuhn3 = OpenSpielEnv("kuhn_poker", {"players": 3})
    kuhn3.reset(0)
    kuhn3.forfeit(0)
    assert kuhn3.returns() == [-2.0, 1.0, 1.0]  # zero-sum: min utility, others share

    hanabi, opponent = OpenSpielEnv("hanabi", {**SMALL_HANABI, "max_life_tokens": 3}), None
    for seed in range(20):  # find an episode where the team scored before the end
        hanabi.reset(seed)
        opponent, total = RandomOpponent(seed), np.zeros(2)
        while hanabi.returns()[0] == 0 and not hanabi.done:
            total += hanabi.step(opponent.choose(hanabi, hanabi.current_seat())).rewards
        if not hanabi.done:
            break
    assert not hanabi.done and hanabi.returns()[0] > 0
    total += hanabi.forfeit(hanabi.current_seat()).rewards
    assert hanabi.returns() == [0.0, 0.0]  # cooperative: the whole team fails
    np.testing.assert_allclose(total, [0.0, 0.0])  # the forfeit step took the score back


def test_hanabi_parameters_from_a_plain_dict() -> None:
    for players in range(2, 6):
        env = OpenSpielEnv("hanabi", {**SMALL_HANABI, "players": players, "colors": 3})
        assert env.num_seats == players
        env.reset(0)
        assert "Info tokens: 3" in env.observation(0)


@pytest.mark.parametrize(("game_name", "params", "needle"), [
    ("hanabi", {"players": 7}, "game_params.players"),
    ("hanabi", {"colors": 6}, "game_params.colors"),
    ("hanabi", {"hand_size": 0}, "game_params.hand_size"),
    ("hanabi", {"colors": 1, "ranks": 1, "hand_size": 2}, "deck"),
    ("hanabi", {"players": 2.0}, "game_params.players"),
    ("hanabi", {"players": "2"}, "game_params.players"),
    ("kuhn_poker", {"playerz": 2}, "game_params.playerz"),
    ("no_such_game", {}, "game_name"),
    ("mfg_crowd_modelling", {}, "game_name: .*MEAN_FIELD"),
    ("turn_based_simultaneous_game", {}, "game_params.game"),
    ("turn_based_simultaneous_game", {"game": "nope(num_cards=4)"},
     "game_params.game: unknown OpenSpiel game 'nope'"),
    ("turn_based_simultaneous_game", {"game": {"name": "hanabi", "players": 9}},
     "game_params.game.players for hanabi"),
    ("turn_based_simultaneous_game", {"game": 3}, "game_params.game must be a game"),
])
def test_bad_game_config_raises_clear_error(game_name: str, params: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        OpenSpielEnv(game_name, params)


RENDERED_GAMES = [("hanabi", SMALL_HANABI), ("hanabi", {}), ("tic_tac_toe", {}),
                  ("kuhn_poker", {}), ("connect_four", {}), ("leduc_poker", {}),
                  ("liars_dice", {}), ("breakthrough", {}), ("nim", {}),
                  ("goofspiel", {"num_cards": 5}), ("oshi_zumo", {"coins": 4})]


@pytest.mark.parametrize(("game_name", "params"), RENDERED_GAMES)
def test_prompts_list_every_legal_move_and_parse_back(game_name: str, params: dict) -> None:
    env, opponent, config = OpenSpielEnv(game_name, params), RandomOpponent(7), ActionConfig()
    env.reset(11)
    for _ in range(6):
        seat = env.current_seat()
        legal = env.legal_actions(seat)
        prompt = render_prompt(env, seat)
        assert "<answer>" in prompt.text
        assert all(move in prompt.text for move in legal)
        if game_name not in RENDERERS:
            assert env.game.get_type().long_name in prompt.text
        if game_name in ("tic_tac_toe", "kuhn_poker"):
            assert len(prompt.text) < 600
        for index, move in enumerate(legal, 1):
            assert parse_action(f"<answer>{move}</answer>", legal, config).action == move
            by_number = parse_action(f"<answer>{index}</answer>", legal, config,
                                     prompt.numbered_moves)
            assert by_number.action == (move if prompt.numbered_moves else None)
        env.step(opponent.choose(env, seat))
        if env.done:
            break


def test_specific_renderers_show_private_information() -> None:
    kuhn = OpenSpielEnv("kuhn_poker")
    kuhn.reset(0)
    card = "JQK"[int(kuhn.state.information_state_string(0))]
    assert f"Your card: {card}." in render_prompt(kuhn, 0).text
    kuhn.step("Bet")
    assert "Moves so far: Bet." in render_prompt(kuhn, 1).text
    leduc = OpenSpielEnv("leduc_poker")
    leduc.reset(0)
    private = int(leduc.observation(0).split("[Private: ")[1].split("]")[0])
    assert f"Your card: {'JQK'[private // 2]}." in render_prompt(leduc, 0).text
    ttt = OpenSpielEnv("tic_tac_toe")
    ttt.reset(0)
    assert "Tic Tac Toe as player 0" in render_generic(ttt, 0).text


def play_match(env: OpenSpielEnv, players: dict[int, object], seed: int) -> list[float]:
    env.reset(seed)
    while not env.done:
        seat = env.current_seat()
        env.step(players[seat].choose(env, seat))
    return env.returns()


def test_mcts_beats_random_at_tic_tac_toe() -> None:
    env = OpenSpielEnv("tic_tac_toe")
    mcts, rand = MCTSOpponent(simulations=100, seed=0), RandomOpponent(1)
    wins = losses = 0
    for game in range(20):  # MCTS alternates between moving first and second
        mcts_seat = game % 2
        returns = play_match(env, {mcts_seat: mcts, 1 - mcts_seat: rand}, seed=game)
        wins += returns[mcts_seat] > 0
        losses += returns[mcts_seat] < 0
    # Random vs random wins and loses about equally often (~9 each in 20 games).
    assert wins >= 14 and losses <= 3, (wins, losses)


def test_mcts_is_reproducible_with_a_seed() -> None:
    env = OpenSpielEnv("tic_tac_toe")

    def history(seed: int) -> list[int]:
        play_match(env, {0: MCTSOpponent(10, seed), 1: RandomOpponent(seed)}, seed=0)
        return env.history_ids()

    assert history(3) == history(3)


def test_tic_tac_toe_lines_renderer_shows_each_moves_lines() -> None:
    """o to move on  o.. / .x. / ..x : each legal move followed by the other two cells of every
    line through it (row, column, then the diagonals it is on), marks first."""
    env = OpenSpielEnv("tic_tac_toe")
    env.reset(0)
    for cell in (4, 0, 8):  # x centre, o corner, x opposite corner
        env.apply_action_id(cell)
    prompt = renderer_named("tic_tac_toe_lines", "tic_tac_toe")(env, 1)
    assert "You are o." in prompt.text and "Board:\no..\n.x.\n..x\n" in prompt.text
    for line in ("1. o(0,1) lines: o. x.",         # row 0: o + empty; column 1: x + empty
                 "2. o(0,2) lines: o. x. x.",      # row, column 2 (x at 2,2), anti-diagonal
                 "4. o(1,2) lines: x. x.",
                 "5. o(2,0) lines: x. o. x.",
                 "6. o(2,1) lines: x. x."):
        assert line in prompt.text
    legal = env.legal_actions(1)
    assert prompt.numbered_moves
    assert parse_action("<answer>2</answer>", legal, ActionConfig(), True).action == "o(0,2)"
    assert renderer_named("", "tic_tac_toe") is render_prompt
    with pytest.raises(KeyError, match="tic_tac_toe_lines"):
        renderer_named("no_such_renderer", "tic_tac_toe")
    with pytest.raises(KeyError, match="for kuhn_poker"):  # a variant of another game
        renderer_named("tic_tac_toe_lines", "kuhn_poker")


def test_connect_four_lines_renderer_shows_each_moves_longest_lines() -> None:
    """x: 1 2 3 on the bottom row, o: column 6 three high, x to move. After each legal move the
    longest line through the cell it fills for an x and for an o there, worked out by hand:
    0 and 4 complete x's row (4); 6 tops o's column (4); 5 is two cells from x's (0,3), so an
    x there stands alone (1), and beside o's (0,6) an o makes 2."""
    env = OpenSpielEnv("connect_four")
    env.reset(0)
    for column in (1, 6, 2, 6, 3, 6):
        env.apply_action_id(column)
    prompt = renderer_named("connect_four_lines", "connect_four")(env, 0)
    assert "You are x." in prompt.text
    assert "Board (bottom row last):\n.......\n.......\n.......\n......o\n......o\n.xxx..o\n" \
        in prompt.text
    listed = prompt.text.split("for an o there):\n")[1].split("\nThink")[0].splitlines()
    assert listed == ["x0: x 4, o 1", "x1: x 2, o 1", "x2: x 2, o 1", "x3: x 2, o 1",
                      "x4: x 4, o 1", "x5: x 1, o 2", "x6: x 1, o 4"]
    assert not prompt.numbered_moves
    assert parse_action("<answer>x6</answer>", env.legal_actions(0), ActionConfig(),
                        False).action == "x6"
    # bottom row x o o o . . x, row 1 . x x o, row 2 . . x o (the moves of
    # test_connect_four_baselines' diagonal test): an x at (3,3) ends x's diagonal from (0,0),
    # an o there o's column 3 (4 each); at (0,4) an o ends o's bottom row; at (1,0) an x makes
    # row 1's x x x (3) and an o the anti-diagonal with (0,1) (2)
    env.reset(0)
    for column in (0, 1, 1, 2, 2, 3, 2, 3, 6, 3):
        env.apply_action_id(column)
    prompt = renderer_named("connect_four_lines", "connect_four")(env, 0)
    for line in ("x3: x 4, o 4", "x4: x 1, o 4", "x0: x 3, o 2"):
        assert line in prompt.text
    with pytest.raises(KeyError, match="for tic_tac_toe"):  # a variant of another game
        renderer_named("connect_four_lines", "tic_tac_toe")


def test_hanabi_words_renderer_spells_out_hints_and_playable_cards() -> None:
    """The examples' small Hanabi (2 colors, ranks 1-3), deal 3: player 0 sees its partner's
    yellow 2 and yellow 1 and hints rank 1; player 1's prompt then says, by hand: its card 1
    was hinted rank 1, can be red or yellow 1, so it is playable on the empty fireworks; its
    card 0 is not a 1 (the hint's negative side), so rank 2 or 3 and not playable; of the
    partner's red 1 and red 2 only the 1 is playable."""
    env = OpenSpielEnv("hanabi", {"players": 2, "colors": 2, "ranks": 3, "hand_size": 2,
                                  "max_information_tokens": 3, "max_life_tokens": 1})
    env.reset(3)
    env.step("(Reveal player +1 rank 1)")
    prompt = renderer_named("hanabi_words", "hanabi")(env, 1)
    for line in ("You are player 1. Lives: 1. Hint tokens: 2. Cards in the deck: 8.",
                 "Fireworks: red 0, yellow 0. Next: red 1, yellow 1.",
                 "card 0: hinted nothing; could be red or yellow, rank 2 or 3.\n",
                 "card 1: hinted rank 1; could be red or yellow, rank 1. Playable now.",
                 "Player +1's cards:\ncard 0: red 1, playable now (they know: hinted nothing;"
                 " could be red or yellow, rank 1 or 2 or 3).\ncard 1: red 2 (they know:",
                 "Discarded: none.",
                 "6. (Reveal player +1 rank 1)"):  # (discards allowed: 2 of 3 tokens left)
        assert line in prompt.text
    from roll.agentic.env.renderers import hanabi_playable

    # its own card 0 (rank 2 or 3) no, card 1 (a 1) yes; the partner's red 1 yes, red 2 no
    assert hanabi_playable(env.observation(1)) == [[False, True], [True, False]]
    env.step("(Play 1)")  # player 1 plays its red or yellow 1: the firework grows
    assert "Next: red 2, yellow 1." in renderer_named("hanabi_words", "hanabi")(env, 0).text \
        or "Next: red 1, yellow 2." in renderer_named("hanabi_words", "hanabi")(env, 0).text
