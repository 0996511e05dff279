"""Run by test_lora_kernels.py and test_attention_kernel.py in a process started with
TRITON_INTERPRET=1 (Triton's CPU interpreter must be chosen before triton is imported): the
LoRA kernels against a hand-written loop, the hf engine with ``lora_kernels='triton'`` against
``'torch'``, the blocked token picker against ``pick_tokens``; or (``attention``) the decode
attention kernel against SDPA. Prints one JSON object."""

from __future__ import annotations

import json
import sys

import torch

from roll.distributed.roles import push_adapters
from roll.inference import GenerationRequest, SamplingParams
from roll.inference.hf import lora_kernels
from roll.models import load_tokenizer
from roll.pipeline.builders import hf_engine_for

from .helpers import chat_prompts, perturbed_team, picker_inputs


def kernel_gaps() -> dict:
    """A group of 3 members (outputs 48, 32, 16) over 3 slots of rank capacity 8 (slot 1 has
    rank 5: zero-padded rows and columns), 20 rows: slot 1, slot 0, a base row (block −1),
    then 17 rows of slot 2 (two tiles). Chunks of 16 output columns (the largest power of two
    dividing the splits) and of 8 (several programs per member). Reference: the formulas of
    lora_kernels.py as plain loops."""
    gen = torch.Generator().manual_seed(0)
    slots, rank, k, outs = 3, 8, 40, (48, 32, 16)
    columns = slots * rank
    a = torch.randn(len(outs) * columns, k, generator=gen)
    b = torch.randn(sum(outs), columns, generator=gen)
    for member in range(len(outs)):
        a[member * columns + rank + 5: member * columns + 2 * rank] = 0
    b[:, rank + 5: 2 * rank] = 0
    blocks = [1, 0, -1] + [2] * 17
    order, tiles = lora_kernels.row_tiles(blocks, slots)
    x = torch.randn(len(blocks), k, generator=gen)
    splits = [outs[0], outs[0] + outs[1]]
    tiled = [lora_kernels.lora_tiled(x, a, b, order, tiles, rank, columns, splits)]
    tiled.append(torch.empty_like(tiled[0]))
    lora_kernels.launch_tiled(x, a, b, order, tiles, tiled[1], rank, columns, splits,
                              **lora_kernels.TILED, chunk=8, num_stages=1)
    expected = torch.zeros(len(x), sum(outs))
    for m, block in enumerate(blocks):
        if block < 0:
            continue
        start = 0
        for member, n in enumerate(outs):
            h = [sum(float(a[member * columns + block * rank + r, i]) * float(x[m, i])
                     for i in range(k)) for r in range(rank)]
            for col in range(start, start + n):
                expected[m, col] = sum(float(b[col, block * rank + r]) * h[r]
                                       for r in range(rank))
            start += n
    # the expand half alone, its shrink in the product's last columns (a GEMM over the base
    # weight with the stacked A factors appended), added into the base outputs in place
    n = sum(outs)
    w = torch.randn(n, k, generator=gen)
    product = torch.cat([x @ w.T, x @ a.T], dim=1)
    before = product.clone()
    lora_kernels.launch_expand(product, b, order, tiles, rank, columns, splits, block_n=16,
                               chunk=8)
    # the base product and the deltas side by side (linear_lora: two streams on CUDA; here one
    # after the other), with a bias
    bias = torch.randn(n, generator=gen)
    both, delta = lora_kernels.linear_lora(x, w, bias, a, b, order, tiles, rank, columns, splits)
    base = torch.tensor([[sum(float(w[col, i]) * float(x[m, i]) for i in range(k))
                          + float(bias[col]) for col in range(n)] for m in range(len(x))])
    return {"gaps": [float((d - expected).abs().max()) for d in tiled],
            "linear_lora_gaps": [float((both - base).abs().max()),
                                 float((delta - expected).abs().max())],
            "expand_gap": float((product[:, :n] - before[:, :n] - expected).abs().max()),
            "expand_kept_shrink": bool(torch.equal(product[:, n:], before[:, n:])),
            "expand_base_row_kept": bool(torch.equal(product[2], before[2])),
            "base_row_zero": all(bool((d[2] == 0).all()) for d in tiled),
            "order": order.tolist(), "tiles": tiles.tolist(),
            "delta_size": float(expected.abs().max())}


