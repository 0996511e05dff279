"""benchmarks/hanabi_stand_in.py: its advantage estimators against numbers worked out by hand,
and a short run's curve."""

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from roll.multi_agent.optim import RateFactor

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import hanabi_stand_in as stand_in  # noqa: E402


def test_gae_with_gamma_one_by_hand():
    # delta = r_t + V_{t+1} - V_t: -0.25, 1.25, -1.5 (nothing after the last move);
    # A_2 = -1.5, A_1 = 1.25 + 0.5 * -1.5 = 0.5, A_0 = -0.25 + 0.5 * 0.5 = 0.
    assert stand_in.gae([0.0, 1.0, -1.0], [0.5, 0.25, 0.5], lam=0.5) == pytest.approx(
        [0.0, 0.5, -1.5])
    # lam 1: the return to go minus the value.
    assert stand_in.gae([0.0, 1.0, -1.0], [0.5, 0.25, 0.5], lam=1.0) == pytest.approx(
        [-0.5, -0.25, -1.5])


def test_reward_to_go_and_whitening_by_hand():
    # G_2 = -2, G_1 = 1 + 0.5 * -2 = 0, G_0 = 0 + 0.5 * 0 = 0: a card played (+1) then the last
    # life lost (-2) nets 0 at gamma 0.5; at gamma 1 the sum to go
    assert stand_in.reward_to_go([0.0, 1.0, -2.0], 0.5) == pytest.approx([0.0, 0.0, -2.0])
    assert stand_in.reward_to_go([0.0, 1.0, -2.0], 1.0) == pytest.approx([-1.0, -1.0, -2.0])
    assert stand_in.reward_to_go([1.0, 0.0, 0.0], 0.9) == pytest.approx([1.0, 0.0, 0.0])
    # mean 1, centred (-1, -1, 2), population std sqrt(6 / 3)
    assert stand_in.whiten(np.array([0.0, 0.0, 3.0])) == pytest.approx(
        np.array([-1.0, -1.0, 2.0]) / math.sqrt(2.0), abs=1e-5)


def test_group_relative_by_hand():
    # mean 1, centred (0, -1, -1, 2), population std sqrt(6 / 4)
    expected = np.array([0.0, -1.0, -1.0, 2.0]) / math.sqrt(1.5)
    assert stand_in.group_relative(np.array([1.0, 0.0, 0.0, 3.0])) == pytest.approx(
        expected, abs=1e-5)
    assert not stand_in.group_relative(np.array([2.0, 2.0, 2.0, 2.0])).any()


def test_the_rate_schedules_by_hand():
    linear, constant = (argparse.Namespace(steps=4, schedule=kind, lr=1e-3)
                        for kind in ("linear", "constant"))
    factor = RateFactor(stand_in.rate_config(linear))
    assert [factor(done) for done in range(4)] == [1.0, 0.75, 0.5, 0.25]
    factor = RateFactor(stand_in.rate_config(constant))
    assert [factor(done) for done in range(4)] == [1.0] * 4


@pytest.mark.parametrize("lr, expected", [
    # the first mini-batch at ratio 1: b + lr * A * d log pi(0) / db = lr * (0.5, -0.5);
    (1.0, 0.5),      # the second: pi(0) = sigmoid(1) = 0.7311, r = 1.4621 > 1.2 with A > 0,
                     # clipped: no gradient (unclipped it would go on to 0.5 + 0.3932)
    (0.1, 0.099875)])  # r = sigmoid(0.1) / 0.5 = 1.04996 inside the clip: + 0.1 r (1 - 0.52498)
def test_the_clipped_minibatch_update_by_hand(lr, expected):
    class Bias(torch.nn.Module):  # the same logits (b0, b1) for every row
        def __init__(self):
            super().__init__()
            self.b = torch.nn.Parameter(torch.zeros(2))

        def forward(self, obs):
            return self.b.expand(len(obs), 2)

    policy = Bias()
    args = argparse.Namespace(minibatches=2, clip=0.2)
    rows = 2  # two alike rows (action 0, advantage +1): the shuffle cannot matter
    stand_in.update(policy, torch.optim.SGD(policy.parameters(), lr=lr), torch.zeros(rows, 3),
                    torch.ones(rows, 2, dtype=torch.bool), torch.zeros(rows, dtype=torch.long),
                    torch.ones(rows), 0.0, args, torch.Generator().manual_seed(0))
    assert policy.b.tolist() == pytest.approx([expected, -expected], abs=1e-6)
    # one mini-batch: one plain step, -A log pi (ratio 1), whatever the rate
    single = Bias()
    stand_in.update(single, torch.optim.SGD(single.parameters(), lr=lr), torch.zeros(rows, 3),
                    torch.ones(rows, 2, dtype=torch.bool), torch.zeros(rows, dtype=torch.long),
                    torch.ones(rows), 0.0, argparse.Namespace(minibatches=1, clip=0.2),
                    torch.Generator().manual_seed(0))
    assert single.b.tolist() == pytest.approx([lr * 0.5, -lr * 0.5], abs=1e-7)


@pytest.mark.parametrize("setting, playable, params, minibatches", [
    ("grpo:0.05", False, {}, 1), ("rtg:0", False, {}, 1), ("mappo:0", False, {}, 1),
    ("mappo:0", True, {}, 1), ("grpo:0", False, {"max_life_tokens": 3}, 1),
    ("grpo:0", False, {}, 4)])
def test_a_short_run_evaluates_before_and_after(setting, playable, params, minibatches):
    args = argparse.Namespace(games=8, steps=2, lr=1e-3, critic_lr=1e-3, lam=0.95, gamma=0.9,
                              width=16, schedule="linear", minibatches=minibatches, clip=0.2,
                              eval_every=2, eval_games=8, playable=playable, params=params,
                              target_kl=0.0)
    result = stand_in.run(setting, 0, args)
    assert result["params"] == params
    assert [point["step"] for point in result["curve"]] == [0, 2]
    for point in result["curve"]:
        assert 0.0 <= point["sampled"] <= 6.0 and 0.0 <= point["greedy"] <= 6.0
    assert result["curve"] == stand_in.run(setting, 0, args)["curve"]  # seeded
