"""1,000 garbage model outputs in each example game and each team task: no crash, every
unusable answer penalised and counted, every episode ends with finite returns (issue 31's
fault campaign; tic-tac-toe, Kuhn and Connect Four also go through the whole rollout loop in
test_rollout.py)."""

from __future__ import annotations

import math

import pytest

from roll.agentic.env.actions import ActionConfig
from roll.agentic.env.openspiel_env import OpenSpielEnv
from roll.agentic.env.renderers import render_prompt
from roll.agentic.env.seating import build_seating
from roll.agentic.rollout.episode import EpisodeSetup, EpisodeSpec, LocalEpisodes
from roll.agentic.tasks.registry import render_task, task_factory

from .test_actions import garbage_outputs

MATH_ITEMS = [{"question": "Ada has 3 apples and gets 4 more. How many?", "answer": "7",
               "choices": ["6", "7", "8"]}]
TARGETS = {
    "leduc_poker": (lambda: OpenSpielEnv("leduc_poker"), render_prompt, 2),
    "hanabi": (lambda: OpenSpielEnv("hanabi"), render_prompt, 2),
    "goofspiel": (lambda: OpenSpielEnv("goofspiel"), render_prompt, 2),
    "liars_dice": (lambda: OpenSpielEnv("liars_dice"), render_prompt, 2),
    "math_team": (task_factory("math_team", {"max_rounds": 2}, MATH_ITEMS), render_task, 3),
    "writing_team": (task_factory("writing_team", {}, [{"prompt": "A story."}]), render_task, 2),
    "debate": (task_factory("debate", {"debaters": 2, "rounds": 2}, MATH_ITEMS), render_task, 2),
    "majority_vote": (task_factory("majority_vote", {"voters": 3}, MATH_ITEMS), render_task, 3),
}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_garbage_never_crashes_and_is_penalised(target):
    factory, render, seats = TARGETS[target]
    names = [f"agent_{i}" for i in range(seats)]
    setup = EpisodeSetup(factory, render, ActionConfig(format_penalty=0.5), 50, False)
    seating = build_seating(names, seats, names)
    host = LocalEpisodes()
    outputs = iter(garbage_outputs(1000, seed=7))
    played = errors = episodes = 0
    while played < 1000:
        item = 0 if render is render_task else None  # games deal no dataset item
        ask = host.open(setup, [EpisodeSpec(0, episodes, seating, 0, item)])[0]
        while ask is not None and played < 1000:
            result, ask = host.play(0, next(outputs))
            played += 1
            errors += result.format_error is not None
        if ask is not None:
            host.cut(0)  # the 1,000 outputs ran out mid-episode
        outcome = host.outcomes()[0]
        assert all(math.isfinite(value) for value in outcome.returns), outcome.returns
        for rewards in outcome.turn_rewards.values():
            assert all(math.isfinite(value) for value in rewards)
        episodes += 1
    if target == "writing_team":  # free text: any non-empty part is a part of the story
        assert 0 < errors < 300, errors
    else:  # almost every output is unusable (a few tag-soup or well-formed ones may parse)
        assert errors > 700, (target, errors)
