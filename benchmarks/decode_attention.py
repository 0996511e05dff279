"""The decode step's attention alone: SDPA over the whole cache (``ring_decode_attention``, the
engine's default) against the Triton kernel that reads only the visible columns
(``roll/inference/hf/attention_kernel.py``) under several tile settings.

    python benchmarks/decode_attention.py          # GPU only (CUDA graphs replay each variant)

Qwen3-0.6B's attention shape (16 query heads over 8 kv heads of 128), bf16. Each variant runs
the 28 layers of a decode step, each on its own keys and values (so small caches do not sit in
L2 between layers), captured in a CUDA graph and replayed (``do_bench_cudagraph``), as the
compiled decode step replays it. Visible columns per lane: ``prefix`` (every lane sees the first
3/4 of the cache: lock-step ``generate`` at its mean context) or ``ring`` (each lane a random
span, wrapped: continuous serving). Bytes read are the visible keys and values; achieved
bandwidth = those bytes / time. Prints one JSON object (and writes $OUT/decode_attention.json):
per case SDPA's µs, the kernel's with its defaults, every setting tried, the best, and the
largest gap to an fp32 reference.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import emit  # noqa: E402

LAYERS, QUERY_HEADS, KV_HEADS, HEAD_DIM = 28, 16, 8, 128
CASES = ((32, 256, "prefix"), (64, 256, "prefix"), (256, 256, "prefix"), (32, 1024, "ring"),
         (64, 512, "ring"), (256, 256, "ring"))
"""(lanes, cache columns, visible pattern)."""


def visible_columns(lanes: int, columns: int, pattern: str, gen: torch.Generator) -> torch.Tensor:
    """(lanes, columns) bool: which columns each lane sees."""
    if pattern == "prefix":
        seen = torch.zeros(lanes, columns, dtype=torch.bool)
        seen[:, :columns * 3 // 4] = True
        return seen
    start = torch.randint(0, columns, (lanes,), generator=gen)
    length = torch.randint(1, columns + 1, (lanes,), generator=gen)
    offset = (torch.arange(columns)[None, :] - start[:, None]) % columns
    return offset < length[:, None]


def measure(lanes: int, columns: int, pattern: str, gen: torch.Generator, bench) -> dict:
    """One case: SDPA, the kernel with its defaults and under every setting tried (µs per
    layer), achieved bandwidth on the visible bytes, gaps to an fp32 reference."""
    from roll.inference.hf import attention_kernel as ak
    from roll.inference.hf.ring import additive_mask, ring_decode_attention

    device, dtype = torch.device("cuda"), torch.bfloat16
    scale = HEAD_DIM ** -0.5
    seen = visible_columns(lanes, columns, pattern, gen)
    mask = additive_mask(seen[:, None, None, :], dtype).to(device)  # (B, 1, 1, C)
    flat_mask = mask[:, 0, 0]
    layers = [(torch.randn(lanes, QUERY_HEADS, 1, HEAD_DIM, dtype=dtype, device=device),
               torch.randn(lanes, KV_HEADS, columns, HEAD_DIM, dtype=dtype, device=device),
               torch.randn(lanes, KV_HEADS, columns, HEAD_DIM, dtype=dtype, device=device))
              for _ in range(LAYERS)]
    live_bytes = int(seen.sum()) * KV_HEADS * HEAD_DIM * 2 * dtype.itemsize
    q, k, v = layers[0]
    exact = ring_decode_attention(None, q.float(), k.float(), v.float(), mask.float(),
                                  scaling=scale)[0][:, 0]  # (B, Hq, D)

    def sdpa():
        for q, k, v in layers:
            ring_decode_attention(None, q, k, v, mask, scaling=scale)

    def kernel(**settings):
        def run():
            for q, k, v in layers:
                ak.launch(q[:, :, 0], k, v, flat_mask, scale, **settings)
        return run

    case = {"lanes": lanes, "columns": columns, "pattern": pattern,
            "visible_share": round(float(seen.float().mean()), 4),
            "live_mb_per_layer": round(live_bytes / 1e6, 2),
            "sdpa_us": bench(sdpa),
            "sdpa_gap": float((ring_decode_attention(None, q, k, v, mask, scaling=scale)[0][:, 0]
                               .float() - exact).abs().max()),
            "kernel_default_us": bench(kernel()),
            "kernel_default_block_n": ak.block_columns(device, HEAD_DIM, dtype.itemsize),
            "kernel_gap": float((ak.launch(q[:, :, 0], k, v, flat_mask, scale).float()
                                 - exact).abs().max())}
    tried = {}
    for block_n, chunk, warps, stages, skip in itertools.product(
            (32, 64, 128), (None, 64, 128), (4, 8), (None, 2, 3), (True, False)):
        if chunk is not None and chunk % block_n:
            continue
        settings = {"block_n": block_n, "chunk": chunk, "num_warps": warps,
                    "num_stages": stages, "skip": skip}
        try:
            tried[json.dumps(settings)] = bench(kernel(**settings))
        except Exception as error:  # a setting the compiler refuses (e.g. shared memory)
            tried[json.dumps(settings)] = f"{type(error).__name__}: {str(error)[:120]}"
    timed = {key: us for key, us in tried.items() if isinstance(us, float)}
    best = min(timed, key=timed.get)
    return case | {"kernel_best": [json.loads(best), timed[best]], "kernel_all": tried,
                   "sdpa_gb_s": round(live_bytes / case["sdpa_us"] / 1e3, 1),
                   "kernel_default_gb_s": round(live_bytes / case["kernel_default_us"] / 1e3, 1),
                   "kernel_best_gb_s": round(live_bytes / timed[best] / 1e3, 1),
                   "sdpa_over_kernel_default": round(case["sdpa_us"] / case["kernel_default_us"],
                                                     3)}


def main() -> None:
    import triton
    from triton.testing import do_bench_cudagraph

    gen = torch.Generator().manual_seed(0)
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "triton": triton.__version__, "layers": LAYERS,
                    "shape": [QUERY_HEADS, KV_HEADS, HEAD_DIM], "cases": []}
    began = time.time()

    def bench(fn) -> float:
        return do_bench_cudagraph(fn, rep=40) * 1000 / LAYERS  # µs per layer

    for lanes, columns, pattern in CASES:
        case = measure(lanes, columns, pattern, gen, bench)
        result["cases"].append(case)
        best = case["kernel_best"]
        print(f"[{time.time() - began:6.1f} s] lanes {lanes} columns {columns} {pattern}: sdpa "
              f"{case['sdpa_us']:.1f} µs/layer ({case['sdpa_gb_s']} GB/s of live bytes), kernel "
              f"default {case['kernel_default_us']:.1f} ({case['kernel_default_gb_s']}), best "
              f"{best[1]:.1f} {json.dumps(best[0])}; gaps sdpa {case['sdpa_gap']:.4f} kernel "
              f"{case['kernel_gap']:.4f}", flush=True)
        torch.cuda.empty_cache()
    emit(result, "decode_attention.json")


if __name__ == "__main__":
    main()
