#!/usr/bin/env bash
# Issue 34's runs (and issue 33's open measurements on the spare GPUs) on one 4-GPU machine,
# as chains that share its GPUs, launched detached by device_runs.sh:
#   bash scripts/device_runs.sh bench multi 'bash scripts/multi_gpu_runs.sh'
# Each run's stdout goes to $RUNS/NAME.log (every `watch` shows its last line), its JSON to
# $OUT/NAME*.json as soon as it ends (a run cut off later keeps what the earlier ones wrote).
#   GPU 0      the 1-GPU rows (Kuhn, Hanabi; 4 agents, 64 episodes a step, lookahead 1)
#   GPUs 2, 3  the same examples on 2 GPUs: Ray, 2 train ranks + 2 hf engine actors, colocated
#   GPU 1      issue 33: the micro-8 train step compiled in the default mode and replayed as CUDA
#              graphs (reduce-overhead), interleaved
#   then       GPUs 0, 1: a base larger than one GPU (82.7 B, ZeRO-3); GPU 2: 1 and 8 agents in
#              the pipeline (issue 33); GPU 3: Hanabi's prefills compiled or not, profiled
#   last       the same examples on all 4 GPUs (if the machine is still there)
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${DEVICE_RUNS:-/tmp/runs}
OUT=${OUT:?OUT: where the JSON goes}
ts() { date +%H:%M:%S; }
steps="--modes continuous --steps 4"
fill="rollout.num_groups=16 rollout.lookahead=1"
ray2="cluster.backend=ray actor_infer.colocate=true actor_train.world_size=2 actor_infer.num_engines=2"
ray4="cluster.backend=ray actor_infer.colocate=true actor_train.world_size=4 actor_infer.num_engines=4"

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

(one kuhn4_1gpu 0 16 benchmarks/pipeline_step.py --settings kuhn:4 $steps --override $fill
 one hanabi4_1gpu 0 16 benchmarks/pipeline_step.py --settings hanabi:4 $steps --override $fill) &
a=$!
(one kuhn4_2gpu 2,3 16 benchmarks/pipeline_step.py --settings kuhn:4 $steps --override $fill $ray2
 one hanabi4_2gpu 2,3 16 benchmarks/pipeline_step.py --settings hanabi:4 $steps --override $fill $ray2) &
b=$!
(for m in default reduce-overhead default reduce-overhead; do
   one "tt_${m}_$(date +%s)" 1 16 benchmarks/train_throughput.py --agents 1 8 --micro 8 --compile \
     --compile_mode "$m" --paths fused --repeats 3
 done) &
c=$!
wait $a $c
(one zero3_large83b 0,1 32 benchmarks/train_data_parallel.py --world_sizes 2 --strategy deepspeed \
   --zero_stage 3 --shape large --layers 96 --agents 2 --rows 2 --tokens 256 --prompt 128 --micro 1 \
   --repeats 2 --live 200000000) &
e=$!
wait $b
(one agents_kuhn 2 16 benchmarks/pipeline_step.py --settings kuhn:1 kuhn:8 $steps
 one agents_hanabi 2 16 benchmarks/pipeline_step.py --settings hanabi:1 hanabi:8 $steps) &
f=$!
(for c in false true; do
   one "prefill_$c" 3 16 benchmarks/pipeline_step.py --settings hanabi:2 $steps --profile_rollout 3 \
     --override rollout.lookahead=2 rollout.hf.compile_prefill=$c
 done) &
g=$!
wait $e $f $g
one kuhn4_4gpu 0,1,2,3 64 benchmarks/pipeline_step.py --settings kuhn:4 $steps --override $fill $ray4
one hanabi4_4gpu 0,1,2,3 64 benchmarks/pipeline_step.py --settings hanabi:4 $steps --override $fill $ray4
echo "[$(ts)] all done"
