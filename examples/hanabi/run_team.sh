#!/usr/bin/env bash
# Two agents play the small Hanabi as a team, the measured starting point (team.yaml says what
# it reaches and what was tried). On a GPU: model.device=cuda
# Extra arguments are Hydra overrides, e.g. max_steps=200 output_dir=runs/mine
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/hanabi \
  --config_name team "$@"