def gemm_lora_gaps() -> dict:
    """gemm_lora.py: a family of 3 members (outputs 32, 16, 16) over 3 slots of rank 8 (slot
    capacity 24 columns, padded to 32 in the kernel), 21 inputs of 40: rows of slots 0-2 and two
    without adapter (block −1). Launched with the default settings (one tile of rows; columns in
    tiles of 16, the largest power of two dividing the splits) and with tiles of 16 rows and 16
    inputs (two row tiles, three input steps, the last short), with a bias. Reference: the
    formulas of gemm_lora.py as plain loops."""
    from roll.inference.hf.gemm_lora import FUSED, gemm_lora, launch_gemm_lora

    gen = torch.Generator().manual_seed(1)
    slots, rank, k, outs = 3, 8, 40, (32, 16, 16)
    columns, n = slots * rank, sum(outs)
    blocks = [0, 2, -1, 1, 1, 2, 0, -1] + [m % slots for m in range(13)]
    x = torch.randn(len(blocks), k, generator=gen)
    w = torch.randn(n, k, generator=gen)
    bias = torch.randn(n, generator=gen)
    a = torch.randn(len(outs) * columns, k, generator=gen)
    b = torch.randn(n, columns, generator=gen)
    splits = [outs[0], outs[0] + outs[1]]
    rows = torch.tensor(blocks)
    fused = gemm_lora(x, w, None, a, b, rows, rank, columns, splits)
    tiled = torch.empty_like(fused)
    launch_gemm_lora(x, w, bias, a, b, rows.to(torch.int32), tiled, rank, columns, splits,
                     **(FUSED | {"block_m": 16, "block_k": 16, "num_stages": 1}))
    base = torch.zeros(len(blocks), n)
    delta = torch.zeros(len(blocks), n)
    member_of = [0] * outs[0] + [1] * outs[1] + [2] * outs[2]
    for m, block in enumerate(blocks):
        for col in range(n):
            base[m, col] = sum(float(w[col, i]) * float(x[m, i]) for i in range(k))
        if block < 0:
            continue
        for col in range(n):
            j = member_of[col]
            h = [sum(float(a[j * columns + block * rank + r, i]) * float(x[m, i])
                     for i in range(k)) for r in range(rank)]
            delta[m, col] = sum(float(b[col, block * rank + r]) * h[r] for r in range(rank))
    return {"gap": float((fused - base - delta).abs().max()),
            "gap_tiles_bias": float((tiled - base - delta - bias).abs().max()),
            "base_rows_gap": float((fused[[2, 7]] - base[[2, 7]]).abs().max()),
            "delta_size": float(delta.abs().max())}


VARIANTS = {"torch": {"lora_kernels": "torch"}, "triton": {"lora_kernels": "triton"},
            "streams": {"lora_kernels": "triton_streams"},
            "streams_fused": {"lora_kernels": "triton_streams", "fuse_projections": True}}
"""Engines compared with the torch path: the tiled kernel after each group's base product, and
beside it (``triton_streams``: lora_kernels.linear_lora; here one after the other), with
q/k/v and gate/up as separate products or as one per family."""


def engine_gaps(path: str) -> dict:
    """Greedy mixed batches (every agent and the base model), lock-step and continuous: the
    torch path vs the Triton tiled kernel (``VARIANTS``)."""
    team = perturbed_team(path, 4)
    tokenizer = load_tokenizer(path)
    engines = {}
    for variant, options in VARIANTS.items():
        engines[variant] = hf_engine_for(team, tokenizer, **options)
        push_adapters(engines[variant], team, version=1)
    calls = {"tiled": 0, "linear": 0}
    for name in calls:
        op = getattr(lora_kernels, f"{name}_lora" if name == "linear" else f"lora_{name}")

        def counted(*args, _op=op, _name=name):
            calls[_name] += 1
            return _op(*args)
        setattr(lora_kernels, f"{name}_lora" if name == "linear" else f"lora_{name}", counted)

    sampling = SamplingParams(temperature=0.0, max_new_tokens=4)
    # Short prompts of unequal lengths (Triton's interpreter runs ~1 ms per program instance).
    prompts = [prompt[-6 - i:] for i, prompt in enumerate(chat_prompts(path))]
    slots = [*team.agent_names, None]
    requests = [GenerationRequest(prompts[i], slots[i], sampling) for i in range(5)]
    result: dict = {"kernels": {k: e.fused.kernels for k, e in engines.items()}}
    outputs, served, calls_of = {}, {}, {}
    for variant, engine in engines.items():
        before = dict(calls)
        outputs[variant] = engine.generate(requests)
        served[variant] = {}

        def follow(key, output, _store=served[variant]):
            _store[key] = output
            return []
        engine.serve(requests[:3], follow)
        calls_of[variant] = {name: calls[name] - before[name] for name in calls}
    result["calls"] = calls_of
    for variant in VARIANTS.keys() - {"torch"}:
        pairs = list(zip(outputs["torch"], outputs[variant], strict=True))
        pairs += [(served["torch"][key], served[variant][key]) for key in range(3)]
        result[variant] = {
            "tokens_equal": all(a.token_ids == b.token_ids for a, b in pairs),
            "logprob_gap": max(max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs,
                                                              strict=True)) for a, b in pairs)}

    # A member called before its group's first one (k before q) computes its own delta.
    x = torch.randn(len(requests), 1, team.base_model.config.hidden_size,
                    generator=torch.Generator().manual_seed(1))
    alone = {}
    for variant, engine in engines.items():
        engine.fused.set_rows([r.adapter for r in requests])
        attention = engine.model.get_submodule("model.layers.0.self_attn")
        with engine.fused.active(), torch.no_grad():
            alone[variant] = attention.k_proj(x)
    result["out_of_order_gap"] = max(float((alone["torch"] - alone[variant]).abs().max())
                                     for variant in VARIANTS.keys() - {"torch"})
    result["out_of_order_delta"] = float(
        (alone["torch"] - attention.k_proj.base_layer(x)).abs().max())
    groups = engines["triton"].fused.groups.values()
    result["groups"] = sorted({group.size for group, _ in groups})
    return result


