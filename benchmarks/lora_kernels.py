"""The fused LoRA deltas of a decode step, per group of projections with one input: torch's
stacked products vs the tiled Triton kernel (``roll/inference/hf/lora_kernels.py``) under several
launch settings.

    python benchmarks/lora_kernels.py [--sweep stages|shipped|fused|concurrent]  # GPU only

Per group also the engine's fused base GEMM with the tiled kernel against the shrink as more
output columns of that GEMM (the stacked A factors appended to the weights) followed by
``launch_expand`` (the deltas added in place), with its settings swept. With ``--sweep fused``
instead: the GEMM and the deltas in one kernel (``roll/inference/hf/gemm_lora.py``, its
settings swept) against the base GEMM + tiled kernel. With ``--sweep concurrent``: the base
GEMM and the tiled kernel on two streams side by side (``lora_kernels.linear_lora``) against
one after the other.

Qwen3-0.6B projection shapes (hidden 1024, 16 × 128 query heads, 8 × 128 KV heads, MLP 3072),
4 slots of rank 32, rows mixed round-robin over the slots, bf16. Each variant is captured in a
CUDA graph and replayed (``triton.testing.do_bench_cudagraph``), as the compiled decode step
replays it. Prints one JSON object (and writes it to $OUT/lora_kernels.json when OUT is set):
per batch size and group (q/k/v, o, gate/up, down) the base product, the torch path (per
member: A product, row-mask multiply, B product, add), the tiled kernel with its default
settings (chunk from ``chunk_size``) and every setting tried, and per decode step (28 layers).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import emit  # noqa: E402

GROUPS = {"q/k/v": (1024, [2048, 1024, 1024]), "o": (2048, [1024]),
          "gate/up": (1024, [3072, 3072]), "down": (3072, [1024])}
"""name → (in, outs) of the Qwen3-0.6B projection groups (one per layer each)."""
LAYERS = 28
SLOTS, RANK = 4, 32
COLUMNS = SLOTS * RANK


SWEEPS = {
    # chunk, block_k, block_n, num_warps, num_stages (None: Triton's default)
    "settings": list(itertools.product((None, 256, 512, 1024, 2048, 4096), (128, 256),
                                       (128, 256), (4, 8), (None,))),
    # the shipped settings alone (the tiled kernel's figure beside the other paths)
    "shipped": [(None, 256, 256, 4, None)],
    # the same, then the GEMM and the deltas in one kernel (gemm_lora.py) instead of the
    # shrink in the GEMM
    "fused": [(None, 256, 256, 4, None)],
    # the same, then the GEMM and the tiled kernel side by side on two streams
    "concurrent": [(None, 256, 256, 4, None)],
    # the loops' software pipelining and fewer, longer loop steps over the inputs
    "stages": list(itertools.product((None, 512, 1024), (256, 512, 1024), (256,), (4, 8),
                                     (1, 2, 3, 4))),
}


FUSED_SWEEP = list(itertools.product((32, 64, 128), (64, 128), (64, 128), (4, 8), (3,)))
"""gemm_lora settings tried (block_m, block_n, block_k, num_warps, num_stages)."""


def fused_gemm(bench, x, w, a, b, blocks, splits, reference) -> dict:
    """The group's base GEMM + the tiled kernel (the engine today) against ``gemm_lora``: the
    GEMM and the deltas in one kernel, under each of ``FUSED_SWEEP``'s settings."""
    import triton

    from roll.inference.hf import gemm_lora as gl
    from roll.inference.hf import lora_kernels as lk

    order, tiles = (t.to(x.device) for t in lk.row_tiles(blocks.tolist(), SLOTS))
    d = torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype)
    out = torch.empty_like(d)
    blocks = blocks.to(torch.int32)

    def current():
        F.linear(x, w)
        lk.launch_tiled(x, a, b, order, tiles, d, RANK, COLUMNS, splits, **lk.TILED)

    swept = {}
    for block_m, block_n, block_k, warps, stages in FUSED_SWEEP:
        settings = {"block_m": block_m, "block_n": block_n, "block_k": block_k,
                    "num_warps": warps, "num_stages": stages}
        try:
            swept[json.dumps(settings)] = bench(lambda s=settings: gl.launch_gemm_lora(
                x, w, None, a, b, blocks, out, RANK, COLUMNS, splits, **s))
        except triton.runtime.errors.OutOfResources:
            continue
    best = min(swept, key=swept.get)
    fused = gl.gemm_lora(x, w, None, a, b, blocks, RANK, COLUMNS, splits)
    gap = (fused.float() - F.linear(x, w).float() - reference.float()).abs().max()
    return {"gemm_us": bench(lambda: F.linear(x, w)), "gemm_tiled_us": bench(current),
            "fused_us": bench(lambda: gl.gemm_lora(x, w, None, a, b, blocks, RANK, COLUMNS,
                                                   splits)),
            "fused_best": [json.loads(best), swept[best]], "fused_all": swept,
            "fused_gap_to_torch": float(gap)}


