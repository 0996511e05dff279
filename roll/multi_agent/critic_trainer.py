"""Critic updates: each critic trains its own LoRA adapter and value head on its own rows.

One train step = one optimizer step per critic that has rows: the clipped value loss
(``roll.algorithms.losses.value_loss``) of its rows against their return targets, token-mean
over the critic's response tokens, accumulated over micro-batches of ``micro_batch_size`` of
its rows, its gradient norm clipped to its ``optim.max_grad_norm``, then its own AdamW and
learning-rate schedule. Critics never share a forward here (one critic's micro-batch at a time;
a critic is one forward more per step, not a fused path), so invariant 1 holds as for agents:
critics trained together get exactly what each gets alone, and a critic without rows keeps its
weights and optimizer state bitwise. A non-finite loss or gradient norm in any critic refuses
the whole step before any critic moves.

Simplification, stated: one pass over the rows per step (no PPO epochs or mini-batches for
critics yet).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from roll.algorithms.losses import value_loss
from roll.batch import TrajectoryBatch
from roll.multi_agent.config import AgentConfig, ConfigError
from roll.multi_agent.critic import ValueHeads, critic_values
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.multi_agent.worker import NonFiniteLossError, clip_gradients, lr_lambda


@dataclass
class CriticTrainConfig:
    """How critics are updated (checked by ``validate``; errors name the field)."""

    value_clip: float | None = 0.2
    """Clip of the value loss: a value moves at most this far from its old value to gain on
    the loss (None: plain squared error)."""
    micro_batch_size: int = 8
    """Rows of one critic per forward/backward; gradients accumulate over its micro-batches."""

    def validate(self) -> CriticTrainConfig:
        if self.value_clip is not None and not self.value_clip > 0:
            raise ConfigError("critic.value_clip", self.value_clip, "must be > 0 or null")
        if not isinstance(self.micro_batch_size, int) or self.micro_batch_size < 1:
            raise ConfigError("critic.micro_batch_size", self.micro_batch_size, "must be >= 1")
        return self


class CriticTrainer:
    """Per-critic AdamW over (its LoRA tensors, its head), clipped value loss.

    Args:
        model: holds the critics' adapters (``critic_names``) on the shared base.
        heads: their value heads.
        critics: each critic's config (name, lora, optim), in ``model.critic_names`` order.
    """

    def __init__(self, model: MultiAgentLoRAModel, heads: ValueHeads,
                 critics: Sequence[AgentConfig], config: CriticTrainConfig) -> None:
        if [c.name for c in critics] != model.critic_names:
            raise ValueError(f"critic trainer critics {[c.name for c in critics]} differ from "
                             f"the model's {model.critic_names}")
        self.model, self.heads, self.config = model, heads, config.validate()
        self.names = list(model.critic_names)
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR] = {}
        self.max_grad_norm = {critic.name: critic.optim.max_grad_norm for critic in critics}
        for critic in critics:
            optim = critic.optim
            params = [*model.agent_parameters(critic.name), *heads.heads[critic.name].parameters()]
            self.optimizers[critic.name] = torch.optim.AdamW(
                params, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                weight_decay=optim.weight_decay)
            self.schedulers[critic.name] = torch.optim.lr_scheduler.LambdaLR(
                self.optimizers[critic.name], lr_lambda(optim))

    def parameters(self, name: str) -> list[torch.nn.Parameter]:
        """Critic ``name``'s trained tensors: its adapter's, then its head's."""
        return list(self.optimizers[name].param_groups[0]["params"])

    @torch.no_grad()
    def values(self, batch: TrajectoryBatch, critic_id: Tensor) -> Tensor:
        """Values (B, T) on the response tokens, each row through its critic (``critic_id``
        (B,)), in forwards of one critic's rows at a time."""
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32,
                          device=batch.input_ids.device)
        for rows in self._micro_batches(critic_id).values():
            for micro in rows:
                out[micro] = self._forward(batch, critic_id, micro)
        return out

    def train_step(self, batch: TrajectoryBatch, critic_id: Tensor) -> dict[str, dict[str, float]]:
        """One update of every critic with rows. ``batch`` needs ``values`` (the critics'
        values when the rows were scored) and ``returns`` (the targets), (B, T)."""
        batch.require("values", "returns")
        plan = self._micro_batches(critic_id)
        mask = batch.response_mask.float()
        metrics: dict[str, dict[str, float]] = {}
        norms: dict[str, Tensor] = {}
        losses: dict[str, Tensor] = {}
        steps = {name: self.schedulers[name].last_epoch for name in plan}
        for name, micros in plan.items():
            self.optimizers[name].zero_grad(set_to_none=True)
            normaliser = mask[torch.cat(micros)].sum().clamp(min=1.0)
            sums = dict.fromkeys(("value_loss", "value_clip_frac", "value_error"), 0.0)
            with self.model.training_forward({name: steps[name]}, "critic_dropout"):
                for micro in micros:
                    values = self._forward(batch, critic_id, micro)
                    loss, parts = value_loss(values, batch.values[micro], batch.returns[micro],
                                             mask[micro], clip=self.config.value_clip,
                                             normalizer=normaliser)
                    loss.backward()
                    share = mask[micro].sum() / normaliser
                    sums["value_loss"] += loss.detach()
                    sums["value_clip_frac"] += parts["value_clip_frac"] * share
                    sums["value_error"] += parts["value_error"] * share
            losses[name] = sums["value_loss"]
            norms[name] = self._clip(name)
            metrics[name] = {key: float(value) for key, value in sums.items()}
            metrics[name]["num_rows"] = float(sum(len(m) for m in micros))
        self._refuse_non_finite(losses, norms)
        for name in plan:
            self.optimizers[name].step()
            self.schedulers[name].step()
            self.optimizers[name].zero_grad(set_to_none=True)
            metrics[name]["grad_norm"] = float(norms[name])
        return metrics

    def state_dict(self) -> dict:
        """Optimizers and schedulers (adapters and heads are saved by ``save_critic``)."""
        return {"optimizers": {n: o.state_dict() for n, o in self.optimizers.items()},
                "schedulers": {n: s.state_dict() for n, s in self.schedulers.items()}}

    def load_state_dict(self, state: dict) -> None:
        for name in self.names:
            self.optimizers[name].load_state_dict(state["optimizers"][name])
            self.schedulers[name].load_state_dict(state["schedulers"][name])

    # ------------------------------------------------------------------ internals
    def _micro_batches(self, critic_id: Tensor) -> dict[str, list[Tensor]]:
        """Each critic with rows -> its rows (indices, in batch order) in micro-batches."""
        plan = {}
        for index, name in enumerate(self.names):
            rows = (critic_id == index).nonzero().squeeze(-1)
            if rows.numel():
                plan[name] = list(rows.split(self.config.micro_batch_size))
        return plan

    def _forward(self, batch: TrajectoryBatch, critic_id: Tensor, rows: Tensor) -> Tensor:
        return critic_values(self.model, self.heads, batch.input_ids[rows],
                             batch.attention_mask[rows], critic_id[rows],
                             positions=batch.response_mask[rows].bool())

    def _clip(self, name: str) -> Tensor:
        return clip_gradients(self.parameters(name), self.max_grad_norm[name])

    def _refuse_non_finite(self, losses: dict[str, Tensor], norms: dict[str, Tensor]) -> None:
        for name in losses:
            for what, value in (("value loss", losses[name]), ("gradient norm", norms[name])):
                if not math.isfinite(float(value)):
                    for optimizer in self.optimizers.values():
                        optimizer.zero_grad(set_to_none=True)
                    raise NonFiniteLossError(
                        f"critic {name!r}: {what} is {float(value)}; the critic step was "
                        "refused and no critic was updated")
