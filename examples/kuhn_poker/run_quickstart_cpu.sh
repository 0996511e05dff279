#!/usr/bin/env bash
# The README's main job: two agents learn Kuhn poker against a random player, tiny model, CPU.
# Extra arguments are Hydra overrides, e.g. max_steps=200 output_dir=runs/mine
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/kuhn_poker \
  --config_name quickstart_cpu "$@"
