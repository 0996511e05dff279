#!/usr/bin/env bash
# Issue 34's runs (and issue 33's open measurements) on one 4-GPU machine, as chains that share
# its GPUs, launched detached by device_runs.sh (Ray carried alone: `pack_engines ray`):
#   bash scripts/device_runs.sh bench multi 'bash scripts/multi_gpu_runs.sh'
# Each run's stdout goes to $RUNS/NAME.log (every `watch` shows its last line), its JSON to
# $OUT/NAME_*.json as soon as it ends (a run cut off later keeps what the earlier ones wrote).
# Session 64 ran the plan before this one (benchmarks/README.md, "One GPU against two with the
# next rollout overlapped"); this one is the next, in its order:
#   GPUs 2, 3  the 2-GPU colocated layout with rollout.overlap over 8 steps (a steady window of
#              6, not 2), Kuhn and Hanabi at 64 and 128 episodes, the ranks' recompiles logged;
#              then the 1-GPU overlapped layout at 128 episodes; every GPU's utilization per
#              phase (--gpu_busy: nvidia-smi every 100 ms) beside each figure (all Ray runs in this one
#              chain: one local Ray cluster at a time)
#   GPUs 0, 1  the 82.7 B base under ZeRO-3 with the base's projections saving weights, not
#              views (zero3_memory.py); then GPU 0: the 1-GPU one-process rows over 8 steps
#   GPU 1      ZeRO-3 / ZeRO-2 on the 0.6B shape (the base stays gathered again), twice
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/chain.sh  # RUNS, OUT, ts, one NAME GPUS THREADS SCRIPT ARGS...
steps="--modes continuous --steps 8 --gpu_busy"
games="--settings kuhn:4 hanabi:4 $steps --groups 16 32"
ray="cluster.backend=ray rollout.overlap=true rollout.lookahead=1"
coloc1="$ray actor_infer.colocate=true actor_train.world_size=1 actor_infer.num_engines=1"
coloc2="$ray actor_infer.colocate=true actor_train.world_size=2 actor_infer.num_engines=2"

(TORCH_LOGS=recompiles RUN_LIMIT=900 one coloc2_overlap 2,3 32 benchmarks/pipeline_step.py \
   $games --override $coloc2
 RUN_LIMIT=900 one coloc1_overlap 2 16 benchmarks/pipeline_step.py --settings kuhn:4 hanabi:4 \
   $steps --groups 32 --override $coloc1) &
r=$!
large="benchmarks/train_data_parallel.py --world_sizes 2 --strategy deepspeed --zero_stage 3
  --shape large --layers 96 --agents 2 --rows 2 --tokens 256 --prompt 128 --micro 1 --repeats 2"
one zero3_83b_live 0,1 32 $large --live 200000000
(RUN_LIMIT=900 one local1 0 16 benchmarks/pipeline_step.py $games --override rollout.lookahead=1) &
p=$!
(for stage in 3 2 3 2; do
   one "zero${stage}_06b_$(date +%s)" 1 16 benchmarks/train_data_parallel.py --world_sizes 1 \
     --strategy deepspeed --zero_stage $stage --repeats 3
 done) &
z=$!
wait $r $p $z
echo "[$(ts)] all done"
