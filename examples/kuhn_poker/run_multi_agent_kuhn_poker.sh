#!/usr/bin/env bash
# Two agents play Kuhn poker against each other (seat 0 and seat 1). Extra arguments are Hydra overrides, e.g. model.path=Qwen/Qwen3-0.6B model.device=cuda
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/kuhn_poker \
  --config_name multi_agent_kuhn_poker --num_agents 2 "$@"
