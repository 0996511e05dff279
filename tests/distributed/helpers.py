"""What the distributed tests share: the Kuhn example's config with small rollouts, and a
checkpoint's adapters read back from its PEFT files."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from roll.pipeline.cli import load_config

ROOT = Path(__file__).resolve().parents[2]
KUHN_SMALL = [
    "rollout.num_groups=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens=12",
    "rollout.constrained_decoding=true", "team.optim.lr=1e-2", "eval.eval_steps=0",
    "tracking.backends=[jsonl]",
    # Adam's first steps are ~lr * sign(g): eps 1e-3 keeps the 1e-10 noise of summing in
    # another order (over ranks) on near-zero coordinates from flipping lr-sized steps.
    "team.optim.eps=1e-3",
]


def kuhn_config(out: Path, *extra: str):
    """The Kuhn poker example, small rollouts, writing to ``out``; ``extra`` overrides."""
    return load_config(str(ROOT / "examples" / "kuhn_poker"), "multi_agent_kuhn_poker",
                       [*KUHN_SMALL, f"output_dir={out}", *extra])


def checkpoint_adapters(checkpoint: Path) -> dict[str, torch.Tensor]:
    """``{agent}/{tensor key}`` → tensor, from each agent's PEFT folder of a checkpoint."""
    return {f"{agent.name}/{key}": value
            for agent in sorted((checkpoint / "agents").iterdir())
            for key, value in load_file(agent / "adapter_model.safetensors").items()}
