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
# Each run's stdout goes to $RUNS/NAME.log, its JSON to $OUT/NAME_*.json as soon as it ends.
set -uo pipefail
cd "$(dirname "$0")/.."
. scripts/chain.sh  # RUNS, OUT, ts, one NAME GPUS THREADS SCRIPT ARGS...
gpu=${CUDA_VISIBLE_DEVICES:-0} threads=${OMP_NUM_THREADS:-16}
train=(benchmarks/train_throughput.py --agents 1 8 --repeats 3 --paths fused --compile --micro 8)
for run in ${I33_RUNS:-train capture capture8 vllm}; do
  case $run in
    train) one train "$gpu" "$threads" "${train[@]}" ;;
    capture) one capture "$gpu" "$threads" benchmarks/train_capture.py ;;
    capture8) one capture8 "$gpu" "$threads" benchmarks/train_capture.py --agents 8 ;;
    vllm) VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 \
      one vllm "$gpu" "$threads" benchmarks/rollout_throughput.py --vllm --pipeline-defaults \
        --compiled-only --skip-stock --extra --skip-hf-compiled --batches 64 256 --rounds 5 ;;
    *) echo "unknown run $run" >&2 ;;
  esac
done
