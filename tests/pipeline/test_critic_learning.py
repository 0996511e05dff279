"""Critic-based learners end to end (critic.mode; roll/multi_agent/critics.py): IPPO, MAPPO, HAPPO.

Two agents see the SAME prompt; agent 0 is paid 0.5 for 'left', agent 1 is paid 1.5 for
'right'. With IPPO each agent has its own critic: on the same state (the prompt) critic_agent_0
must come to predict about 0.5 x P(left) and critic_agent_1 about 1.5 x P(right), so crossing
the critics' rows or targets swaps the two values, and crossing the agents' rows makes them
learn the wrong sides. With MAPPO (and HAPPO) one critic fits both agents' returns: on that
same state it predicts their mean, between the two.
"""

from __future__ import annotations

import pytest
import torch

from roll.agentic.env.base import StepResult, global_view
from roll.agentic.env.renderers import RenderedPrompt
from roll.algorithms.advantages import AdvantageConfig
from roll.models import apply_chat_template
from roll.multi_agent.config import (
    CriticConfig,
    LoRAConfig,
    MultiAgentConfig,
    OptimConfig,
    TrainerConfig,
)
from roll.multi_agent.critics import critic_values
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.config import (
    EnvSchema,
    EvalSchema,
    PipelineConfig,
    RolloutSchema,
    SamplingSchema,
)
from roll.pipeline.validation import validate_config
from roll.utils.tracking import TrackingConfig

from .test_learning import PROMPT, PickSideEnv, _p_left

pytestmark = pytest.mark.slow

PAY = {0: 0.5, 1: 1.5}


class ScaledPickSideEnv(PickSideEnv):
    """PickSideEnv with seat s's reward scaled by PAY[s]."""

    def step(self, action: str) -> StepResult:
        result = super().step(action)
        return StepResult([r * PAY[s] for s, r in enumerate(result.rewards)], result.done)


def _run(tmp_path, mode: str, estimator: str, env_factory=ScaledPickSideEnv,
         critic_input: str = "local", max_steps: int = 80,
         num_groups: int = 4, critic_lr: float = 1e-2, norm: str = "none") -> AgenticPipeline:
    cfg = PipelineConfig(
        team=MultiAgentConfig(num_agents=2, lora=LoRAConfig(rank=8, alpha=16),
                              optim=OptimConfig(lr=2e-2)),
        trainer=TrainerConfig(micro_batch_size=32),
        advantage=AdvantageConfig(estimator=estimator, norm=norm),
        critic=CriticConfig(mode=mode, lora=LoRAConfig(rank=8, alpha=16),
                            optim=OptimConfig(lr=critic_lr), micro_batch_size=16,
                            input=critic_input),
        env=EnvSchema(game="tic_tac_toe", seat_to_agent=["agent_0", "agent_1"]),
        rollout=RolloutSchema(num_groups=num_groups, group_size=4, constrained_decoding=True,
                              sampling=SamplingSchema(max_new_tokens=12)),
        eval=EvalSchema(eval_steps=0),
        tracking=TrackingConfig(backends=["jsonl"]),
        output_dir=str(tmp_path / "run"),
        max_steps=max_steps,
        save_steps=0,
    )
    validate_config(cfg)
    pipeline = AgenticPipeline(cfg, env_factory=env_factory,
                               render=lambda env, seat: RenderedPrompt(PROMPT, False))
    pipeline.run()
    return pipeline


def _value_of_prompt(pipeline: AgenticPipeline, critic: int, text: str = PROMPT) -> float:
    """Critic ``critic``'s value of the state 'prompt ``text``, nothing answered yet'."""
    tokenizer = pipeline.tokenizer
    prompt = apply_chat_template(tokenizer, [{"role": "user", "content": text}])
    row = prompt + tokenizer.encode("<answer>left</answer>", add_special_tokens=False)
    ids = torch.tensor([row])
    positions = torch.zeros_like(ids)
    positions[:, len(prompt):] = 1
    with torch.no_grad():
        values = critic_values(pipeline.model, pipeline.critics.heads, ids, torch.ones_like(ids),
                               torch.tensor([critic]), positions=positions)
    return float(values[0, len(prompt)])  # V before the first answer token


def test_ippo_each_critic_fits_its_own_agents_returns(tmp_path):
    pipeline = _run(tmp_path, "per_agent", "ippo")
    assert pipeline.model.critic_names == ["critic_agent_0", "critic_agent_1"]
    p_left = {agent: _p_left(pipeline, agent) for agent in pipeline.agent_names}
    assert p_left["agent_0"] > 0.75 and 1 - p_left["agent_1"] > 0.75, p_left
    values = [_value_of_prompt(pipeline, critic) for critic in (0, 1)]
    # about 0.5 x 0.86 and 1.5 x 0.83 (measured 0.41 and 1.39); crossed: swapped
    assert 0.2 < values[0] < 0.7 and 1.0 < values[1] < 1.7, values


