"""Memory and time of the old-log-prob pass and of one training step (issue: log-prob memory).

    python benchmarks/logprob_memory.py                 # GPU: Qwen3-0.6B shape, random bf16
    python benchmarks/logprob_memory.py --tiny          # CPU smoke check (seconds)

A Qwen3-0.6B-shaped model (vocabulary 151,936) with random bf16 weights, ``--agents`` agents with
LoRA r=32 on all 7 projections, ``--rows`` rows of ``--tokens`` tokens split evenly among the
agents: a prompt of ``--prompt`` ± 20 tokens, the rest is the response. Measured, each after one
untimed warm-up:
  old_logprob   the trainer's no-grad pass over every row (each row through its own agent),
  train_step    one MultiAgentTrainer.train_step (PPO loss, KL to the reference, entropy
                metric; ``--micro`` rows per forward/backward) on rows with old and reference
                log-probs already filled in.
Peak memory is ``torch.cuda.max_memory_allocated`` over the measured call, minus what was
allocated before it. (The "before" rows of benchmarks/README.md were measured by an earlier
version of this script that also drove the older, unchunked API.)
Prints one JSON object; writes it to ``$OUT/logprob_memory[_<label>].json`` when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

QWEN3_06B = dict(
    vocab_size=151936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, intermediate_size=3072, max_position_embeddings=40960,
    rope_theta=1_000_000.0, tie_word_embeddings=True,
)
TINY = dict(
    vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=32, intermediate_size=128, max_position_embeddings=4096,
    tie_word_embeddings=True,
)


def build(args):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from roll.batch import TrajectoryBatch
    from roll.multi_agent.config import AgentConfig, LoRAConfig, OptimConfig, TrainerConfig
    from roll.multi_agent.model import MultiAgentLoRAModel
    from roll.multi_agent.trainer import MultiAgentTrainer

    device = torch.device(args.device)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    torch.manual_seed(0)
    with device:
        base = Qwen3ForCausalLM(Qwen3Config(**(TINY if args.tiny else QWEN3_06B))).to(dtype)
    lora = LoRAConfig(rank=32, alpha=32)
    agents = [AgentConfig(f"agent_{i}", lora=lora, optim=OptimConfig(lr=1e-5))
              for i in range(args.agents)]
    model = MultiAgentLoRAModel(base, agents, seed=0)
    trainer = MultiAgentTrainer(model, agents, TrainerConfig(micro_batch_size=args.micro,
                                                             kl_coef=0.01))
    gen = torch.Generator().manual_seed(0)
    vocab = base.config.vocab_size
    rows, tokens = args.rows, args.tokens
    input_ids = torch.randint(0, vocab, (rows, tokens), generator=gen)
    response_mask = torch.zeros(rows, tokens)
    for row in range(rows):
        prompt = args.prompt + int(torch.randint(-20, 21, (1,), generator=gen))
        response_mask[row, prompt:] = 1
    batch = TrajectoryBatch(
        input_ids=input_ids,
        attention_mask=torch.ones(rows, tokens, dtype=torch.long),
        response_mask=response_mask,
        agent_id=torch.arange(rows) % args.agents,
        advantages=torch.randn(rows, tokens, generator=gen) * response_mask,
    ).to(device)
    return model, trainer, batch


def measure(fn, device, repeats: int = 1) -> dict:
    """Seconds of ``fn`` after one warm-up call: the median of ``repeats`` timed calls (with
    their range when more than one), the warm-up's own seconds, and the peak memory above what
    was allocated before."""
    cuda = device.type == "cuda"
    start = time.perf_counter()
    fn()  # warm-up (kernels, allocator, compiles)
    if cuda:
        torch.cuda.synchronize()
    warmup = time.perf_counter() - start
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    result = {"seconds": round(statistics.median(times), 3), "warmup_seconds": round(warmup, 1)}
    if repeats > 1:
        result["range"] = [round(min(times), 3), round(max(times), 3)]
    if cuda:
        result["peak_gb"] = round((torch.cuda.max_memory_allocated() - before) / 1e9, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke check)")
    parser.add_argument("--rows", type=int, default=192)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--prompt", type=int, default=300)
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--logprob-micro", type=int, default=None,
                        help="rows per forward of the no-grad pass (default: --micro)")
    parser.add_argument("--label", default="", help="suffix of the JSON file name")
    args = parser.parse_args()
    if args.tiny:
        args.rows, args.tokens, args.prompt = 16, 64, 40
    args.device = "cpu" if args.tiny or not torch.cuda.is_available() else "cuda"
    device = torch.device(args.device)
    model, trainer, batch = build(args)
    forward_rows = args.logprob_micro or args.micro
    keywords = {"positions": batch.response_mask.bool(), "forward_rows": forward_rows}

    def old_logprob():
        return model.logprobs(batch.input_ids, batch.attention_mask, batch.agent_id, **keywords)

    filled = batch.with_fields(
        old_logprobs=old_logprob(),
        ref_logprobs=model.reference_logprobs(batch.input_ids, batch.attention_mask, **keywords),
    )
    results = {
        "api": "positions/micro-batched",
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "rows": args.rows, "tokens": args.tokens, "prompt": args.prompt,
        "agents": args.agents, "micro_batch_size": args.micro,
        "logprob_micro_batch_size": forward_rows,
        "response_tokens": int(batch.response_mask.sum()),
        "old_logprob": measure(old_logprob, device),
        "train_step": measure(lambda: trainer.train_step(filled), device),
    }
    text = json.dumps(results, indent=2)
    print(text)
    if os.environ.get("OUT"):
        name = f"logprob_memory{'_' + args.label if args.label else ''}.json"
        with open(os.path.join(os.environ["OUT"], name), "w") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
