"""Per-agent LoRA dropout: each agent's masks come from its own generator (model.py's
docstring says why), so an agent draws the same masks alone or in any team."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class AgentDropout(nn.Module):
    """Inverted dropout on a LoRA input, drawing masks from its agent's own generator.

    Active only while ``active`` is set (by ``MultiAgentLoRAModel.training_forward``);
    ``nn.Module.train()`` does not switch it on.
    """

    def __init__(self, p: float, generators: dict[torch.device, torch.Generator]) -> None:
        super().__init__()
        self.p = float(p)
        self.generators = generators  # shared by all of one agent's dropout layers
        self.active = False

    def forward(self, x: Tensor) -> Tensor:
        if not self.active or self.p == 0.0:
            return x
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=self.generators[x.device])
        return x * keep / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


__all__ = ["AgentDropout"]
