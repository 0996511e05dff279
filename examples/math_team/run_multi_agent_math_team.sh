#!/usr/bin/env bash
# A generator, a critic and a refiner (one adapter each) solve math together; answers checked
# with math-verify. Extra arguments are Hydra overrides, e.g. model.path=Qwen/Qwen3-0.6B
# model.device=cuda model.dtype=bfloat16 team.shared_adapter=true
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/math_team \
  --config_name multi_agent_math_team --num_agents 3 "$@"
