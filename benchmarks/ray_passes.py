"""The no-grad passes on Ray train ranks: k ranks against one on the same rows.

    python benchmarks/ray_passes.py                       # CPU: ranks of 1 thread each, gloo
    python benchmarks/ray_passes.py --rows 128 --tokens 256 --world_sizes 1 2

``RayTrainGroup.logprob_passes`` (roll/distributed/ray_train.py) splits a batch's rows into k
contiguous shares, each rank runs the old-log-prob pass (and the reference pass: here
``trainer.kl_coef`` > 0) on its share, and the driver puts the results back in row order;
``RayTrainGroup.critic_values`` does the same for the critics' values (``--critic per_agent``,
one critic per agent, the default; ``shared``, MAPPO's one; ``none``: no critic pass). Timed:
the median of ``--repeats`` calls after an untimed warm-up, for each world size, on a tiny
Qwen3 built offline (``--hidden`` wide, ``--layers`` deep, 4 agents with LoRA r 8). Reported:
seconds (all passes, and each), the ratio to one rank (issue 32's goal: <= 0.6 at k = 2,
old + reference + critic passes), and the largest difference from one rank's log-probs and
values. Prints one JSON object; writes $OUT/ray_passes.json when OUT is set.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from batches import synthetic_batch  # noqa: E402
from report import emit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=192)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--world_sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--critic", default="per_agent", choices=["per_agent", "shared", "none"])
    args = parser.parse_args()

    import ray

    from roll.distributed.ray_train import RayTrainGroup
    from roll.distributed.roles import TrainSpec
    from roll.models import load_model
    from roll.models.tiny import TinyModelSpec, build_tiny_model
    from roll.multi_agent.config import CriticConfig, LoRAConfig, MultiAgentConfig, TrainerConfig
    from roll.multi_agent.critics import critic_agents
    from roll.multi_agent.model import MultiAgentLoRAModel

    spec = TinyModelSpec(hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=args.hidden // 4)
    path = build_tiny_model(None, spec)
    agents = MultiAgentConfig(num_agents=4, lora=LoRAConfig(rank=8, alpha=16)).validate(
    ).resolved_agents()
    trainer = TrainerConfig(kl_coef=0.1, logprob_micro_batch_size=16)
    base = load_model(path)
    critic = CriticConfig(mode=args.critic, lora=LoRAConfig(rank=8, alpha=16)).validate()
    critics = critic_agents(critic, [agent.name for agent in agents])
    driver = MultiAgentLoRAModel(base, agents, seed=0, critics=critics)
    batch = synthetic_batch(args.rows, args.tokens, args.tokens // 2, base.config.vocab_size,
                            torch.arange(args.rows) % len(agents))
    ray.init(num_cpus=max(args.world_sizes), include_dashboard=False, log_to_driver=False)
    results, reference = [], None
    try:
        for world_size in args.world_sizes:
            train_spec = TrainSpec(model_path=str(path), dtype="float32", device="cpu",
                                   agents=tuple(agents), trainer=trainer, seed=0,
                                   temperature=1.0, critic=critic if critics else None)
            group = RayTrainGroup(train_spec, driver, world_size, cpus_per_rank=1)
            try:
                passes(group, batch, bool(critics))  # warm-up
                times = {"logprobs": [], "critic": [], "all": []}
                for _ in range(args.repeats):
                    out, values, split = passes(group, batch, bool(critics))
                    for key, value in split.items():
                        times[key].append(value)
            finally:
                group.close()
            if reference is None:
                reference = (out, values)
            gap = max(float((out.old_logprobs - reference[0].old_logprobs).abs().max()),
                      float((out.ref_logprobs - reference[0].ref_logprobs).abs().max()),
                      float((values - reference[1]).abs().max()) if critics else 0.0)
            results.append({"world_size": world_size,
                            "seconds": round(statistics.median(times["all"]), 3),
                            "logprob_seconds": round(statistics.median(times["logprobs"]), 3),
                            "critic_seconds": (round(statistics.median(times["critic"]), 3)
                                               if critics else None),
                            "rows_per_rank": group.pass_rows_per_rank,
                            "max_gap_to_first": gap})
            print(f"k={world_size}: {results[-1]['seconds']} s "
                  f"(log-probs {results[-1]['logprob_seconds']} s, "
                  f"critic {results[-1]['critic_seconds']} s)", flush=True)
    finally:
        ray.shutdown()
    for row in results:
        row["ratio_to_first"] = round(row["seconds"] / results[0]["seconds"], 3)
    emit({"rows": args.rows, "tokens": args.tokens, "hidden": args.hidden,
          "layers": args.layers, "critic": args.critic,
          "passes": "old + reference" + ("" if args.critic == "none" else " + critic values"),
          "results": results},
         "ray_passes.json")


def passes(group, batch, with_critic: bool):
    """One call of each pass on ``group``: (log-prob fields, critic values or None, seconds of
    each and of all)."""
    start = time.perf_counter()
    out = group.logprob_passes(batch)
    middle = time.perf_counter()
    values = group.critic_values(batch) if with_critic else None
    end = time.perf_counter()
    return out, values, {"logprobs": middle - start, "critic": end - middle, "all": end - start}


if __name__ == "__main__":
    main()
