#!/usr/bin/env bash
# Two writers, one joint reward (MAGRPO, as CoMLRL's writing baseline). Extra arguments are
# Hydra overrides, e.g. model.path=Qwen/Qwen3-0.6B model.device=cuda team.shared_adapter=true
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/writing_magrpo \
  --config_name multi_agent_writing_magrpo --num_agents 2 "$@"
