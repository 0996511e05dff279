"""One agent's (or critic's) optimizer: AdamW or SGD, its learning-rate schedule, gradient clipping.

Every adapter gets its own of each, counted in its own optimizer steps (DESIGN.md invariant 1);
the agents' trainer and the critics' trainer build them here, the same way.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from roll.errors import ConfigError
from roll.multi_agent.config import MultiAgentConfig, OptimConfig, TrainerConfig


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
    """``optim``'s learning-rate schedule (warm-up, then constant/linear/cosine; with
    ``target_kl`` the rate steered by the policy's movement) on ``optimizer``, stepped once per
    train step of its agent, whatever that step's mini-batches and epochs
    (``OptimConfig.total_steps``; ``step_schedules``)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, RateFactor(optim))


def step_schedules(schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR],
                   metrics: dict[str, dict[str, float]]) -> None:
    """The end of a train step: each agent in ``metrics`` (those that had rows) hands its
    step's ``approx_kl`` to its rate (``RateFactor.observe``, where ``target_kl`` is set and
    the step took two or more optimizer steps), steps its schedule and logs the rate its next
    step takes (``lr``)."""
    with warnings.catch_warnings():  # LambdaLR warns that DeepSpeed's per-agent AdamW never
        warnings.simplefilter("ignore", UserWarning)  # step themselves
        for name, figures in metrics.items():
            scheduler = schedulers[name]
            if figures["optimizer_steps"] >= 2:
                scheduler.lr_lambdas[0].observe(figures["approx_kl"], scheduler.last_epoch)
            scheduler.step()
            figures["lr"] = scheduler.get_last_lr()[0]


def check_target_kl(team: MultiAgentConfig, trainer: TrainerConfig) -> None:
    """``target_kl`` reads the KL that a train step's later optimizer steps see: refused (one
    line naming the key) where every train step is one optimizer step."""
    optims = [("team.optim", team.optim)] + [
        (f"team.agents[{i}].optim", agent.optim) for i, agent in enumerate(team.agents)
        if agent.optim is not None]
    for where, optim in optims:
        if optim.target_kl and trainer.ppo_mini_batch_size is None and trainer.ppo_epochs < 2:
            raise ConfigError(f"{where}.target_kl", optim.target_kl,
                              "needs two or more optimizer steps a train step to measure the "
                              "policy's movement (one step's approx_kl is 0); set "
                              "trainer.ppo_mini_batch_size (e.g. a quarter of an agent's rows) "
                              "or trainer.ppo_epochs >= 2")


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


class RateFactor:
    """LambdaLR's multiplier of an agent's peak rate ``optim.lr`` after ``step`` train steps.

    Without ``target_kl``: the schedule's factor (``shape``: warm-up, then constant, linear or
    cosine decay to 0 at ``total_steps``). With it: ``kl_scale``, which ``observe`` moves by
    1.5x toward keeping each step's approx_kl within [1/2, 2] x ``target_kl`` x ``shape`` (the
    schedule shapes the target), held within [1/100, 100]. ``kl_scale`` is its only state and
    the only thing LambdaLR's ``state_dict`` keeps of it (the config sits in a slot): it goes
    into checkpoints and the trainer's snapshots, and resumes exactly; a checkpoint from
    before it resumes at 1."""

    __slots__ = ("optim", "__dict__")
    STEP = 1.5
    BOUNDS = (0.01, 100.0)

    def __init__(self, optim: OptimConfig) -> None:
        self.optim = optim
        self.kl_scale = 1.0

    def __call__(self, step: int) -> float:
        return self.kl_scale if self.optim.target_kl else self.shape(step)

    def shape(self, step: int) -> float:
        """The schedule's factor after ``step`` train steps."""
        optim = self.optim
        if optim.warmup_steps and step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.lr_scheduler == "constant":
            return 1.0
        progress = (step - optim.warmup_steps) / max(1, optim.total_steps - optim.warmup_steps)
        progress = min(1.0, progress)
        if optim.lr_scheduler == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    def observe(self, approx_kl: float, step: int) -> None:
        """Train step ``step`` (0-based) moved the policy by ``approx_kl``: a larger or smaller
        rate for the next one, if it left the band around its target."""
        if not self.optim.target_kl:
            return
        target = self.optim.target_kl * self.shape(step)
        low, high = self.BOUNDS
        if approx_kl > 2.0 * target:
            self.kl_scale = max(low, self.kl_scale / self.STEP)
        elif approx_kl < 0.5 * target:
            self.kl_scale = min(high, self.kl_scale * self.STEP)

