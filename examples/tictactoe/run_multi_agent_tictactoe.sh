#!/usr/bin/env bash
# Two agents on TicTacToe. Extra arguments are Hydra overrides, e.g. model.path=Qwen/Qwen3-0.6B
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/tictactoe \
  --config_name multi_agent_tictactoe --num_agents 2 "$@"
