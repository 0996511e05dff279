"""Host time of one forward + backward of the trainer's forwards, agents' and critics'.

    python benchmarks/forward_host_time.py --layers 30 --backend inductor eager

A deep, narrow tiny model (SmolLM2-135M has 30 decoder layers) with two agents and two critics,
a few short rows, one thread: the arithmetic is negligible, so the time is what the host spends
per forward + backward (Python, dispatch, guards, graph breaks). On a GPU that time is paid per
micro-batch whatever its size; a step that runs far slower than its FLOPs starts here.
Prints JSON: per backend, the agents' and the critics' median milliseconds over ``--repeats``
calls (and the reference pass's, forward only), graphs compiled and graph breaks seen.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def measure(layers: int, backend: str, rows: int, tokens: int, repeats: int) -> dict:
    from torch._dynamo.utils import counters

    from roll.models import load_model
    from roll.models.tiny import TinyModelSpec, build_tiny_model
    from roll.multi_agent.config import AgentConfig, LoRAConfig, OptimConfig
    from roll.multi_agent.critics import ValueHeads, critic_values
    from roll.multi_agent.model import MultiAgentLoRAModel
    from roll.utils.recompiles import compile_count

    torch._dynamo.reset()
    counters.clear()
    path = build_tiny_model(Path(tempfile.gettempdir(), f"roll_tiny_{layers}_layers"),
                            TinyModelSpec(num_hidden_layers=layers))
    lora = LoRAConfig(rank=8, alpha=16)
    agents = [AgentConfig(name, lora=lora) for name in ("agent_0", "agent_1")]
    critics = [AgentConfig(name, lora=lora, optim=OptimConfig(lr=1e-3))
               for name in ("critic_0", "critic_1")]
    model = MultiAgentLoRAModel(load_model(path), agents, seed=0, critics=critics)
    heads = ValueHeads(model.critic_names, model.base_model.config.hidden_size)
    if backend != "eager":
        model.enable_compile(backend)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(10, 500, (rows, tokens), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    positions = torch.zeros_like(input_ids, dtype=torch.bool)
    positions[:, tokens // 2:] = True
    row_ids = torch.arange(rows) * 2 // rows  # each agent's rows contiguous, as trained

    def agents_pass():
        model(input_ids, attention_mask, row_ids, positions=positions)[0].sum().backward()

    def critics_pass():
        critic_values(model, heads, input_ids, attention_mask, row_ids, positions).sum().backward()

    def reference_pass():  # no grad, every adapter off (the KL's reference, the engine's base)
        with torch.no_grad():
            model.reference_logprobs(input_ids, attention_mask, positions=positions)

    result = {"layers": layers, "backend": backend, "rows": rows, "tokens": tokens}
    for name, call in (("agents", agents_pass), ("critics", critics_pass),
                       ("reference", reference_pass)):
        call()  # compiles (when compiled)
        call()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        result[f"{name}_ms"] = round(1e3 * statistics.median(times), 1)
    result["graphs"] = compile_count()
    result["graph_breaks"] = sum(counters["graph_break"].values())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--backend", nargs="+", default=["inductor", "eager"],
                        help="torch.compile backends of trainer.compile, or 'eager'")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = "cpu"
    results = [measure(args.layers, backend, args.rows, args.tokens, args.repeats)
               for backend in args.backend]
    print(json.dumps({"device": device, "torch": torch.__version__, "results": results},
                     indent=1))


if __name__ == "__main__":
    main()
