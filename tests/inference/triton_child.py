"""Run by test_lora_kernels.py in a process started with TRITON_INTERPRET=1 (Triton's CPU
interpreter must be chosen before triton is imported): the per-row LoRA kernels against a
hand-written loop, and the hf engine with ``lora_kernels='triton'`` against ``'torch'``.
Prints one JSON object."""

from __future__ import annotations

import json
import sys

import torch

from roll.inference import GenerationRequest, HFEngine, SamplingParams, lora_kernels, push_adapters
from roll.models import load_tokenizer

from .helpers import chat_prompts, perturbed_team


def kernel_gaps() -> dict:
    """A group of 3 members (outputs 48, 32, 16) over 3 slots of rank capacity 8 (slot 1 has
    rank 5: zero-padded rows and columns), 4 batch rows of 3 tokens each, one row on the base
    model (block -1). Reference: the formulas of lora_kernels.py as plain loops. The one-kernel
    delta runs with chunks of 16 columns (the largest power of two dividing the splits) and of
    8 (several programs per member)."""
    gen = torch.Generator().manual_seed(0)
    slots, rank, k, outs, tokens = 3, 8, 40, (48, 32, 16), 3
    columns = slots * rank
    a = torch.randn(len(outs) * columns, k, generator=gen)
    b = torch.randn(sum(outs), columns, generator=gen)
    for member in range(len(outs)):
        a[member * columns + rank + 5: member * columns + 2 * rank] = 0
    b[:, rank + 5: 2 * rank] = 0
    blocks = torch.tensor([2, -1, 0, 1], dtype=torch.int32)
    x = torch.randn(len(blocks) * tokens, k, generator=gen)
    splits = [outs[0], outs[0] + outs[1]]
    h = lora_kernels.lora_shrink(x, a, blocks, rank, columns, tokens)
    d = lora_kernels.lora_expand(h, b, blocks, rank, splits, tokens)
    one_kernel = {}
    for chunk in (1024, 8):
        lora_kernels.DELTA["chunk"] = chunk
        one_kernel[chunk] = lora_kernels.lora_delta(x, a, b, blocks, rank, columns, splits, tokens)
    lora_kernels.DELTA["chunk"] = 1024
    expected_h = torch.zeros(len(x), len(outs) * rank)
    expected_d = torch.zeros(len(x), sum(outs))
    for m in range(len(x)):
        block = int(blocks[m // tokens])
        if block < 0:
            continue
        start = 0
        for member, n in enumerate(outs):
            for r in range(rank):
                row = a[member * columns + block * rank + r]
                expected_h[m, member * rank + r] = sum(
                    float(row[i]) * float(x[m, i]) for i in range(k))
            mine = expected_h[m, member * rank:(member + 1) * rank]
            expected_d[m, start:start + n] = b[start:start + n, block * rank:(block + 1) * rank
                                               ] @ mine
            start += n
    base_rows = slice(tokens, 2 * tokens)
    return {"h_gap": float((h - expected_h).abs().max()),
            "d_gap": float((d - expected_d).abs().max()),
            "base_rows_zero": bool((d[base_rows] == 0).all() and (h[base_rows] == 0).all()),
            "one_kernel_gaps": [float((one - expected_d).abs().max())
                                for one in one_kernel.values()],
            "one_kernel_base_rows_zero": all(bool((one[base_rows] == 0).all())
                                             for one in one_kernel.values()),
            "delta_size": float(expected_d.abs().max())}


def engine_gaps(path: str) -> dict:
    """Greedy mixed batches (every agent and the base model), lock-step and continuous: the
    torch path vs the Triton one-kernel path ('triton') and two-kernel path ('triton_two')."""
    team = perturbed_team(path, 4)
    tokenizer = load_tokenizer(path)
    engines = {}
    for variant in ("torch", "triton", "triton_two"):
        engines[variant] = HFEngine(team, tokenizer, lora_kernels=variant.removesuffix("_two"))
        engines[variant].fused.one_kernel = variant == "triton"
        push_adapters(engines[variant], team, version=1)
    calls = {"shrink": 0, "expand": 0, "delta": 0}
    for name in calls:
        op = getattr(lora_kernels, f"lora_{name}")

        def counted(*args, _op=op, _name=name):
            calls[_name] += 1
            return _op(*args)
        setattr(lora_kernels, f"lora_{name}", counted)

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
    for variant in ("triton", "triton_two"):
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
    result["out_of_order_gap"] = max(float((alone["torch"] - alone[v]).abs().max())
                                     for v in ("triton", "triton_two"))
    result["out_of_order_delta"] = float(
        (alone["torch"] - attention.k_proj.base_layer(x)).abs().max())
    groups = engines["triton"].fused.groups.values()
    result["groups"] = sorted({group.size for group, _ in groups})
    return result


if __name__ == "__main__":
    print(json.dumps({"kernel": kernel_gaps(), "engine": engine_gaps(sys.argv[1])}))
