"""HAPPO's update in a run (``advantage.estimator=happo``): agents one after another.

Each step draws the order (``happo_order``: from the run seed and the step), then for each agent
in turn: its rows only, its advantages times the factor M of the agents already updated in the
same episodes (``happo_factors``), one ``train_step`` (the others idle: bitwise unchanged), then
its new log-probs on its rows give its episode log-ratios for the agents after it. The trainer's
adapter version therefore advances once per agent with rows, not once per step.
"""

from __future__ import annotations

import torch

from roll.algorithms.happo_ratios import episode_log_ratio, happo_factors, happo_order
from roll.batch import TrajectoryBatch
from roll.distributed.roles import TrainGroup
from roll.errors import NonFiniteLossError, RoleFailed


def happo_update(trainer: TrainGroup, batch: TrajectoryBatch, seed: int, step: int,
                 temperature: float, factor_clip: float | None = None,
                 log_ratio_reduce: str = "sum") -> dict[str, dict[str, float]]:
    """Update every agent with rows, in HAPPO's order; per-agent metrics of each update plus
    ``happo_position`` (0 = first) and ``happo_factor`` / ``happo_factor_min`` /
    ``happo_factor_max`` (the mean, least and largest M its rows were weighted by, M bounded to
    [1/factor_clip, factor_clip]); each earlier turn's log-ratio is the sum or the mean of its
    tokens' (``log_ratio_reduce``, ``episode_log_ratio``). ``batch`` carries old log-probs and
    advantages."""
    batch.require("old_logprobs", "advantages", "env_id")
    names = list(trainer.agent_names)
    updated = torch.zeros(len(batch), dtype=torch.bool, device=batch.agent_id.device)
    log_ratio = torch.zeros(len(batch), dtype=torch.float32, device=batch.agent_id.device)
    metrics: dict[str, dict[str, float]] = {}
    # Atomic (invariant 5): a refusal of a later agent undoes the earlier agents' steps too.
    trainer.hold()
    try:
        for position, name in enumerate(happo_order(names, seed, step)):
            rows = (batch.agent_id == names.index(name)).nonzero().squeeze(-1)
            if not rows.numel():
                continue
            factor = happo_factors(log_ratio, updated, batch.env_id, factor_clip)[rows]  # (b,)
            own = batch.select(rows)
            own = own.with_fields(advantages=own.advantages * factor.unsqueeze(-1).to(
                own.advantages.dtype))
            metrics[name] = dict(trainer.train_step(own)[name])
            metrics[name]["happo_position"] = float(position)
            metrics[name]["happo_factor"] = float(factor.mean())
            metrics[name]["happo_factor_min"] = float(factor.min())
            metrics[name]["happo_factor_max"] = float(factor.max())
            new = trainer.policy_logprobs(own, temperature)  # where the ranks train
            log_ratio[rows] = episode_log_ratio(new, own.old_logprobs, own.response_mask,
                                                log_ratio_reduce).float()
            updated[rows] = True
    except (NonFiniteLossError, RoleFailed):  # RoleFailed: a Ray rank refused
        trainer.rollback()
        raise
    trainer.release()
    return metrics
