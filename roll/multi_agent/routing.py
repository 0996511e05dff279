"""How row b of a mixed batch gets agent j's LoRA delta in training: the two answers.

- Eager (``segment_lora``): rows are sorted so that each agent's rows are one contiguous run
  (``agent_segments``); a forward hook on each adapted base layer adds, to each run, that
  agent's ``B(A(dropout(x))) * scaling``, as PEFT computes it for one adapter. Python-int row
  offsets: cheap, exact, LoRA dropout per agent; a compiled graph would specialise on them.
- Compiled (``RowRouting``, ``trainer.compile=true``; compiled.py): every row gets its own
  agent's factors as data, gathered by the rows' agent index (B,), so one graph serves every
  mix of agents and row counts.

Either way agent j's A/B get gradients from agent j's rows only (DESIGN.md invariant 1).
Critics are routed the same two ways: ``segment_lora`` eagerly, or, under ``trainer.compile``
with no critic dropout, ``RowRouting``'s second group of rows (each row's own critic's
factors, stacked per forward). The engines route rows at decode time on their own
(roll/inference/hf/fused_lora.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from roll.multi_agent.team_factors import TeamFactors, uniform


def agent_segments(agent_ids: list[int], names: Sequence[str]) -> list[tuple[str, int, int]]:
    """(agent name, first row, stop row) of each run of equal agent ids."""
    runs: list[tuple[str, int, int]] = []
    for row, index in enumerate(agent_ids):
        if runs and runs[-1][0] == names[index]:
            runs[-1] = (runs[-1][0], runs[-1][1], row + 1)
        else:
            runs.append((names[index], row, row + 1))
    return runs


@contextmanager
def base_layers_only(lora_layers: Iterable[nn.Module]) -> Iterator[None]:
    """While active, PEFT's LoRA layers compute their base layer alone (the reference policy,
    or the base that ``segment_lora``'s hooks add each row's delta to): each layer's own
    ``disable_adapters`` flag, set and restored directly. PEFT's ways cost host time that grows
    with the model's modules at every call: ``disable_adapter()`` walks every module twice and
    leaves only the active adapter trainable (``requires_grad``), and ``adapter_names=
    ["__base__"] * B`` walks every module twice per forward to place and remove hooks, then
    indexes the rows of each layer in Python (20 ms a forward of a 28-layer model with four
    agents on this project's CPU, 20% of a ZeRO-2 step)."""
    layers = list(lora_layers)
    before = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, flag in zip(layers, before, strict=True):
            layer._disable_adapters = flag


@contextmanager
def segment_lora(lora_layers: Sequence[tuple[str, nn.Module]],
                 segments: list[tuple[str, int, int]]) -> Iterator[None]:
    """While active, rows [first, stop) of every adapted layer's output get agent
    ``name``'s LoRA delta, ``B(A(dropout(x))) * scaling`` with that agent's own dropout,
    as PEFT computes it for one adapter (in the base layer's dtype: bf16 products with
    fp32 master weights on a bf16 base, as under autocast; exact on an fp32 base); a
    forward hook on each base layer, PEFT's own LoRA off meanwhile (``base_layers_only``).
    Differentiable: each agent's A/B get gradients from its own rows only. Instead of
    PEFT's mixed-batch routing, which gathers and scatters every agent's rows in every
    adapted layer."""
    rows = segments[-1][2] if segments else 0

    def hook(layer, module, args, output):
        x = args[0]
        parts = []
        for name, first, stop in segments:
            if name not in layer.lora_A:
                parts.append(output[first:stop])
                continue
            # In the base layer's dtype, the adapter weights cast down (their gradients
            # reach the fp32 weights through the cast): casting the activations up to
            # fp32 and back cost more GPU time than the products themselves (profiled).
            dtype = output.dtype
            part = x if stop - first == rows else x[first:stop]
            hidden = F.linear(layer.lora_dropout[name](part.to(dtype)),
                              layer.lora_A[name].weight.to(dtype))
            delta = F.linear(hidden, layer.lora_B[name].weight.to(dtype)) \
                * layer.scaling[name]
            if stop - first == rows:  # one agent: PEFT's own sum
                return output + delta
            parts.append(output[first:stop] + delta)
        return torch.cat(parts) if parts else output

    handles = [layer.base_layer.register_forward_hook(partial(hook, layer))
               for _, layer in lora_layers]
    try:
        with base_layers_only(layer for _, layer in lora_layers):
            yield
    finally:
        for handle in handles:
            handle.remove()


ROW_CAPACITY = 256
"""Rows the routing one-hot holds at least (more rows in one forward: the next power of two)."""


class RowRouting:
    """Forward hooks that add each row's own agent's LoRA delta while a route is open (module
    docstring); no-ops otherwise (eager forwards, the engines). ``critic_names``: a second
    group of rows, routed to the critics' factors (``route(..., critics=True)``); a forward
    routes one group."""

    def __init__(self, lora_layers: Sequence[nn.Module], agent_names: Sequence[str],
                 critic_names: Sequence[str] = ()) -> None:
        self.agent_names, self.critic_names = list(agent_names), list(critic_names)
        self.base_layers: list[nn.Module] = []
        self._handles = []
        names = (*self.agent_names, *self.critic_names)
        routed = [layer for layer in lora_layers if any(name in layer.lora_A for name in names)]
        for layer in routed:
            if hasattr(layer.base_layer, "lora_rows"):
                # A second team's hook would also read this layer's row index and pick its own
                # (fewer) agents' factors with it.
                raise ValueError("trainer.compile: this base model's layers are already routed "
                                 "by another team's compiled forward; call disable_compile() "
                                 "on that team first")
        shared = [layer for layer in routed if uniform(layer, self.agent_names)]
        self.factors = TeamFactors(shared, self.agent_names) if shared else None
        for layer in routed:
            base = layer.base_layer
            base.lora_rows = None  # (capacity,): row b's agent index, while routed
            base.lora_critics = False  # rows index the critics, not the agents (one graph each)
            base.lora_stack = self.factors.stacks.get(id(layer)) if self.factors else None
            # Permanent while compiled (not per forward): a hook registered anew each forward
            # would be a new object to dynamo's guards, i.e. a recompile per forward.
            self._handles.append(base.register_forward_hook(
                partial(add_row_delta, layer, self.agent_names, self.critic_names)))
            self.base_layers.append(base)

    def close(self) -> None:
        """Remove the hooks (the base layers become plain again); each agent's tensors in
        memory of their own again."""
        for handle in self._handles:
            handle.remove()
        for base in self.base_layers:
            del base.lora_rows, base.lora_stack, base.lora_critics
        if self.factors is not None:
            self.factors.release()
        self._handles, self.base_layers, self.factors = [], [], None

    @contextmanager
    def route(self, agent_id: Tensor | None, dtype: torch.dtype,
              critics: bool = False) -> Iterator[None]:
        """Rows with these agent indices (B,) through their agents' deltas, in any order;
        None: the reference (no delta). ``critics``: the indices are into ``critic_names``."""
        if critics and (agent_id is None or not self.critic_names):
            raise ValueError("a critics' route needs critic rows and routed critics")
        rows = None
        if agent_id is not None:
            # Dynamo gives a module attribute's tensor a static shape: a (B,) index would
            # recompile for every new B. A fixed capacity of rows (the hook takes the first B)
            # changes only when B outgrows it.
            capacity = max(ROW_CAPACITY, 1 << (len(agent_id) - 1).bit_length())
            rows = torch.zeros(capacity, dtype=torch.long, device=agent_id.device)
            rows[: len(agent_id)] = agent_id.long()
        for base in self.base_layers:
            base.lora_rows, base.lora_critics = rows, critics
        try:
            yield
        finally:
            for base in self.base_layers:
                base.lora_rows, base.lora_critics = None, False


def stacked_factors(layer: nn.Module, agent_names: Sequence[str], dtype: torch.dtype
                     ) -> tuple[Tensor, Tensor]:
    """Every agent's A (N, r, in) and B*scaling (N, out, r) of one LoRA layer, in ``dtype``;
    ranks padded with zeros to the largest one, agents that do not adapt this layer all zeros
    (exact: the padding adds nothing and gets no gradient that reaches a parameter)."""
    present = [name for name in agent_names if name in layer.lora_A]
    rank = max(layer.lora_A[name].out_features for name in present)
    weight = layer.lora_A[present[0]].weight
    fan_in, fan_out = weight.shape[1], layer.lora_B[present[0]].weight.shape[0]
    a_blocks, b_blocks = [], []
    for name in agent_names:
        if name not in layer.lora_A:
            a_blocks.append(weight.new_zeros(rank, fan_in))
            b_blocks.append(weight.new_zeros(fan_out, rank))
            continue
        a, b = layer.lora_A[name].weight, layer.lora_B[name].weight * layer.scaling[name]
        pad = rank - a.shape[0]
        a_blocks.append(F.pad(a, (0, 0, 0, pad)) if pad else a)
        b_blocks.append(F.pad(b, (0, pad)) if pad else b)
    return torch.stack(a_blocks).to(dtype), torch.stack(b_blocks).to(dtype)


def add_row_delta(layer, agent_names, critic_names, module, args, output):
    """Forward hook of an adapted base layer: + each row's own agent's (or critic's) LoRA
    delta."""
    if module.lora_rows is None:
        return output
    names = critic_names if module.lora_critics else agent_names
    if not any(name in layer.lora_A for name in names):  # only the other group adapts it
        return output
    x = args[0]  # (B, T, in)
    dtype = output.dtype
    rows = module.lora_rows[: x.shape[0]]  # (B,) row b's agent (or critic)
    stack = None if module.lora_critics else module.lora_stack
    if stack is not None:
        a_all, b_all = stack.a.to(dtype), (stack.b * stack.scales).to(dtype)
    else:
        a_all, b_all = stacked_factors(layer, names, dtype)  # (N, r, in), (N, out, r)
    # A gather, not a one-hot matmul: its backward adds each row's gradient to its own
    # agent's factors only (a one-hot's transpose would add 0 x another agent's NaN = NaN).
    a_rows = a_all[rows]  # (B, r, in)
    b_rows = b_all[rows]  # (B, out, r)
    hidden = torch.bmm(x.to(dtype), a_rows.transpose(1, 2))  # (B, T, r)
    return output + torch.bmm(hidden, b_rows.transpose(1, 2))  # (B, T, out)
