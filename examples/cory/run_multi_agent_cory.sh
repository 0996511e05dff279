#!/usr/bin/env bash
# CORY: a pioneer and an observer (one adapter each, roles swapped every 10 steps) solve math
# with a collective reward. Extra arguments are Hydra overrides, e.g. model.path=Qwen/Qwen3-0.6B
# model.device=cuda model.dtype=bfloat16 env.swap_roles_every=5
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/cory \
  --config_name multi_agent_cory --num_agents 2 "$@"
