"""Builders shared by the multi-agent tests: a team on the tiny model and synthetic rows."""

from __future__ import annotations

import torch

from roll.batch import TrajectoryBatch
from roll.models import load_model
from roll.multi_agent.config import AgentConfig, LoRAConfig, MultiAgentConfig, OptimConfig
from roll.multi_agent.model import MultiAgentLoRAModel


def make_team(path, agents: list[AgentConfig], seed: int = 0, optim: OptimConfig | None = None):
    config = MultiAgentConfig(
        num_agents=len(agents),
        agents=agents,
        lora=LoRAConfig(rank=4, alpha=8),
        optim=optim or OptimConfig(lr=1e-2),
    ).validate()
    resolved = config.resolved_agents()
    return MultiAgentLoRAModel(load_model(path), resolved, seed=seed), resolved


def make_rows(agent_id: list[int], seed: int = 0, vocab: int = 500, length: int = 14):
    """Rows of random prompt+response tokens, right-padded, with random advantages."""
    gen = torch.Generator().manual_seed(seed)
    rows = len(agent_id)
    input_ids = torch.randint(10, vocab, (rows, length), generator=gen)
    attention_mask = torch.zeros(rows, length, dtype=torch.long)
    response_mask = torch.zeros(rows, length)
    for i in range(rows):
        prompt = int(torch.randint(3, 6, (1,), generator=gen))
        total = int(torch.randint(prompt + 2, length + 1, (1,), generator=gen))
        attention_mask[i, :total] = 1
        response_mask[i, prompt:total] = 1
        input_ids[i, total:] = 0  # padding
    advantages = torch.randn(rows, length, generator=gen) * response_mask
    return TrajectoryBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        agent_id=torch.tensor(agent_id),
        advantages=advantages,
        rewards=torch.randn(rows, generator=gen),
    )


def perturb_critics(model: MultiAgentLoRAModel, heads, seed: int) -> None:
    """Random critic adapters and value heads (LoRA B and the heads start at zero: every
    critic would be the same)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in model.critic_names:
            for _, tensor in model.named_agent_tensors(name):
                tensor.add_(0.2 * torch.randn(tensor.shape, generator=generator).to(tensor.dtype))
        for param in heads.parameters():
            param.add_(torch.randn(param.shape, generator=generator))
