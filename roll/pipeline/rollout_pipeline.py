"""Rollout-only evaluation: play trained agents against random, MCTS, snapshots or each other.

Loads the agents from ``resume`` (a checkpoint folder, or 'latest' in output_dir; null plays
the untrained adapters), plays ``eval.num_episodes`` episodes per evaluation seating with
``eval.temperature``, and reports each agent's win rate and mean return with 95% intervals.
"""

from __future__ import annotations

import json
from pathlib import Path

from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.config import PipelineConfig
from roll.utils.checkpoint import resolve_resume
from roll.utils.tracking import Tracker, TrackingConfig


def format_summary(metrics: dict[str, float], agent_names: list[str]) -> str:
    """A small table: one line per agent with its intervals (and one for its greedy policy
    with ``eval.greedy_too``; cooperative games: no win rate, and a last line with the team
    score)."""

    def interval(key: str, sign: str = "") -> str:
        return (f"{metrics[key]:{sign}.3f} [{metrics[key + '_low']:{sign}.3f}, "
                f"{metrics[key + '_high']:{sign}.3f}]")

    lines = [f"{'agent':<16}{'episodes':>9}  {'win rate [95% CI]':<26}{'mean return [95% CI]'}"]
    for agent in agent_names:
        # eval.greedy_too: the greedy policy (argmax answers) on the same games, a line below
        for label, key in ((agent, f"eval/{agent}"), ("  greedy", f"eval_greedy/{agent}")):
            if f"{key}/mean_return" not in metrics:
                continue
            win = (interval(f"{key}/win_rate") if f"{key}/win_rate" in metrics
                   else "n/a (cooperative)")
            ret = interval(f"{key}/mean_return", "+")
            lines.append(f"{label:<16}{int(metrics[f'{key}/episodes']):>9}  {win:<26}{ret}")
    if "eval/team/score" in metrics:
        lines.append(f"{'team score':<16}{'':>9}  {'':<26}{interval('eval/team/score', '+')}")
    return "\n".join(lines)


def run_evaluation(cfg: PipelineConfig) -> dict[str, float]:
    """Evaluate, print the table, write ``<output_dir>/eval_results.json``; return metrics."""
    checkpoint = resolve_resume(cfg.resume, Path(cfg.output_dir))
    if checkpoint is None and cfg.resume is not None:  # before any model loads
        raise FileNotFoundError(f"resume={cfg.resume!r}: no checkpoint in {cfg.output_dir}")
    pipeline = AgenticPipeline(cfg)
    if checkpoint is not None:
        pipeline.load(checkpoint)
    pipeline.pool.take(pipeline.step, persist=False)
    with Tracker(TrackingConfig(backends=["console"]), cfg.output_dir) as tracker:
        metrics = pipeline.evaluate(pipeline.scheduler(pipeline.eval_seatings, True), tracker)
    pipeline.close_roles()  # cluster.backend=ray: evaluation is done, free every role's actors
    print(format_summary(metrics, pipeline.agent_names), flush=True)
    out = Path(cfg.output_dir) / "eval_results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"checkpoint": str(checkpoint), "metrics": metrics}, indent=2))
    return metrics
