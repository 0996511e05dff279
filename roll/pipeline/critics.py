"""The critics of a run (``critic.mode``): which exist, their values before the advantages,
their update after the agents', their checkpoint folders.

    per_agent   critic_<agent> for each trained agent; a row's critic is its agent's (IPPO)
    shared      one centralised critic for every agent's rows (MAPPO)

The critics are adapters of the trainer's PEFT model (``MultiAgentLoRAModel(critics=...)``),
so the base stays one copy (invariant 2); engines never see them. In a step:

    rollout → old/reference log-probs → values (this module) → advantages (GAE reads values)
            → agents' update → critics' update on the returns (this module)

The values the advantages use are the critics' before their update, and the same values are
the clip anchors of the value loss.

``critic.input=global``: the critics read each row's global view (``critic_input_ids``: the
acting seat's prompt plus every seat's observation, then the same response tokens) instead of
the agent's prompt. Values and returns stay in the agents' (B, T) layout; they move between
the two layouts by response-token order (``relayout``), which both layouts share.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from roll.batch import TrajectoryBatch
from roll.multi_agent.config import AgentConfig
from roll.multi_agent.critic import ValueHeads, load_critic, save_critic
from roll.multi_agent.critic_trainer import CriticTrainConfig, CriticTrainer
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.pipeline.config import CriticSchema
from roll.utils.checkpoint import critic_dir

SHARED_CRITIC = "critic"


def critic_agents(cfg: CriticSchema, agent_names: list[str]) -> list[AgentConfig]:
    """The critics ``cfg.mode`` asks for, as adapter configs (none for mode 'none')."""
    if cfg.mode == "none":
        return []
    names = ([f"critic_{name}" for name in agent_names] if cfg.mode == "per_agent"
             else [SHARED_CRITIC])
    return [AgentConfig(name, lora=cfg.lora, optim=cfg.optim) for name in names]


def relayout(x: Tensor, source_mask: Tensor, target_mask: Tensor) -> Tensor:
    """``x`` (B, T) moved from the response tokens of ``source_mask`` (B, T) to those of
    ``target_mask`` (B, T'), in order; zero elsewhere. Both masks must mark as many tokens per
    row (the same responses under different prompts)."""
    source, target = source_mask.bool(), target_mask.bool()
    if not torch.equal(source.sum(dim=1), target.sum(dim=1)):
        raise ValueError("relayout: the two layouts mark different response lengths")
    out = torch.zeros(target.shape, dtype=x.dtype, device=x.device)
    out[target] = x[source]  # row-major order: row by row, left to right in both
    return out


class Critics:
    """The run's critics on ``model`` (which must hold ``critic_agents(cfg, ...)``)."""

    def __init__(self, cfg: CriticSchema, model: MultiAgentLoRAModel,
                 critics: list[AgentConfig]) -> None:
        self.mode = cfg.mode
        self.input = cfg.input
        self.model = model
        device = model.base_model.get_input_embeddings().weight.device
        self.heads = ValueHeads(model.critic_names, model.base_model.config.hidden_size, device)
        self.trainer = CriticTrainer(model, self.heads, critics, CriticTrainConfig(
            value_clip=cfg.value_clip, micro_batch_size=cfg.micro_batch_size))

    @property
    def names(self) -> list[str]:
        return list(self.model.critic_names)

    def critic_id(self, batch: TrajectoryBatch) -> Tensor:
        """(B,) each row's critic, an index into ``names``."""
        if self.mode == "per_agent":
            return batch.agent_id  # critic_<agent i> is critic i
        return torch.zeros_like(batch.agent_id)

    def with_values(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """``batch`` with ``values`` (B, T): each row's critic's V before each response token."""
        view = self._view(batch)
        values = self.trainer.values(view, self.critic_id(batch))
        if view is not batch:
            values = relayout(values, view.response_mask, batch.response_mask)
        return batch.with_fields(values=values)

    def train_step(self, batch: TrajectoryBatch) -> dict[str, float]:
        """One update of every critic with rows (``batch`` has ``values`` and ``returns``);
        metrics ``critic/<critic>/<name>`` plus ``critic/explained_variance`` of the values
        it was given (1: the values predicted the returns, 0: no better than their mean)."""
        view = self._view(batch)
        if view is not batch:
            view = view.with_fields(**{
                name: relayout(getattr(batch, name), batch.response_mask, view.response_mask)
                for name in ("values", "returns")})
        per_critic = self.trainer.train_step(view, self.critic_id(batch))
        metrics = {f"critic/{critic}/{key}": value
                   for critic, parts in per_critic.items() for key, value in parts.items()}
        mask = batch.response_mask.bool()
        returns, values = batch.returns[mask].float(), batch.values[mask].float()
        if returns.numel() > 1:
            variance = returns.var(unbiased=False)
            residual = (returns - values).var(unbiased=False)
            metrics["critic/explained_variance"] = float(
                1.0 - residual / variance) if variance > 0 else 0.0
        return metrics

    def _view(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """The rows as the critics read them: ``batch`` itself (critic.input=local) or its
        global-view layout (critic.input=global)."""
        if self.input == "local":
            return batch
        if batch.critic_input_ids is None:
            raise ValueError("critic.input='global': the batch has no critic_input_ids (the "
                             "rollout must render global views: RolloutConfig.critic_view)")
        return batch.with_fields(input_ids=batch.critic_input_ids,
                                 attention_mask=batch.critic_attention_mask,
                                 response_mask=batch.critic_response_mask)

    # ------------------------------------------------------------------ checkpoints
    def save(self, checkpoint: Path) -> None:
        """Each critic's folder (PEFT adapter + value head) under ``checkpoint/critics/``."""
        for name in self.names:
            save_critic(self.model, self.heads, name, critic_dir(checkpoint, name))

    def state_dict(self) -> dict:
        return {"mode": self.mode, "names": self.names, "trainer": self.trainer.state_dict()}

    def load(self, checkpoint: Path, state: dict | None) -> None:
        """Adapters, heads, optimizers and schedulers from a checkpoint ``save`` wrote into
        (``state``: ``state_dict()`` as saved in the trainer state)."""
        if state is None or state["names"] != self.names:
            saved = "no critics" if state is None else f"critics {state['names']}"
            raise ValueError(f"resume={str(checkpoint)!r}: the checkpoint has {saved}, the "
                             f"config's critic.mode={self.mode!r} asks for {self.names}")
        for name in self.names:
            load_critic(self.model, self.heads, name, critic_dir(checkpoint, name))
        self.trainer.load_state_dict(state["trainer"])