TILINGS = {
    "one_chunk_skip": {"block_n": 32, "skip": True},
    "chunks_of_32": {"block_n": 32, "chunk": 32},  # 3 chunks, the third one short
    "chunks_of_16_skip": {"block_n": 16, "chunk": 16, "skip": True},
    "chunks_of_48": {"block_n": 16, "chunk": 48},  # 2 chunks
}
"""Tile settings of ``attention_kernel.launch`` besides the op's defaults (one chunk of
128-column blocks): split chunks combined by the second kernel, hidden blocks skipped."""


def attention_gaps(path: str) -> dict:
    """The Triton ring attention against ``ring_decode_attention`` (SDPA): lanes whose visible
    columns are a prefix, a ring wrapped around, one column, and none; query heads per kv head
    2 and 3 (padded to 4), head dims 32 and 24 (padded); hidden columns filled with NaN (a
    kernel that read them would return NaN), with the op's tiles and each of ``TILINGS``.
    Then the tiny model's engine, lock-step and
    continuous, with each attention kernel."""
    from roll.inference.hf.attention_kernel import launch, ring_attention
    from roll.inference.hf.ring import additive_mask, ring_decode_attention

    gen = torch.Generator().manual_seed(0)
    columns = 80  # blocks of 32: 0-31, 32-63, 64-79
    visible = torch.zeros(5, columns, dtype=torch.bool)
    visible[0, :50] = True  # a prefix: the third block unread
    visible[1, 70:] = True  # a wrapped ring: the end ...
    visible[1, :5] = True  # ... and the start; the middle block unread
    visible[2, 40] = True  # one column
    visible[3, 10:74] = True
    # lane 4 sees nothing
    result: dict = {"cases": []}
    for query_heads, kv_heads, head_dim in ((4, 2, 32), (6, 2, 24)):
        q = torch.randn(5, query_heads, 1, head_dim, generator=gen)
        k = torch.randn(5, kv_heads, columns, head_dim, generator=gen)
        v = torch.randn(5, kv_heads, columns, head_dim, generator=gen)
        mask = additive_mask(visible[:, None, None, :], torch.float32)  # (5, 1, 1, C)
        expected = ring_decode_attention(None, q, k, v, mask, scaling=0.3)[0][:, 0]  # (5, Hq, D)
        poisoned_k, poisoned_v = k.clone(), v.clone()
        hidden = ~visible[:, None, :, None].expand_as(k)
        poisoned_k[hidden], poisoned_v[hidden] = float("nan"), float("nan")
        outs = {"op": ring_attention(q[:, :, 0], poisoned_k, poisoned_v, mask[:, 0, 0], 0.3)}
        for name, settings in TILINGS.items():
            outs[name] = launch(q[:, :, 0], poisoned_k, poisoned_v, mask[:, 0, 0], 0.3,
                                **settings)
        result["cases"].append({
            "shape": [query_heads, kv_heads, head_dim],
            "gap": {name: float((got[:4] - expected[:4]).abs().max())
                    for name, got in outs.items()},
            "size": float(expected[:4].abs().max()),
            "blind_lane_zero": {name: bool((got[4] == 0).all()) for name, got in outs.items()},
            "finite": {name: bool(torch.isfinite(got).all()) for name, got in outs.items()}})

    from roll.inference.hf import attention_kernel

    calls = {"sdpa": 0, "triton": 0}
    kernel_op = attention_kernel.ring_attention

    def counted(*args):
        calls[current] += 1
        return kernel_op(*args)
    attention_kernel.ring_attention = counted
    team = perturbed_team(path, 3)
    tokenizer = load_tokenizer(path)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=4)
    prompts = [prompt[-6 - i:] for i, prompt in enumerate(chat_prompts(path))]
    slots = [*team.agent_names, None]
    requests = [GenerationRequest(prompts[i], slots[i], sampling) for i in range(4)]
    outputs = {}
    for kernel in ("sdpa", "triton"):
        current = kernel
        engine = hf_engine_for(team, tokenizer, lora_kernels="torch", attention_kernel=kernel)
        push_adapters(engine, team, version=1)
        served = {}

        def follow(key, output, _store=served):
            _store[key] = output
            return []
        engine.serve(requests, follow)
        outputs[kernel] = engine.generate(requests) + [served[key] for key in range(4)]
    pairs = list(zip(outputs["sdpa"], outputs["triton"], strict=True))
    result["engine"] = {
        "kernel_calls": calls,
        "tokens_equal": all(a.token_ids == b.token_ids for a, b in pairs),
        "logprob_gap": max(max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs, strict=True))
                           for a, b in pairs)}
    return result


