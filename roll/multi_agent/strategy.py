"""How a round's gradients become optimizer steps: the part of training a strategy owns.

``MultiAgentTrainer`` (trainer.py) plans the step (rows, mini-batches, rounds, micro-batches),
runs the forwards, computes each agent's loss and refuses NaN/inf; everything that depends on
where the optimizer's state lives goes through one ``TrainStrategy``:

- ``TorchStrategy`` (the default, here): one AdamW and one LambdaLR per agent over its own
  adapter tensors, in this process; with ``grad_sync``, data-parallel ranks sum each round's
  gradients in one all-reduce (roll/distributed/data_parallel.py implements ``GradSync``).
- ``DeepSpeedStrategy`` (roll/distributed/deepspeed_strategy.py): the same gradients, summed
  and clipped the same way, stepped by a DeepSpeed ZeRO-2/3 engine that shards the optimizer.

Every strategy keeps per agent an optimizer whose first parameter group's tensors carry that
agent's gradient (``.grad``: what is summed over ranks, clipped and checked) and a LambdaLR on
it, counted in the agent's own optimizer steps (its ``last_epoch``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from roll.multi_agent.config import AgentConfig
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.multi_agent.optim import build_optimizer, clip_gradients, schedule
from roll.multi_agent.team_factors import (
    native_optimizer_state,
    optimizer_parameters,
    portable_optimizer_state,
)


class GradSync(Protocol):
    """How data-parallel ranks share a round's gradients (roll/distributed implements it)."""

    rank: int
    world_size: int

    def all_reduce(self, flat: Tensor) -> Tensor:
        """The element-wise sum of ``flat`` over all ranks (same shape, same device)."""
        ...


