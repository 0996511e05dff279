"""A training run's evaluation: validation rollouts with the trainer's current adapters (synced
first), summarised per agent, plus the greedy policy's (``eval.greedy_too``) and the exact
exploitability (``eval.exploitability``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from roll.agentic.rollout.scheduler import RolloutScheduler
from roll.pipeline.evaluation import policy_divergences, summarize_episodes
from roll.utils.tracking import Tracker, split_agent_key

if TYPE_CHECKING:  # annotations only: the pipeline imports this module
    from roll.pipeline.agentic_pipeline import AgenticPipeline

EVAL_SEED_OFFSET = 7_919
"""Every evaluation plays the seed ``seed * 1_000_003 + EVAL_SEED_OFFSET``: the same episodes
at every evaluation of a run, none of them a training step's."""


def evaluate_now(p: AgenticPipeline, scheduler: RolloutScheduler, tracker: Tracker
                 ) -> dict[str, float]:
    """``scheduler``'s episodes summarised under ``eval/``; with ``eval.greedy_too`` the greedy
    policy's as well, same seed (``eval_greedy/...``); ``time/eval`` their seconds."""
    start = time.perf_counter()
    metrics = _eval_rollout(p, scheduler, tracker, "eval/")
    if p.cfg.eval.greedy_too:
        if p._greedy_eval is None:
            p._greedy_eval = p.scheduler(p.eval_seatings, True, temperature=0.0)
        metrics.update(_eval_rollout(p, p._greedy_eval, tracker, "eval_greedy/"))
    if p.cfg.eval.exploitability:
        from roll.pipeline.exploitability import agent_exploitabilities  # OpenSpiel

        metrics.update(agent_exploitabilities(p.cfg, p.trainer, p.tokenizer, p.agent_names,
                                              p.render))
    metrics["time/eval"] = time.perf_counter() - start
    return metrics


def _eval_rollout(p: AgenticPipeline, scheduler: RolloutScheduler, tracker: Tracker,
                  prefix: str) -> dict[str, float]:
    """One evaluation's episodes, summarised under ``prefix``."""
    # Team tasks: the evaluation split in order (the same items at every evaluation).
    items = ([i % p.env_setup.eval_items for i in range(scheduler.config.num_groups)]
             if p.env_setup.is_task else None)
    result, _ = p.synced_rollout(scheduler, p.cfg.seed * 1_000_003 + EVAL_SEED_OFFSET, tracker,
                                 f"{prefix.rstrip('/')} episodes", items)
    metrics = summarize_episodes(result.episodes, p.agent_names, p.cooperative, prefix=prefix,
                                 winners=not p.env_setup.is_task)
    if p.env_setup.is_task:
        metrics.update({f"{prefix}{key}": value for key, value in result.metrics.items()
                        if key.startswith("task/")})
        if prefix == "eval/":  # the divergences of the policy trained, not the greedy one
            batch = None if result.batch is None else result.batch.to(p.device)
            metrics.update(policy_divergences(p.trainer, batch, p.agent_names,
                                              p.policy_temperature))
    for key, value in result.metrics.items():
        split = split_agent_key(key, p.agent_names)
        if split is not None and ("format" in split[1] or split[1] == "truncated_rate"):
            metrics[f"{prefix}{key}"] = value
    return metrics


__all__ = ["EVAL_SEED_OFFSET", "evaluate_now"]
