"""Env workers side by side: a rollout whose env step is slow, in-process and over k workers.

    python benchmarks/env_workers.py                        # tiny model, CPU, 0.2 s per step
    python benchmarks/env_workers.py --workers 0 2 4 --step_seconds 0.5

An env whose step sleeps (``--step_seconds``: a game engine, a judge, a sandbox) stands in for a
CPU-heavy env. Each answer's env step starts on its episode's worker (episode i on worker
i mod k) and the rollout takes the result when it is ready, so the steps of k workers run side
by side and beside the decoding (roll/distributed/ray_env.py, ``Later`` in
roll/inference/base.py). Prints one JSON line per setting: rollout seconds (median of
``--repeats``), env steps, the speed-up over in-process play (``--workers 0``), and each
worker's peak resident memory with the heavy modules (torch, the engines...) its process
imported (none: a worker holds the env side alone).
Kuhn poker, both seats played by the tiny model's two agents, greedy-free sampling at 1.0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

AGENTS = ["alice", "bob"]


def sleepy_env_factory(game: str, seconds: float, log: str | None = None):
    """A factory of OpenSpiel envs whose ``step`` sleeps ``seconds`` first; with ``log``, each
    step appends "pid start end" (wall-clock seconds) to that file. The class is made inside
    this function so that Ray pickles it by value: env workers need not import this file."""
    from roll.agentic.env.openspiel_env import OpenSpielEnv

    class SleepyEnv(OpenSpielEnv):
        def step(self, action):
            start = time.time()
            time.sleep(seconds)
            if log is not None:
                with open(log, "a") as out:
                    out.write(f"{os.getpid()} {start} {time.time()}\n")
            return super().step(action)

    return lambda: SleepyEnv(game)


def rollout_scheduler(engine, tokenizer, env_factory, num_groups: int, episodes=None):
    """Kuhn poker, 2 agents in both seats, ``num_groups`` groups of 2, continuous serving."""
    from roll.agentic.env.actions import ActionConfig
    from roll.agentic.env.renderers import render_prompt
    from roll.agentic.env.seating import build_seating
    from roll.agentic.rollout.scheduler import RolloutConfig, RolloutScheduler
    from roll.inference.base import SamplingParams

    return RolloutScheduler(
        env_factory=env_factory, render=render_prompt,
        seatings=[build_seating(s, 2, AGENTS) for s in (AGENTS, AGENTS[::-1])],
        agent_names=AGENTS, engine=engine, tokenizer=tokenizer,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=16),
        action=ActionConfig(format_penalty=0.5, fallback="random"),
        config=RolloutConfig(num_groups=num_groups, group_size=2, shared_deals=True,
                             max_turns=8, max_prompt_tokens=2048, constrained_decoding=True,
                             enable_thinking=False, continuous=True),
        episodes=episodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4],
                        help="env workers (0: episodes in the rollout's process)")
    parser.add_argument("--step_seconds", type=float, default=0.2)
    parser.add_argument("--groups", type=int, default=8, help="groups of 2 Kuhn games")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import ray
    import torch

    from roll.distributed.ray_env import RayEpisodes
    from roll.models import load_model, load_tokenizer
    from roll.models.tiny import build_tiny_model
    from roll.multi_agent.config import AgentConfig, LoRAConfig, MultiAgentConfig
    from roll.multi_agent.model import MultiAgentLoRAModel
    from roll.pipeline.builders import hf_engine_for

    torch.manual_seed(0)
    path = build_tiny_model()
    agents = MultiAgentConfig(num_agents=len(AGENTS), agents=[AgentConfig(n) for n in AGENTS],
                              lora=LoRAConfig(rank=4, alpha=8)).validate().resolved_agents()
    team = MultiAgentLoRAModel(load_model(path, dtype="float32", device="cpu"), agents, seed=0)
    tokenizer = load_tokenizer(path)
    engine = hf_engine_for(team, tokenizer)
    for name in AGENTS:
        engine.load_adapter(name, team.export_adapter(name), team.peft_config(name), 1)
    factory = sleepy_env_factory("kuhn_poker", args.step_seconds)

    def worker_process(worker) -> tuple[int, list[str]]:
        """A worker's peak resident memory (MB) and which heavy modules it has imported
        (made here, so that Ray pickles it by value: workers need not import this file)."""
        import resource

        from roll.distributed.ray_env import loaded_unused_modules

        return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                loaded_unused_modules())

    ray.init(num_cpus=max(2, max(args.workers)), include_dashboard=False, log_to_driver=False)
    baseline = None
    try:
        for workers in args.workers:
            host = RayEpisodes(workers, cpus_per_worker=0.5) if workers else None
            processes = []
            try:
                seconds, steps = [], 0
                for repeat in range(args.repeats):
                    scheduler = rollout_scheduler(engine, tokenizer, factory, args.groups, host)
                    start = time.perf_counter()
                    result = scheduler.rollout(seed=repeat)
                    seconds.append(time.perf_counter() - start)
                    steps = len(result.turns)  # one env step per LLM answer
                if host is not None:
                    processes = ray.get([worker.__ray_call__.remote(worker_process)
                                         for worker in host.workers])
            finally:
                if host is not None:
                    host.close()
            median = statistics.median(seconds)
            baseline = median if workers == 0 else baseline
            print(json.dumps({
                "workers": workers, "step_seconds": args.step_seconds,
                "episodes": 2 * args.groups, "env_steps": steps,
                "rollout_seconds": round(median, 3),
                "env_seconds_in_sequence": round(steps * args.step_seconds, 2),
                "speedup_vs_in_process": (None if baseline is None
                                          else round(baseline / median, 2)),
                "worker_peak_rss_mb": [rss for rss, _ in processes],
                "worker_heavy_modules": sorted({name for _, names in processes
                                                for name in names})}), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
