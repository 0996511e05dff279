"""Adapter traffic of a Ray run per step: rank 0 → the pipeline, and → every engine actor.

    python benchmarks/ray_adapter_traffic.py                 # 0.6B shape, CPU or GPU
    python benchmarks/ray_adapter_traffic.py --tiny          # smoke check

After each train step the Ray pipeline copies the trained agents' adapters from rank 0 into its
own store (``RayTrainGroup``: checkpoints read them) and the next rollout pushes them to every
engine actor (``push_adapters`` → ``RayInferGroup.load_adapter``). With the Qwen3-0.6B shape,
4 agents and LoRA r 32 on all 7 projections that is 80 M fp32 values, 320 MB per step, which
the 2-GPU pipeline runs showed costing more than the rollout saves (benchmarks/README.md,
"Multi-GPU pipeline steps"). Timed here, apart from any training: ``pull`` (rank 0 exports,
the store takes them) and ``push`` (to ``--engines`` hf engine actors), median of ``--steps``
after one warm-up, then one read of the store (``fetch_store``: what a checkpoint costs extra
now that the store fetches rank 0's fp32 copy only when read). Prints one JSON object; writes
$OUT/ray_adapter_traffic.json when OUT is set.
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

from pipeline_step import SHAPE_06B  # noqa: E402
from report import emit  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    import ray

    from roll.distributed.ray_infer import EngineSpec, RayInferGroup
    from roll.distributed.ray_train import RayTrainGroup
    from roll.distributed.roles import TrainSpec, push_adapters
    from roll.models import load_shape
    from roll.models.tiny import TinyModelSpec, build_tiny_model, default_cache_dir
    from roll.multi_agent.config import (
        ALL_LINEAR,
        LoRAConfig,
        MultiAgentConfig,
        TrainerConfig,
    )
    from roll.multi_agent.model import MultiAgentLoRAModel

    cuda = torch.cuda.is_available() and not args.tiny
    path = build_tiny_model(
        default_cache_dir().parent / ("tiny-qwen3" if args.tiny else "qwen3-0.6b-shape"),
        TinyModelSpec() if args.tiny else TinyModelSpec(**SHAPE_06B))
    dtype = "float32" if args.tiny else "bfloat16"
    agents = tuple(MultiAgentConfig(
        num_agents=args.agents,
        lora=LoRAConfig(rank=32, alpha=32, target_modules=list(ALL_LINEAR))).resolved_agents())
    spec = TrainSpec(model_path=str(path), dtype=dtype, device="cuda" if cuda else "cpu",
                     agents=agents, trainer=TrainerConfig(), seed=0, temperature=1.0)
    ray.init(include_dashboard=False, log_to_driver=False)
    store = MultiAgentLoRAModel(load_shape(path, dtype), list(agents), seed=0)
    names = store.agent_names
    gpus = 0.5 if cuda else 0.0
    cpus = 1.0 if cuda else 0.5  # 2 ranks + 2 engines on a 2-core machine
    group = RayTrainGroup(spec, store, args.ranks, cpus_per_rank=cpus, gpus_per_rank=gpus)
    engines = RayInferGroup(spec, args.engines, EngineSpec("hf", {"max_batch_size": 8}),
                            cpus_per_engine=cpus, gpus_per_engine=gpus)
    megabytes = sum(t.nbytes for name in names for t in store.export_adapter(name).values()) / 1e6
    times: dict[str, list[float]] = {"pull": [], "push": []}
    try:
        for step in range(args.steps + 1):
            start = time.perf_counter()
            group._pull_adapters(names)
            pulled = time.perf_counter()
            # as the pipeline's sync does: the engines fetch rank 0's copies where published
            push_adapters(engines, store, step + 1, names,
                          group.published_adapters(group.global_step))
            pushed = time.perf_counter()
            print(f"{time.strftime('%H:%M:%S')} step {step}: pull {pulled - start:.3f} s, "
                  f"push {pushed - pulled:.3f} s", flush=True)
            if step:
                times["pull"].append(pulled - start)
                times["push"].append(pushed - pulled)
        start = time.perf_counter()
        store.import_deferred()
        times["fetch_store"] = [time.perf_counter() - start]
    finally:
        engines.close()
        group.close()
        ray.shutdown()
    summary = {"device": torch.cuda.get_device_name() if cuda else "cpu", "ranks": args.ranks,
               "engines": args.engines, "agents": args.agents,
               "adapter_mb_all_agents": round(megabytes, 1),
               **{f"{key}_s": round(statistics.median(values), 3)
                  for key, values in times.items()},
               **{f"{key}_s_all": [round(v, 3) for v in values] for key, values in times.items()}}
    emit(summary, "ray_adapter_traffic.json")


if __name__ == "__main__":
    main()
