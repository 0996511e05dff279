"""Training throughput of the multi-agent trainer: fused vs per-agent, 1 to 8 agents.

    python benchmarks/train_throughput.py            # GPU: Qwen3-0.6B shape, random bf16
    python benchmarks/train_throughput.py --tiny     # CPU smoke check (seconds)

The same rows (``--rows`` x ``--tokens``, prompt ``--prompt`` ± 20 tokens, the rest response)
are split round-robin among 1, 2, 4 and 8 agents (LoRA r=32 on all 7 projections), then for
each team and each path (fused: one forward/backward per mixed micro-batch; sequential: one
agent at a time) we time, after an untimed warm-up, the median of ``--repeats`` calls of:
  old_logprob   the no-grad pass over every row (``trainer.logprob_micro_batch_size`` rows),
  train_step    one MultiAgentTrainer.train_step (PPO loss, one optimizer step per agent).
Reported: seconds, tokens/s (all tokens of all rows), MFU = 6 * P * tokens / s / peak (P = base
parameters; the usual dense-training estimate, LoRA's own FLOPs ignored) for the train step,
peak memory, and each time relative to the 1-agent team on the same path.
``--compile`` runs the trainer with ``trainer.compile=true`` (roll/multi_agent/compiled.py) and
reports each team's warm-up seconds and compiled graphs; on CUDA its micro-batches are then
replayed from captured graphs (``trainer.capture``'s default; ``--capture off`` for the
launches without, ``on`` runs the captured path's padded step on a CPU too). ``--profile TOP``
adds one profiled train step per point (kernel launches, GPU busy fraction, the TOP
operators by GPU time).
Prints one JSON object; writes $OUT/train_throughput.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from batches import synthetic_batch  # noqa: E402
from logprob_memory import QWEN3_06B, TINY, measure  # noqa: E402
from report import emit  # noqa: E402

PEAK_FLOPS = {"H200": 989e12, "H100": 989e12}
"""Dense bf16 peak (no sparsity) of the GPUs we run on."""


def profile_step(step, top: int) -> dict:
    """One call of ``step`` under torch.profiler: kernels launched, their summed GPU time
    against the call's wall time (a GPU busy well under 100% is launch- or host-bound), and
    the ``top`` operators by their own GPU time."""
    import time

    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.key_averages()

    def own_gpu_us(event) -> float:
        return float(getattr(event, "self_device_time_total", 0.0))

    kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
    gpu_s = sum(own_gpu_us(e) for e in kernels) / 1e6

    def entries(key) -> list[dict]:
        return [{"name": e.key[:80], "calls": e.count,
                 "self_gpu_ms": round(own_gpu_us(e) / 1e3, 2),
                 "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2)}
                for e in sorted(events, key=key, reverse=True)[:top]]

    result = {
        "wall_s": round(wall, 3), "kernel_launches": sum(e.count for e in kernels),
        "kernel_gpu_s": round(gpu_s, 3), "gpu_busy": round(gpu_s / wall, 3) if cuda else None,
        "top": entries(own_gpu_us if cuda else lambda e: e.self_cpu_time_total),
    }
    if cuda:  # where the host's time goes (a step with the GPU idle is bound by this)
        result["top_host"] = entries(lambda e: e.self_cpu_time_total)
    # the project's own ranges (roll.utils.stages.profiled): host time inside each, and the
    # GPU time of the kernels launched inside it
    result["ranges"] = {e.key: {"calls": e.count,
                                "host_ms": round(e.cpu_time_total / 1e3, 2),
                                "gpu_ms": round(float(getattr(e, "device_time_total", 0.0))
                                                / 1e3, 2)}
                        for e in events if e.key.startswith("roll.")}
    return result


def frozen_base(tiny: bool, device: torch.device):
    """A Qwen3 base of random weights (seed 0), frozen: the 0.6B shape in bf16, or (``tiny``)
    the tiny shape in fp32."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    with device:
        base = Qwen3ForCausalLM(Qwen3Config(**(TINY if tiny else QWEN3_06B)))
    base = base.to(torch.float32 if tiny else torch.bfloat16).eval()
    for param in base.parameters():
        param.requires_grad_(False)
    return base


