"""Compiled forwards of the multi-agent LoRA model (``trainer.compile=true``).

Why: the eager train step of a 0.6B model on a GPU is bound by the host launching ~66,000 small
kernels per step (benchmarks/README.md, the profile), not by the GPU. ``torch.compile`` fuses the
elementwise work of each decoder layer. It compiles ONE layer's forward ("regional
compilation"): every decoder layer runs the same code, so one graph per input signature serves
all of them and warm-up costs one layer's compile, not the whole model's.

Routing without data-dependent code. The eager path gives each contiguous run of an agent's rows
that agent's LoRA delta by slicing at Python-int row offsets, which a compiled graph would
specialise on (a recompile per mix of agents). Here, as in the engine's fused multi-LoRA
(roll/inference/fused_lora.py), a forward hook on each adapted base layer stacks every agent's
factors, A_stack = [A_1; ...; A_N] (sum r_j, in) and B_stack = [B_1 s_1, ..., B_N s_N]
(out, sum r_j), and a per-row one-hot over the agents selects the row's block:

    y = W x + B_stack ((A_stack x) * m_row)          = W x + B_a A_a x s_a on a row of agent a,

where m_row is 1 on the columns of the row's agent and 0 elsewhere. A row gets exactly its own
agent's delta (the other blocks add exact zeros), and agent j's A/B get gradients from agent j's
rows only (the mask zeroes the rest exactly). Two products per layer whatever the number of
agents, and one saved input (not one per agent). The reference policy is every mask at 0 (the
same graph; no second copy, no adapter switch). PEFT's own LoRA is switched off meanwhile (no
active adapter). The cost: N x the eager path's (small) LoRA FLOPs.

Simplifications, stated: LoRA dropout is refused (each agent's masks come from its own
generator in the eager path; a compiled graph cannot keep that). LoRA products run in the base
layer's dtype with the adapter weights cast down, as in the eager path.
Not used by the inference engines: the compiled layers are switched in only around the
trainer's forwards.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MIN_ROW_CAPACITY = 256
"""Rows of the routing mask allocated at first: forwards of up to this many rows share one
compiled graph."""


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a transformers causal LM: the longest ``nn.ModuleList`` whose
    entries all share one class (``model.layers`` of Qwen3 and Llama)."""
    best: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > len(best) and len(
                {type(entry) for entry in module}) == 1:
            best = list(module)
    if not best:
        raise ValueError(f"trainer.compile: found no repeated decoder layers in "
                         f"{type(model).__name__}")
    return best


