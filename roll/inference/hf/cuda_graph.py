"""What keeps the hf decoding loops' GPU busy: a step compiled, captured as a CUDA graph and
replayed, and host values sent to the device without waiting for it."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from roll.utils.compile_workers import compile_in_process
from roll.utils.recompiles import recompile_guard


def compile_step(step: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``torch.compile(step)`` (static shapes) called under a raised recompile limit (patched
    for the call only, a hit reported: roll/utils/recompiles.py). Inductor compiles in this
    process (roll/utils/compile_workers.py says why)."""
    compile_in_process()
    compiled = torch.compile(step, dynamic=False)

    def call(*args: Tensor) -> Tensor:
        with recompile_guard("hf engine"):
            return compiled(*args)

    return call


class CapturedStep:
    """``step(*inputs)`` captured once as a CUDA graph over static copies of its inputs.

    A replay copies new inputs into those copies and launches the graph: no Python, no
    compiler guards per step. The step is warmed up twice first on a side stream (lazy
    initialisation, allocator, compilation), as CUDA graph capture requires. ``state``:
    tensors the step advances in place (transformers' static cache counts the tokens it holds
    in ``cumulative_length``), put back after each warm-up run so that the step runs once.
    The output (a tensor, or whatever the step returns that holds tensors) is overwritten by
    the next replay. ``pool``: a memory pool shared with other captures
    (``torch.cuda.graph_pool_handle()``), for steps never replayed at once.
    """

    def __init__(self, step: Callable[..., Tensor], inputs: tuple[Tensor, ...] = (),
                 state: list[Tensor] | None = None, pool=None) -> None:
        self.inputs = tuple(t.clone() for t in inputs)
        state = state or []
        saved = [t.clone() for t in state]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                step(*self.inputs)
                for tensor, value in zip(state, saved, strict=True):
                    tensor.copy_(value)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = step(*self.inputs)

    def replay(self, inputs: tuple[Tensor, ...] = ()) -> Tensor:
        for static, new in zip(self.inputs, inputs, strict=True):
            static.copy_(new)
        self.graph.replay()
        return self.output


def cache_counters(cache) -> list[Tensor]:
    """The token counters of a transformers static cache's layers (none in versions that
    index by ``cache_position`` alone)."""
    counters = (getattr(layer, "cumulative_length", None) for layer in getattr(cache, "layers", ()))
    return [t for t in counters if isinstance(t, Tensor)]
