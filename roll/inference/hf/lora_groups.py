"""Groups of fused-LoRA stacks whose deltas the Triton kernels compute together.

Projections that a model calls, in order, on one input tensor (q/k/v of an attention block,
gate/up of an MLP) form a group; every other stacked projection is a group of one. A group's
A stacks are row blocks of one buffer, its B stacks row blocks of another: member j's A is rows
[j·C, j·C + C) (C = slot capacity × rank capacity), its B rows [splits[j-1], splits[j]). The
stacks become views of those buffers, so loading a slot writes through.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn

SHARED_INPUT_FAMILIES = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Sibling projections that these models call, in this order, on one input tensor."""
SHARED_INPUT_MODELS = frozenset({"qwen3", "qwen2", "llama", "mistral"})
"""Model types (``config.model_type``) whose attention and MLP blocks do so."""
PRODUCT = "_roll_product"
"""Attribute of a linear layer, while the fused LoRA is active with ``triton_streams``: the
function (x, weight, bias) → x Wᵀ + bias that computes its product (and its group's deltas
beside it); a projection family whose first member it is calls it with the family's buffer."""


class Stack:
    """The stacked factors of one target linear layer."""

    def __init__(self, linear: nn.Linear, columns: int, dtype: torch.dtype, device) -> None:
        self.linear = linear
        self.A = torch.zeros(columns, linear.in_features, dtype=dtype, device=device)  # (S·R, in)
        self.B = torch.zeros(linear.out_features, columns, dtype=dtype, device=device)  # (out, S·R)


class Group:
    """One group's buffers, and its members' deltas between their calls in a forward."""

    def __init__(self, A: Tensor, B: Tensor, splits: list[int]) -> None:
        self.A, self.B, self.splits = A, B, splits
        self.size = len(splits) + 1
        self.delta: Tensor | None = None


def shares_inputs(model: nn.Module) -> bool:
    """Whether the model's blocks call the sibling families on one input (by model type)."""
    return getattr(getattr(model, "config", None), "model_type", None) in SHARED_INPUT_MODELS


def build_groups(stacks: dict[str, Stack], columns: int, share_inputs: bool,
                 static_addresses: bool) -> dict[str, tuple[Group, int]]:
    """Move every stack into its group's buffers (values kept); path → (group, position)."""
    siblings: dict[str, dict[str, str]] = {}
    for path in stacks:
        parent, _, name = path.rpartition(".")
        siblings.setdefault(parent, {})[name] = path
    families = SHARED_INPUT_FAMILIES if share_inputs else ()
    groups: dict[str, tuple[Group, int]] = {}
    for children in siblings.values():
        grouped = [members for family in families
                   if len(members := [children[name] for name in family if name in children]) > 1]
        alone = set(children.values()).difference(*grouped)
        for members in [*grouped, *([path] for path in sorted(alone))]:
            members_stacks = [stacks[path] for path in members]
            A = torch.cat([s.A for s in members_stacks])
            B = torch.cat([s.B for s in members_stacks])
            if static_addresses:
                torch._dynamo.mark_static_address(A)
                torch._dynamo.mark_static_address(B)
            ends = list(itertools.accumulate(s.B.shape[0] for s in members_stacks))
            group = Group(A, B, ends[:-1])
            for position, (path, stack) in enumerate(zip(members, members_stacks, strict=True)):
                stack.A = A[position * columns:(position + 1) * columns]
                stack.B = B[ends[position] - stack.B.shape[0]:ends[position]]
                groups[path] = (group, position)
    return groups
