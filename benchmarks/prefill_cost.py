"""What one admission's prefill costs the continuous hf engine, by attention backend.

Why: in the Hanabi pipeline on an H200 (benchmarks/README.md, session 65) the serve loop spent
63 ms of host time per admission of a few ~444-token prompts, against ~1 ms to launch a decode
step: admissions were 59% of the rollout's time. The prefill runs eagerly with a ready 4D
additive mask, so ``scaled_dot_product_attention`` picks its backend per call (cuDNN's, the
memory-efficient one, or the math one), and cuDNN builds an execution plan per new shape.

This times ``roll.inference.hf.prefill.prefill`` on the Qwen3-0.6B shape (random bf16 weights,
2 agents with LoRA r 32 on 7 projections) for admissions of 1-8 rows of 380-470 tokens (every
admission a new width, as in a rollout), under each backend in interleaved rounds: the host's
time in the call (launches) and the time until the device is done, medians in ms. JSON on
stdout (and ``$OUT/prefill_cost.json``).

    PYTHONPATH=$PWD python benchmarks/prefill_cost.py            # a GPU
    python benchmarks/prefill_cost.py --tiny --backends default math graphs  # CPU check
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollout_throughput import QWEN3_06B, TINY, IdTokenizer, build_team  # noqa: E402

from roll.distributed.roles import push_adapters  # noqa: E402
from roll.inference.hf.prefill import prefill  # noqa: E402
from roll.inference.hf.prefill_graphs import PrefillGraphs  # noqa: E402
from roll.pipeline.builders import hf_engine_for  # noqa: E402

BACKENDS = {
    "default": None,
    "cudnn": "CUDNN_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "math": "MATH",
    "graphs": None,
}
"""SDPA backends by name; ``graphs``: torch's own choice, each admission replayed as the CUDA
graph of its (rows, width) bucket (roll/inference/hf/prefill_graphs.py; captured the first
time a bucket is met, which the medians mostly leave out)."""


def backend_context(name: str):
    """SDPA restricted to one backend (``default``: torch's own choice per call)."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if BACKENDS[name] is None:
        return nullcontext()
    return sdpa_kernel([getattr(SDPBackend, BACKENDS[name])])


def admissions(count: int, vocab: int, seed: int) -> list[tuple[list[list[int]], list[str]]]:
    """``count`` admissions: 1-8 rows (mostly few, as in a Hanabi rollout's steady part) of
    380-470 random tokens, agents alternating."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        rows = rng.choice([1, 1, 2, 2, 3, 4, 8])
        prompts = [[rng.randrange(10, vocab - 10) for _ in range(rng.randint(380, 470))]
                   for _ in range(rows)]
        out.append((prompts, [f"agent_{i % 2}" for i in range(rows)]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny shape on the CPU")
    parser.add_argument("--admissions", type=int, default=40, help="per backend and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", nargs="*", default=list(BACKENDS))
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    shape, dtype = (TINY, torch.float32) if args.tiny else (QWEN3_06B, torch.bfloat16)
    team = build_team(shape, 32, 2, dtype, device)
    engine = hf_engine_for(team, IdTokenizer(shape["eos_token_id"], shape["pad_token_id"]),
                           device=device)
    push_adapters(engine, team, version=1)

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    graphs = {name: PrefillGraphs(engine, dtype, capture=True) if name == "graphs" else None
              for name in args.backends}
    times: dict[str, dict[str, list[float]]] = {b: {"host_ms": [], "done_ms": []}
                                                for b in args.backends}
    with engine._generation_mode():
        for name in args.backends:  # warm-up: each backend's first call (plans, allocator)
            with backend_context(name):
                prompts, agents = admissions(1, shape["vocab_size"], 0)[0]
                prefill(engine, prompts, agents, False, dtype, graphs[name])
        sync()
        for round_ in range(args.rounds):
            for name in args.backends:
                batch = admissions(args.admissions, shape["vocab_size"], 1 + round_)
                with backend_context(name):
                    for prompts, agents in batch:
                        sync()
                        start = time.perf_counter()
                        prefill(engine, prompts, agents, False, dtype, graphs[name])
                        launched = time.perf_counter()
                        sync()
                        done = time.perf_counter()
                        times[name]["host_ms"].append(1e3 * (launched - start))
                        times[name]["done_ms"].append(1e3 * (done - start))
                print(f"[{time.strftime('%H:%M:%S')}] round {round_ + 1} {name}: "
                      f"{statistics.median(times[name]['done_ms']):.1f} ms", flush=True)
        # the graphs' logits against the eager prefill's, same admissions
        gap = 0.0
        if graphs.get("graphs") is not None:
            for prompts, agents in admissions(8, shape["vocab_size"], 99):
                eager = prefill(engine, prompts, agents, False, dtype)[0].float()
                replayed = prefill(engine, prompts, agents, False, dtype,
                                   graphs["graphs"])[0].float()
                gap = max(gap, float((eager - replayed).abs().max()))
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "shape": "tiny" if args.tiny else "qwen3-0.6b",
        "admissions": args.admissions * args.rounds,
        "graphs_captured": sum(g.captures for g in graphs.values() if g is not None),
        "graphs_max_logit_gap": round(gap, 5),
        "backends": {name: {key: round(statistics.median(values), 2)
                            for key, values in figures.items()}
                     for name, figures in times.items()},
    }
    text = json.dumps(result, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "prefill_cost.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
