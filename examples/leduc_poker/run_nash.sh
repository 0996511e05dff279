#!/usr/bin/env bash
# Equilibrium play in Leduc poker (nash.yaml says how). On a GPU: model.device=cuda
# Extra arguments are Hydra overrides, e.g. max_steps=200 output_dir=runs/mine
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/leduc_poker \
  --config_name nash "$@"
