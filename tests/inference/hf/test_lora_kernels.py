"""The tiled Triton LoRA kernel (lora_kernels.py) and the engine's triton path, on CPU through
Triton's interpreter (it must be chosen before triton is imported: a child process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from roll.inference import HFEngine
from roll.inference.hf.fused_lora import resolve_kernels
from roll.models import load_model, load_tokenizer

REPO = Path(__file__).resolve().parents[3]
# The full CI runs them; Triton's interpreter takes ~9 s in the child (quick subset < 3 min).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def child(tiny_model_path) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.inference.triton_child",
                           str(tiny_model_path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernel_equals_the_formulas_by_hand(child):
    kernel = child["kernel"]
    assert kernel["delta_size"] > 10  # the deltas are far from zero: the gaps below can fail
    # rows in slot order (stable); tiles of at most 16 rows of one slot, then empty tiles up to
    # ceil(20 / 16) + 3 slots + 1 = 6
    assert kernel["order"] == [2, 1, 0, *range(3, 20)]
    assert kernel["tiles"] == [[-1, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 19], [2, 19, 20],
                               [-1, 0, 0]]
    # whole members per program, and two programs per member
    assert len(kernel["gaps"]) == 2 and max(kernel["gaps"]) < 1e-4
    assert kernel["base_row_zero"]  # block -1: no adapter, exactly zero
    # the expand half on a product that holds the shrink: base + the same deltas, in place;
    # the shrink columns and the base row untouched
    assert kernel["expand_gap"] < 1e-4
    assert kernel["expand_kept_shrink"] and kernel["expand_base_row_kept"]
    # linear_lora: x Wᵀ + bias (a loop by hand) and the same deltas, returned together
    assert max(kernel["linear_lora_gaps"]) < 1e-4


def test_gemm_and_lora_in_one_kernel_equal_the_formulas_by_hand(child):
    """gemm_lora.py: base product + each row's own slot's delta (the other slots' shrink
    columns masked), with and without bias, one or several tiles of rows and inputs."""
    fused = child["gemm_lora"]
    assert fused["delta_size"] > 10  # the deltas are far from zero: the gaps below can fail
    assert fused["gap"] < 1e-3 and fused["gap_tiles_bias"] < 1e-3
    assert fused["base_rows_gap"] < 1e-4  # block -1: the base product alone


def test_blocked_picker_picks_what_pick_tokens_picks(child):
    """picker_kernel.py (the same child process: Triton's interpreter): tokens equal, log-probs
    within float order, for greedy, sampled and constrained rows."""
    picker = child["picker"]
    for case in ("greedy", "sampled", "sampled_masked", "greedy_masked"):
        assert picker[case]["tokens_equal"], case
        assert picker[case]["logprob_gap"] < 1e-5, case
    assert picker["sampled"]["drew"] and not picker["greedy"]["drew"]  # the noise was drawn
    assert picker["tie_token"] == 40  # the first of two equal maxima, blocks apart
    # blocked_picker (the engine's on CUDA): the kernels for plain calls, the picker it was
    # given (the compiled pick_tokens) only for the call with top-k/top-p
    assert picker["routing"] == {"unfiltered_equal": True, "calls_before": 0,
                                 "filtered_equal": True, "calls_after": 1}


def test_engine_with_triton_kernels_equals_the_stacked_path(child):
    engine = child["engine"]
    assert engine["kernels"] == {"torch": "torch", "triton": "triton",
                                 "streams": "triton_streams", "streams_fused": "triton_streams"}
    assert engine["groups"] == [1, 2, 3]  # o/down alone, gate/up, q/k/v
    # lock-step generate and continuous serve: same greedy tokens, same log-probs (fp32),
    # whether the kernel runs after each group's base product or beside it (linear_lora), and
    # whether q/k/v and gate/up are one product per family or not
    for variant in ("triton", "streams", "streams_fused"):
        assert engine[variant]["tokens_equal"], variant
        assert engine[variant]["logprob_gap"] < 1e-5, variant
    # decode steps ran the kernel: 2 layers x 4 groups per step, one kernel per group; the
    # torch path none; beside the products, every group's deltas came from linear_lora (with
    # fused families too: the family's product computed them), none from the hooks
    calls = engine["calls"]
    assert calls["torch"] == {"tiled": 0, "linear": 0}
    assert calls["triton"]["tiled"] > 0 and calls["triton"]["tiled"] % 8 == 0
    assert calls["triton"]["linear"] == 0
    for variant in ("streams", "streams_fused"):
        assert calls[variant] == {"tiled": 0, "linear": calls["triton"]["tiled"]}, variant
    # a member called before its group's first one computes its own delta
    assert engine["out_of_order_delta"] > 1 and engine["out_of_order_gap"] < 1e-4


def test_kernel_choice_is_checked_before_use(tiny_model_path, monkeypatch):
    base, tokenizer = load_model(tiny_model_path), load_tokenizer(tiny_model_path)
    with pytest.raises(ValueError, match="lora_kernels='cuda'"):
        HFEngine(base, tokenizer, lora_kernels="cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="runs on CUDA, not cpu"):
        HFEngine(base, tokenizer, lora_kernels="triton")
    assert HFEngine(base, tokenizer).fused.kernels == "torch"  # auto on CPU
    # auto on CUDA (Triton is importable here): the tiled kernel beside the base GEMMs
    assert resolve_kernels("auto", torch.device("cuda")) == "triton_streams"
    assert resolve_kernels("triton", torch.device("cuda")) == "triton"
