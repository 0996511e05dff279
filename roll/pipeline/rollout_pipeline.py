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
    """A small table: one line per agent with its intervals."""
    lines = [f"{'agent':<16}{'episodes':>9}  {'win rate [95% CI]':<26}{'mean return [95% CI]'}"]
    for agent in agent_names:
        key = f"eval/agent_{agent}"
        if f"{key}/win_rate" not in metrics:
            continue
        win = (f"{metrics[f'{key}/win_rate']:.3f} [{metrics[f'{key}/win_rate_low']:.3f}, "
               f"{metrics[f'{key}/win_rate_high']:.3f}]")
        ret = (f"{metrics[f'{key}/mean_return']:+.3f} [{metrics[f'{key}/mean_return_low']:+.3f}, "
               f"{metrics[f'{key}/mean_return_high']:+.3f}]")
        lines.append(f"{agent:<16}{int(metrics[f'{key}/episodes']):>9}  {win:<26}{ret}")
    return "\n".join(lines)


def run_evaluation(cfg: PipelineConfig) -> dict[str, float]:
    """Evaluate, print the table, write ``<output_dir>/eval_results.json``; return metrics."""
    pipeline = AgenticPipeline(cfg)
    checkpoint = resolve_resume(cfg.resume, Path(cfg.output_dir))
    if checkpoint is not None:
        pipeline.load(checkpoint)
    elif cfg.resume is not None:
        raise FileNotFoundError(f"resume={cfg.resume!r}: no checkpoint in {cfg.output_dir}")
    pipeline.pool.take(pipeline.step)
    pipeline.sync_adapters()
    tracking = TrackingConfig(backends=["console"], log_dir=cfg.output_dir)
    with Tracker(tracking) as tracker:
        metrics = pipeline.evaluate(pipeline.scheduler(pipeline.eval_seatings, True), tracker)
    print(format_summary(metrics, pipeline.agent_names), flush=True)
    out = Path(cfg.output_dir) / "eval_results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"checkpoint": str(checkpoint), "metrics": metrics}, indent=2))
    return metrics
