"""Answer parsing, fallback and format-error counters."""

from __future__ import annotations

import numpy as np
import pytest

from roll.agentic.env.actions import (
    ActionConfig,
    FormatCounters,
    FormatError,
    apply_parsed_action,
    parse_action,
    strip_thinking,
)
from roll.agentic.env.openspiel_env import OpenSpielEnv
from roll.errors import ConfigError

TTT = ["x(0,0)", "x(0,1)", "x(1,1)"]
HANABI = ["(Play 0)", "(Play 1)", "(Reveal player +1 color R)"]
CONFIG = ActionConfig()


@pytest.mark.parametrize(("text", "legal", "numbered", "action", "matched_by"), [
    ("<answer>x(1,1)</answer>", TTT, False, "x(1,1)", "exact"),
    ("<answer>  x(1,1)\n</answer>", TTT, False, "x(1,1)", "exact"),
    ("<ANSWER>X( 1, 1 )</Answer>", TTT, False, "x(1,1)", "normalized"),
    ("<answer>`x(0,1)`.</answer>", TTT, False, "x(0,1)", "normalized"),
    ("<answer>**play 1**</answer>", HANABI, False, "(Play 1)", "normalized"),
    ("<answer>3</answer>", TTT, True, "x(1,1)", "index"),
    ("<answer>#2</answer>", TTT, True, "x(0,1)", "index"),
    ("<answer>3. x(1,1)</answer>", TTT, True, "x(1,1)", "index"),
    ("<answer>3</answer>", ["1", "2", "3"], True, "3", "exact"),  # text beats number
    ("<think>maybe <answer>x(0,0)</answer></think><answer>x(0,1)</answer>", TTT, False,
     "x(0,1)", "exact"),
    ("reasoning...</think><answer>x(0,0)</answer>", TTT, False, "x(0,0)", "exact"),
    ("<answer>x(0,0)</answer> no wait <answer>x(1,1)</answer>", TTT, False, "x(1,1)", "exact"),
    ("<answer><answer>x(0,1)</answer></answer>", TTT, False, "x(0,1)", "exact"),
    ("<think><think>a</think>b</think><answer>x(0,0)</answer>", TTT, False, "x(0,0)", "exact"),
    ("<answer> Here is my essay. </answer>", [], False, "Here is my essay.", "free_form"),
])
def test_accepted_answers(text: str, legal: list[str], numbered: bool, action: str,
                          matched_by: str) -> None:
    parsed = parse_action(text, legal, CONFIG, numbered_moves=numbered)
    assert (parsed.action, parsed.matched_by, parsed.format_error) == (action, matched_by, None)


@pytest.mark.parametrize(("text", "legal", "numbered", "error"), [
    ("x(1,1)", TTT, False, FormatError.NO_ANSWER),
    ("<think><answer>x(1,1)</answer>", TTT, False, FormatError.NO_ANSWER),  # unclosed think
    ("<answer>x(1,1)", TTT, False, FormatError.NO_ANSWER),
    ("<answer>   </answer>", TTT, False, FormatError.EMPTY_ANSWER),
    ("<answer></answer>", [], False, FormatError.EMPTY_ANSWER),
    ("<answer>x(2,2)</answer>", TTT, False, FormatError.ILLEGAL_ACTION),
    ("<answer>3</answer>", TTT, False, FormatError.ILLEGAL_ACTION),  # moves were not numbered
    ("<answer>4</answer>", TTT, True, FormatError.ILLEGAL_ACTION),  # out of range
    ("<answer>0</answer>", TTT, True, FormatError.ILLEGAL_ACTION),  # numbers start at 1
    ("<answer>1. x(1,1)</answer>", TTT, True, FormatError.ILLEGAL_ACTION),  # number ≠ text
    ("<answer>pass</answer>", ["Pass", "PASS"], False, FormatError.AMBIGUOUS_ACTION),
])
def test_rejected_answers(text: str, legal: list[str], numbered: bool,
                          error: FormatError) -> None:
    parsed = parse_action(text, legal, CONFIG, numbered_moves=numbered)
    assert parsed.action is None and parsed.format_error == error


def test_strip_thinking() -> None:
    assert strip_thinking("<think>a</think>b<THINK >c</think>d") == "bd"
    assert strip_thinking("a</think>b") == "b"
    assert strip_thinking("a<think>b") == "a"
    assert strip_thinking("plain") == "plain"


def test_custom_answer_pattern() -> None:
    config = ActionConfig(answer_pattern=r"Move:\s*(\S+)")
    assert parse_action("Move: x(0,0) then Move: x(1,1)", TTT, config).action == "x(1,1)"
    whole_match = ActionConfig(answer_pattern=r"x\(\d,\d\)")
    assert parse_action("I pick x(0,1)!", TTT, whole_match).action == "x(0,1)"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"answer_pattern": "(unclosed"}, "answer_pattern"),
    ({"answer_pattern": "(a)(b)"}, "answer_pattern"),
    ({"fallback": "resign"}, "fallback"),
    ({"format_penalty": -1.0}, "format_penalty"),
    ({"format_penalty": float("nan")}, "format_penalty"),
])
def test_bad_action_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"env.action.{field}="):
        ActionConfig(**kwargs)


