"""The token picker of a decode step: the compiled ``sampling.pick_tokens`` (what the engine runs
on CUDA) against ``picker_kernel.pick_tokens_blocked`` (the vocabulary in blocks, two kernels).

    python benchmarks/picker.py          # GPU only

Qwen3's vocabulary (151,936 tokens), bf16 logits, 64 and 256 rows; greedy rows, sampled rows
(temperature 1) and sampled rows under a constraint that forbids half of the tokens (the
masked fp32 logits a constrained step passes). Each call is timed with
``triton.testing.do_bench`` (the engine calls the picker after its decode graph, not inside it),
the blocked picker at several block sizes. Per case: µs of each, the logits' bytes over the
time (GB/s), whether the tokens are equal and the largest log-prob gap. Prints one JSON object
(and writes $OUT/picker.json when OUT is set).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import emit  # noqa: E402

VOCAB = 151_936
BLOCKS = (1024, 2048, 4096, 8192)


def main() -> None:
    import triton
    from triton.testing import do_bench

    from roll.inference.hf.picker_kernel import pick_tokens_blocked
    from roll.inference.hf.sampling import _VOCAB_SALT, compiled_picker, mix32, seed_key

    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    compiled = compiled_picker()
    vocab_keys = mix32(torch.arange(VOCAB, device=device) + _VOCAB_SALT)
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "triton": triton.__version__, "vocab": VOCAB, "cases": []}
    for rows in (64, 256):
        logits = torch.randn(rows, VOCAB, device=device, generator=gen).to(torch.bfloat16)
        keys = torch.tensor([seed_key(seed) for seed in range(rows)], device=device)
        steps = torch.arange(rows, device=device) % 7
        ones = torch.ones(rows, 1, device=device)
        drawing = torch.ones(rows, dtype=torch.bool, device=device)
        masked = logits.float().masked_fill(
            torch.rand(rows, VOCAB, device=device, generator=gen) < 0.5, float("-inf"))
        cases = {"greedy": (logits, ones, None, keys, steps, vocab_keys),
                 "sampled": (logits, ones, drawing, keys, steps, vocab_keys),
                 "sampled_masked": (logits, ones, drawing, keys, steps, vocab_keys, masked)}
        for name, args in cases.items():
            want_tokens, want_logprobs = compiled(*args)
            read = logits.nbytes + (masked.nbytes if len(args) > 6 else 0)
            row = {"rows": rows, "case": name, "compiled_us": do_bench(lambda a=args: compiled(*a))
                   * 1000}
            for block in BLOCKS:
                tokens, logprobs = pick_tokens_blocked(*args, block=block)
                us = do_bench(lambda a=args, b=block: pick_tokens_blocked(*a, block=b)) * 1000
                row[f"blocked_{block}"] = {
                    "us": us, "gb_s": round(read / us / 1e3, 1),
                    "tokens_equal": float((tokens == want_tokens).float().mean()),
                    "logprob_gap": float((logprobs - want_logprobs).abs().max())}
            row["compiled_gb_s"] = round(read / row["compiled_us"] / 1e3, 1)
            result["cases"].append(row)
            best = min(BLOCKS, key=lambda b, r=row: r[f"blocked_{b}"]["us"])
            print(f"{rows} rows, {name}: compiled {row['compiled_us']:.1f} µs, blocked "
                  f"{row[f'blocked_{best}']['us']:.1f} µs (block {best})", file=sys.stderr,
                  flush=True)
    emit(result, "picker.json")


if __name__ == "__main__":
    main()
