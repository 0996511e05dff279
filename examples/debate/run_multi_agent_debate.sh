#!/usr/bin/env bash
# Three debaters, two rounds, the team answer by majority. Extra arguments are Hydra
# overrides, e.g. model.path=Qwen/Qwen3-0.6B model.device=cuda env.params.rounds=3
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/debate \
  --config_name multi_agent_debate --num_agents 3 "$@"