EXPAND = list(itertools.product((64, 128, 256), (None, 512), (2, 4, 8)))
"""Expand settings tried (block_n, chunk: None = block_n, num_warps)."""


def shrink_in_gemm(bench, x, w, a, b, order, tiles, splits, reference) -> dict:
    """The group's base weights as one GEMM (the engine's fused families), then either the
    tiled kernel (shrink and expand: the engine today; its add is fused into the next
    operation) or the GEMM over the weights with the stacked A rows appended (the shrink as
    G·C more output columns) and ``launch_expand`` adding the deltas in place."""
    import triton

    from roll.inference.hf import lora_kernels as lk

    n = w.shape[0]
    w_ext = torch.cat([w, a])
    d = torch.empty(x.shape[0], n, device=x.device, dtype=x.dtype)

    def current():
        F.linear(x, w)
        lk.launch_tiled(x, a, b, order, tiles, d, RANK, COLUMNS, splits, **lk.TILED)

    def extended(**settings):
        lk.launch_expand(F.linear(x, w_ext), b, order, tiles, RANK, COLUMNS, splits, **settings)

    swept = {}
    for block_n, chunk, warps in EXPAND:
        settings = {"block_n": block_n, "chunk": chunk, "num_warps": warps}
        try:
            swept[json.dumps(settings)] = bench(lambda s=settings: extended(**s))
        except triton.runtime.errors.OutOfResources:
            continue
    best = min(swept, key=swept.get)
    product = F.linear(x, w_ext)
    lk.launch_expand(product, b, order, tiles, RANK, COLUMNS, splits)
    gap = (product[:, :n].float() - F.linear(x, w).float() - reference.float()).abs().max()
    return {"gemm_us": bench(lambda: F.linear(x, w)), "gemm_tiled_us": bench(current),
            "gemm_shrink_us": bench(lambda: F.linear(x, w_ext)),
            "gemm_expand_us": bench(extended), "gemm_expand_best": [json.loads(best),
                                                                    swept[best]],
            "gemm_expand_all": swept, "gemm_expand_gap_to_torch": float(gap)}


