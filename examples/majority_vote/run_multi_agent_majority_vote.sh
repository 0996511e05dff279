#!/usr/bin/env bash
# Three independent voters, the team answer by majority. Extra arguments are Hydra overrides,
# e.g. model.path=Qwen/Qwen3-0.6B model.device=cuda, or five voters on five adapters:
#   env.params.voters=5 --num_agents 5 'env.role_to_agent={}'   (empty: voter i -> agent i)
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/majority_vote \
  --config_name multi_agent_majority_vote --num_agents 3 "$@"
