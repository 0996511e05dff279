#!/usr/bin/env bash
# Two agents play Leduc poker against each other. Extra arguments are Hydra overrides, e.g. model.path=Qwen/Qwen3-0.6B model.device=cuda
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/leduc_poker \
  --config_name multi_agent_leduc_poker --num_agents 2 "$@"
