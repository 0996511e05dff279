#!/usr/bin/env bash
# Kuhn poker with a real instruct model (SmolLM2-135M-Instruct, no download), on the GPU if
# there is one, else on CPU. Prints exploitability and win rates before and after training.
# Extra arguments are Hydra overrides, e.g. max_steps=200 output_dir=runs/mine
set -euo pipefail
cd "$(dirname "$0")/../.."
device=$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
if [ "$device" = cpu ]; then
  echo "no GPU: SmolLM2 on CPU takes minutes a step at this recipe's 256 games (562 s for step 1" \
       "on 2 cores); on a GPU the whole run takes minutes" >&2
fi
python examples/start_multi_agent_pipeline.py --config_path examples/kuhn_poker \
  --config_name quickstart_smollm2 "model.device=$device" "$@"
