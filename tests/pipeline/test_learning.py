"""Two agents, the SAME prompt, opposite rewards: each adapter must learn its own behaviour.

Agent 0 (seat 0) is paid for answering 'left', agent 1 (seat 1) for 'right'. Both see exactly
the same prompt, so only the adapter tells them apart: crossing adapters, agent ids or rewards
anywhere in rollout → advantages → training → sync makes one of them learn the wrong side.
"""

from __future__ import annotations

import pytest
import torch

from roll.agentic.env.base import StepResult
from roll.agentic.env.renderers import RenderedPrompt
from roll.models import apply_chat_template
from roll.multi_agent.config import LoRAConfig, MultiAgentConfig, OptimConfig, TrainerConfig
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

PAID = {0: "left", 1: "right"}
PROMPT = "Pick a side. Legal moves: left, right. Answer inside <answer>...</answer>."


class PickSideEnv:
    """Two seats answer one after the other; seat s earns 1 for the side PAID[s]."""

    name = "pick_side"
    num_seats = 2

    def reset(self, seed: int) -> None:
        self.seat, self.total = 0, [0.0, 0.0]

    @property
    def done(self) -> bool:
        return self.seat > 1

    def current_seat(self):
        return None if self.done else self.seat

    def observation(self, seat: int) -> str:
        return PROMPT

    def legal_actions(self, seat: int) -> list[str]:
        return ["left", "right"]

    def step(self, action: str) -> StepResult:
        rewards = [0.0, 0.0]
        rewards[self.seat] = 1.0 if action == PAID[self.seat] else 0.0
        self.total = [a + b for a, b in zip(self.total, rewards, strict=True)]
        self.seat += 1
        return StepResult(rewards, self.done)

    def forfeit(self, seat: int) -> StepResult:
        self.seat = 2
        return StepResult([0.0, 0.0], True)

    def returns(self) -> list[float]:
        return list(self.total)


def _p_left(pipeline: AgenticPipeline, agent: str) -> float:
    """Probability the agent's adapter gives the 'left' answer rather than 'right'."""
    tokenizer = pipeline.tokenizer
    prompt = apply_chat_template(tokenizer, [{"role": "user", "content": PROMPT}])
    rows = [prompt + tokenizer.encode(f"<answer>{side}</answer>", add_special_tokens=False)
            for side in ("left", "right")]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    index = pipeline.agent_names.index(agent)
    logp = pipeline.model.logprobs(ids, mask, torch.full((2,), index))
    answer = torch.zeros_like(logp)
    answer[:, len(prompt):] = 1
    total = (logp * answer * mask).sum(-1)  # (2,) log p(left), log p(right)
    return float(torch.softmax(total, -1)[0])


@pytest.mark.slow  # a learning run (~5 s): the quick subset stays under 3 minutes
def test_each_agent_learns_its_own_behaviour(tmp_path):
    cfg = PipelineConfig(
        team=MultiAgentConfig(num_agents=2, lora=LoRAConfig(rank=8, alpha=16),
                              optim=OptimConfig(lr=2e-2)),
        trainer=TrainerConfig(micro_batch_size=32),
        env=EnvSchema(game="tic_tac_toe", seat_to_agent=["agent_0", "agent_1"]),
        # 32 episodes a step: at 16, agent_1 ended at 0.85 'right' on an AVX2-only CPU (session
        # 75, seed 0); at 32, 0.99 / 0.97 / 0.99 for seeds 0-2 there
        rollout=RolloutSchema(num_groups=8, group_size=4, constrained_decoding=True,
                              sampling=SamplingSchema(max_new_tokens=12)),
        eval=EvalSchema(eval_steps=0),
        tracking=TrackingConfig(backends=["jsonl"]),
        output_dir=str(tmp_path / "run"),
        max_steps=50,
        save_steps=0,
    )
    validate_config(cfg)
    pipeline = AgenticPipeline(cfg, env_factory=PickSideEnv,
                               render=lambda env, seat: RenderedPrompt(PROMPT, False))
    before = {agent: _p_left(pipeline, agent) for agent in pipeline.agent_names}
    # LoRA B starts at zero: both agents start as the base model, with the same preference.
    assert before["agent_0"] == pytest.approx(before["agent_1"])
    pipeline.run()
    after = {agent: _p_left(pipeline, agent) for agent in pipeline.agent_names}
    assert after["agent_0"] > 0.9, (before, after)        # agent 0 learned 'left'
    assert 1 - after["agent_1"] > 0.9, (before, after)    # agent 1 learned 'right'
