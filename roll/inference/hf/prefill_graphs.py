"""Admissions' prefills replayed as CUDA graphs, one per (rows, width) bucket.

Why: an eager prefill launches every op of every decoder layer from Python (~1,500 small
kernels through transformers' modules for a 28-layer model). Measured on an H200
(benchmarks/README.md, "An admission's prefill", session 65): 53-113 ms of host time per
admission of 1-8 prompts of ~444 tokens for the Qwen3-0.6B shape, whatever the attention
backend, while the device is done as soon as the host is; in the Hanabi rollout the serve loop
spent 59% of its time admitting, every lane stopped meanwhile. A captured graph launches it all
at once.

Buckets: rows rounded up to a power of two, width up to a multiple of ``WIDTH_STEP``, at most
``MAX_TOKENS`` tokens (rows x width) per bucket; the serve loop cuts a larger admission (a
rollout's first, all of its episodes at once; the many turns that end at one decode step) into
bucket-sized prefills (``rows_per_bucket``), each replayed. Only a prompt wider than a bucket
runs eagerly. Pad rows are base-model rows of pad tokens; each prompt is
left-padded to the bucket's width, its extra columns masked keys as the eager path's own left
padding is, so a prompt's logits and keys/values are the eager ones up to floating-point order.

A replay's logits and keys/values live in the graph's static outputs until the next replay: the
caller copies them into the ring and samples from the logits before it admits again, on the same
stream. All buckets share one memory pool (two replays never run at once, and each replay's
outputs are consumed before the next one starts). A new fused-LoRA layout (a slot that grows
the stacks) drops every graph, as it makes the decode step capture again.

Without ``capture`` (the CPU) the same buckets and padding run eagerly: what tests check.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from roll.inference.hf.cuda_graph import CapturedStep
from roll.inference.hf.prefill import tail_inputs
from roll.inference.hf.ring import CaptureCache

if TYPE_CHECKING:
    from roll.inference.hf.engine import HFEngine

WIDTH_STEP = 64
"""Bucket widths are multiples of this many tokens."""
MAX_TOKENS = 4096
"""Largest bucket (rows x width): 8 prompts of 512 tokens. Its keys/values for the 0.6B shape
take 470 MB of the pool."""


def bucket(rows: int, width: int) -> tuple[int, int]:
    """(rows, width) rounded up: rows to a power of two, width to a multiple of WIDTH_STEP."""
    return 1 << (rows - 1).bit_length(), -(-width // WIDTH_STEP) * WIDTH_STEP


class PrefillGraphs:
    """The engine's prefills by bucket: replayed graphs (``capture``, CUDA) or the same padded
    forward run eagerly."""

    def __init__(self, engine: HFEngine, dtype: torch.dtype, capture: bool) -> None:
        self.engine, self.dtype = engine, dtype
        self.capture = capture and engine.device.type == "cuda"
        self.graphs: dict[tuple[int, int], CapturedStep] = {}
        self.layout: int | None = None
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        self.capture_failures = 0
        self.new_serve()

    def new_serve(self) -> None:
        """Count the next ``serve``'s replays and captures from zero (the graphs are kept)."""
        self.replays = 0
        """Prefills served by a bucket (replayed or, without ``capture``, padded eagerly)."""
        self.captures = 0
        """Graphs captured (one per bucket met, again after a new LoRA layout)."""
        self.capture_s = 0.0
        """Seconds those captures took (each ~3 forwards: two warm-ups and the capture)."""

    def fits(self, prompts: list[list[int]]) -> bool:
        return len(prompts) <= self.rows_per_bucket(prompts)

    def rows_per_bucket(self, prompts: list[list[int]]) -> int:
        """The most of these prompts one bucket takes (a power of two, at their longest
        prompt's width); 0 where not even one fits."""
        rows = MAX_TOKENS // bucket(1, max(len(p) for p in prompts))[1]
        return 1 << (rows.bit_length() - 1) if rows else 0

    def run(self, prompts: list[list[int]], adapters: list) -> tuple[Tensor, CaptureCache, int]:
        """Logits (len(prompts), V), the keys/values (bucket rows, H, width, D) and the
        bucket's width (``prefill``'s W)."""
        rows, width = bucket(len(prompts), max(len(p) for p in prompts))
        inputs = tail_inputs(self.engine, prompts, rows, width, 0, self.dtype)
        # pad rows: the base model
        self.engine.fused.set_rows(list(adapters) + [None] * (rows - len(prompts)))
        self.replays += 1
        graph = self._graph(rows, width, inputs) if self.capture else None
        logits, capture = graph.replay(inputs) if graph is not None else self._forward(*inputs)
        return logits[: len(prompts)], capture, width

    def _graph(self, rows: int, width: int, inputs: tuple[Tensor, ...]) -> CapturedStep | None:
        """The bucket's graph, captured the first time it is met (~3 eager forwards: two
        warm-ups and the capture); None when the capture fails (said loudly, counted, and
        prefills go on eagerly from then on)."""
        layout = self.engine.fused.layout_key
        if self.layout != layout:  # new stacks: every graph read the old ones
            self.graphs.clear()
            self.layout = layout
        if (rows, width) not in self.graphs:
            start = time.perf_counter()
            try:
                self.graphs[(rows, width)] = CapturedStep(self._forward, inputs, pool=self.pool)
            except RuntimeError as error:
                print(f"hf engine: CUDA graph capture of a prefill failed, prefilling eagerly: "
                      f"{error}", flush=True)
                self.capture = False
                self.capture_failures += 1
                return None
            self.captures += 1
            self.capture_s += time.perf_counter() - start
        return self.graphs[(rows, width)]

    def _forward(self, input_ids: Tensor, mask: Tensor, positions: Tensor
                 ) -> tuple[Tensor, CaptureCache]:
        capture = CaptureCache()
        return self.engine.forward_last(input_ids, mask, positions, capture), capture
