"""Adapter sync cost per training step, trainer → engine, for 2 and 8 agents (vLLM and hf).

    python benchmarks/adapter_sync.py [--model PATH] [--agents 2 8] [--steps 5] [--dtype float32]
    python benchmarks/adapter_sync.py --engines hf --shape 0.6b --agents 1 8 --dtype bfloat16  # GPU

One step of sync for vLLM = export every agent's adapter from the MultiAgentLoRAModel + write
its PEFT folder + register it (``VLLMEngine.load_adapter``) + the extra cost of the next
generation (vLLM moves a new adapter into its LoRA slots when a batch first uses it): measured
as a 1-token generate per agent right after the sync minus the same generate without a sync.
For hf, what the pipeline's ``time/sync`` holds: ``push_adapters`` of every agent into an
``HFEngine`` in this process (on the model's device it takes the model's own tensors and copies
them into its fused stacks; on an H200 the host round trip it made before cost a Hanabi step 1.2
s with 8 agents). LoRA r=32 on all 7 projections. Tiny model on CPU by default; ``--shape 0.6b``
the Qwen3-0.6B shape (random weights, 20 M adapter values per agent). Prints one JSON object
(and writes it to $OUT/adapter_sync.json when OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from roll.distributed.roles import push_adapters
from roll.inference import GenerationRequest, SamplingParams
from roll.models import apply_chat_template, build_tiny_model, load_model, load_tokenizer
from roll.models.tiny import TinyModelSpec, default_cache_dir
from roll.multi_agent.config import ALL_LINEAR, AgentConfig, LoRAConfig
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.pipeline.builders import hf_engine_for

RANK = 32


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _train_step(model: MultiAgentLoRAModel) -> None:
    """Stand-in for an optimizer step: every adapter tensor changes."""
    with torch.no_grad():
        for name in model.agent_names:
            for param in model.agent_parameters(name):
                param.add_(torch.randn_like(param) * 1e-3)


def _summary(samples: dict[str, list[float]]) -> dict[str, float]:
    return {f"{key}_ms": _ms(statistics.median(values)) for key, values in samples.items()}


def bench_vllm(engine, model, prompt, names, steps, version) -> dict:
    from roll.inference.vllm_engine import _write_peft_folder

    one_token = SamplingParams(temperature=0.0, max_new_tokens=1)
    requests = [GenerationRequest(prompt, name, one_token) for name in names]
    samples: dict[str, list[float]] = {k: [] for k in
                                       ("export", "write", "load_adapter", "first_generate",
                                        "steady_generate", "sync_total")}
    scratch = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    for step in range(steps + 1):  # step 0 warms up
        _train_step(model)
        start = time.perf_counter()
        exported = {name: model.export_adapter(name) for name in names}
        export = time.perf_counter() - start
        start = time.perf_counter()  # the folder write alone, to split load_adapter's cost
        for name in names:
            _write_peft_folder(scratch / f"{step}-{name}", exported[name],
                               model.peft_config(name))
        write = time.perf_counter() - start
        start = time.perf_counter()
        for name in names:
            engine.load_adapter(name, exported[name], model.peft_config(name), version + step)
        load = time.perf_counter() - start
        first = _timed(lambda: engine.generate(requests))
        steady = _timed(lambda: engine.generate(requests))
        if step == 0:
            continue
        for key, value in (("export", export), ("write", write), ("load_adapter", load),
                           ("first_generate", first), ("steady_generate", steady),
                           ("sync_total", export + load + max(0.0, first - steady))):
            samples[key].append(value)
    shutil.rmtree(scratch)
    return _summary(samples)


def bench_hf(model, tokenizer, prompt, names, steps) -> dict:
    engine = hf_engine_for(model, tokenizer)
    one_token = SamplingParams(temperature=0.0, max_new_tokens=1)
    requests = [GenerationRequest(prompt, name, one_token) for name in names]
    samples: dict[str, list[float]] = {"sync_total": []}
    cuda = next(model.parameters()).device.type == "cuda"
    for step in range(steps + 1):
        _train_step(model)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        push_adapters(engine, model, step)
        if cuda:
            torch.cuda.synchronize()
        if step:
            samples["sync_total"].append(time.perf_counter() - start)
        engine.generate(requests)
    return _summary(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the tiny model)")
    parser.add_argument("--agents", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--steps", type=int, default=5, help="timed sync steps per setting")
    parser.add_argument("--dtype", default="float32", help="float32 / bfloat16 / float16")
    parser.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--engines", nargs="+", default=["vllm", "hf"], choices=["vllm", "hf"])
    parser.add_argument("--shape", default="tiny", choices=["tiny", "0.6b"],
                        help="without --model: the tiny model or the Qwen3-0.6B shape")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the JSON only
    if args.model:
        path = Path(args.model)
    elif args.shape == "0.6b":
        from pipeline_step import SHAPE_06B  # benchmarks/ (this script's folder)

        path = build_tiny_model(default_cache_dir().parent / "qwen3-0.6b-shape",
                                TinyModelSpec(**SHAPE_06B))
    else:
        path = build_tiny_model()
    tokenizer = load_tokenizer(path)
    prompt = apply_chat_template(tokenizer, [{"role": "user", "content": "Your move?"}])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    engine = None
    if "vllm" in args.engines:
        from roll.inference.vllm_engine import VLLMEngine

        engine = VLLMEngine(str(path), tokenizer, max_loras=max(args.agents), max_lora_rank=RANK,
                            dtype=args.dtype, enforce_eager=args.enforce_eager,
                            max_model_len=1024)
    results = []
    version = 0
    for num_agents in args.agents:
        agents = [AgentConfig(f"agent_{i}", lora=LoRAConfig(rank=RANK, alpha=2 * RANK,
                                                            target_modules=list(ALL_LINEAR)))
                  for i in range(num_agents)]
        model = MultiAgentLoRAModel(load_model(path, dtype=args.dtype, device=device), agents)
        names = model.agent_names
        adapter_bytes = sum(t.nbytes for t in model.export_adapter(names[0]).values())
        row = {"agents": num_agents, "adapter_mb_each": round(adapter_bytes / 2**20, 3)}
        if engine is not None:
            for slot in engine.slots:  # each setting starts from an empty engine
                engine.remove_adapter(slot)
            row["vllm"] = bench_vllm(engine, model, prompt, names, args.steps, version)
        if "hf" in args.engines:
            row["hf"] = bench_hf(model, tokenizer, prompt, names, args.steps)
        version += args.steps + 1
        results.append(row)
        del model
    report = {
        "benchmark": "adapter_sync",
        "model": str(path) if args.model else f"{args.shape} shape (build_tiny_model)",
        "dtype": args.dtype,
        "lora": {"rank": RANK, "target_modules": list(ALL_LINEAR)},
        "steps": args.steps,
        "enforce_eager": args.enforce_eager,
        "device": device,
        "results": results,
        "note": "median ms per sync step over all agents; sync_total = export + load_adapter "
                "(+ first generate - steady generate for vLLM: its lazy slot activation); "
                "hf: push_adapters, as the pipeline's time/sync",
        "vllm": __import__("vllm").__version__ if engine is not None else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    print(json.dumps(report, indent=2))
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "adapter_sync.json").write_text(json.dumps(report, indent=2))
    if engine is not None:
        engine.close()


if __name__ == "__main__":
    main()
