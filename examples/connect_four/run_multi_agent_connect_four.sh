#!/usr/bin/env bash
# Two agents play Connect Four against each other. Extra arguments are Hydra overrides, e.g. model.path=Qwen/Qwen3-0.6B model.device=cuda
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/connect_four \
  --config_name multi_agent_connect_four --num_agents 2 "$@"
