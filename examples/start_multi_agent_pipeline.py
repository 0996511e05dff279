"""Train a team of agents (one LoRA adapter each, one shared base model).

    python examples/start_multi_agent_pipeline.py --config_path examples/tictactoe \
        --config_name multi_agent_tictactoe --num_agents 2 --lora_rank 32 --lora_alpha 32 \
        max_steps=200
"""

from __future__ import annotations

import sys

from roll.pipeline.cli import run_cli


def main(cfg) -> None:
    from roll.pipeline.agentic_pipeline import AgenticPipeline

    AgenticPipeline(cfg).run()


if __name__ == "__main__":
    sys.exit(run_cli(main, None, __doc__.strip().splitlines()[0]))
