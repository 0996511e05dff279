"""How far does one optimizer step move an LLM agent's policy over legal moves?

    python benchmarks/policy_step.py --steps 5 --override team.optim.lr=2e-4     # SmolLM2, CPU ok
    python benchmarks/policy_step.py --tiny --steps 5 --override team.optim.lr=1e-2

Self-play convergence in a game like Kuhn poker depends on the step size IN POLICY SPACE:
``benchmarks/tabular_kuhn.py`` moves one logit per information state by at most ``lr`` per
Adam step and converges with ~0.03; an adapter's Adam step moves millions of weights by ``lr``
each, all of which feed the same few decision logits, so the same ``lr`` can move a decision
logit by far more. This script measures it: it trains the Kuhn recipe
(`examples/kuhn_poker/nash.yaml`, overrides last) for ``--steps`` steps and, before and after
each, reads each agent's exact policy in all 12 information states (the legal-move
probabilities constrained decoding samples from, at the evaluation temperature). Per step and
agent it prints the mean and the largest change of the log-odds of betting/calling, and the
mean entropy over legal moves (nats; ln 2 = 0.693 is uniform). One JSON line per step.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _policies(pipeline) -> dict[str, np.ndarray]:
    """Per agent, (information states, 2) legal-move probabilities, each seat played by it."""
    from roll.pipeline.exploitability import llm_policy

    cfg = pipeline.cfg
    tables = {}
    for agent in pipeline.agent_names:
        table = llm_policy(cfg.env.game, dict(cfg.env.params), pipeline.trainer,
                           pipeline.tokenizer, lambda seat, agent=agent: agent,
                           pipeline.render,
                           cfg.eval.temperature, enable_thinking=cfg.model.enable_thinking)
        tables[agent] = np.array(table.action_probability_array)
    return tables


def _log_odds(probs: np.ndarray) -> np.ndarray:
    """log P(second action) / P(first action) per state (Kuhn: bet/call vs pass/fold)."""
    clipped = np.clip(probs, 1e-12, 1.0)
    return np.log(clipped[:, 1]) - np.log(clipped[:, 0])


def _entropy(probs: np.ndarray) -> float:
    clipped = np.clip(probs, 1e-12, 1.0)
    return float(-(probs * np.log(clipped)).sum(-1).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny random model on CPU")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--override", nargs="*", default=[])
    args = parser.parse_args()

    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config
    from roll.utils.tracking import Tracker

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    out = Path(tempfile.mkdtemp(prefix="policy_step_"))
    overrides = [f"model.path={'tiny' if args.tiny else 'smollm2-135m'}",
                 f"model.device={device}", "tracking.backends=[jsonl]", "save_steps=0",
                 f"output_dir={out}", "eval.eval_steps=0", *args.override]
    cfg = load_config(str(ROOT / "examples/kuhn_poker"), "nash", overrides)
    pipeline = AgenticPipeline(cfg)
    scheduler = pipeline.scheduler(pipeline.train_seatings, evaluation=False)
    before = _policies(pipeline)
    with Tracker(cfg.tracking, str(out), run_id="policy-step") as tracker:
        for step in range(1, args.steps + 1):
            start = time.perf_counter()
            pipeline.step = step
            metrics = pipeline.train_step(scheduler, tracker)
            after = _policies(pipeline)
            record = {"step": step, "lr": cfg.team.optim.lr, "optimizer": cfg.team.optim.name,
                      "seconds": round(time.perf_counter() - start, 1)}
            for agent in pipeline.agent_names:
                moved = np.abs(_log_odds(after[agent]) - _log_odds(before[agent]))
                record[agent] = {
                    "mean_log_odds_change": round(float(moved.mean()), 4),
                    "max_log_odds_change": round(float(moved.max()), 4),
                    "legal_move_entropy": round(_entropy(after[agent]), 4),
                    "grad_norm": round(metrics.get(f"{agent}/grad_norm", float("nan")), 4)}
            print(json.dumps(record), flush=True)
            before = after
    shutil.rmtree(out, ignore_errors=True)  # the run's folder (its metrics are printed above)


if __name__ == "__main__":
    main()
