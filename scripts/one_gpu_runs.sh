#!/usr/bin/env bash
# Issue 33's lanes figure on one GPU: the Hanabi example's rollout with the admissions'
# prefills replayed as CUDA graphs (rollout.hf.prefill_graphs, the default on CUDA) or eager,
# q/k/v and gate/up fused (rollout.hf.fuse_projections, the default on CUDA) or not, with and
# without rollout.lookahead=2, launched detached by device_runs.sh:
#   bash scripts/device_runs.sh bench lanes 'bash scripts/one_gpu_runs.sh'
# Each step also reports where the serve loop's host time went (rollout/serve_*_s) and what the
# prefill graphs' captures took of it (rollout/prefill_captures, rollout/prefill_capture_s).
# Each run's stdout goes to $RUNS/NAME.log, its JSON to $OUT/NAME.json as soon as it ends.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${DEVICE_RUNS:-/tmp/runs}
OUT=${OUT:?OUT: where the JSON goes}
ts() { date +%H:%M:%S; }
# LANES_RUNS: "LOOKAHEAD GRAPHS FUSE ATTENTION" separated by commas (FUSE may be left out: true;
# ATTENTION: rollout.hf.attention_kernel, left out: the default)
IFS=, read -ra runs <<< "${LANES_RUNS:-2 true true,2 true false,0 true true,0 true false}"
for run in "${runs[@]}"; do
  set -- $run
  fuse=${3:-true}
  attention=${4:-default}
  name="lanes_la$1_graphs_$2_fuse_${fuse}_attention_$attention"
  work="$RUNS/w_$name"
  mkdir -p "$work"
  echo "[$(ts)] start $name"
  OUT=$work timeout 560 python benchmarks/pipeline_step.py --settings hanabi:2 --modes continuous \
    --steps 6 --override rollout.lookahead=$1 rollout.hf.prefill_graphs=$2 \
    rollout.hf.fuse_projections=$fuse \
    ${4:+rollout.hf.attention_kernel=$4} > "$RUNS/$name.log" 2>&1
  echo "[$(ts)] end $name rc=$?"
  [ -f "$work/pipeline_step.json" ] && cp "$work/pipeline_step.json" "$OUT/$name.json"
done
