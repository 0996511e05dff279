"""One agent's (or critic's) optimizer: AdamW or SGD, its learning-rate schedule, gradient clipping.

Every adapter gets its own of each, counted in its own optimizer steps (DESIGN.md invariant 1);
the agents' trainer and the critics' trainer build them here, the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from roll.multi_agent.config import OptimConfig


def build_optimizer(params: Sequence[Tensor], optim: OptimConfig) -> torch.optim.Optimizer:
    """``optim.name``'s optimizer over ``params``: AdamW (fused on CUDA) or SGD."""
    params = list(params)
    if optim.name == "sgd":
        return torch.optim.SGD(params, lr=optim.lr, momentum=optim.momentum,
                               weight_decay=optim.weight_decay)
    return torch.optim.AdamW(
        params,
        lr=optim.lr,
        betas=tuple(optim.betas),
        eps=optim.eps,
        weight_decay=optim.weight_decay,
        # On CUDA one fused kernel per step instead of foreach's ~10 multi-tensor ops and their
        # per-tensor host work (with 8 agents x 392 tensors that host work was most of what 8
        # agents' train step cost over one agent's).
        fused=True if all(param.is_cuda for param in params) else None,
    )


def schedule(optimizer: torch.optim.Optimizer,
             optim: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """``optim``'s learning-rate schedule (warm-up, then constant/linear/cosine) on
    ``optimizer``, stepped once per train step of its agent, whatever that step's
    mini-batches and epochs (``OptimConfig.total_steps``)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(optim))


def clip_gradients(params: Sequence[torch.nn.Parameter], limit: float) -> Tensor:
    """Clip the gradients of ``params`` (those that have one) to total norm ``limit`` (0: no
    clipping); the norm before clipping, 0 when none has a gradient (rows without a response
    token: nothing to learn, a zero update)."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return torch.zeros((), device=params[0].device)
    if limit > 0:
        return torch.nn.utils.clip_grad_norm_(with_grad, limit)
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in with_grad]))


def lr_lambda(optim: OptimConfig):
    """Multiplier of the peak LR after ``step`` train steps of one agent."""

    def factor(step: int) -> float:
        if optim.warmup_steps and step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.lr_scheduler == "constant":
            return 1.0
        progress = (step - optim.warmup_steps) / max(1, optim.total_steps - optim.warmup_steps)
        progress = min(1.0, progress)
        if optim.lr_scheduler == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
