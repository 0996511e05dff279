#!/usr/bin/env bash
# Issue 34's runs (and issue 33's open measurements) on one 4-GPU machine, as chains that share
# its GPUs, launched detached by device_runs.sh (Ray carried alone: `pack_engines ray`):
#   bash scripts/device_runs.sh bench multi 'bash scripts/multi_gpu_runs.sh'
# Each run's stdout goes to $RUNS/NAME.log (every `watch` shows its last line), its JSON to
# $OUT/NAME_*.json as soon as it ends (a run cut off later keeps what the earlier ones wrote).
# Session 63 ran the plan of session 62 (benchmarks/README.md, "The plan run on 4 x H200");
# this is the next one, in its order:
#   GPUs 0, 1  the 82.7 B base under ZeRO-3 again (each layer now released after use), with
#              a live cap, then with DeepSpeed's defaults
#   GPUs 2, 3  whole-step tok/s against episodes per step on 2 GPUs (Kuhn, Hanabi)
#   then GPU 0 the same on 1 GPU; GPU 1: ZeRO-3 / ZeRO-2 on the 0.6B shape (no prefetch now),
#              then 1 and 8 agents in the pipeline (the device-side adapter sync)
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${DEVICE_RUNS:-/tmp/runs}
OUT=${OUT:?OUT: where the JSON goes}
ts() { date +%H:%M:%S; }
steps="--modes continuous --steps 4"
ray2="cluster.backend=ray actor_infer.colocate=true actor_train.world_size=2 actor_infer.num_engines=2"

one() {  # one NAME GPUS THREADS SCRIPT ARGS...: a benchmark in its own $OUT, its JSON copied as NAME_*
  local name=$1 gpus=$2 threads=$3; shift 3
  local work="$RUNS/w_$name"
  mkdir -p "$work"
  echo "[$(ts)] start $name on GPUs $gpus: $*"
  CUDA_VISIBLE_DEVICES=$gpus OMP_NUM_THREADS=$threads OUT=$work timeout "${RUN_LIMIT:-900}" \
    python "$@" > "$RUNS/$name.log" 2>&1
  local rc=$?
  for f in "$work"/*.json; do [ -f "$f" ] && cp "$f" "$OUT/${name}_$(basename "$f")"; done
  echo "[$(ts)] end $name rc=$rc"
}

large="benchmarks/train_data_parallel.py --world_sizes 2 --strategy deepspeed --zero_stage 3
  --shape large --layers 96 --agents 2 --rows 2 --tokens 256 --prompt 128 --micro 1 --repeats 2"
(one zero3_83b_live 0,1 32 $large --live 200000000
 one zero3_83b_defaults 0,1 32 $large) &
a=$!
# (--groups: one process per sweep, each result written to its JSON as it ends)
(one kuhn4_2gpu 2,3 32 benchmarks/pipeline_step.py --settings kuhn:4 $steps --groups 16 32 64 \
   --override rollout.lookahead=1 $ray2
 one hanabi4_2gpu 2,3 32 benchmarks/pipeline_step.py --settings hanabi:4 $steps --groups 16 32 \
   --override rollout.lookahead=1 $ray2) &
b=$!
wait $a
(one kuhn4_1gpu 0 16 benchmarks/pipeline_step.py --settings kuhn:4 $steps --groups 16 32 64 \
   --override rollout.lookahead=1
 one hanabi4_1gpu 0 16 benchmarks/pipeline_step.py --settings hanabi:4 $steps --groups 16 32 \
   --override rollout.lookahead=1) &
c=$!
(for stage in 3 2 3 2; do
   one "zero${stage}_06b_$(date +%s)" 1 16 benchmarks/train_data_parallel.py --world_sizes 1 \
     --strategy deepspeed --zero_stage $stage --repeats 3
 done
 one agents_kuhn 1 16 benchmarks/pipeline_step.py --settings kuhn:1 kuhn:8 $steps) &
d=$!
wait $b $c $d
echo "[$(ts)] all done"