def compile_count() -> int:
    """Graphs torch.compile has built in this process (forward and backward, all regions)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class CompiledLayers:
    """The compiled decoder layers of one model, switched in only inside ``active``."""

    def __init__(self, base_model: nn.Module, backend: str = "inductor") -> None:
        self.layers = decoder_layers(base_model)
        self.embeddings = base_model.get_input_embeddings()
        # One compiled callable per layer; they share one code object, so dynamo's cache (and
        # its compiled graphs) is shared by every layer. Rows and tokens vary from one forward
        # to the next: dynamic from the start, not one static graph and then a dynamic one.
        self._compiled = [torch.compile(layer._call_impl, backend=backend, dynamic=True)
                          for layer in self.layers]

    @contextmanager
    def active(self) -> Iterator[None]:
        """Calls of the decoder layers go through their compiled forwards (nn.Module.__call__
        runs ``_compiled_call_impl`` when set; ``nn.Module.compile`` sets it the same way)."""
        for layer, compiled in zip(self.layers, self._compiled, strict=True):
            layer._compiled_call_impl = compiled
        # With gradients on, the first layer's input (the frozen embeddings' output) would be
        # the only one not requiring grad: a second graph for layer 0 alone. Marked here, as
        # transformers' enable_input_require_grads does, one graph serves every layer.
        handle = self.embeddings.register_forward_hook(
            lambda module, args, output: output.requires_grad_(True)
            if torch.is_grad_enabled() and not output.requires_grad else output)
        try:
            yield
        finally:
            handle.remove()
            for layer in self.layers:
                layer._compiled_call_impl = None


class StackedRouting:
    """Forward hooks that add every row's own agent's LoRA delta from stacked factors while a
    route is open (module docstring); no-ops otherwise (eager forwards, the engines)."""

    def __init__(self, lora_layers: Sequence[nn.Module], agent_names: Sequence[str]) -> None:
        self.agent_names = list(agent_names)
        self._rows: Tensor | None = None  # (capacity, N) one-hot of each row's agent
        self.base_layers: list[nn.Module] = []
        for layer in lora_layers:
            names = [name for name in self.agent_names if name in layer.lora_A]
            if not names:  # a layer only critics adapt
                continue
            # Column j of the stacked product belongs to agent column_agent[j].
            device = layer.lora_A[names[0]].weight.device
            column_agent = torch.cat([torch.full((layer.lora_A[name].out_features,),
                                                 self.agent_names.index(name), dtype=torch.long,
                                                 device=device) for name in names])
            base = layer.base_layer
            base.agent_rows = None  # (capacity >= B, N) while a route is open
            base.register_forward_hook(partial(_add_delta, layer, names, column_agent))
            self.base_layers.append(base)

    @contextmanager
    def route(self, agent_id: Tensor | None, input_ids: Tensor, dtype: torch.dtype
              ) -> Iterator[None]:
        """Rows of ``agent_id`` (B,) through their agents' deltas (None: the reference)."""
        count, need = len(self.agent_names), input_ids.shape[0]
        rows = self._rows
        if rows is None or rows.shape[0] < need or rows.dtype != dtype \
                or rows.device != input_ids.device:
            # A compiled graph sees a module's tensor attribute with a fixed shape; the hook
            # takes the forward's first B rows of it. Capacity: at least 256 rows, then powers
            # of two (each growth is one more compile).
            capacity = max(MIN_ROW_CAPACITY, 1 << max(need - 1, 0).bit_length())
            rows = self._rows = torch.zeros(capacity, count, dtype=dtype,
                                            device=input_ids.device)
        rows.zero_()
        if agent_id is not None:
            rows[:need] = F.one_hot(agent_id, count).to(dtype)
        for base in self.base_layers:
            base.agent_rows = rows
        try:
            yield
        finally:
            for base in self.base_layers:
                base.agent_rows = None


def _add_delta(layer, names, column_agent, module, args, output):
    """Forward hook of an adapted base layer: + B_stack((A_stack x) * mask) (module docstring)."""
    rows = module.agent_rows
    if rows is None:
        return output
    rows = rows[: args[0].shape[0]]  # (B, N): this forward's rows
    dtype = output.dtype
    a_stack = torch.cat([layer.lora_A[name].weight for name in names]).to(dtype)  # (C, in)
    b_stack = torch.cat([layer.lora_B[name].weight * layer.scaling[name]
                         for name in names], dim=1).to(dtype)  # (out, C)
    mask = rows[:, column_agent].unsqueeze(1)  # (B, 1, C)
    hidden = F.linear(args[0].to(dtype), a_stack) * mask  # (B, T, C)
    return output + F.linear(hidden, b_stack)


class CompiledForward:
    """Logits of a PEFT model through the compiled layers, PEFT's own LoRA off (no active
    adapter) and each row's own agent's delta added by the stacked routing."""

    def __init__(self, peft_model: nn.Module, lora_layers: Sequence[nn.Module],
                 agent_names: Sequence[str], backend: str = "inductor") -> None:
        self.peft_model = peft_model
        self.lora_layers = list(lora_layers)
        self.layers = CompiledLayers(peft_model.get_base_model(), backend)
        self.routing = StackedRouting(self.lora_layers, agent_names)
        self.dtype = next(peft_model.get_base_model().parameters()).dtype

    def logits(self, input_ids: Tensor, attention_mask: Tensor, agent_id: Tensor | None,
               kwargs: dict) -> Tensor:
        # PEFT's own LoRA off: no active adapter in any LoRA layer. Set on PEFT's attribute
        # directly: its set_adapter would also flip requires_grad on every adapter tensor, and
        # with 8 agents those flips (and undoing them) cost more host time than the forward.
        previous = [layer._active_adapter for layer in self.lora_layers]
        for layer in self.lora_layers:
            layer._active_adapter = []
        try:
            with self.routing.route(agent_id, input_ids, self.dtype), self.layers.active():
                return self.peft_model(input_ids=input_ids, attention_mask=attention_mask,
                                       **kwargs).logits
        finally:
            for layer, active in zip(self.lora_layers, previous, strict=True):
                layer._active_adapter = active
