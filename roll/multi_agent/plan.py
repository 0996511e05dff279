"""How one train step's rows are cut: each agent's mini-batches (its optimizer steps) and the
micro-batches that share a forward/backward (MultiAgentTrainer). Pure functions of row counts,
sizes and a seed: the same plan alone or in any team, and after a resume."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from roll.multi_agent.config import AgentConfig, TrainerConfig


def optimizer_steps(num_rows: int, size: int | None, epochs: int) -> int:
    """How many mini-batches ``mini_batches`` cuts ``num_rows`` rows into (0 rows: 0)."""
    if num_rows <= 0:
        return 0
    size = size or num_rows
    return epochs if size >= num_rows else epochs * -(-num_rows // size)


def mini_batches(num_rows: int, size: int | None, epochs: int, seed: int) -> list[Tensor]:
    """Positions (among an agent's ``num_rows`` rows) of each of its optimizer steps, epoch by
    epoch, shuffled per epoch by a generator seeded with ``seed``; ``size`` None or >= the
    rows: every row in each epoch's one mini-batch, in order."""
    size = size or num_rows
    if size >= num_rows:
        return [torch.arange(num_rows)] * epochs
    generator = torch.Generator().manual_seed(seed)
    # ceil(rows / size) mini-batches of nearly equal size (10 rows, size 4: 4, 3, 3): a last
    # mini-batch of a few rows would take as large an Adam step on far more noise
    count = optimizer_steps(num_rows, size, 1)
    minis: list[Tensor] = []
    for _ in range(epochs):
        minis.extend(torch.randperm(num_rows, generator=generator).tensor_split(count))
    return minis


def old_pass_agents(config: TrainerConfig, rows_per_agent: dict[str, int],
                    dropout: dict[str, float]) -> set[str]:
    """The agents (of those with rows) whose loss needs the no-grad old-log-prob pass in a
    train step on these rows (each agent's count). ``trainer.old_logprob_pass='always'``: every
    one; 'auto': those that take more than one optimizer step or have LoRA ``dropout`` (the
    pass runs without it, the training forward with it). For the others the weights their
    loss reads ARE the old policy's, so the training forward's own log-probs, detached, are the
    old ones (ratio exactly 1). Each agent's own: the same alone or in any team."""
    return {name for name, rows in rows_per_agent.items() if rows and (
        config.old_logprob_pass == "always" or dropout.get(name, 0.0)
        or optimizer_steps(rows, config.ppo_mini_batch_size, config.ppo_epochs) > 1)}


def agent_dropout(agents: Iterable[AgentConfig]) -> dict[str, float]:
    """Each resolved agent's LoRA dropout (what ``old_pass_agents`` reads)."""
    return {agent.name: agent.lora.dropout if agent.lora else 0.0 for agent in agents}


def micro_groups(minis: dict[str, Tensor], size: int,
                 fused: bool) -> list[list[tuple[str, Tensor]]]:
    """Which rows share a forward/backward. Each agent's micro-batches (``minis[agent]`` split
    into ``size`` rows) are what they would be alone (so are its dropout masks and its gradient
    sums); not ``fused``, one agent's micro-batch per forward; fused, micro-batches of several
    agents (at most one of each, in each agent's own order) are packed into one forward of at
    most ``size`` rows, so memory per forward does not grow with the number of agents."""
    split = {name: rows.split(size) for name, rows in minis.items()}
    if not fused:
        return [[(name, micro)] for name, micros in split.items() for micro in micros]
    count = max(len(micros) for micros in split.values())
    queue = [(name, micros[k]) for k in range(count) for name, micros in split.items()
             if k < len(micros)]
    groups: list[list[tuple[str, Tensor]]] = []
    current: list[tuple[str, Tensor]] = []
    for name, micro in queue:
        rows = sum(len(m) for _, m in current)
        if current and (rows + len(micro) > size or any(n == name for n, _ in current)):
            groups.append(current)
            current = []
        current.append((name, micro))
    if current:
        groups.append(current)
    return groups


__all__ = ["agent_dropout", "micro_groups", "mini_batches", "old_pass_agents",
           "optimizer_steps"]
