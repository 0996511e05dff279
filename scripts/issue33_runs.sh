#!/usr/bin/env bash
# Issue 33's open figures on one GPU, one after another, launched detached by device_runs.sh
# (vLLM's pieces stashed first: the header of device_runs.sh says how):
#   bash scripts/device_runs.sh bench i33 'bash scripts/issue33_runs.sh'
# 1. the default micro-batch's compiled train step, 1 and 8 agents (train_throughput.py);
#    capture, capture8: the same step's micro-batches replayed from one captured CUDA graph
#    beside the eager launches (train_capture.py), 1 and 8 agents;
# 2. our engine (the pipeline's CUDA defaults: compiled, fused projections, Triton attention)
#    and vLLM 0.26 in one call, interleaved rounds, no-adapter and mixed rows, batch 64 and 256.
# I33_RUNS picks some of: train, capture, capture8, vllm (default: all, in that order).
# Each run's stdout goes to $RUNS/NAME.log, its JSON to $OUT/NAME.json as soon as it ends.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${DEVICE_RUNS:-/tmp/runs}
OUT=${OUT:?OUT: where the JSON goes}
ts() { date +%H:%M:%S; }
one() {  # one NAME COMMAND...: run it (stdout to its log), copy its JSON out
  local name=$1 work="$RUNS/w_$1"; shift
  mkdir -p "$work"
  echo "[$(ts)] start $name: $*"
  OUT=$work timeout 560 "$@" > "$RUNS/$name.log" 2>&1
  echo "[$(ts)] end $name rc=$?"
  for file in "$work"/*.json; do [ -f "$file" ] && cp "$file" "$OUT/$name.json"; done
}
train=(python benchmarks/train_throughput.py --agents 1 8 --repeats 3 --paths fused --compile
       --micro 8)
for run in ${I33_RUNS:-train capture capture8 vllm}; do
  case $run in
    train) one train "${train[@]}" ;;
    capture) one capture python benchmarks/train_capture.py ;;
    capture8) one capture8 python benchmarks/train_capture.py --agents 8 ;;
    vllm) VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
      one vllm python benchmarks/rollout_throughput.py --vllm --pipeline-defaults \
        --compiled-only --skip-stock --extra --skip-hf-compiled --batches 64 256 --rounds 5 ;;
    *) echo "unknown run $run" >&2 ;;
  esac
done
