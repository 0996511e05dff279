"""Builders shared by the inference tests: perturbed teams, prompts, stock-PEFT references."""

from __future__ import annotations

import torch
from peft import PeftModel

from roll.models import apply_chat_template, load_model, load_tokenizer
from roll.multi_agent.config import AgentConfig, LoRAConfig

from ..multi_agent.helpers import make_team

# One agent per shape we must handle: default (r 4, all 7 projections), a small rank on two
# layers, a larger rank on three others, and a second default-shaped agent.
AGENTS = [
    AgentConfig("alice"),
    AgentConfig("bob", lora=LoRAConfig(rank=2, alpha=4, target_modules=["q_proj", "up_proj"])),
    AgentConfig("carol", lora=LoRAConfig(rank=8, alpha=8,
                                         target_modules=["v_proj", "o_proj", "down_proj"])),
    AgentConfig("dave"),
]
PROMPTS = [
    "What is 12 + 30?",
    "Kuhn poker: your card is the King. Pass or Bet?",
    "Hi",
    "Play card 0. Discard card 1. Reveal player +1 color R. Reveal rank 2. Your move?",
    "Connect Four: drop a piece in a column.",
]


def perturb(team, name: str, seed: int, scale: float = 0.5) -> None:
    """Give an adapter non-zero B so it changes outputs (fresh LoRA B is zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in team.agent_parameters(name):
            param.add_(torch.randn(param.shape, generator=gen) * scale)


def perturbed_team(path, num_agents: int):
    """A team of the first ``num_agents`` AGENTS, every adapter perturbed differently."""
    team, _ = make_team(path, AGENTS[:num_agents])
    for index, name in enumerate(team.agent_names):
        perturb(team, name, seed=100 + index)
    return team


def chat_prompts(path) -> list[list[int]]:
    """Chat-templated prompts of different lengths."""
    tokenizer = load_tokenizer(path)
    return [apply_chat_template(tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]


def sequence_logprobs(model, prompt: list[int], generated: list[int],
                      temperature: float = 1.0) -> list[float]:
    """Log-prob of each generated token under ``softmax(logits / temperature)`` of ``model``
    (one plain forward, no padding, no filter)."""
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    logp = torch.log_softmax(logits[0, len(prompt) - 1 : -1] / temperature, dim=-1)  # (G, V)
    return logp.gather(-1, torch.tensor(generated)[:, None])[:, 0].tolist()


def stock_greedy(model, prompt: list[int], max_new_tokens: int) -> tuple[list[int], list[float]]:
    """HF ``generate(do_sample=False)`` alone (batch of one), and its tokens' log-probs."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
        )
    generated = out[0, len(prompt) :].tolist()
    return generated, sequence_logprobs(model, prompt, generated)


def stock_peft_model(path, team, name: str, folder):
    """The agent as stock PEFT loads it from its saved folder, on a fresh base model."""
    team.save_agent(name, folder)
    return PeftModel.from_pretrained(load_model(path), folder).eval()


class LateFollowUps:
    """A ``Later`` (roll/inference/base.py) whose follow-ups arrive after ``follow`` returned,
    as env steps on env workers do: request i + ``ahead`` is made when request i finishes but
    becomes ready only ``delay`` polls later (or at once when the engine waits). Outputs are
    kept by request index; ``waits`` counts the engine's blocking calls, ``polled`` the
    requests it took without waiting."""

    def __init__(self, requests: list, ahead: int, delay: int = 3) -> None:
        self.requests, self.ahead, self.delay = requests, ahead, delay
        self.outputs: dict[int, object] = {}
        self.order = list(range(min(ahead, len(requests))))  # key -> request index
        self.pending: list[list] = []  # [polls left, request index]
        self.waits = self.polled = 0

    def first(self) -> list:
        return [self.requests[index] for index in self.order]

    def follow(self, key: int, output) -> list:
        self.outputs[self.order[key]] = output
        made = len(self.order) + len(self.pending)
        if made < len(self.requests):
            self.pending.append([self.delay, made])
        return []

    def outstanding(self) -> int:
        return len(self.pending)

    def ready(self, wait: bool) -> list:
        if wait:
            self.waits += 1
        for item in self.pending:
            item[0] = 0 if wait else item[0] - 1
        due = [index for polls, index in self.pending if polls <= 0]
        self.pending = [item for item in self.pending if item[0] > 0]
        self.order += due
        self.polled += 0 if wait else len(due)
        return [self.requests[index] for index in due]


def picker_inputs(rows: int = 37, vocab: int = 301) -> dict:
    """Arguments of ``sampling.pick_tokens`` for mixed rows (seeded): bf16 ``logits``, each
    row's ``temperature`` (0.5-1.5), ``sampled`` (two rows in three draw), noise ``keys`` and
    ``steps``, ``vocab_keys``, and ``masked`` logits with about half of the tokens forbidden."""
    from roll.inference.hf.sampling import _VOCAB_SALT, mix32, seed_key

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=generator).to(torch.bfloat16)
    temperature = torch.rand(rows, 1, generator=generator) + 0.5
    masked = logits.float().masked_fill(torch.rand(rows, vocab, generator=generator) < 0.5,
                                        float("-inf"))
    return {"logits": logits, "temperature": temperature, "sampled": torch.arange(rows) % 3 != 0,
            "keys": torch.tensor([seed_key(seed) for seed in range(rows)]),
            "steps": torch.arange(rows) % 5,
            "vocab_keys": mix32(torch.arange(vocab) + _VOCAB_SALT), "masked": masked}