def concurrent(bench, x, w, a, b, order, tiles, splits, reference) -> dict:
    """The group's base GEMM then the tiled kernel on one stream (the engine today) against
    the two on two streams side by side (``linear_lora``), each graph-captured."""
    from roll.inference.hf import lora_kernels as lk

    d = torch.empty(x.shape[0], w.shape[0], device=x.device, dtype=x.dtype)

    def current():
        F.linear(x, w)
        lk.launch_tiled(x, a, b, order, tiles, d, RANK, COLUMNS, splits, **lk.TILED)

    def carved(sms: int):
        def run():
            torch._C._set_sm_carveout_experimental(sms)  # cuBLASLt leaves `sms` SMs free
            try:
                lk.linear_lora(x, w, None, a, b, order, tiles, RANK, COLUMNS, splits)
            finally:
                torch._C._set_sm_carveout_experimental(None)
        return run

    product, delta = lk.linear_lora(x, w, None, a, b, order, tiles, RANK, COLUMNS, splits)
    torch.cuda.synchronize()
    carveouts = {str(sms): bench(carved(sms)) for sms in (8, 16, 32, 64)}
    return {"concurrent_carveout_us": carveouts, "gemm_us": bench(lambda: F.linear(x, w)),
            "gemm_tiled_us": bench(current),
            "concurrent_us": bench(lambda: lk.linear_lora(x, w, None, a, b, order, tiles, RANK,
                                                          COLUMNS, splits)),
            "concurrent_gap_to_torch": float((delta.float() - reference.float()).abs().max()),
            "concurrent_product_gap": float((product.float() - F.linear(x, w).float())
                                            .abs().max())}


