"""Per-row Triton LoRA kernels (lora_kernels.py) and the engine's triton path, on CPU through
Triton's interpreter (it must be chosen before triton is imported: a child process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll.inference import HFEngine
from roll.models import load_model, load_tokenizer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def child(tiny_model_path) -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.inference.triton_child",
                           str(tiny_model_path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernels_equal_the_formulas_by_hand(child):
    kernel = child["kernel"]
    assert kernel["delta_size"] > 10  # the deltas are far from zero: the gaps below can fail
    assert kernel["h_gap"] < 1e-4 and kernel["d_gap"] < 1e-4
    assert kernel["base_rows_zero"]  # block -1: no adapter, exactly zero
    # one kernel (shrink and expand fused), whole members and two programs per member
    assert max(kernel["one_kernel_gaps"]) < 1e-4 and len(kernel["one_kernel_gaps"]) == 2
    assert kernel["one_kernel_base_rows_zero"]


def test_engine_with_triton_kernels_equals_the_stacked_path(child):
    engine = child["engine"]
    assert engine["kernels"] == {"torch": "torch", "triton": "triton", "triton_two": "triton"}
    assert engine["groups"] == [1, 2, 3]  # o/down alone, gate/up, q/k/v
    # lock-step generate and continuous serve: same greedy tokens, same log-probs (fp32)
    for variant in ("triton", "triton_two"):
        assert engine[variant]["tokens_equal"], variant
        assert engine[variant]["logprob_gap"] < 1e-5, variant
    # decode steps ran the kernels: 2 layers x 4 groups per step; one kernel per group, or a
    # shrink and an expand; the torch path none
    calls = engine["calls"]
    assert calls["torch"] == {"shrink": 0, "expand": 0, "delta": 0}
    assert calls["triton"]["shrink"] == calls["triton"]["expand"] == 0
    assert calls["triton"]["delta"] > 0 and calls["triton"]["delta"] % 8 == 0
    assert calls["triton_two"]["delta"] == 0
    assert calls["triton_two"]["shrink"] == calls["triton_two"]["expand"] == calls["triton"][
        "delta"]
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