def picker_gaps() -> dict:
    """``picker_kernel.pick_tokens_blocked`` against ``sampling.pick_tokens``: 37 rows over 301
    tokens in blocks of 128 (3 blocks, the last short), greedy rows at temperature 1, then
    sampled rows among greedy ones at temperatures 0.5-1.5, with and without a constraint that
    forbids about half of the tokens; and a row whose largest logit appears twice, in two
    blocks (the first must win, as ``torch.argmax``)."""
    from roll.inference.hf.picker_kernel import blocked_picker, pick_tokens_blocked
    from roll.inference.hf.sampling import pick_tokens

    inputs = picker_inputs()
    rows = inputs["logits"].shape[0]
    logits, temperature, sampled, keys, steps, vocab_keys, masked = (
        inputs[key] for key in ("logits", "temperature", "sampled", "keys", "steps",
                                "vocab_keys", "masked"))
    logits[5, 40] = logits[5, 200] = 9.0  # a tie across blocks 0 and 1
    cases = {"greedy": (logits, torch.ones(rows, 1), None, keys, steps, vocab_keys),
             "sampled": (logits, temperature, sampled, keys, steps, vocab_keys),
             "sampled_masked": (logits, temperature, sampled, keys, steps, vocab_keys, masked),
             "greedy_masked": (logits, temperature, None, keys, steps, vocab_keys, masked)}
    result = {}
    for name, args in cases.items():
        want_tokens, want_logprobs = pick_tokens(*args)
        tokens, logprobs = pick_tokens_blocked(*args, block=128)
        result[name] = {"tokens_equal": bool(torch.equal(tokens, want_tokens)),
                        "logprob_gap": float((logprobs - want_logprobs).abs().max()),
                        "drew": bool((want_tokens != logits.float().argmax(-1)).any())}
    result["tie_token"] = int(pick_tokens_blocked(*cases["greedy"], block=128)[0][5])
    # the engine's picker on CUDA: rows that filter go to the picker it is given, others to the
    # kernels (the default block: one short block a row here)
    filtered_calls = []

    def filtered(*args):
        filtered_calls.append(len(args))
        return pick_tokens(*args)

    picker = blocked_picker(filtered)
    top_k, top_p = torch.full((rows,), 5), torch.full((rows,), 0.9)
    unfiltered = [torch.equal(picker(*args)[0], pick_tokens(*args)[0]) for args in cases.values()]
    calls_before = len(filtered_calls)
    with_filters = (*cases["sampled"], None, top_k, top_p)
    result["routing"] = {"unfiltered_equal": all(unfiltered), "calls_before": calls_before,
                         "filtered_equal": bool(torch.equal(picker(*with_filters)[0],
                                                            pick_tokens(*with_filters)[0])),
                         "calls_after": len(filtered_calls)}
    return result


if __name__ == "__main__":
    if sys.argv[2:] == ["attention"]:
        print(json.dumps(attention_gaps(sys.argv[1])))
    else:
        print(json.dumps({"kernel": kernel_gaps(), "engine": engine_gaps(sys.argv[1]),
                          "picker": picker_gaps(), "gemm_lora": gemm_lora_gaps()}))
