"""``team.optim.target_kl``: a rate steered by each train step's approx_kl (optim.RateFactor).

The controller's moves are checked step by step against numbers worked out by hand, its state
through a checkpoint's save and load, and the trainer's use of it on the tiny model."""

from __future__ import annotations

import io

import pytest
import torch

from roll.errors import ConfigError
from roll.multi_agent.config import (
    AgentConfig,
    CriticConfig,
    MultiAgentConfig,
    OptimConfig,
    TrainerConfig,
)
from roll.multi_agent.optim import RateFactor, check_target_kl, schedule
from roll.multi_agent.trainer import MultiAgentTrainer

from .helpers import make_rows, make_team


def test_the_controller_by_hand():
    factor = RateFactor(OptimConfig(lr=1e-3, target_kl=0.01))  # constant schedule: target 0.01
    assert factor(0) == 1.0
    factor.observe(0.03, 0)  # above 2 x 0.01: / 1.5
    assert factor.kl_scale == pytest.approx(2 / 3) and factor(1) == pytest.approx(2 / 3)
    factor.observe(0.01, 1)  # inside [0.005, 0.02]: kept
    factor.observe(0.0201, 2)  # just above the band
    assert factor.kl_scale == pytest.approx(4 / 9)
    factor.observe(0.0049, 3)  # below 0.005: x 1.5
    assert factor.kl_scale == pytest.approx(2 / 3)
    for step in range(4, 30):  # 1.5^12 > 100 x 1.5: held at the upper bound
        factor.observe(0.0, step)
    assert factor.kl_scale == 100.0
    for step in range(30, 60):  # 1.5^-22 < 1/100: held at the lower bound
        factor.observe(1.0, step)
    assert factor.kl_scale == 0.01


def test_the_schedule_shapes_the_target_not_the_rate():
    factor = RateFactor(OptimConfig(lr=1.0, lr_scheduler="linear", total_steps=4, target_kl=0.01))
    assert [factor(step) for step in range(4)] == [1.0] * 4  # the rate: kl_scale alone
    factor.observe(0.011, 0)  # the target at step 0: 0.01 (band [0.005, 0.02]): kept
    assert factor.kl_scale == 1.0
    factor.observe(0.011, 2)  # at step 2 the linear factor is 0.5: target 0.005, band to 0.01
    assert factor.kl_scale == pytest.approx(2 / 3)
    # without target_kl: the schedule's factor, and observing changes nothing
    plain = RateFactor(OptimConfig(lr=1.0, lr_scheduler="linear", total_steps=4))
    plain.observe(5.0, 0)
    assert [plain(step) for step in range(5)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


def _saved_and_loaded(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)  # as roll.utils.checkpoint loads


def test_the_multiplier_survives_a_checkpoint_and_nothing_else_is_saved():
    optim = OptimConfig(lr=2e-4, target_kl=1e-3)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=optim.lr)
    scheduler = schedule(optimizer, optim)
    for step, kl in enumerate([0.01, 0.01, 0.0]):  # / 1.5, / 1.5, x 1.5: 2/3
        optimizer.step()  # (no gradient: nothing moves)
        scheduler.lr_lambdas[0].observe(kl, step)
        scheduler.step()
    assert scheduler.get_last_lr()[0] == pytest.approx(2e-4 * 2 / 3)
    state = _saved_and_loaded(scheduler.state_dict())
    assert state["lr_lambdas"] == [{"kl_scale": pytest.approx(2 / 3)}]  # not the config
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=optim.lr)
    resumed = schedule(optimizer, optim)
    resumed.load_state_dict(state)
    assert resumed.lr_lambdas[0].kl_scale == scheduler.lr_lambdas[0].kl_scale  # bit-exact
    optimizer.step()
    resumed.lr_lambdas[0].observe(0.01, 3)
    resumed.step()
    assert resumed.get_last_lr()[0] == pytest.approx(2e-4 * 4 / 9)
    # a checkpoint from before the controller (lr_lambdas [None]) resumes at 1
    old = dict(state, lr_lambdas=[None])
    fresh = schedule(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1.0), optim)
    fresh.load_state_dict(old)
    assert fresh.lr_lambdas[0].kl_scale == 1.0


@pytest.mark.parametrize("target, scale", [(1e-12, 2 / 3), (0.5, 1.5)])
def test_the_trainer_steers_each_agents_rate_by_its_approx_kl(tiny_model_path, target, scale):
    agents = [AgentConfig("alice", optim=OptimConfig(lr=1e-2, target_kl=target)),
              AgentConfig("bob")]  # bob: the team's rate, no controller
    model, resolved = make_team(tiny_model_path, agents)
    trainer = MultiAgentTrainer(model, resolved, TrainerConfig(micro_batch_size=4,
                                                               ppo_mini_batch_size=2))
    metrics = trainer.train_step(make_rows([0, 0, 0, 0, 1, 1, 1, 1], seed=3))
    alice = metrics["alice"]
    assert alice["optimizer_steps"] == 2.0
    assert 0 < alice["approx_kl"] < 0.25  # the second mini-batch saw the first's step
    # a tiny target: above twice it, / 1.5; a huge one: below half of it, x 1.5
    assert alice["lr"] == pytest.approx(1e-2 * scale)
    assert metrics["bob"]["lr"] == pytest.approx(1e-2)  # its schedule alone (constant)


def test_one_optimizer_step_leaves_the_rate_alone(tiny_model_path):
    agents = [AgentConfig("alice", optim=OptimConfig(lr=1e-2, target_kl=1e-12))]
    model, resolved = make_team(tiny_model_path, agents)
    trainer = MultiAgentTrainer(model, resolved, TrainerConfig(micro_batch_size=4))
    metrics = trainer.train_step(make_rows([0, 0, 0], seed=1))
    assert metrics["alice"]["optimizer_steps"] == 1.0 and metrics["alice"]["approx_kl"] == 0.0
    assert metrics["alice"]["lr"] == pytest.approx(1e-2)  # no measurement, no move


@pytest.mark.parametrize("value", [-1e-3, 1.0, "0.01"])
def test_a_bad_target_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match=r"team\.optim\.target_kl"):
        OptimConfig(target_kl=value).validate("team.optim")


def test_a_target_that_cannot_be_measured_or_has_no_policy_is_refused():
    team = MultiAgentConfig(num_agents=2, optim=OptimConfig(target_kl=1e-3))
    with pytest.raises(ConfigError, match=r"team\.optim\.target_kl.*ppo_mini_batch_size"):
        check_target_kl(team, TrainerConfig())  # one optimizer step a train step
    check_target_kl(team, TrainerConfig(ppo_mini_batch_size=64))
    check_target_kl(team, TrainerConfig(ppo_epochs=2))
    one = MultiAgentConfig(num_agents=2, agents=[
        AgentConfig("a"), AgentConfig("b", optim=OptimConfig(target_kl=1e-3))])
    with pytest.raises(ConfigError, match=r"team\.agents\[1\]\.optim\.target_kl"):
        check_target_kl(one, TrainerConfig())
    critic = CriticConfig(mode="per_agent", optim=OptimConfig(target_kl=1e-3))
    with pytest.raises(ConfigError, match=r"critic\.optim\.target_kl"):
        critic.validate()
