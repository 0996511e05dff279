"""N named LoRA adapters on one frozen base model (PEFT).

The base weights exist once. Each agent is one PEFT adapter named after the agent; the
reference policy is the same module with every adapter disabled (DESIGN.md invariant 2).
Checkpoints are standard PEFT adapter folders (invariant 4).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from roll.algorithms.losses import entropy_from_logits
from roll.models.peft_io import ADAPTER_WEIGHTS, write_peft_folder
from roll.multi_agent.config import AgentConfig, LoRAConfig


def adapter_init_seed(seed: int, agent_name: str) -> int:
    """Seed of one agent's adapter init: depends on the run seed and the agent's name only,
    so agent 'b' starts from the same weights alone or in any team."""
    return (seed * 1_000_003 + zlib.crc32(agent_name.encode())) % (2**31)


def _peft_lora_config(lora: LoRAConfig, base_name_or_path: str | None):
    from peft import LoraConfig, TaskType

    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type=TaskType.CAUSAL_LM,
        base_model_name_or_path=base_name_or_path,
    )


def token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """Log-prob of each token given the ones before it.

    logits (B, T, V), input_ids (B, T) → (B, T); position 0 (no context) is 0.
    """
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)  # (B, T-1, V)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (B, T-1)
    return F.pad(picked, (1, 0))


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy of the next-token distribution, aligned like token_logprobs: (B, T)."""
    return F.pad(entropy_from_logits(logits[:, :-1]), (1, 0))


class MultiAgentLoRAModel(nn.Module):
    """One frozen base, one PEFT LoRA adapter per agent.

    Args:
        base_model: a loaded causal LM (its weights are frozen here and never copied).
        agents: resolved agent configs (each with ``lora`` set), in agent-id order.
        seed: run seed; each adapter's init depends on (seed, agent name) only.
    """

    def __init__(self, base_model: nn.Module, agents: Sequence[AgentConfig], seed: int = 0):
        super().__init__()
        from peft import get_peft_model

        if not agents:
            raise ValueError("MultiAgentLoRAModel needs at least one agent")
        base_path = getattr(base_model.config, "_name_or_path", None) or None
        for param in base_model.parameters():
            param.requires_grad_(False)
        self.agent_names: list[str] = [agent.name for agent in agents]
        peft_model = None
        for agent in agents:
            config = _peft_lora_config(agent.lora, base_path)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(adapter_init_seed(seed, agent.name))
                if peft_model is None:
                    peft_model = get_peft_model(base_model, config, adapter_name=agent.name)
                else:
                    peft_model.add_adapter(agent.name, config)
        self.peft_model = peft_model
        self.set_active_agent(self.agent_names[0])

    # ------------------------------------------------------------------ adapters
    @property
    def base_model(self) -> nn.Module:
        """The underlying transformers model (shared by every agent and the reference)."""
        return self.peft_model.get_base_model()

    def agent_index(self, name: str) -> int:
        try:
            return self.agent_names.index(name)
        except ValueError:
            raise KeyError(f"unknown agent {name!r}; agents are {self.agent_names}") from None

    def set_active_agent(self, name: str) -> None:
        """Route forward passes through this agent's adapter; only it requires grad."""
        self.agent_index(name)
        self.peft_model.set_adapter(name)

    def agent_parameters(self, name: str) -> list[nn.Parameter]:
        """This agent's adapter tensors (and nothing else), in a stable order."""
        self.agent_index(name)
        return [p for n, p in self._named_agent_tensors(name)]

    def _named_agent_tensors(self, name: str) -> Iterator[tuple[str, nn.Parameter]]:
        marker = f".{name}."
        for param_name, param in self.peft_model.named_parameters():
            if "lora_" in param_name and marker in param_name + ".":
                yield param_name, param

    @contextmanager
    def reference(self) -> Iterator[None]:
        """Adapters off: the base model is the reference policy (no second copy)."""
        with self.peft_model.disable_adapter():
            yield

    # ------------------------------------------------------------------ forward
    def forward_agent(
        self,
        agent: str | None,
        input_ids: Tensor,
        attention_mask: Tensor,
        with_entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Token log-probs (B, T) of all rows under one agent's adapter (None: reference).

        Gradients flow to that agent's adapter when grad is enabled.
        """
        if agent is None:
            with self.reference():
                logits = self.peft_model(input_ids=input_ids, attention_mask=attention_mask).logits
        else:
            self.set_active_agent(agent)
            logits = self.peft_model(input_ids=input_ids, attention_mask=attention_mask).logits
        entropy = token_entropy(logits) if with_entropy else None
        return token_logprobs(logits, input_ids), entropy

    @torch.no_grad()
    def logprobs(self, input_ids: Tensor, attention_mask: Tensor, agent_id: Tensor) -> Tensor:
        """Per-row log-probs (B, T), each row through its own agent's adapter."""
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        for index in agent_id.unique().tolist():
            rows = agent_id == index
            out[rows], _ = self.forward_agent(
                self.agent_names[index], input_ids[rows], attention_mask[rows]
            )
        return out

    @torch.no_grad()
    def reference_logprobs(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Log-probs (B, T) of the base model with every adapter disabled."""
        logprobs, _ = self.forward_agent(None, input_ids, attention_mask)
        return logprobs

    # ------------------------------------------------------------------ interchange
    def export_adapter(self, name: str) -> dict[str, Tensor]:
        """One agent's adapter tensors with PEFT's on-disk key names (detached CPU copies)."""
        from peft.utils import get_peft_model_state_dict

        self.agent_index(name)
        state = get_peft_model_state_dict(self.peft_model, adapter_name=name)
        return {key: value.detach().to("cpu", copy=True) for key, value in state.items()}

    def import_adapter(self, name: str, tensors: dict[str, Tensor]) -> None:
        """Overwrite one agent's adapter with tensors from export_adapter (or a PEFT file)."""
        from peft.utils import set_peft_model_state_dict

        expected = set(self.export_adapter(name))
        if set(tensors) != expected:
            missing = sorted(expected - set(tensors))[:3]
            extra = sorted(set(tensors) - expected)[:3]
            raise ValueError(
                f"adapter tensors for agent {name!r} do not match its LoRA shape: "
                f"missing {missing}, unexpected {extra}"
            )
        set_peft_model_state_dict(self.peft_model, tensors, adapter_name=name)

    def lora_config(self, name: str):
        """The PEFT LoraConfig of one agent."""
        self.agent_index(name)
        return self.peft_model.peft_config[name]

    def save_agent(self, name: str, directory: str | os.PathLike) -> Path:
        """Write one agent as a standard PEFT adapter folder (safetensors + adapter_config.json).

        Stock ``peft.PeftModel.from_pretrained(base, directory)`` and vLLM load it unchanged.
        """
        return write_peft_folder(directory, self.export_adapter(name), self.lora_config(name))

    def load_agent(self, name: str, directory: str | os.PathLike) -> None:
        """Load a PEFT adapter folder into an existing agent (shapes must match)."""
        from safetensors.torch import load_file

        path = Path(directory) / ADAPTER_WEIGHTS
        if not path.is_file():
            raise FileNotFoundError(f"no {ADAPTER_WEIGHTS} in {directory} (agent {name!r})")
        self.import_adapter(name, load_file(str(path)))
