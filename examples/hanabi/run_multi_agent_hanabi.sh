#!/usr/bin/env bash
# Two agents cooperate in a small Hanabi (2 colors, 3 ranks); the team score is shared. Extra arguments are Hydra overrides, e.g. model.path=Qwen/Qwen3-0.6B model.device=cuda
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/hanabi \
  --config_name multi_agent_hanabi --num_agents 2 "$@"
