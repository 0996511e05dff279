"""Synthetic training rows shared by the training benchmarks."""

from __future__ import annotations

import torch


def synthetic_batch(rows: int, tokens: int, prompt: int, vocab_size: int,
                    agent_id: torch.Tensor):
    """``rows`` full-length rows of random tokens whose responses start near ``prompt``
    (±20 tokens, seeded), with random advantages on the response tokens."""
    from roll.batch import TrajectoryBatch

    gen = torch.Generator().manual_seed(0)
    response_mask = torch.zeros(rows, tokens)
    for row in range(rows):
        response_mask[row, prompt + int(torch.randint(-20, 21, (1,), generator=gen)):] = 1
    return TrajectoryBatch(
        input_ids=torch.randint(0, vocab_size, (rows, tokens), generator=gen),
        attention_mask=torch.ones(rows, tokens, dtype=torch.long),
        response_mask=response_mask,
        agent_id=agent_id,
        advantages=torch.randn(rows, tokens, generator=gen) * response_mask,
    )
