#!/usr/bin/env bash
# Issue 33's open figures on one GPU, one after another, launched detached by device_runs.sh
# (vLLM's pieces stashed first: the header of device_runs.sh says how):
#   bash scripts/device_runs.sh bench i33 'bash scripts/issue33_runs.sh'
# 1. the default micro-batch's compiled train step, 1 and 8 agents (train_throughput.py; its
#    micro-batches replayed from captured graphs, trainer.capture's default on CUDA); train32:
#    the same at micro 32; nocapture: micro 8 with --capture off (the launches without graphs);
#    capture, capture8: the same step's micro-batches replayed from one captured CUDA graph
#    beside the eager launches (train_capture.py), 1 and 8 agents;
# 2. our engine (the pipeline's CUDA defaults: compiled, fused projections, Triton attention)
#    and vLLM 0.26 in one call, interleaved rounds, no-adapter and mixed rows, batch 64 and 256.
# 3. profiles: trainprof (the train step at micro 8, 1 and 8 agents, 20 operators each) and
#    decodeprof (the batch-256 decode step with the pipeline's defaults);
# 4. lanes: the Hanabi example (2 agents, 6 steps) with rollout.lookahead=2, busy lanes and the
#    in-pipeline / 32-lane engine figure; pipe18: the Hanabi example with 1 and with 8 agents
#    (6 steps each, the trainer's defaults: compiled, micro-batches captured), the train phase's
#    tokens per second; nash, nash_nocapture: the Kuhn and Leduc nash recipes (constrained
#    answers, the policy over legal moves), 4 steps each, micro-batches captured or not;
# 5. defaults, pdl, pdlall: the decode steps (batch 64 and 256, the pipeline's defaults: since
#    session 71 the blocked token picker), each beside the same engine with the picker compiled
#    by inductor (--compiled-picker, the default before); pdl: our Triton kernels launched with
#    programmatic dependent launch (ROLL_TRITON_PDL=1, pdl.py); pdlall: inductor's kernels too
#    (TORCHINDUCTOR_ENABLE_PDL=1). Session 71 on an H200: neither gained;
#    expand: the LoRA shrink as more columns of the base GEMM + the expand kernel alone, against
#    the base GEMM + the tiled kernel (benchmarks/lora_kernels.py, per group and decode step);
#    picker: the compiled pick_tokens against the blocked Triton picker (benchmarks/picker.py);
#    gemmlora: the base GEMM and the LoRA deltas in one kernel (gemm_lora.py) against the GEMM
#    + the tiled kernel (benchmarks/lora_kernels.py --sweep fused).
# I33_RUNS picks some of: train, train32, nocapture, capture, capture8, vllm, trainprof,
# decodeprof, lanes, pipe18, nash, nash_nocapture, defaults, pdl, pdlall, expand, picker,
# gemmlora (default: train, capture, capture8, vllm, in that order).
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
    train32) one train32 "$gpu" "$threads" "${train[@]:0:9}" --micro 32 ;;
    nocapture) one nocapture "$gpu" "$threads" "${train[@]}" --capture off ;;
    trainprof) one trainprof "$gpu" "$threads" "${train[@]}" --profile 20 ;;
    decodeprof) one decodeprof "$gpu" "$threads" benchmarks/rollout_throughput.py --pipeline-defaults \
      --compiled-only --skip-stock --skip-hf-compiled --extra --batches 256 --rounds 2 --profile ;;
    pipe18) one pipe18 "$gpu" "$threads" benchmarks/pipeline_step.py --settings hanabi:1 hanabi:8 \
      --modes continuous --steps 6 ;;
    nash) one nash "$gpu" "$threads" benchmarks/pipeline_step.py --settings kuhn_nash:2 \
      leduc_nash:2 --modes continuous --steps 4 ;;
    nash_nocapture) one nash_nocapture "$gpu" "$threads" benchmarks/pipeline_step.py --settings \
      kuhn_nash:2 leduc_nash:2 --modes continuous --steps 4 --override trainer.capture=false ;;
    defaults|pdl|pdlall) inductor=0 ours=0; [ "$run" = pdlall ] && inductor=1
      [ "$run" != defaults ] && ours=1
      TORCHINDUCTOR_ENABLE_PDL=$inductor ROLL_TRITON_PDL=$ours one "$run" "$gpu" "$threads" \
        benchmarks/rollout_throughput.py \
        --pipeline-defaults --compiled-only --skip-stock --skip-hf-compiled --extra \
        --compiled-picker --batches 64 256 --rounds 3 ;;
    expand) one expand "$gpu" "$threads" benchmarks/lora_kernels.py --sweep shipped ;;
    gemmlora) one gemmlora "$gpu" "$threads" benchmarks/lora_kernels.py --sweep fused ;;
    picker) one picker "$gpu" "$threads" benchmarks/picker.py ;;
    lanes) one lanes "$gpu" "$threads" benchmarks/pipeline_step.py --settings hanabi:2 \
      --modes continuous --steps 6 --override rollout.lookahead=2 ;;
    *) echo "unknown run $run" >&2 ;;
  esac
done
