"""Critics as adapters: value models on the one frozen base (issue 13, part 1).

A critic is the shared base + its own LoRA adapter (held by the same PEFT model as the agents,
listed in ``MultiAgentLoRAModel.critic_names``, never synced to an engine) + a scalar value
head, ``Linear(hidden, 1)`` in fp32, zero-initialised (every value starts at 0). So invariant 2
holds: however many critics, the base exists once.

Values are per token: ``values[:, t]`` is V of the state in which token t was generated, i.e.
the head applied to the final hidden state at position t - 1 (the position whose output
predicts token t) — the alignment GAE reads (roll/algorithms/advantages.py). Token-level rather
than turn-level values, because the PPO loss is per token and GAE with gamma = lam = 1 over a
turn reduces to the turn's return minus its first value anyway.

Rows are routed to critics exactly as the agents' forward routes rows to agents: each
contiguous run of one critic's rows gets that critic's LoRA delta (the model's segment hooks),
with PEFT's own LoRA off, so a critic's gradients come from its own rows only.

A critic is saved as a standard PEFT adapter folder plus ``value_head.safetensors``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from roll.multi_agent.model import MultiAgentLoRAModel, _segments

VALUE_HEAD = "value_head.safetensors"


class ValueHeads(nn.Module):
    """One scalar head per critic, ``Linear(hidden_size, 1)`` in fp32, zero-initialised."""

    def __init__(self, names: Sequence[str], hidden_size: int,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.heads = nn.ModuleDict()
        for name in names:
            head = nn.Linear(hidden_size, 1, device=device, dtype=torch.float32)
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
            self.heads[name] = head

    def forward(self, name: str, hidden: Tensor) -> Tensor:
        """Values (b, T) of hidden states (b, T, H) through ``name``'s head."""
        return self.heads[name](hidden.float()).squeeze(-1)


def critic_values(model: MultiAgentLoRAModel, heads: ValueHeads, input_ids: Tensor,
                  attention_mask: Tensor, critic_id: Tensor,
                  positions: Tensor | None = None) -> Tensor:
    """Values (B, T) of each row's critic (``critic_id`` (B,) indexes ``model.critic_names``):
    ``values[:, t]`` = V(state before token t); 0 at t = 0 and outside ``positions`` (B, T).
    Differentiable in the critics' adapters and heads. Keep each critic's rows contiguous
    (its dropout masks are then those of a forward of its rows alone)."""
    segments = _segments(critic_id.tolist(), model.critic_names)
    decoder = model.base_model.get_decoder()
    # PEFT's own LoRA off (the reference context; it also freezes every adapter, so they are
    # made trainable again inside it); the segment hooks add each row's critic's delta.
    with model.reference(), model._segment_lora(segments):
        model._all_trainable()
        hidden = decoder(input_ids=input_ids, attention_mask=attention_mask,
                         use_cache=False).last_hidden_state  # (B, T, H)
    values = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    parts = [heads(name, hidden[first:stop, :-1]) for name, first, stop in segments]
    values = torch.cat([values[:, :1], torch.cat(parts)], dim=1) if parts else values
    if positions is not None:
        values = torch.where(positions.bool(), values, torch.zeros_like(values))
    return values


def save_critic(model: MultiAgentLoRAModel, heads: ValueHeads, name: str,
                directory: str | os.PathLike) -> Path:
    """A PEFT adapter folder (the critic's LoRA) + ``value_head.safetensors`` (its head)."""
    from safetensors.torch import save_file

    if name not in model.critic_names:
        raise KeyError(f"unknown critic {name!r}; critics are {model.critic_names}")
    folder = model.save_agent(name, directory)
    head = heads.heads[name]
    save_file({"weight": head.weight.detach().cpu().contiguous(),
               "bias": head.bias.detach().cpu().contiguous()}, str(folder / VALUE_HEAD))
    return folder


def load_critic(model: MultiAgentLoRAModel, heads: ValueHeads, name: str,
                directory: str | os.PathLike) -> None:
    """Load a folder written by ``save_critic`` into critic ``name`` (shapes must match)."""
    from safetensors.torch import load_file

    path = Path(directory) / VALUE_HEAD
    if not path.is_file():
        raise FileNotFoundError(f"no {VALUE_HEAD} in {directory} (critic {name!r})")
    model.load_agent(name, directory)
    tensors = load_file(str(path))
    head = heads.heads[name]
    with torch.no_grad():
        for key, param in (("weight", head.weight), ("bias", head.bias)):
            if tensors[key].shape != param.shape:
                raise ValueError(f"{path}: {key} has shape {tuple(tensors[key].shape)}, "
                                 f"expected {tuple(param.shape)}")
            param.copy_(tensors[key])
