"""Sibling projections of one input as one product: q/k/v of an attention block, gate/up of an MLP.

A decode step of a small batch is bound by how many kernels it runs, not by what they read: on
an H200 a 32-row step of the Qwen3-0.6B shape ran 615 kernels (22 a layer), 7 of them a layer
the base projections' GEMMs of ~5 µs each, whatever their size (benchmarks/README.md, "The
decode step's kernels"). Models whose blocks call q/k/v (and gate/up) one after the other on
one input (``lora_groups.SHARED_INPUT_MODELS``) can run each family as one GEMM over the
members' weights stacked row-wise: 4 GEMMs a layer instead of 7.

The base stays ONE copy (DESIGN invariant 2): the members' weights are moved, once, into one
buffer per family, and each member's ``weight`` becomes a view of its rows (row blocks of a
row-major matrix are themselves contiguous, so every other user of the model — the trainer,
PEFT's layers — sees the same values, shapes and strides). While the engine runs
(``active()``), the family's first member computes the whole product and returns its own
columns; the later members return theirs from it. Their forward hooks (the fused LoRA deltas)
run as before. Outside ``active()`` every layer is the plain ``nn.Linear`` it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from roll.inference.hf.lora_groups import PRODUCT, SHARED_INPUT_FAMILIES, shares_inputs

FAMILY = "_roll_fused_family"
"""Attribute naming, on each member layer, the family whose buffer holds its weight."""


class Family:
    """One family's buffer (members' weights stacked row-wise, biases likewise) and the product
    of the current forward, between its first member's call and its last's."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        self.linears = linears
        self.ends = [0]  # member j's rows of the buffer: [ends[j], ends[j + 1])
        for linear in linears:
            self.ends.append(self.ends[-1] + linear.out_features)
        with torch.no_grad():
            self.weight = torch.cat([linear.weight for linear in linears])
            self.bias = (torch.cat([linear.bias for linear in linears])
                         if linears[0].bias is not None else None)
            for j, linear in enumerate(linears):  # each member now reads its rows of the buffer
                rows = slice(self.ends[j], self.ends[j + 1])
                linear.weight.data = self.weight[rows]
                if self.bias is not None:
                    linear.bias.data = self.bias[rows]
        self.product: Tensor | None = None
        # one forward per member, made once (a compiled step sees the same function each time)
        self.forwards = [self._first] + [self._later(position)
                                         for position in range(1, len(linears))]

    def _first(self, x: Tensor) -> Tensor:
        # the fused LoRA's product (its deltas beside it on a side stream) where it set one
        product = getattr(self.linears[0], PRODUCT, F.linear)(x, self.weight, self.bias)
        self.product = product
        return product[..., : self.ends[1]]

    def _later(self, position: int):
        def forward(x: Tensor) -> Tensor:
            product = self.product
            if product is None or product.shape[:-1] != x.shape[:-1]:
                raise RuntimeError(
                    f"fused projections: member {position} of a family was called without its "
                    f"first member on the same input (the model does not call them in order)")
            if position == len(self.linears) - 1:
                self.product = None
            return product[..., self.ends[position]:self.ends[position + 1]]
        return forward


def _fusable(linears: list[nn.Linear]) -> bool:
    """Same input size, dtype and device, all with a bias or none, frozen plain weights."""
    first = linears[0]
    return all(
        isinstance(linear, nn.Linear) and linear.in_features == first.in_features
        and linear.weight.dtype == first.weight.dtype
        and linear.weight.device == first.weight.device
        and (linear.bias is None) == (first.bias is None)
        and not linear.weight.requires_grad and linear.weight.is_contiguous()
        and not hasattr(linear.weight, "ds_id")  # DeepSpeed owns a partitioned weight
        for linear in linears)


class FusedProjections:
    """Every fusable family of a model (none for a model type not in SHARED_INPUT_MODELS).

    Args:
        model: the transformers model the engine runs (PEFT-wrapped layers are fine: their
            ``base_layer`` is fused); None: no family (nothing fused).
    """

    def __init__(self, model: nn.Module | None) -> None:
        self.families: list[Family] = []
        if model is None or not shares_inputs(model):
            return
        for parent in model.modules():
            for names in SHARED_INPUT_FAMILIES:
                children = [getattr(parent, name, None) for name in names]
                if any(child is None for child in children):
                    continue
                linears = [getattr(child, "base_layer", child) for child in children]
                # a second engine on the same model takes the family the first one made:
                # moving the weights again would leave the first one's captured graphs
                # reading freed memory
                family = getattr(linears[0], FAMILY, None)
                if family is None and _fusable(linears):
                    family = Family(linears)
                    for linear in linears:
                        setattr(linear, FAMILY, family)
                if family is not None:
                    self.families.append(family)

    @property
    def gemms_saved(self) -> int:
        """GEMMs a forward no longer launches (members beyond each family's first)."""
        return sum(len(family.linears) - 1 for family in self.families)

    @contextmanager
    def active(self) -> Iterator[None]:
        """The families' members compute through their buffers; plain layers again on exit."""
        for family in self.families:
            for linear, forward in zip(family.linears, family.forwards, strict=True):
                linear.forward = forward
        try:
            yield
        finally:
            for family in self.families:
                family.product = None
                for linear in family.linears:
                    del linear.forward
