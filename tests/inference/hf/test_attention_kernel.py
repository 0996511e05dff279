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
    for 2 and 3 query heads per kv head and a head dim that is not a power of two; a lane that
    sees nothing gets zeros."""
    assert [case["shape"] for case in child["cases"]] == [[4, 2, 32], [6, 2, 24]]
    for case in child["cases"]:
        assert case["size"] > 0.5  # outputs far from zero: the gap can fail
        assert case["gap"] < 1e-5
        assert case["finite"] and case["blind_lane_zero"]


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
