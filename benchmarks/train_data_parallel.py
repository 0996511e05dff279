"""Data-parallel training throughput: k ranks vs one, at the same rows per rank.

    python benchmarks/train_data_parallel.py --world_sizes 1 2     # GPUs: one rank per GPU, NCCL
    python benchmarks/train_data_parallel.py --tiny                # CPU smoke check (gloo)

Each rank is a process (torch.multiprocessing) running roll's MultiAgentTrainer with the
TorchDistributedSync that ``cluster.backend=ray`` ranks use (roll/distributed/data_parallel.py):
every rank holds the Qwen3-0.6B-shaped base (random bf16) with 4 agents (LoRA r 32 on all 7
projections), gets the whole batch of ``--rows`` x world_size rows (``--tokens`` each, agents
round-robin), forwards its share and sums gradients with the others. Timed: one train_step after
an untimed warm-up (median of ``--repeats``). Reported per world size: seconds, tokens/s over
all ranks, the speed-up over one rank (goal: >= 1.8x on 2 GPUs), rank 0's peak memory and the
parameter elements it holds at rest. ``--strategy deepspeed --zero_stage 2|3`` runs the
DeepSpeed trainer instead (ZeRO-3: each rank holds 1/k of the parameters). Prints one JSON object;
writes $OUT/train_data_parallel.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from batches import synthetic_batch  # noqa: E402
from logprob_memory import QWEN3_06B  # noqa: E402

SHAPES = {
    "0.6b": QWEN3_06B,
    # Llama-3-70B's width (hidden 8192, MLP 28672, 64 heads, 8 KV heads) at 56 layers, a 32k
    # vocabulary: 48.4 B parameters, 96.9 GB in bf16, more than one 80 GB H100 holds.
    "large": dict(vocab_size=32000, hidden_size=8192, num_hidden_layers=56,
                  num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                  intermediate_size=28672, max_position_embeddings=4096,
                  tie_word_embeddings=False),
}
from report import emit  # noqa: E402


def count_leaf_walks(step, leaf_types: list[type]) -> int:
    """Calls during ``step()`` that walk the modules inside a module of ``leaf_types``
    (``named_parameters`` or ``named_buffers`` with ``recurse=True`` on a leaf itself)."""
    from torch import nn

    walks = 0

    def counting(self, *args, **kwargs):
        nonlocal walks
        recurse = kwargs.get("recurse", args[2] if len(args) > 2 else True)
        walks += bool(recurse)
        return nn.Module._named_members(self, *args, **kwargs)

    for leaf_type in leaf_types:
        assert "_named_members" not in vars(leaf_type), leaf_type  # nn.Module's, restored below
        leaf_type._named_members = counting
    try:
        step()
    finally:
        for leaf_type in leaf_types:
            del leaf_type._named_members
    return walks


def gathered_peak(step, model) -> float:
    """The most frozen base weight elements ZeRO-3 held in memory at once during ``step()``,
    in decoder layers (one layer's base weights = 1), sampled after every module's forward and
    around every module's backward: the weights gathered now, plus the storage of weights
    released since whose data autograd still holds for the backward (a view saved by torch's
    linear keeps a released weight's memory alive: roll/distributed/zero3_memory.py). Weights
    kept whole on every rank (``ds_persist``) are not counted: never gathered or released."""
    import weakref

    from torch import nn

    base = [p for p in model.parameters()
            if hasattr(p, "ds_numel") and not p.requires_grad and not p.ds_persist]
    first_layer = model.base_model.get_decoder().layers[0]
    layer = sum(int(p.ds_numel) for p in first_layer.parameters() if not p.requires_grad)
    held: list[weakref.ref] = []  # tensors autograd saved that shared a gathered weight's data
    peak = 0

    def pack(tensor):
        gathered = {p.data.untyped_storage().data_ptr() for p in base if p.data.numel()}
        if tensor.numel() and tensor.untyped_storage().data_ptr() in gathered:
            held.append(weakref.ref(tensor))
        return tensor

    def census(*unused) -> None:
        nonlocal peak
        storages = {p.data.untyped_storage().data_ptr(): p.data.numel() for p in base}
        for ref in held:  # a released weight's old data, still saved: counted once
            tensor = ref()
            if tensor is not None and tensor.numel():
                storage = tensor.untyped_storage()
                storages.setdefault(storage.data_ptr(), storage.nbytes() // tensor.element_size())
        peak = max(peak, sum(storages.values()))

    handles = [nn.modules.module.register_module_forward_hook(census),
               nn.modules.module.register_module_full_backward_pre_hook(census),
               nn.modules.module.register_module_full_backward_hook(census)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            step()
    finally:
        for handle in handles:
            handle.remove()
    return round(peak / layer, 2)


def rank_main(rank: int, world_size: int, address: str, args, results) -> None:
    import torch.distributed as dist
    from logprob_memory import TINY
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from roll.distributed.data_parallel import TorchDistributedSync, init_ranks
    from roll.distributed.resident import resident_elements
    from roll.multi_agent.config import AgentConfig, LoRAConfig, OptimConfig, TrainerConfig
    from roll.multi_agent.model import MultiAgentLoRAModel
    from roll.multi_agent.strategy import TorchStrategy
    from roll.multi_agent.trainer import MultiAgentTrainer

    torch_linear = torch.nn.functional.linear
    device = torch.device("cpu" if args.tiny else f"cuda:{rank}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        os.environ["LOCAL_RANK"] = str(rank)  # DeepSpeed places its engine by it
    init_ranks(rank, world_size, address, "cpu" if args.tiny else "cuda")
    torch.manual_seed(0)
    shape = dict(TINY if args.tiny else SHAPES[args.shape])
    if args.layers:
        shape["num_hidden_layers"] = args.layers
    dtype = torch.float32 if args.tiny else torch.bfloat16
    say = (lambda text: print(f"{time.strftime('%H:%M:%S')} rank 0: {text}", flush=True)) \
        if rank == 0 else (lambda text: None)
    say(f"building the base ({args.shape}, {world_size} rank(s), {args.strategy}"
        f"{' zero ' + str(args.zero_stage) if args.strategy == 'deepspeed' else ''})")
    if args.strategy == "deepspeed" and args.zero_stage == 3:
        # Partitioned as it is built (random weights, no checkpoint): no rank ever holds the
        # whole base, which is how a base larger than one device can train (zero3_load.py).
        from transformers import AutoModelForCausalLM

        from roll.distributed.zero3_load import partitioned_construction

        with partitioned_construction("float32" if args.tiny else "bfloat16", device.type):
            base = AutoModelForCausalLM.from_config(Qwen3Config(**shape), dtype=dtype)
        base.eval()
        for param in base.parameters():
            param.requires_grad_(False)
    else:
        with device:
            base = Qwen3ForCausalLM(Qwen3Config(**shape))
        base = base.to(dtype).eval()
    base_elements = sum(int(getattr(p, "ds_numel", p.numel())) for p in base.parameters())
    say(f"base built: {base_elements / 1e9:.2f} B parameters")
    lora = LoRAConfig(rank=args.lora_rank, alpha=args.lora_rank)
    agents = [AgentConfig(f"agent_{i}", lora=lora,
                          optim=OptimConfig(lr=1e-5)) for i in range(args.agents)]
    model = MultiAgentLoRAModel(base, agents, seed=0)
    config = TrainerConfig(micro_batch_size=args.micro)
    if args.strategy == "deepspeed":
        from roll.distributed.deepspeed_strategy import PERSIST_ELEMENTS, DeepSpeedStrategy

        strategy = DeepSpeedStrategy(args.zero_stage, TorchDistributedSync(), args.live,
                                     args.gather,
                                     PERSIST_ELEMENTS if args.persist is None else args.persist)
    else:
        strategy = TorchStrategy(TorchDistributedSync() if world_size > 1 else None)
    trainer = MultiAgentTrainer(model, agents, config, strategy=strategy)
    resident = resident_elements(model)
    cuda = device.type == "cuda"
    load_peak = torch.cuda.max_memory_allocated() if cuda else None
    say(f"team and trainer built; peak so far {load_peak and load_peak / 1e9} GB")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rows, tokens = args.rows * world_size, args.tokens
    batch = synthetic_batch(rows, tokens, args.prompt, base.config.vocab_size,
                            torch.arange(rows) % args.agents).to(device)
    batch = batch.with_fields(old_logprobs=model.logprobs(
        batch.input_ids, batch.attention_mask, batch.agent_id,
        positions=batch.response_mask.bool()))

    def step() -> float:
        if world_size > 1:
            dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        trainer.train_step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    step()  # warm-up
    say("warm-up step done")
    times = [step() for _ in range(args.repeats)]
    say(f"steps: {[round(t, 2) for t in times]}")
    # ZeRO-3: how often a step walked the modules inside a leaf (DeepSpeed's fetch and release
    # ask each leaf for its parameters; deepspeed_strategy.list_leaf_parameters_once), counted
    # in one more step, untimed
    zero3 = args.strategy == "deepspeed" and args.zero_stage == 3
    leaf_walks = count_leaf_walks(step, strategy.leaf_types) if zero3 else None
    # ZeRO-3: the most base weights gathered at once in one more step (untimed): about one
    # decoder layer (plus a prefetched one) when each is released after use
    gathered = gathered_peak(step, model) if zero3 else None
    if rank == 0:
        seconds = statistics.median(times)
        base_bytes = base_elements * (4 if args.tiny else 2)
        results.put({"world_size": world_size, "strategy": args.strategy,
                     "zero_stage": args.zero_stage if args.strategy == "deepspeed" else None,
                     "gather": args.gather if args.strategy == "deepspeed" else None,
                     "live": args.live, "persist": args.persist,
                     # ZeRO-3: elements kept whole on the rank (never gathered or released)
                     "persistent_elements_rank0": sum(
                         int(param.ds_numel) for param in model.parameters()
                         if getattr(param, "ds_persist", False)),
                     "resident_params_rank0": resident, "rows_per_rank": args.rows,
                     "rows_total": rows, "rows_forwarded_rank0": trainer.rows_forwarded,
                     "seconds": round(seconds, 3), "times": [round(t, 3) for t in times],
                     "leaf_walks_per_step": leaf_walks,
                     "gathered_peak_layers_rank0": gathered,
                     "tokens_per_s": round(rows * tokens / seconds),
                     "peak_gb_rank0": round(torch.cuda.max_memory_allocated() / 1e9, 2)
                     if cuda else None,
                     "load_peak_gb_rank0": round(load_peak / 1e9, 2) if cuda else None,
                     "base_gb": round(base_bytes / 1e9, 2),
                     "base_share_gb": round(base_bytes / world_size / 1e9, 2),
                     "shape": args.shape if not args.tiny else "tiny",
                     "layers": shape["num_hidden_layers"],
                     # DeepSpeed's zero.Init may replace it for the whole process
                     "functional_linear_is_torch": torch.nn.functional.linear is torch_linear})
    if world_size > 1:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--world_sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rows", type=int, default=None, help="rows per rank (64; --tiny 8)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens a row (512; --tiny 64)")
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens (256; --tiny 32)")
    parser.add_argument("--lora_rank", type=int, default=32)
    parser.add_argument("--layers", type=int, default=None,
                        help="decoder layers, in place of the shape's (e.g. --tiny --layers 28: "
                             "the host's per-layer work of a 0.6B step at a tiny width)")
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--strategy", default="torch", choices=["torch", "deepspeed"])
    parser.add_argument("--zero_stage", type=int, default=2, choices=[2, 3])
    parser.add_argument("--shape", default="0.6b", choices=sorted(SHAPES),
                        help="the base's shape (random bf16 weights); 'large' (48.4 B parameters, "
                             "96.9 GB in bf16) does not fit one 80 GB GPU: use it with "
                             "--strategy deepspeed --zero_stage 3 on 2+ GPUs")
    parser.add_argument("--gather", default="layer", choices=["layer", "projection"],
                        help="ZeRO-3: what is gathered whole (actor_train.zero3_gather)")
    parser.add_argument("--persist", type=int, default=None,
                        help="ZeRO-3: actor_train.zero3_persist_elements (default: the config's)")
    parser.add_argument("--live", type=int, default=None,
                        help="ZeRO-3: actor_train.zero3_live_elements (default: DeepSpeed's)")
    args = parser.parse_args()
    for key, (full, tiny) in {"rows": (64, 8), "tokens": (512, 64), "prompt": (256, 32)}.items():
        if getattr(args, key) is None:
            setattr(args, key, tiny if args.tiny else full)
    from roll.distributed.data_parallel import free_port

    context = mp.get_context("spawn")
    entries = []
    for world_size in args.world_sizes:
        results = context.Queue()
        address = f"127.0.0.1:{free_port()}"
        mp.start_processes(rank_main, args=(world_size, address, args, results),
                           nprocs=world_size, join=True, start_method="spawn")
        entry = results.get(timeout=60)
        entries.append(entry)
        print(json.dumps(entry), file=sys.stderr, flush=True)
    for entry in entries:
        entry["speedup_vs_1"] = round(entry["tokens_per_s"] / entries[0]["tokens_per_s"], 3)
    name = torch.cuda.get_device_name() if torch.cuda.is_available() and not args.tiny else "cpu"
    summary = {"device": name, "gpus": torch.cuda.device_count(), "torch": torch.__version__,
               "agents": args.agents, "tokens": args.tokens, "micro_batch_size": args.micro,
               "results": entries}
    emit(summary, "train_data_parallel.json")


if __name__ == "__main__":
    main()
