#!/usr/bin/env bash
# Two agents on Connect Four, each in both seats against each other and random (mixed.yaml says
# how). On a GPU: model.device=cuda model.dtype=bfloat16 trainer.micro_batch_size=128
# Extra arguments are Hydra overrides, e.g. model.path=Qwen/Qwen3-0.6B
set -euo pipefail
cd "$(dirname "$0")/../.."
python examples/start_multi_agent_pipeline.py --config_path examples/connect_four \
  --config_name mixed "$@"