@pytest.mark.parametrize("estimator", ["mappo", "happo"])
def test_one_shared_critic_fits_every_agents_returns(tmp_path, estimator):
    """MAPPO, and HAPPO (the same critic, agents updated one after another)."""
    # 32 episodes a step: at 16 the 0.5-paid agent_0 ended at 0.59-0.71 with this machine's
    # tiny model (2026-11-25, packages of that day), too close to the learning threshold.
    # Advantages centred per agent (norm=mean, as MAPPO's implementations whiten them): the
    # shared critic predicts the MEAN of both agents' returns, so without it every advantage
    # of the 0.5-paid agent_0 is negative and it stalled at 0.70-0.72 after 110-160 steps on
    # an AVX2-only CPU (session 75, seed 0); centred: 0.998, 0.993, 0.986 for seeds 0-2.
    pipeline = _run(tmp_path, "shared", estimator, max_steps=110, num_groups=8, norm="mean")
    assert pipeline.model.critic_names == ["critic"]
    p_left = {agent: _p_left(pipeline, agent) for agent in pipeline.agent_names}
    assert p_left["agent_0"] > 0.75 and 1 - p_left["agent_1"] > 0.75, p_left
    # the mean of both agents' expected returns (measured 0.85): between theirs
    assert 0.6 < _value_of_prompt(pipeline, 0) < 1.2


def test_vdn_critics_sum_to_the_joint_return(tmp_path):
    """VDN: one critic per agent, fitted so that their SUM predicts the joint return J (the mean
    of the two seats' returns, 0.5 x P(left) / 2 + 1.5 x P(right) / 2 for the two agents)."""
    pipeline = _run(tmp_path, "per_agent", "vdn", num_groups=8)  # as the test above
    p_left = {agent: _p_left(pipeline, agent) for agent in pipeline.agent_names}
    assert p_left["agent_0"] > 0.75 and 1 - p_left["agent_1"] > 0.75, p_left
    values = [_value_of_prompt(pipeline, critic) for critic in (0, 1)]
    joint = (0.5 * p_left["agent_0"] + 1.5 * (1 - p_left["agent_1"])) / 2
    # IPPO's critics would sum to about twice J (each fits its own seat's whole return)
    assert abs(sum(values) - joint) < 0.25, (values, joint)


COIN = 3.0


class CoinEnv(PickSideEnv):
    """PickSideEnv plus a coin (heads on odd seeds) that only seat 1's observation shows; each
    seat's turn earns COIN more on heads. The agents' prompts never show it (both read
    PROMPT)."""

    def reset(self, seed: int) -> None:
        super().reset(seed)
        self.heads = seed % 2 == 1

    def observation(self, seat: int) -> str:
        # said four times: one word in a long prompt barely moves a random two-layer model's
        # last hidden state, and this test is of the wiring (the critic reads it), not of how
        # faint a signal a critic can find (once: 3 of 8 seed x thread runs, and seed 0 on an
        # AVX2-only CPU, never told the two apart)
        side = "heads" if self.heads else "tails"
        return " ".join([f"The coin shows {side}."] * 4) if seat else PROMPT

    def step(self, action: str) -> StepResult:
        seat = self.seat
        result = super().step(action)
        return StepResult([r + COIN * self.heads * (s == seat) for s, r in
                           enumerate(result.rewards)], result.done)


def test_a_global_critic_sees_what_no_agent_sees(tmp_path):
    """critic.input=global: the shared critic reads every seat's observation, so it tells heads
    from tails (COIN apart); reading the agents' own prompts (or with the view unwired) it cannot:
    both states are the same tokens."""
    pipeline = _run(tmp_path, "shared", "mappo", env_factory=CoinEnv, critic_input="global",
                    max_steps=40, critic_lr=3e-3)
    views = {}
    for heads in (True, False):
        env = CoinEnv()
        env.reset(int(heads))
        views[heads] = _value_of_prompt(pipeline, 0, global_view(env, 0, PROMPT))
    # about P(paid side) + 3 vs P(paid side), with critic.input=local one value for both.
    # Seed-sensitive with the coin said once at critic lr 1e-2 (session 71: in 3 of 8 seed x
    # thread runs the critic settled on one value for both states; session 75, an AVX2-only
    # CPU: seed 0 too). Said four times at lr 3e-3 (session 75, that CPU, two threads): gaps
    # 2.47, 3.05, 3.03, 3.55, 2.38, 3.58 for seeds 0-5.
    assert views[True] - views[False] > 1.0, views