def garbage_outputs(count: int, seed: int) -> list[str]:
    """Model outputs a broken policy might produce, ``count`` of them, seeded."""
    rng = np.random.default_rng(seed)
    fragments = ["<answer>", "</answer>", "<think>", "</think>", "<answer><answer>", "x(1,1)",
                 "3", "Pass", "\x00", "\ud800", "🂡", "</answer></think>", " ", "\n", "(#2)"]
    outputs = ["", "<answer>", "</answer></answer>", "<think>" * 10_000,
               "<answer>" * 20_000 + "x(1,1)", "a" * 1_000_000 + "<answer>x(0,0)</answer>",
               "<think>" + "b" * 500_000 + "<answer>x(0,0)</answer>"]
    while len(outputs) < count:
        kind = len(outputs) % 4
        if kind == 0:  # random bytes, decoded any which way
            raw = rng.integers(0, 256, rng.integers(0, 400)).astype(np.uint8).tobytes()
            outputs.append(raw.decode("utf-8", errors="surrogateescape"))
        elif kind == 1:  # random unicode code points (lone surrogates included)
            points = rng.integers(0, 0x10FFFF, rng.integers(0, 200))
            outputs.append("".join(chr(int(p)) for p in points))
        elif kind == 2:  # tag soup
            outputs.append("".join(rng.choice(fragments, rng.integers(0, 30))))
        else:  # well-formed answers naming illegal or random moves
            move = rng.choice(["x(9,9)", "o(0,0)", "resign", "99", "-1", "x(0,0)", "1e3"])
            outputs.append(f"<think>{rng.integers(1000)}</think><answer>{move}</answer>")
    return outputs


@pytest.mark.parametrize("fallback", ["random", "forfeit"])
def test_garbage_never_raises_and_is_counted(fallback: str) -> None:
    config, counters = ActionConfig(fallback=fallback), FormatCounters()
    env, rng = OpenSpielEnv("tic_tac_toe"), np.random.default_rng(0)
    env.reset(0)
    errors = 0
    for index, text in enumerate(garbage_outputs(1000, seed=1)):
        if env.done:
            env.reset(index)
        seat = env.current_seat()
        parsed = parse_action(text, env.legal_actions(seat), config, numbered_moves=index % 2 == 0)
        outcome = apply_parsed_action(env, seat, parsed, config, rng, counters,
                                      agent_id=f"agent{seat}")
        errors += parsed.format_error is not None
        assert (outcome.penalty > 0) == (parsed.format_error is not None)
        assert (outcome.fallback is not None) == (parsed.format_error is not None)
    metrics = counters.metrics()
    assert sum(counters.turns.values()) == 1000
    assert sum(counters.errors.values()) == errors and errors > 800
    assert sum(counters.fallbacks.values()) == errors
    assert {kind for _, kind in counters.errors} >= {"no_answer", "empty_answer", "illegal_action"}
    assert metrics[f"agent0/format/fallback_{fallback}"] > 0
    assert sum(value for key, value in metrics.items()
               if key.startswith(("agent0/", "agent1/")) and "fallback" not in key) == errors
    assert "agent0/format/error_rate" not in metrics  # the rollout reports the one rate
    counters.reset()
    assert counters.metrics() == {}


def test_random_fallback_is_seeded_and_legal() -> None:
    def play(seed: int) -> list[str]:
        env, rng = OpenSpielEnv("tic_tac_toe"), np.random.default_rng(seed)
        env.reset(0)
        moves = []
        while not env.done:
            seat = env.current_seat()
            parsed = parse_action("no idea", env.legal_actions(seat), CONFIG)
            moves.append(apply_parsed_action(env, seat, parsed, CONFIG, rng).action)
        return moves

    assert play(5) == play(5) and play(5) != play(6)


def test_forfeit_fallback_ends_the_game_for_that_seat() -> None:
    config = ActionConfig(fallback="forfeit", format_penalty=0.5)
    env = OpenSpielEnv("tic_tac_toe")
    env.reset(0)
    env.step("x(1,1)")
    parsed = parse_action("<answer>x(0,0)</answer>", env.legal_actions(1), config)
    outcome = apply_parsed_action(env, 1, parsed, config, np.random.default_rng(0))
    assert outcome.format_error == FormatError.ILLEGAL_ACTION and outcome.fallback == "forfeit"
    assert outcome.action is None and outcome.penalty == 0.5
    assert outcome.step.done and env.returns() == [1.0, -1.0]