class TrainStrategy(Protocol):
    """What ``MultiAgentTrainer`` asks of the optimizers' side. Under data parallelism every
    method is called on every rank in the same order (a strategy's may be collectives)."""

    @property
    def grad_sync(self) -> GradSync | None:
        """Data-parallel ranks (each forwards its share of every mini-batch); None: alone."""
        ...

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Per agent: ``param_groups[0]["params"]`` carry its gradient, and its learning rate."""
        ...

    @property
    def schedulers(self) -> dict[str, torch.optim.lr_scheduler.LambdaLR]:
        """Per agent: its learning-rate schedule, stepped by the trainer once per train step in
        which the agent has rows (however many optimizer steps that step takes)."""
        ...

    def setup(self, model: MultiAgentLoRAModel, agents: Sequence[AgentConfig]) -> None:
        """Build the optimizers and schedulers of ``agents`` (the model's, in its order)."""
        ...

    def backward(self, total: Tensor, names: list[str]) -> None:
        """Add the gradient of one forward's loss to these agents' gradient carriers."""
        ...

    def padding_passes(self, passes: int) -> int:
        """How many padding passes to run after this rank's ``passes`` forward/backward passes
        of a round (a strategy whose forwards are collectives makes every rank run as many as
        the busiest one); 0: none."""
        ...

    def padding_backward(self, loss: Tensor, name: str) -> None:
        """The backward of a padding pass (a zero ``loss`` on agent ``name``'s row): run it,
        drop its gradients."""
        ...

    def sum_over_ranks(self, names: list[str], extra: Tensor) -> Tensor:
        """One all-reduce of these agents' gradients (in place; a carrier keeps ``grad=None``
        only if it has none on every rank) and of ``extra`` (flat float, on its device);
        returns the summed ``extra``."""
        ...

    def clip(self, name: str, limit: float) -> Tensor:
        """Clip this agent's gradient to norm ``limit`` (0: no clipping); the norm before."""
        ...

    def zero_grad(self, names: list[str]) -> None:
        """Drop these agents' gradients."""
        ...

    def step(self, names: list[str]) -> None:
        """Apply these agents' (summed, clipped) gradients: one optimizer step each (the
        trainer steps the schedules, once per train step)."""
        ...

    def export_adapters(self, names: Sequence[str]) -> dict[str, dict[str, Tensor]]:
        """These agents' adapter tensors (PEFT keys), as the model holds them now."""
        ...

    def load_adapters(self, adapters: dict[str, dict[str, Tensor]]) -> None:
        """Overwrite agents' adapters (and whatever copy of them the optimizer steps)."""
        ...

    def state_dict(self) -> dict:
        """``{"optimizers": per agent AdamW state dict (one entry per adapter tensor),
        "schedulers": per agent LambdaLR state dict}``: one format for every strategy."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Inverse of ``state_dict`` (from any strategy's checkpoint)."""
        ...

    def snapshot(self, names: list[str]) -> object:
        """What a step of these agents changes (adapters, optimizer and scheduler states)."""
        ...

    def restore(self, snapshot: object) -> None:
        """Put back a ``snapshot`` (a refused step: no agent half-updated)."""
        ...


class TorchStrategy:
    """Plain torch: per agent its optimizer (``optim.build_optimizer``) over the tensors the
    model says it steps (``team_factors.optimizer_parameters``) and its LambdaLR; gradients
    summed over ``grad_sync``'s ranks by hand (one flat all-reduce per round)."""

    def __init__(self, grad_sync: GradSync | None = None) -> None:
        self.grad_sync = grad_sync
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR] = {}

    def setup(self, model: MultiAgentLoRAModel, agents: Sequence[AgentConfig],
              optimizers: dict[str, torch.optim.Optimizer] | None = None) -> None:
        """``optimizers``: each agent's own, when they hold other tensors than the model's
        (a strategy that steps the adapters elsewhere keeps their gradients here)."""
        self.model = model
        for agent in agents:
            optimizer = (optimizers[agent.name] if optimizers is not None else
                         build_optimizer(optimizer_parameters(model, agent.name), agent.optim))
            self.optimizers[agent.name] = optimizer
            self.schedulers[agent.name] = schedule(optimizer, agent.optim)

    def carriers(self, name: str) -> list[Tensor]:
        """The tensors whose ``.grad`` hold agent ``name``'s gradient."""
        return self.optimizers[name].param_groups[0]["params"]

    # ------------------------------------------------------------------ gradients
    def backward(self, total: Tensor, names: list[str]) -> None:
        total.backward()

    def padding_passes(self, passes: int) -> int:
        return 0

    def padding_backward(self, loss: Tensor, name: str) -> None:
        torch.autograd.grad(loss, self.model.agent_parameters(name), allow_unused=True)

    def sum_over_ranks(self, names: list[str], extra: Tensor) -> Tensor:
        return sum_gradients([param for name in names for param in self.carriers(name)],
                             extra, self.grad_sync)

    def clip(self, name: str, limit: float) -> Tensor:
        return clip_gradients(self.carriers(name), limit)

    def zero_grad(self, names: list[str]) -> None:
        for name in names:
            self.optimizers[name].zero_grad(set_to_none=True)

    def step(self, names: list[str]) -> None:
        for name in names:
            self.optimizers[name].step()

    # ------------------------------------------------------------------ state
    def export_adapters(self, names: Sequence[str]) -> dict[str, dict[str, Tensor]]:
        return {name: self.model.export_adapter(name) for name in names}

    def load_adapters(self, adapters: dict[str, dict[str, Tensor]]) -> None:
        for name, tensors in adapters.items():
            self.model.import_adapter(name, tensors)

    def state_dict(self) -> dict:
        return {
            "optimizers": {name: portable_optimizer_state(self.model, name, opt.state_dict())
                           for name, opt in self.optimizers.items()},
            "schedulers": {name: s.state_dict() for name, s in self.schedulers.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        for name in self.optimizers:
            self.optimizers[name].load_state_dict(
                native_optimizer_state(self.model, name, state["optimizers"][name]))
            self.schedulers[name].load_state_dict(state["schedulers"][name])

    def snapshot(self, names: list[str]) -> dict:
        return {
            name: (
                [p.detach().clone() for p in self.model.agent_parameters(name)],
                copy.deepcopy(self.optimizers[name].state_dict()),
                copy.deepcopy(self.schedulers[name].state_dict()),
            )
            for name in names
        }

    @torch.no_grad()
    def restore(self, snapshot: dict) -> None:
        for name, (params, optimizer_state, scheduler_state) in snapshot.items():
            for param, saved in zip(self.model.agent_parameters(name), params, strict=True):
                param.copy_(saved)
            self.optimizers[name].load_state_dict(optimizer_state)
            self.schedulers[name].load_state_dict(scheduler_state)


def sum_gradients(params: list[Tensor], extra: Tensor, grad_sync: GradSync) -> Tensor:
    """Sum the ``.grad`` of ``params`` and the flat float ``extra`` over ``grad_sync``'s ranks
    in one all-reduce (gradients in place; a tensor keeps ``grad=None`` only if it has none on
    every rank); returns the summed ``extra``. Every rank must pass the same tensors, in the
    same order."""
    device = extra.device
    has_grad = [param.grad is not None for param in params]
    flat = torch.cat(
        [(param.grad if param.grad is not None else torch.zeros_like(param))
         .reshape(-1).float().to(device) for param in params]
        + [torch.tensor(has_grad, dtype=torch.float32, device=device), extra])
    summed = grad_sync.all_reduce(flat)
    sizes = [param.numel() for param in params]
    grads = summed[:sum(sizes)].split(sizes)
    any_grad = summed[sum(sizes):sum(sizes) + len(params)].tolist()  # one host sync
    for param, grad, has in zip(params, grads, any_grad, strict=True):
        param.grad = grad.view_as(param).to(param.dtype) if has > 0 else None
    return summed[sum(sizes) + len(params):]


__all__ = ["GradSync", "TorchStrategy", "TrainStrategy", "sum_gradients"]
