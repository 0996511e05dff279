"""Where a lock-step decode step's time goes: host work vs waiting for the GPU.

    python benchmarks/decode_host.py          # GPU only

Qwen3-0.6B shape, random bf16 weights, 4 agents (LoRA r 32 on all 7 projections), 128-token
prompts, 128 new tokens, greedy, batch 64 and 256; compiled ``HFEngine`` with no adapter, with
``lora_kernels='torch'`` and with ``'triton'``. ``generate`` syncs with the GPU only every 8
steps (``RowFinish.all_finished``), so per step: wall = host work + time blocked in those syncs.
Per engine (median of 5 calls, after 2 warm-up calls; the engines take turns, one call each per
round, so a drift of the machine's speed hits all alike): wall, wait (time inside the syncs) and
the host time of the ``_decode`` call (the compiled step). A decode that waits little is bound
by its host, not by its kernels. Prints JSON (and writes $OUT/decode_host.json when OUT is set).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import rollout_throughput as rt  # noqa: E402
from report import emit  # noqa: E402

from roll.distributed.roles import push_adapters
from roll.inference import GenerationRequest, SamplingParams
from roll.inference.hf import finish
from roll.pipeline.builders import hf_engine_for

NEW_TOKENS = 128


def main() -> None:
    device, dtype, shape = torch.device("cuda"), torch.bfloat16, rt.QWEN3_06B
    team = rt.build_team(shape, 32, 4, dtype, device)
    tokenizer = rt.IdTokenizer(shape["eos_token_id"], shape["pad_token_id"])
    sampling = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    gen = torch.Generator().manual_seed(0)
    clock = {"wait": 0.0, "decode": 0.0}
    all_finished = finish.RowFinish.all_finished

    def timed_all_finished(self) -> bool:
        start = time.perf_counter()
        done = all_finished(self)
        clock["wait"] += time.perf_counter() - start
        return done

    finish.RowFinish.all_finished = timed_all_finished
    result: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "engines": {}}
    for batch in (64, 256):
        prompts = torch.randint(0, shape["pad_token_id"], (batch, 128), generator=gen)
        engines, rows = {}, {}
        for name in ("no_adapter", "torch", "triton"):
            slots = [None if name == "no_adapter" else team.agent_names[r % 4]
                     for r in range(batch)]
            requests = [GenerationRequest(prompts[r].tolist(), slots[r], sampling)
                        for r in range(batch)]
            engine = hf_engine_for(team, tokenizer, max_batch_size=batch, compile=True,
                                   lora_kernels="torch" if name == "no_adapter" else name)
            if name != "no_adapter":
                push_adapters(engine, team, version=1)
            decode = engine._decode

            def timed_decode(*args, _decode=decode):
                start = time.perf_counter()
                logits = _decode(*args)
                clock["decode"] += time.perf_counter() - start
                return logits

            engine._decode = timed_decode
            for _ in range(2):
                engine.generate(requests)
            engines[name], rows[name] = (engine, requests), []
        for _ in range(5):  # rounds: every engine once, in turn
            for name, (engine, requests) in engines.items():
                clock["wait"] = clock["decode"] = 0.0
                torch.cuda.synchronize()
                start = time.perf_counter()
                engine.generate(requests)
                wall = time.perf_counter() - start
                rows[name].append({"wall_ms_per_step": 1000 * wall / NEW_TOKENS,
                                   "wait_ms_per_step": 1000 * clock["wait"] / NEW_TOKENS,
                                   "decode_call_host_ms": 1000 * clock["decode"] / (NEW_TOKENS - 1),
                                   "tok_s": batch * NEW_TOKENS / wall})
        for name, runs in rows.items():
            runs.sort(key=lambda row: row["wall_ms_per_step"])
            result["engines"][f"{batch}/{name}"] = runs[2]
            print(batch, name, runs[2], file=sys.stderr, flush=True)
        del engines, engine, decode, timed_decode
        torch.cuda.empty_cache()
    emit(result, "decode_host.json")


if __name__ == "__main__":
    main()