def main() -> None:
    import argparse

    import triton
    from triton.testing import do_bench_cudagraph

    from roll.inference.hf import lora_kernels as lk

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", choices=sorted(SWEEPS), default="settings",
                        help="launch settings tried per group: 'settings' (chunk, block sizes, "
                             "warps), 'stages' (software pipelining, longer input steps), "
                             "'shipped' (TILED alone), 'fused' (TILED alone, then gemm_lora's "
                             "settings instead of the shrink in the GEMM), 'concurrent' (TILED "
                             "alone, then the GEMM and the tiled kernel on two streams)")
    args = parser.parse_args()
    device = torch.device("cuda")
    dtype = torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(0)
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "triton": triton.__version__, "slots": SLOTS, "rank": RANK,
                    "defaults": lk.TILED, "tile_rows": lk.TILE_ROWS, "sweep": args.sweep,
                    "batches": {}}

    def bench(fn) -> float:
        return do_bench_cudagraph(fn, rep=30) * 1000  # µs

    for batch in (64, 256):
        rows: dict = {}
        blocks = torch.arange(batch, device=device) % SLOTS
        mask = (blocks[:, None] == torch.arange(SLOTS * RANK, device=device)[None] // RANK)
        mask = mask.to(dtype)
        order, tiles = (t.to(device) for t in lk.row_tiles(blocks.tolist(), SLOTS))
        for name, (k, outs) in GROUPS.items():
            n = sum(outs)
            splits = [sum(outs[:j]) for j in range(1, len(outs))]
            x = torch.randn(batch, k, device=device, dtype=dtype, generator=gen)
            a = torch.randn(len(outs) * COLUMNS, k, device=device, dtype=dtype,
                            generator=gen) / k**0.5
            b = torch.randn(n, COLUMNS, device=device, dtype=dtype, generator=gen) / 8
            w = torch.randn(n, k, device=device, dtype=dtype, generator=gen) / k**0.5
            members = [(w[lo:lo + size], a[j * COLUMNS:(j + 1) * COLUMNS], b[lo:lo + size])
                       for j, (lo, size) in enumerate(zip([0, *splits], outs, strict=True))]
            outs_base = [F.linear(x, wj) for wj, _, _ in members]

            def torch_path(x=x, members=members, outs_base=outs_base, mask=mask):
                return [o + F.linear(F.linear(x, aj) * mask, bj)
                        for o, (_, aj, bj) in zip(outs_base, members, strict=True)]

            row = {"base_mm_us": bench(lambda x=x, members=members: [F.linear(x, wj)
                                                                     for wj, _, _ in members]),
                   "torch_us": bench(torch_path)}
            reference = torch.cat(torch_path(), dim=1) - torch.cat(outs_base, dim=1)
            d = torch.empty(batch, n, device=device, dtype=dtype)
            tiled = {}
            for chunk, block_k, block_n, warps, stages in SWEEPS[args.sweep]:
                settings = {"chunk": chunk, "block_k": block_k, "block_n": block_n,
                            "num_warps": warps, "num_stages": stages}
                try:
                    tiled[json.dumps(settings)] = bench(
                        lambda s=settings, x=x, a=a, b=b, d=d, splits=splits, o=order, t=tiles:
                        lk.launch_tiled(x, a, b, o, t, d, RANK, COLUMNS, splits, **s))
                except triton.runtime.errors.OutOfResources:  # e.g. shared memory: not a variant
                    continue
            d = lk.lora_tiled(x, a, b, order, tiles, RANK, COLUMNS, splits)
            best = min(tiled, key=tiled.get)
            row |= {"tiled_us": bench(lambda x=x, a=a, b=b, splits=splits, o=order, t=tiles:
                                      lk.lora_tiled(x, a, b, o, t, RANK, COLUMNS, splits)),
                    "tiled_chunk": lk.chunk_for(splits, lk.chunk_size(batch, k, n)),
                    "tiled_gap_to_torch": float((d.float() - reference.float()).abs().max()),
                    "tiled_best": [json.loads(best), tiled[best]], "tiled_all": tiled}
            if args.sweep == "concurrent":
                row |= concurrent(bench, x, w, a, b, order, tiles, splits, reference)
                print(f"batch {batch} {name}: GEMM then tiled {row['gemm_tiled_us']:.1f} µs, "
                      f"side by side {row['concurrent_us']:.1f}, GEMM alone "
                      f"{row['gemm_us']:.1f}, gap {row['concurrent_gap_to_torch']:.3g}, "
                      f"GEMM leaving SMs free {row['concurrent_carveout_us']}",
                      file=sys.stderr, flush=True)
            elif args.sweep == "fused":
                row |= fused_gemm(bench, x, w, a, b, blocks, splits, reference)
                print(f"batch {batch} {name}: GEMM + tiled {row['gemm_tiled_us']:.1f} µs, "
                      f"gemm_lora {row['fused_us']:.1f} (best {row['fused_best'][1]:.1f} "
                      f"{row['fused_best'][0]}), gap {row['fused_gap_to_torch']:.3g}",
                      file=sys.stderr, flush=True)
            else:
                row |= shrink_in_gemm(bench, x, w, a, b, order, tiles, splits, reference)
                print(f"batch {batch} {name}: fused GEMM + tiled {row['gemm_tiled_us']:.1f} "
                      f"µs, GEMM with the A rows + expand {row['gemm_expand_us']:.1f} (best "
                      f"{row['gemm_expand_best'][1]:.1f} {row['gemm_expand_best'][0]})",
                      file=sys.stderr, flush=True)
            rows[name] = row
            print(f"batch {batch} {name}: base {row['base_mm_us']:.1f} µs, torch LoRA "
                  f"{row['torch_us']:.1f}, tiled {row['tiled_us']:.1f} (chunk "
                  f"{row['tiled_chunk']}), best {tiled[best]:.1f} {best}", file=sys.stderr,
                  flush=True)
        fused = args.sweep == "fused"
        keys = {"fused": ("fused_us",), "concurrent": ("concurrent_us",)}.get(
            args.sweep, ("gemm_shrink_us", "gemm_expand_us"))
        per_step = {key: LAYERS * sum(rows[g][key] for g in rows)
                    for key in ("base_mm_us", "torch_us", "tiled_us", "gemm_us",
                                "gemm_tiled_us", *keys)}
        if args.sweep != "concurrent":
            best_key = "fused_best" if fused else "gemm_expand_best"
            per_step[f"{best_key}_us"] = LAYERS * sum(rows[g][best_key][1] for g in rows)
        per_step["tiled_best_us"] = LAYERS * sum(rows[g]["tiled_best"][1] for g in rows)
        result["batches"][str(batch)] = {"per_step_us": per_step, "projections": rows}
        print(f"batch {batch} per step (µs): {json.dumps(per_step)}", file=sys.stderr, flush=True)
    emit(result, "lora_kernels.json")


if __name__ == "__main__":
    main()
