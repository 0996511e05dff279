"""The Triton ring attention (attention_kernel.py) on CPU through Triton's interpreter (chosen
before triton is imported: a child process, tests/inference/triton_child.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll.inference import HFEngine
from roll.models import load_model, load_tokenizer

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def child(tiny_model_path) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.inference.triton_child",
                           str(tiny_model_path), "attention"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_kernel_equals_sdpa_and_never_reads_a_hidden_column(child):
    """Lanes seeing a prefix, a wrapped ring, one column: the kernel's output equals the
    fused SDPA path's with NaN in every hidden column (SDPA itself would return NaN there),
    for 2 and 3 query heads per kv head and a head dim that is not a power of two, in one
    chunk per lane and in chunks combined by the second kernel (one of them seeing nothing),
    hidden blocks skipped or only masked; a lane that sees nothing gets zeros."""
    assert [case["shape"] for case in child["cases"]] == [[4, 2, 32], [6, 2, 24]]
    tilings = ["op", "one_chunk_skip", "chunks_of_32", "chunks_of_16_skip", "chunks_of_48"]
    for case in child["cases"]:
        assert case["size"] > 0.5  # outputs far from zero: the gap can fail
        assert list(case["gap"]) == tilings  # one chunk and split chunks, skipping or not
        for tiling in tilings:
            assert case["gap"][tiling] < 1e-5, tiling
            assert case["finite"][tiling] and case["blind_lane_zero"][tiling], tiling


@pytest.mark.slow
def test_engine_with_the_triton_attention_equals_sdpa(child):
    engine = child["engine"]
    # lock-step generate and continuous serve: same greedy tokens, log-probs within fp32
    assert engine["tokens_equal"]
    assert engine["logprob_gap"] < 1e-5
    # the decode steps ran the kernel (2 layers a step), the sdpa engine never
    assert engine["kernel_calls"]["sdpa"] == 0
    assert engine["kernel_calls"]["triton"] > 0 and engine["kernel_calls"]["triton"] % 2 == 0


def test_attention_kernel_choice_is_checked(tiny_model_path):
    base, tokenizer = load_model(tiny_model_path), load_tokenizer(tiny_model_path)
    with pytest.raises(ValueError, match="attention_kernel='flash'"):
        HFEngine(base, tokenizer, attention_kernel="flash")


def test_block_columns_fit_the_devices_shared_memory(monkeypatch):
    """128 columns a block where two pipelined stages of a block's keys and values (bf16, head
    dim 128: 2 x 128 x 128 x 2 B x 2 = 128 KiB) take at most 3/4 of shared memory (an H200's
    227 KiB: 170 KiB); 64 on an A100 (163 KiB: 122 KiB) or at head dim 256; 32 with 48 KiB
    (36 KiB: 32 KiB fits, 64 KiB does not); 128 without CUDA (the interpreter)."""
    import torch

    from roll.inference.hf import attention_kernel as ak

    cuda = torch.device("cuda", 0)
    for shared, head_dim, itemsize, block in ((232448, 128, 2, 128), (166912, 128, 2, 64),
                                              (232448, 256, 2, 64), (232448, 64, 4, 128),
                                              (101376, 128, 2, 64), (49152, 128, 2, 32)):
        monkeypatch.setitem(ak._SHARED_MEMORY, 0, shared)
        assert ak.block_columns(cuda, head_dim, itemsize) == block, (shared, head_dim)
    assert ak.block_columns(torch.device("cpu"), 128, 2) == ak.BLOCK_N == 128
