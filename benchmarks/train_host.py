"""Host time of a captured train step outside its micro-batches, 1 against N agents (CPU).

    python benchmarks/train_host.py                 # 28 narrow layers, 1 and 8 agents
    python benchmarks/train_host.py --layers 2 --agents 1 2 --repeats 2   # a quick check

With ``trainer.capture`` the micro-batches of a step are replayed graphs and the GPU waits for
the host only before the first one and after the last (the plan, the per-agent normalisers,
the round's bookkeeping; then clipping, the optimizer steps and the metrics). Those are host
work per agent and per adapter tensor, which is what made 8 agents cost more than one on an
H200 (benchmarks/README.md, session 69). This measures them on a model with the 0.6B shape's
depth (28 layers, 7 adapted projections each) but narrow layers (the forwards are cheap), the
trainer's compiled forward with the ``aot_eager`` backend and ``trainer.capture=true`` (on a
CPU the same padded step, no graph): per team the median over ``--repeats`` steps of the
milliseconds from the step's start to its first micro-batch (``before_ms``) and from its last
micro-batch to the step's end (``after_ms``). Prints one JSON object; writes
$OUT/train_host.json when OUT is set.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from batches import synthetic_batch  # noqa: E402
from report import emit  # noqa: E402


def team_edges(layers: int, agents: int, repeats: int) -> dict:
    """Median host milliseconds before the first and after the last micro-batch of a step."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import roll.multi_agent.captured as captured
    from roll.multi_agent.config import AgentConfig, LoRAConfig, OptimConfig, TrainerConfig
    from roll.multi_agent.model import MultiAgentLoRAModel
    from roll.multi_agent.trainer import MultiAgentTrainer

    torch.manual_seed(0)
    base = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        max_position_embeddings=512)).eval()
    for param in base.parameters():
        param.requires_grad_(False)
    team = [AgentConfig(f"agent_{i}", lora=LoRAConfig(rank=8, alpha=8),
                        optim=OptimConfig(lr=1e-5)) for i in range(agents)]
    model = MultiAgentLoRAModel(base, team, seed=0)
    trainer = MultiAgentTrainer(model, team, TrainerConfig(
        micro_batch_size=8, compile=True, compile_backend="aot_eager", capture=True).validate())
    batch = trainer.logprob_passes(synthetic_batch(32, 64, 32, 1000, torch.arange(32) % agents))
    marks: dict[str, float] = {}
    run = captured.CapturedSteps.run

    def timed_run(self, micro, first):  # the micro-batches' edges
        marks.setdefault("first", time.perf_counter())
        run(self, micro, first)
        marks["last"] = time.perf_counter()

    captured.CapturedSteps.run = timed_run
    try:
        trainer.train_step(batch)  # warm-up: compiles
        before, after = [], []
        for _ in range(repeats):
            marks.clear()
            start = time.perf_counter()
            trainer.train_step(batch)
            end = time.perf_counter()
            before.append(1000 * (marks["first"] - start))
            after.append(1000 * (end - marks["last"]))
    finally:
        captured.CapturedSteps.run = run
        model.disable_compile()
    return {"agents": agents, "before_ms": round(statistics.median(before), 2),
            "after_ms": round(statistics.median(after), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    results = [team_edges(args.layers, agents, args.repeats) for agents in args.agents]
    emit({"device": "cpu", "torch": torch.__version__, "layers": args.layers,
          "results": results}, "train_host.json")


if __name__ == "__main__":
    main()
