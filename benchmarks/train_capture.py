"""A whole micro-batch's forward and backward as one CUDA graph: the ceiling for issue 33's MFU
goal at the default micro-batch of 8 rows, measured before the trainer is made to capture.

    python benchmarks/train_capture.py            # GPU: Qwen3-0.6B shape, random bf16
    python benchmarks/train_capture.py --tiny     # CPU: the same loops, no graph (a check)

The default train step (64 rows x 512 tokens in micro-batches of 8) is bound by the host:
~4,240 kernel launches a micro-batch, the GPU busy 58% (benchmarks/README.md, session 62), and
torch.compile's CUDA graphs cannot replay the per-layer compiled backward (session 68). Here
the trainer's compiled forward (``trainer.compile``'s layers and row routing, the team's
gradient buffer) and a token loss without host syncs run a step of ``--rows`` rows:

  eager     each micro-batch launched as the trainer launches it today;
  captured  the same forward and backward recorded once as one CUDA graph (after a warm-up on
            a side stream), then per micro-batch: its rows copied into the graph's static
            inputs and the graph replayed; the gradients accumulate in place in the team's
            buffer either way.

Reported per mode: seconds a step (median of ``--repeats`` after a warm-up step), train
tok/s, MFU (6 * P * tokens / s / peak), and the largest gap between the two modes' summed
gradients (the captured step must give the eager step's). On the CPU there is no graph: the
"captured" loop runs the same function on the static inputs (a check of the copies).
Prints one JSON object; writes $OUT/train_capture.json when OUT is set.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from batches import synthetic_batch  # noqa: E402
from logprob_memory import measure  # noqa: E402
from report import emit  # noqa: E402
from train_throughput import PEAK_FLOPS, frozen_base  # noqa: E402


def build(args, device: torch.device):
    """The team on a base of random weights (``--agents`` adapters r 32 on 7 projections, B
    perturbed so every factor gets a gradient) with its compiled forward, and the batch."""
    from roll.multi_agent.config import AgentConfig, LoRAConfig
    from roll.multi_agent.model import MultiAgentLoRAModel

    base = frozen_base(args.tiny, device)
    agents = [AgentConfig(f"agent_{i}", lora=LoRAConfig(rank=args.rank, alpha=args.rank))
              for i in range(args.agents)]
    params = sum(p.numel() for p in base.parameters())  # the base's alone (for MFU)
    model = MultiAgentLoRAModel(base, agents, seed=0)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name in model.agent_names:
            for _, tensor in model.named_agent_tensors(name):
                tensor.add_(0.01 * torch.randn(tensor.shape, generator=generator).to(tensor))
    model.enable_compile(args.backend)
    batch = synthetic_batch(args.rows, args.tokens, args.prompt, base.config.vocab_size,
                            torch.arange(args.rows) % args.agents).to(device)
    return model, batch, params


class Step:
    """One train step's micro-batches through ``model``'s compiled forward and a sync-free
    token loss, eagerly or replayed from one captured graph."""

    def __init__(self, model, batch, micro: int, temperature: float = 1.0) -> None:
        self.model, self.micro, self.temperature = model, micro, temperature
        positions = batch.response_mask.bool()
        self.first = int(positions.any(0).nonzero()[0])  # the window, read once per step
        self.tokens = batch.input_ids.shape[1]
        weights = (batch.advantages * batch.response_mask)[:, self.first:]
        self.scale = 1.0 / float(batch.response_mask.sum())  # token-mean over the whole step
        self.parts = [(batch.input_ids[start:start + micro],
                       batch.attention_mask[start:start + micro],
                       batch.agent_id[start:start + micro],
                       weights[start:start + micro])
                      for start in range(0, len(batch), micro)]
        self.static = None  # the graph's inputs (captured mode)
        self.graph = None

    def loss(self, input_ids, attention_mask, agent_id, weights):
        """The micro-batch's share of a token-mean policy-gradient loss, backward included:
        no host read anywhere (the window is fixed, every window token is scored)."""
        logits = self.model._window_logits(input_ids, attention_mask, agent_id,
                                           (self.first, self.tokens))
        targets = input_ids[:, self.first:]
        logp = torch.log_softmax(logits.float() / self.temperature, -1).gather(
            -1, targets[..., None]).squeeze(-1)
        loss = -(logp * weights).sum() * self.scale
        loss.backward()
        return loss.detach()

    def eager(self) -> None:
        for part in self.parts:
            self.loss(*part)

    def capture(self, warmups: int = 3) -> None:
        """Static inputs of the first micro-batch's shape, a warm-up on a side stream (the
        compiled graphs, the allocator), then the forward and backward recorded as one graph
        (on a CPU: no graph, ``replayed`` calls ``loss`` on the static inputs)."""
        self.static = [tensor.clone() for tensor in self.parts[0]]
        if not self.static[0].is_cuda:
            return
        # While a stream captures, transformers always builds the 4-D attention mask (its
        # is_tracing() is true); outside, a padding mask of ones gives no mask at all (a host
        # read decides). The warm-up must compile the layers' variant the capture will run
        # (a compile while capturing fails: session 69), so it sees one padded position.
        mask = self.static[1]
        mask[0, 0] = 0
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(warmups):
                self.loss(*self.static)
        torch.cuda.current_stream().wait_stream(stream)
        mask.copy_(self.parts[0][1])
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss(*self.static)

    def replayed(self) -> None:
        for part in self.parts:
            for static, tensor in zip(self.static, part, strict=True):
                static.copy_(tensor)
            if self.graph is not None:
                self.graph.replay()
            else:
                self.loss(*self.static)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on the CPU (a check)")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--agents", type=int, default=1)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    args = parser.parse_args()
    if args.tiny:
        args.rows, args.tokens, args.prompt, args.rank = 16, 64, 32, 8
    if args.rows % args.micro:
        parser.error(f"--rows {args.rows} must be a multiple of --micro {args.micro} (one "
                     "graph of one shape)")
    from roll.utils.stages import stage

    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    with stage("building the team and its compiled forward"):
        model, batch, params = build(args, device)
    factors = model._compiled.factors
    if factors is None:
        raise SystemExit("train_capture: the team has no shared buffer of factors")
    step = Step(model, batch, args.micro)
    grads = factors.grads

    def from_zero(run):  # a step's gradients alone, accumulated in the team's buffer
        return lambda: (grads.zero_(), run())

    result: dict = {}
    with model.training_forward(dict.fromkeys(model.agent_names, 0)):
        with stage(f"eager: a warm-up step (compiles the training forward), {args.repeats} "
                   "timed"):
            result["eager"] = measure(from_zero(step.eager), device, args.repeats)
        eager_grads = grads.clone()
        with stage("captured: warm-up on a side stream, then one micro-batch recorded"):
            step.capture()
        with stage(f"captured: a warm-up step, {args.repeats} timed"):
            result["captured"] = measure(from_zero(step.replayed), device, args.repeats)
        captured_grads = grads.clone()
    name = torch.cuda.get_device_name() if cuda else "cpu"
    peak = next((v for k, v in PEAK_FLOPS.items() if k in name), None)
    tokens = args.rows * args.tokens
    for mode in ("eager", "captured"):
        seconds = result[mode]["seconds"]
        result[mode]["train_tokens_per_s"] = round(tokens / seconds)
        if peak:
            result[mode]["mfu"] = round(6 * params * tokens / seconds / peak, 4)
    result["grad_gap"] = float((captured_grads - eager_grads).abs().max())
    result["grad_scale"] = float(eager_grads.abs().max())
    result["captured_over_eager"] = round(result["captured"]["seconds"]
                                          / result["eager"]["seconds"], 3)
    summary = {"device": name, "torch": torch.__version__, "base_params": params,
               "rows": args.rows, "tokens": args.tokens, "micro_batch_size": args.micro,
               "agents": args.agents, "lora_rank": args.rank, "backend": args.backend,
               "captured_graph": step.graph is not None, "window_first": step.first,
               **result}
    emit(summary, "train_capture.json")


if __name__ == "__main__":
    main()
