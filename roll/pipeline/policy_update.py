"""The learning half of a train step: the no-grad passes it needs (``behaviour_passes``), then,
after the critics' values: advantages → zero-advantage rows → the magnet's log-probs → every
agent's update (fused, or HAPPO's one agent after another) and every critic's.

One refusal rule (invariant 5): every agent and every critic steps, or none does. The critics'
gradients are formed and checked first (their targets do not depend on the agents' update), the
agents' update then refuses as a whole (HAPPO undoes its earlier agents), and only then do the
critics step; a refusal anywhere names the first non-finite agent or critic.

The snapshot magnet (``trainer.magnet=snapshot``, magnetic mirror descent / NashPG): each
agent's adapter as it was at the start of step 1, 1 + K, 1 + 2K, … (K = ``trainer.magnet_refresh``);
the KL term pulls the agent toward it over legal moves (roll/algorithms/choices.py), and each
refresh moves the magnet to where the agent has got to. Its tensors are saved beside the agents
in every checkpoint (``<checkpoint>/magnet/<agent>/``, PEFT folders) and restored on resume.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import Tensor

from roll.agentic.rollout.results import Turn
from roll.algorithms.advantages import (
    RunningBaselines,
    compute_advantages,
    zero_advantage_rows,
    zero_advantage_shares,
)
from roll.batch import TrajectoryBatch
from roll.distributed.roles import TrainGroup
from roll.errors import NonFiniteLossError, RoleFailed
from roll.models.peft_io import ADAPTER_WEIGHTS, write_peft_folder
from roll.multi_agent.critics import Critics
from roll.multi_agent.logprobs import with_old_of_rows
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.multi_agent.plan import old_pass_agents
from roll.pipeline.config import PipelineConfig
from roll.pipeline.happo_update import happo_update
from roll.pipeline.step_metrics import logprob_metrics

PROBE_ROWS = 8
"""Fresh rows (and rows played ahead) of the old-log-prob pass run for the step's metrics alone
when the update skips it."""


def behaviour_passes(cfg: PipelineConfig, trainer: TrainGroup, batch: TrajectoryBatch,
                     turns: list[Turn], comparable: bool,
                     stale: bool) -> tuple[TrajectoryBatch, dict[str, float]]:
    """``batch`` with the no-grad log-probs its update reads, and their metrics
    (``logprob_metrics``). Old log-probs only for the rows of agents that need them (plan.py
    ``old_pass_agents``; HAPPO's ratios: every agent), 0 in the others' rows; where a row has
    none, the engine gap and ``team/kl_ref`` come from the pass over ``PROBE_ROWS`` fresh rows
    and as many played ahead (``Turn.ahead``) alone."""
    counts = torch.bincount(batch.agent_id, minlength=len(trainer.agent_names)).tolist()
    rows_of = dict(zip(trainer.agent_names, counts, strict=True))
    need = (set(trainer.agent_names) if cfg.advantage.estimator == "happo"
            else old_pass_agents(trainer.config, rows_of, trainer.dropout))
    ids = [trainer.agent_names.index(name) for name in need]
    rows = torch.isin(batch.agent_id, torch.tensor(ids, dtype=batch.agent_id.dtype,
                                                   device=batch.agent_id.device))
    if bool(rows.all()):
        batch = trainer.logprob_passes(batch)  # on the train ranks in Ray mode
        return batch, logprob_metrics(batch, turns, comparable, stale)
    batch = trainer.logprob_passes(batch, old=False)  # the reference's, where it is paid
    if bool(rows.any()):
        rows = rows.nonzero().squeeze(-1)
        batch = with_old_of_rows(batch, rows, trainer.logprob_passes(batch.select(rows)))
    if not (comparable or batch.ref_logprobs is not None):
        return batch, {}
    trained = [turn for turn in turns if turn.trained_agent is not None]  # batch order
    ahead = [stale or turn.ahead for turn in trained]
    picked = sorted([row for row, late in enumerate(ahead) if not late][:PROBE_ROWS]
                    + [row for row, late in enumerate(ahead) if late][:PROBE_ROWS])
    probe = trainer.logprob_passes(
        batch.select(torch.tensor(picked, device=batch.agent_id.device))
        .with_fields(old_logprobs=None, old_move_logprobs=None))
    return batch, logprob_metrics(probe, [trained[row] for row in picked], comparable, stale)


class SnapshotMagnet:
    """Each agent's adapter at its last refresh, and the magnet's policy over legal moves."""

    def __init__(self, agent_names: list[str], refresh: int) -> None:
        self.agent_names = list(agent_names)
        self.refresh = refresh
        self.tensors: dict[str, dict[str, Tensor]] = {}
        self.taken_at: int | None = None
        """The pipeline step whose start the tensors come from."""

    def maybe_refresh(self, model: MultiAgentLoRAModel, step: int) -> bool:
        """Take the agents' adapters now if step is 1, 1 + K, 1 + 2K, … (or none is held)."""
        if self.tensors and (step - 1) % self.refresh:
            return False
        self.tensors = {name: model.export_adapter(name) for name in self.agent_names}
        self.taken_at = step
        return True

    def logprobs(self, trainer: TrainGroup, batch: TrajectoryBatch, temperature: float
                 ) -> Tensor:
        """(B, T, C): the magnet's log-probs of each row's legal tokens at its branching
        points (each row under its own agent's magnet), renormalised per point, computed where
        the agents train."""
        return trainer.choice_logprobs(batch, temperature, self.tensors)

    def save(self, checkpoint: Path, model: MultiAgentLoRAModel) -> None:
        for name, tensors in self.tensors.items():
            write_peft_folder(checkpoint / "magnet" / name, tensors, model.peft_config(name))

    def state_dict(self) -> dict:
        return {"taken_at": self.taken_at}

    def load(self, checkpoint: Path, state: dict | None) -> None:
        from safetensors.torch import load_file

        if state is None or state.get("taken_at") is None:
            return
        self.tensors = {name: load_file(str(checkpoint / "magnet" / name / ADAPTER_WEIGHTS))
                        for name in self.agent_names}
        self.taken_at = state["taken_at"]


def update_agents(cfg: PipelineConfig, trainer: TrainGroup, model: MultiAgentLoRAModel,
                  batch: TrajectoryBatch, step: int, temperature: float,
                  baselines: RunningBaselines | None, magnet: SnapshotMagnet | None,
                  critics: Critics | None = None,
                  ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Advantages, then one update of every agent with rows and of every critic (on the
    advantages' returns); (per-agent metrics, critic metrics). ``zero_adv_fraction`` is
    counted over every row, before ``advantage.drop_zero_advantage`` drops them from the policy
    update.

    Truncated episodes (cut at ``rollout.max_turns`` or by a prompt too long): without a critic
    their partial returns would be scored as a finished game's, so their rows leave the step
    (``<agent>/truncated_rows``) before any advantage or baseline sees them. With a critic
    they stay, and GAE bootstraps the value after the cut from the critic (``gae``)."""
    cut = {}
    if batch.values is None and batch.truncated is not None and bool(batch.truncated.any()):
        counts = torch.bincount(batch.agent_id[batch.truncated], minlength=len(model.agent_names))
        cut = {name: float(count) for name, count in zip(model.agent_names, counts.tolist(),
                                                           strict=True) if count}
        batch = batch.select(~batch.truncated)
        if not len(batch):
            return {name: {"truncated_rows": rows} for name, rows in cut.items()}, {}
    batch = compute_advantages(batch, cfg.advantage, baselines)
    critic_seconds = time.perf_counter()
    if critics is not None:
        critics.backward(batch)
    critic_seconds = time.perf_counter() - critic_seconds
    zero_rows = zero_advantage_rows(batch)
    zero = zero_advantage_shares(zero_rows, batch.agent_id, model.agent_names)
    policy_batch = batch.select(~zero_rows) if cfg.advantage.drop_zero_advantage else batch
    if magnet is not None and policy_batch.choice_tokens is not None:
        magnet.maybe_refresh(model, step)
        policy_batch = policy_batch.with_fields(magnet_logprobs=magnet.logprobs(
            trainer, policy_batch, temperature))
    try:
        if cfg.advantage.estimator == "happo":  # agents one after another (happo_update.py)
            per_agent = happo_update(trainer, policy_batch, cfg.seed, step, temperature,
                                     cfg.advantage.happo_factor_clip,
                                     cfg.advantage.happo_log_ratio)
        else:
            per_agent = trainer.train_step(policy_batch)
    except (NonFiniteLossError, RoleFailed):  # RoleFailed: a Ray rank refused
        if critics is not None:
            critics.discard()
        raise
    critic_metrics = {}
    if critics is not None:
        start = time.perf_counter()
        critic_metrics = critics.step()
        # Part of time/train (the critics' backward comes before the agents' update).
        critic_metrics["time/critic"] = critic_seconds + time.perf_counter() - start
    for name, rows in cut.items():
        per_agent.setdefault(name, {})["truncated_rows"] = rows
    for name, shares in zero.items():
        per_agent.setdefault(name, {})["zero_adv_fraction"] = shares["zero_adv_fraction"]
        if cfg.advantage.drop_zero_advantage:
            per_agent[name]["dropped_rows"] = shares["zero_adv_rows"]
    return per_agent, critic_metrics


__all__ = ["SnapshotMagnet", "update_agents"]
