"""Prompts show the acting seat its whole information state, and nothing that is not in it.

Over many sampled histories of each example game (and of games rendered generically), at every
decision: two information states of the acting seat that are not strategically equivalent never
render the same prompt, and one information state always renders the same prompt. The
equivalences are stated per game and are real ones:

- Leduc poker: the suit of a card (the rules compare ranks only);
- TicTacToe and Connect Four: the order of the moves (the board is the whole state, as
  OpenSpiel's observation shows it);
- Hanabi: OpenSpiel gives no perfect-recall string, so the seat's information is its observation
  (what it sees and what hints told it);
- every other game: none (OpenSpiel's perfect-recall ``information_state_string``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import pytest

from roll.agentic.env.openspiel_env import OpenSpielEnv
from roll.agentic.env.renderers import render_generic, render_prompt, renderer_named

SMALL_HANABI = {"players": 2, "colors": 2, "ranks": 2, "hand_size": 2,
                "max_information_tokens": 3, "max_life_tokens": 1}


def _leduc_without_suits(env: OpenSpielEnv, seat: int) -> str:
    """Leduc's information state with each card (2 per rank: id = 2 * rank + suit) as its rank."""
    return re.sub(r"\[(Private|Public): (\d+)\]",
                  lambda m: f"[{m.group(1)}: rank {int(m.group(2)) // 2}]",
                  env.information_state(seat))


def _board(env: OpenSpielEnv, seat: int) -> str:
    return env.observation(seat)


def _information_state(env: OpenSpielEnv, seat: int) -> str:
    return env.information_state(seat)


Key = Callable[[OpenSpielEnv, int], str]
CASES: list[tuple[str, dict, Key, Callable]] = [
    ("kuhn_poker", {}, _information_state, render_prompt),
    ("kuhn_poker", {"players": 3}, _information_state, render_prompt),
    ("leduc_poker", {}, _leduc_without_suits, render_prompt),
    ("tic_tac_toe", {}, _board, render_prompt),
    ("tic_tac_toe", {}, _board, renderer_named("tic_tac_toe_lines", "tic_tac_toe")),
    ("connect_four", {}, _board, render_prompt),
    ("connect_four", {}, _board, renderer_named("connect_four_lines", "connect_four")),
    ("hanabi", SMALL_HANABI, _board, render_prompt),
    ("hanabi", SMALL_HANABI, _board, renderer_named("hanabi_words", "hanabi")),
    ("hanabi", {**SMALL_HANABI, "players": 3, "colors": 3, "ranks": 3}, _board,
     renderer_named("hanabi_words", "hanabi")),
    # rendered generically
    ("liars_dice", {}, _information_state, render_prompt),
    ("leduc_poker", {}, _information_state, render_generic),
    ("kuhn_poker", {}, _information_state, render_generic),
]


def prompts_by_state(game: str, params: dict, key: Key, render, games: int,
                     seed: int = 0) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(information state -> prompts rendered for it, prompt -> information states) over
    ``games`` random playouts; the acting seat is part of both."""
    env = OpenSpielEnv(game, params)
    rng = np.random.default_rng(seed)
    prompts_of, states_of = defaultdict(set), defaultdict(set)
    for episode in range(games):
        env.reset(seed * 100_003 + episode)
        while not env.done:
            seat = env.current_seat()
            state, prompt = f"{seat}|{key(env, seat)}", f"{seat}|{render(env, seat).text}"
            prompts_of[state].add(prompt)
            states_of[prompt].add(state)
            moves = env.legal_actions(seat)
            env.step(moves[rng.integers(len(moves))])
    return prompts_of, states_of


@pytest.mark.parametrize("game, params, key, render", CASES,
                         ids=[f"{c[0]}-{c[3].__name__}-{len(c[1])}-{c[1].get('players', 2)}"
                              for c in CASES])
def test_prompt_is_a_function_of_the_information_state_and_tells_states_apart(
        game, params, key, render):
    prompts_of, states_of = prompts_by_state(game, params, key, render, games=400)
    assert len(prompts_of) >= 12  # 2-player Kuhn has 12: enough decisions to mean something
    merged = {prompt: sorted(states)[:3] for prompt, states in states_of.items()
              if len(states) > 1}
    assert not merged, f"{len(merged)} prompts show several information states, e.g. " \
                       f"{next(iter(merged.values()))}"
    split = {state: len(prompts) for state, prompts in prompts_of.items() if len(prompts) > 1}
    assert not split, f"information states rendered several ways: {list(split)[:3]}"


def test_the_check_catches_a_renderer_that_drops_the_first_rounds_betting():
    """Leduc as it was rendered before (only the current round's bets): round-1 'call, raise,
    call' and 'raise, call' both became 'Round 2 ... Bets this round: none'."""

    def current_round_only(env: OpenSpielEnv, seat: int):
        prompt = render_prompt(env, seat)
        text = re.sub(r"Bets in round 1: [^.]*\. Bets in round 2: ([^.]*)\.",
                      r"Bets this round: \1.", prompt.text)
        return type(prompt)(text, prompt.numbered_moves)

    _, states_of = prompts_by_state("leduc_poker", {}, _leduc_without_suits,
                                    current_round_only, games=400)
    assert any(len(states) > 1 for states in states_of.values())
