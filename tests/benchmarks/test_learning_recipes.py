"""benchmarks/learning.py: every recipe's overrides load into a valid config (a typo in a key or
a seating list fails here, not on the GPU machine), and the TicTacToe critic candidate is what
its comment says."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning  # noqa: E402


def _args(tiny: bool) -> argparse.Namespace:
    return argparse.Namespace(tiny=tiny, model="smollm2-135m", steps=7, eval_every=7,
                              override=["seed=3"])


@pytest.mark.slow  # the full CI runs it (quick subset < 3 min)
@pytest.mark.parametrize("name", sorted(learning.RECIPES))
def test_every_recipe_makes_a_valid_config(name, tmp_path):
    cfg = learning.recipe_config(_args(tiny=False), name, tmp_path)
    assert cfg.max_steps == 7 and cfg.seed == 3 and cfg.output_dir == str(tmp_path)
    assert learning.recipe_config(_args(tiny=True), name, tmp_path).model.path == "tiny"


def test_the_tictactoe_critic_candidate_trains_each_o_seat_twice_against_random(tmp_path):
    cfg = learning.recipe_config(_args(tiny=False), "tictactoe_critics", tmp_path)
    assert cfg.advantage.estimator == "ippo" and cfg.critic.mode == "per_agent"
    assert cfg.rollout.num_groups * cfg.rollout.group_size == 256
    seatings = [tuple(seating) for seating in cfg.env.seat_to_agent]
    for agent in ("agent_0", "agent_1"):
        assert seatings.count(("random", agent)) == 2
        assert seatings.count((agent, "random")) == 1
