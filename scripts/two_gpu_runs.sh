#!/usr/bin/env bash
# What issue 34 still needs from a 2-GPU machine (nvidia-h200-x2), as one chain launched
# detached by device_runs.sh (DeepSpeed from .whl; Ray stashed too for the pipeline stage:
# `pack_engines ray`, 2 pieces):
#   bash scripts/device_runs.sh bench two 'bash scripts/two_gpu_runs.sh'
# TWO_STAGES picks, in order, some of:
#   large     the 82.7 B base under ZeRO-3 on both GPUs (run 3: each rank's peak against its
#             share; session 64 ran out of memory before zero3_memory.FrozenWeightLinear), with a
#             live budget of 2e8 elements, then DeepSpeed's default
#   pipeline  the 2-GPU colocated layout with rollout.overlap over 8 steps (a steady window of 6,
#             session 64 had 2), Kuhn and Hanabi at 64 episodes, every GPU's utilization per
#             phase; then the 1-GPU one-process rows, the same games (GPU 0)
# (default: large pipeline). Session 68 lost its x2 machine between calls before `large` ran.
# Each run's stdout goes to $RUNS/NAME.log, its JSON to $OUT/NAME_*.json as soon as it ends.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/chain.sh  # RUNS, OUT, ts, one NAME GPUS THREADS SCRIPT ARGS...
large="benchmarks/train_data_parallel.py --world_sizes 2 --strategy deepspeed --zero_stage 3
  --shape large --layers 96 --agents 2 --rows 2 --tokens 256 --prompt 128 --micro 1 --repeats 2"
games="--settings kuhn:4 hanabi:4 --modes continuous --steps 8 --gpu_busy --groups 16"
coloc2="cluster.backend=ray rollout.overlap=true rollout.lookahead=1 actor_infer.colocate=true
  actor_train.world_size=2 actor_infer.num_engines=2"
for stage in ${TWO_STAGES:-large pipeline}; do
  case $stage in
    large)
      one zero3_83b_live2e8 0,1 32 $large --live 200000000
      one zero3_83b_default 0,1 32 $large ;;
    pipeline)
      RUN_LIMIT=900 one coloc2_overlap 0,1 32 benchmarks/pipeline_step.py $games --override $coloc2
      RUN_LIMIT=900 one local1 0 16 benchmarks/pipeline_step.py $games \
        --override rollout.lookahead=1 ;;
    *) echo "unknown stage $stage" >&2 ;;
  esac
done
echo "[$(ts)] all done"
