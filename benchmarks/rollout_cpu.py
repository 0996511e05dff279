"""32 Hanabi games, 2 agents, tiny model on CPU: wall time and generated tokens per second.

    python benchmarks/rollout_cpu.py [--games 32] [--constrained]

Prints one JSON object (and writes it to $OUT/rollout_cpu.json when OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

from roll.agentic.env.actions import ActionConfig
from roll.agentic.env.openspiel_env import OpenSpielEnv
from roll.agentic.env.renderers import render_prompt
from roll.agentic.env.seating import build_seating
from roll.agentic.rollout.scheduler import RolloutConfig, RolloutScheduler
from roll.inference.base import SamplingParams
from roll.models import build_tiny_model, load_model, load_tokenizer
from roll.multi_agent.config import AgentConfig, LoRAConfig
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.pipeline.builders import hf_engine_for

HANABI = {"players": 2, "colors": 2, "ranks": 3, "hand_size": 2,
          "max_information_tokens": 3, "max_life_tokens": 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--constrained", action="store_true")
    args = parser.parse_args()

    path = build_tiny_model()
    tokenizer = load_tokenizer(path)
    agents = [AgentConfig(f"agent_{i}", lora=LoRAConfig(rank=8, alpha=16)) for i in range(2)]
    model = MultiAgentLoRAModel(load_model(path), agents)
    engine = hf_engine_for(model, tokenizer)
    for agent in agents:
        engine.load_adapter(agent.name, model.export_adapter(agent.name),
                            model.peft_config(agent.name), 0)
    names = [a.name for a in agents]
    scheduler = RolloutScheduler(
        env_factory=lambda: OpenSpielEnv("hanabi", HANABI),
        render=render_prompt,
        seatings=[build_seating(names, 2, names)],
        agent_names=names,
        engine=engine,
        tokenizer=tokenizer,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens),
        action=ActionConfig(),
        config=RolloutConfig(num_groups=args.games, group_size=1, shared_deals=True, max_turns=64,
                             max_prompt_tokens=2048, constrained_decoding=args.constrained,
                             enable_thinking=False, continuous=True),
    )
    start = time.perf_counter()
    result = scheduler.rollout(seed=0)
    wall = time.perf_counter() - start
    generated = sum(len(t.response_ids) for t in result.turns)
    report = {
        "benchmark": "rollout_cpu",
        "game": "hanabi",
        "game_params": HANABI,
        "games": args.games,
        "agents": 2,
        "constrained_decoding": args.constrained,
        "max_new_tokens": args.max_new_tokens,
        "llm_turns": len(result.turns),
        "generated_tokens": generated,
        "wall_s": round(wall, 3),
        "generated_tok_per_s": round(generated / wall, 1),
        "turns_per_s": round(len(result.turns) / wall, 2),
        "format_error_rate": {a: result.metrics.get(f"{a}/format_error_rate")
                              for a in names},
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "rollout_cpu.json"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
