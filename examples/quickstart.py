"""Two agents, one tiny base model, two different rewards: each adapter learns its own.

    python examples/quickstart.py [--steps 30]

Agent ``alice`` is rewarded for emitting even token ids, ``bob`` for odd ones. Both start near
0.5 (the random base model has no preference); after training each should sit clearly on its
own side. Runs on CPU in about a minute on the tiny offline model (built on first use).
"""

from __future__ import annotations

import argparse
import time

import torch

from roll.algorithms import AdvantageConfig, compute_advantages
from roll.batch import TrajectoryBatch
from roll.models import apply_chat_template, build_tiny_model, load_model, load_tokenizer
from roll.multi_agent.config import AgentConfig, MultiAgentConfig, OptimConfig, TrainerConfig
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.multi_agent.worker import MultiAgentTrainer

REWARDED_PARITY = {"alice": 0, "bob": 1}


def sample(model, prompt, agent, samples, new_tokens, pad_id):
    """``samples`` completions of the agent; returns (input_ids, response_mask)."""
    model.set_active_agent(agent)
    prompt_ids = torch.tensor([prompt] * samples)
    with torch.no_grad():
        out = model.peft_model.generate(
            input_ids=prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            do_sample=True,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad_id,
        )
    response_mask = torch.zeros(out.shape)
    response_mask[:, len(prompt):] = 1
    return out, response_mask


def parity_rate(input_ids, response_mask, parity):
    hits = ((input_ids % 2) == parity).float() * response_mask
    return (hits.sum(-1) / response_mask.sum(-1))  # (B,)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--samples", type=int, default=8, help="completions per agent per step")
    parser.add_argument("--new-tokens", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)

    path = build_tiny_model()
    tokenizer = load_tokenizer(path)
    team = MultiAgentConfig(
        num_agents=2,
        agents=[AgentConfig(name) for name in REWARDED_PARITY],
        optim=OptimConfig(lr=2e-2),
    ).validate()
    model = MultiAgentLoRAModel(load_model(path), team.resolved_agents(), seed=0)
    trainer = MultiAgentTrainer(model, team.resolved_agents(), TrainerConfig(micro_batch_size=8))
    prompt = apply_chat_template(tokenizer, [{"role": "user", "content": "Say something."}])
    advantage_cfg = AdvantageConfig(estimator="grpo")

    history = {name: [] for name in REWARDED_PARITY}
    start = time.time()
    for step in range(args.steps):
        rows = []
        for index, (agent, parity) in enumerate(REWARDED_PARITY.items()):
            ids, mask = sample(model, prompt, agent, args.samples, args.new_tokens,
                               tokenizer.pad_token_id)
            reward = parity_rate(ids, mask, parity)
            history[agent].append(float(reward.mean()))
            n = len(ids)
            rows.append(TrajectoryBatch(
                input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=mask,
                agent_id=torch.full((n,), index), rewards=reward,
                env_id=torch.arange(n) + index * n, seat=torch.zeros(n, dtype=torch.long),
                group_id=torch.full((n,), index), turn=torch.zeros(n, dtype=torch.long),
            ))
        batch = TrajectoryBatch(**{
            name: torch.cat([getattr(r, name) for r in rows])
            for name in ("input_ids", "attention_mask", "response_mask", "agent_id", "rewards",
                         "env_id", "seat", "group_id", "turn")
        })
        metrics = trainer.train_step(compute_advantages(batch, advantage_cfg))
        print(f"step {step + 1:3d}/{args.steps}  "
              + "  ".join(f"{a}: reward {history[a][-1]:.2f} loss {m['policy_loss']:+.3f}"
                          for a, m in metrics.items()),
              flush=True)
    print(f"\ndone in {time.time() - start:.0f}s")
    for agent in REWARDED_PARITY:
        first = sum(history[agent][:5]) / 5
        last = sum(history[agent][-5:]) / 5
        print(f"{agent}: rewarded parity rate {first:.2f} (first 5 steps) -> {last:.2f} (last 5)")


if __name__ == "__main__":
    main()
