"""Side by side with CoMLRL (PyPI ``comlrl``) on its MAGRPO writing baseline: s/step, generated
tok/s and peak memory of each, 2 and 4 agents, one run.

    python benchmarks/vs_comlrl.py            # GPU: Qwen3-0.6B shape, random bf16
    python benchmarks/vs_comlrl.py --tiny     # CPU: the tiny offline model

The same workload for both: the built-in writing prompts (one prompt per step), ``--generations``
samples per prompt and agent (``--prompts`` prompts per step for roll, which can batch them;
CoMLRL takes one), ``--max_new_tokens`` per answer, temperature 0.7, top-p 0.9, the
same joint reward (roll/agentic/tasks/writing_team.py: ``joint_scores``), the same base model
folder. What differs is what each framework is: CoMLRL's ``MAGRPOTrainer`` loads one full copy
of the model per agent and trains all of its weights; roll runs the writing_magrpo example
(one base, one LoRA adapter per agent, r ``--lora_rank``, mixed-adapter generation). Each
(framework, agents) runs in its own process (clean peak memory); the first step is warm-up and
the figures are the mean of the later ones. Prints JSON; writes $OUT/vs_comlrl.json when OUT
is set.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import emit  # noqa: E402

SHAPE_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128)
PARTS = {2: ["background", "method"], 4: ["background", "method", "results", "discussion"]}


def model_folder(tiny: bool) -> Path:
    from roll.models.tiny import TinyModelSpec, build_tiny_model, default_cache_dir

    spec = TinyModelSpec() if tiny else TinyModelSpec(**SHAPE_06B)
    return build_tiny_model(
        default_cache_dir().parent / ("tiny-qwen3" if tiny else "qwen3-0.6b-shape"), spec)


def peak_gb() -> float | None:
    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / 1e9, 2)


def run_roll(args, agents: int) -> dict:
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    out = Path(tempfile.mkdtemp(prefix=f"vs_comlrl_roll_{agents}_"))
    cfg = load_config(str(ROOT / "examples" / "writing_magrpo"), "multi_agent_writing_magrpo", [
        f"model.path={model_folder(args.tiny)}",
        f"model.dtype={'float32' if args.tiny else 'bfloat16'}",
        f"model.device={'cpu' if args.tiny else 'cuda'}", f"team.num_agents={agents}",
        "env.role_to_agent={}", f"env.params.parts=[{','.join(PARTS[agents])}]",
        f"rollout.num_groups={args.prompts}", f"rollout.group_size={args.generations}",
        f"rollout.max_turns={agents}",
        f"rollout.sampling.max_new_tokens={args.max_new_tokens}",
        f"team.lora.rank={args.lora_rank}", f"team.lora.alpha={args.lora_rank}",
        f"max_steps={args.steps}", "save_steps=0", "eval.eval_steps=0",
        "tracking.backends=[jsonl]", f"output_dir={out}", *args.override])
    pipeline = AgenticPipeline(cfg)
    pipeline.run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:] or rows
    seconds = statistics.mean(row["time/step"] for row in later)
    tokens = statistics.mean(row["rollout/generated_tokens"] for row in later)
    split = {key: round(statistics.mean(row.get(key, 0.0) for row in later), 3)
             for key in ("time/rollout", "time/logprobs", "time/train", "time/sync")}
    return {"framework": "roll", "agents": agents, "prompts_per_step": args.prompts,
            "s_per_step": round(seconds, 3), "generated_tokens_per_step": round(tokens, 1),
            "generated_tok_per_s": round(tokens / seconds, 1), "peak_gb": peak_gb(),
            "steps": len(rows), "split": split}


def run_comlrl(args, agents: int) -> dict:
    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
    from transformers import AutoTokenizer

    from roll.agentic.tasks.writing_prompts import writing_prompts
    from roll.agentic.tasks.writing_team import INSTRUCTIONS, OTHER_PART, joint_scores

    folder = model_folder(args.tiny)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    parts = PARTS[agents]
    counted = {"tokens": 0}

    def reward(*completions):  # one list of one completion per agent
        return [joint_scores([c[0] for c in completions], 60)["joint"]]

    def counting(generate):
        """Count the tokens each generate call made (every non-pad token after the prompt)."""
        def wrapped(*args, **kwargs):
            output = generate(*args, **kwargs)
            sequences = getattr(output, "sequences", output)
            prompt = kwargs.get("input_ids", args[0] if args else None)
            new = sequences[:, prompt.shape[1]:]
            counted["tokens"] += int((new != tokenizer.pad_token_id).sum())
            return output
        return wrapped

    def formatter(part):
        instruction = INSTRUCTIONS.get(part, OTHER_PART.format(part=part))
        return lambda item: f"{item['prompt']}\n\n{instruction}"

    config = MAGRPOConfig(
        num_train_epochs=1, agent_learning_rate=1e-5, num_agents=agents,
        num_generations=args.generations, max_new_tokens=args.max_new_tokens,
        temperature=0.7, top_p=0.9, top_k=None, num_turns=1, eval_interval=0,
        rollout_buffer_size=1, logging_steps=1)
    # A plain list (its DataLoader takes any sequence): datasets' fingerprinting of a
    # Dataset failed to pickle on the GPU machine's Python 3.12.
    dataset = [{"prompt": p} for p in writing_prompts(args.steps)]
    trainer = MAGRPOTrainer(
        agent_model=str(folder), num_agents=agents, tokenizer=tokenizer,
        model_config={"dtype": torch.float32 if args.tiny else torch.bfloat16},
        train_dataset=dataset, reward_func=reward, formatters=[formatter(p) for p in parts],
        args=config)
    trainer.verbose = False
    for agent in trainer.agents:
        agent.generate = counting(agent.generate)
    steps: list[tuple[float, int]] = []
    inner = trainer._train_step_returns

    def timed(batch_item, **kwargs):
        start, before = time.perf_counter(), counted["tokens"]
        result = inner(batch_item, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        steps.append((time.perf_counter() - start, counted["tokens"] - before))
        return result

    trainer._train_step_returns = timed
    trainer.train()
    later = steps[1:] or steps
    seconds = statistics.mean(s for s, _ in later)
    tokens = statistics.mean(t for _, t in later)
    return {"framework": "comlrl", "agents": agents, "s_per_step": round(seconds, 3),
            "generated_tokens_per_step": round(tokens, 1),
            "generated_tok_per_s": round(tokens / seconds, 1), "peak_gb": peak_gb(),
            "steps": len(steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU")
    parser.add_argument("--agents", type=int, nargs="+", default=[2, 4], choices=[2, 4])
    parser.add_argument("--frameworks", nargs="+", default=["roll", "comlrl"],
                        choices=["roll", "comlrl"])
    parser.add_argument("--steps", type=int, default=4, help="prompts (steps) per run")
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=1,
                        help="roll only: prompts per step (CoMLRL takes one per step)")
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--lora_rank", type=int, default=32)
    parser.add_argument("--override", nargs="*", default=[],
                        help="roll only: more Hydra overrides, e.g. trainer.micro_batch_size=8")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # "framework:agents", in a child
    args = parser.parse_args()
    if args.one:
        framework, agents = args.one.split(":")
        runner = run_roll if framework == "roll" else run_comlrl
        print(json.dumps(runner(args, int(agents))), flush=True)
        return
    results = []
    base = [sys.executable, str(Path(__file__).resolve()), "--steps", str(args.steps),
            "--prompts", str(args.prompts),
            "--generations", str(args.generations), "--max_new_tokens",
            str(args.max_new_tokens), "--lora_rank", str(args.lora_rank)]
    if args.tiny:
        base.append("--tiny")
    if args.override:
        base += ["--override", *args.override]
    for agents in args.agents:
        for framework in args.frameworks:
            done = subprocess.run([*base, "--one", f"{framework}:{agents}"],
                                  capture_output=True, text=True, cwd=ROOT)
            if done.returncode != 0:
                results.append({"framework": framework, "agents": agents,
                                "error": done.stderr.strip().splitlines()[-3:]})
            else:
                results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    for agents in args.agents:  # (with --prompts > 1 roll does more work per step)
        pair = {r["framework"]: r for r in results if r["agents"] == agents and "error" not in r}
        if len(pair) == 2:
            pair["roll"]["vs_comlrl_tok_per_s"] = round(
                pair["roll"]["generated_tok_per_s"] / pair["comlrl"]["generated_tok_per_s"], 2)
    memory = {r["framework"]: {} for r in results}
    for r in results:
        if r.get("peak_gb"):
            memory[r["framework"]][r["agents"]] = r["peak_gb"]
    ratios = {f: round(m[4] / m[2], 2) for f, m in memory.items() if 2 in m and 4 in m}
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    emit({"device": name, "torch": torch.__version__, "steps": args.steps,
          "prompts_per_step_roll": args.prompts,
          "generations": args.generations, "max_new_tokens": args.max_new_tokens,
          "memory_4_over_2_agents": ratios, "results": results}, "vs_comlrl.json")


if __name__ == "__main__":
    main()
