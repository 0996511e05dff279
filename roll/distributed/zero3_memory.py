"""What ZeRO-3 keeps gathered of the frozen base, and a release that really frees it.

- ``base_stays_gathered`` / ``release_after_each_use``: a base that fits the live budget stays
  gathered through a step (DeepSpeed's trace); a larger one is released after each use.
- ``save_weights_not_views``: the base's projections save their weights, not views of them,
  for the backward, so that a release frees the memory.

Why the second: torch's ``linear`` with a weight that needs no gradient saves ``weight.t()`` for
the backward, a view that shares the gathered weight's storage. ZeRO-3 releases a weight after
its module's forward by pointing the parameter at an empty tensor; the view saved by autograd
still holds the old storage, so every base weight gathered in a forward stays in memory until
the backward reaches it: a whole base at once, which is what a base larger than one GPU cannot
afford (an 82.7 B base on two H200s ran out of memory in its first forward, 57 GB over its
share, benchmarks/README.md). DeepSpeed's own answer replaces ``torch.nn.functional.linear`` for
the whole process (``memory_efficient_linear``, off here: deepspeed_strategy.py says why); ours
touches only the base's frozen ``nn.Linear`` modules of the model being trained.

``FrozenWeightLinear`` saves the parameter itself, not a view of its data, and no input (a
frozen weight needs no gradient, so the input is not needed either); its backward reads the
weight as gathered again by then (DeepSpeed gathers a module's weights before its backward),
and gathers it itself, then partitions it again, if it is not.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn


class FrozenWeightLinear(torch.autograd.Function):
    """``y = x W^T + b`` for a weight (and bias) that get no gradient. Backward: ``dx = dy W``
    (dy: (..., out), W: (out, in), dx: (..., in))."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: nn.Parameter, bias: torch.Tensor | None
                ) -> torch.Tensor:
        ctx.save_for_backward(weight)  # the parameter: releasing it frees the gathered data
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (weight,) = ctx.saved_tensors
        released = weight.numel() == 0 and hasattr(weight, "all_gather")  # a ZeRO-3 weight
        if released:
            weight.all_gather()
        try:
            grad_x = grad_out.matmul(weight.to(grad_out.dtype))
        finally:
            if released:
                weight.partition()
        return grad_x, None, None


def _frozen_forward(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled():  # no-grad passes: nothing is saved either way
        return F.linear(x, module.weight, module.bias)
    return FrozenWeightLinear.apply(x, module.weight, module.bias)


def save_weights_not_views(model: nn.Module) -> int:
    """Every ``nn.Linear`` of ``model`` whose weight and bias need no gradient computes through
    ``FrozenWeightLinear`` from now on (an attribute of each instance; the class and torch are
    untouched). Returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is nn.Linear and not any(p.requires_grad for p in module.parameters()):
            module.forward = partial(_frozen_forward, module)
            count += 1
    return count


DEEPSPEED_MAX_LIVE = 1_000_000_000
"""DeepSpeed's default ``stage3_max_live_parameters``: elements kept gathered at once."""


def base_stays_gathered(model: nn.Module, live_elements: int | None) -> bool:
    """Whether ZeRO-3 keeps the frozen base gathered through a step, as DeepSpeed's recorded
    trace does once a step has run (fast: a 0.6B base's ZeRO-3 step 1.13x a ZeRO-2 step on an
    H200, 3.17x when each layer is gathered and released at every use): only when the base fits
    in the live budget (``live_elements``, else DeepSpeed's default of 1e9 elements). A larger
    base is released after each use (``release_after_each_use``)."""
    budget = DEEPSPEED_MAX_LIVE if live_elements is None else live_elements
    base = sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters()
               if not p.requires_grad)
    return base <= budget


def release_after_each_use(engine) -> None:
    """ZeRO-3 releases each gathered weight as soon as its module's forward or backward is
    done, and prefetches nothing: DeepSpeed's trace of a first step's module order, which
    decides later releases and prefetches, is never recorded. A trace assumes every step runs
    the modules in one order; ours do not (passes per agent and micro-batch, no-grad passes,
    padding passes), and with a trace it released nothing from a step's second micro-batch on:
    every layer stayed gathered (CPU, 8 layers, 2 micro-batches: 9.77 layers' base weights at
    once against 1.77 without it, ``train_data_parallel.py``'s ``gathered_peak_layers_rank0``;
    an 82.7 B base ran out of an H200's memory in its first step, benchmarks/README.md). A
    release frees memory only where the base's projections save their weights, not views of
    them, for the backward (``save_weights_not_views``; the 1.77 above did not see the views,
    and the 82.7 B base ran out of memory again with this alone, session 64). Called for a
    base larger than the live budget only (``base_stays_gathered``)."""
    coordinator = engine.optimizer.parameter_offload.get_param_coordinator()
    coordinator.is_complete_trace = lambda: False
    coordinator.is_record_trace = lambda: False


__all__ = ["DEEPSPEED_MAX_LIVE", "FrozenWeightLinear", "base_stays_gathered",
           "release_after_each_use", "save_weights_not_views"]
