"""Evaluate trained agents (rollouts only): win rate / mean return with 95% intervals.

    python examples/start_agentic_rollout_pipeline.py --config_path examples/tictactoe \
        --config_name multi_agent_tictactoe resume=latest eval.opponent=mcts:50
"""

from __future__ import annotations

import sys

from roll.pipeline.cli import run_cli


def main(cfg) -> None:
    from roll.pipeline.rollout_pipeline import run_evaluation

    run_evaluation(cfg)


if __name__ == "__main__":
    sys.exit(run_cli(main, None, __doc__.strip().splitlines()[0]))