def run(args, num_agents: int, fused: bool, base, batch) -> dict:
    from roll.multi_agent.config import AgentConfig, LoRAConfig, OptimConfig, TrainerConfig
    from roll.multi_agent.model import MultiAgentLoRAModel
    from roll.multi_agent.trainer import MultiAgentTrainer

    agents = [AgentConfig(f"agent_{i}", lora=LoRAConfig(rank=32, alpha=32),
                          optim=OptimConfig(lr=1e-5)) for i in range(num_agents)]
    model = MultiAgentLoRAModel(base, agents, seed=0)
    if base.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    config = TrainerConfig(micro_batch_size=args.micro, fused=fused, compile=args.compile,
                           capture={"auto": None, "on": True, "off": False}[args.capture])
    if args.compile:
        torch._dynamo.reset()  # each team compiles afresh: its warm-up and graphs are its own
    trainer = MultiAgentTrainer(model, agents, config)
    batch = batch.with_fields(agent_id=torch.arange(len(batch), device=batch.input_ids.device)
                              % num_agents)
    keywords = dict(positions=batch.response_mask.bool(), forward_rows=config.forward_rows)

    def old_logprob():
        return model.logprobs(batch.input_ids, batch.attention_mask, batch.agent_id, **keywords)

    from roll.utils.stages import stage

    team = f"{num_agents} agent(s), fused={fused}, compile={args.compile}"
    with stage(f"{team}: old-log-prob pass (first call compiles when on)"):
        filled = batch.with_fields(old_logprobs=old_logprob())
    result = {"agents": num_agents, "fused": fused}
    with stage(f"{team}: old-log-prob pass timed"):
        result["old_logprob"] = measure(old_logprob, batch.input_ids.device, args.repeats)
    with stage(f"{team}: train step timed (its warm-up compiles when on)"):
        result["train_step"] = measure(lambda: trainer.train_step(filled),
                                       batch.input_ids.device, args.repeats)
    if args.compile:
        from roll.utils.recompiles import compile_count

        result["compiled_graphs"] = compile_count()  # after warm-ups AND timed calls
    captured = trainer.captured
    result["captured"] = captured is not None
    if captured is not None:  # trainer.capture: graphs recorded, their seconds, runs without
        result.update(graphs=captured.captures, capture_s=round(captured.capture_s, 2),
                      uncaptured_micro_batches=captured.uncaptured)
    if base.device.type == "cuda":  # the train step's peak_gb counts from after its warm-up,
        # which holds a captured graph's memory: the whole team's peak is this one
        result["max_reserved_gb"] = round(torch.cuda.max_memory_reserved() / 1e9, 2)
    if args.profile:
        result["profile"] = profile_step(lambda: trainer.train_step(filled), args.profile)
    # Remove this team's hooks and adapters from the shared base before the next team is built.
    model.disable_compile()
    base_model = model.peft_model.unload()
    assert base_model is base
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed calls per point after the warm-up (the median is reported)")
    parser.add_argument("--profile", type=int, default=0, metavar="TOP",
                        help="also profile one train step per point; report the TOP operators")
    parser.add_argument("--compile", action="store_true",
                        help="trainer.compile=true: compiled decoder layers, gated LoRA rows")
    parser.add_argument("--capture", choices=["auto", "on", "off"], default="auto",
                        help="trainer.capture: auto (the default: on with --compile on CUDA), "
                             "on, off")
    parser.add_argument("--paths", nargs="+", default=["fused", "sequential"],
                        choices=["fused", "sequential"])
    args = parser.parse_args()
    if args.tiny:
        args.rows, args.tokens, args.prompt = 16, 64, 32
    device = torch.device("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    base = frozen_base(args.tiny, device)
    params = sum(p.numel() for p in base.parameters())
    rows, tokens = args.rows, args.tokens
    batch = synthetic_batch(rows, tokens, args.prompt, base.config.vocab_size,
                            torch.zeros(rows, dtype=torch.long)).to(device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    results = []
    for fused in [path == "fused" for path in args.paths]:
        for num_agents in args.agents:
            entry = run(args, num_agents, fused, base, batch)
            seconds = entry["train_step"]["seconds"]
            entry["train_tokens_per_s"] = round(rows * tokens / seconds)
            if peak:
                entry["train_mfu"] = round(6 * params * rows * tokens / seconds / peak, 4)
            results.append(entry)
            print(json.dumps(entry), flush=True)
    for entry in results:
        one = next(e for e in results if e["agents"] == args.agents[0]
                   and e["fused"] == entry["fused"])
        for phase in ("old_logprob", "train_step"):
            entry[phase]["vs_first_team"] = round(
                entry[phase]["seconds"] / one[phase]["seconds"], 3)
    summary = {"device": name, "torch": torch.__version__, "base_params": params,
               "rows": rows, "tokens": tokens, "prompt": args.prompt,
               "micro_batch_size": args.micro, "compile": args.compile,
               "capture": args.capture, "results": results}
    emit(summary, "train_throughput.json")


if __name__ == "__main__":
    main()
